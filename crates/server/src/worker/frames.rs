//! Encodings a worker makes once and shares with every connection: the keep-alives and the
//! ping frame, and how shared compressed frames are made. A leaf: the engine holds them and
//! the transport seam (`transport/frame.rs`) picks among them.

use std::sync::Arc;

use crate::config::Config;
use crate::message::DeflateSettings;

/// Encodings made once and shared by every connection.
pub(crate) struct Frames {
    /// An empty Ping frame, shared by every keep-alive ping.
    pub(crate) ping_frame: Arc<[u8]>,
    /// An SSE comment and an empty NDJSON line (as a chunk): keep-alives for HTTP streams.
    pub(crate) sse_keepalive: Arc<[u8]>,
    pub(crate) stream_keepalive: Arc<[u8]>,
    /// How shared compressed frames are made.
    pub(crate) deflate_settings: DeflateSettings,
}

impl Frames {
    /// The encodings for a server configured with `config`.
    pub(crate) fn new(config: &Config) -> Frames {
        Frames {
            ping_frame: clarion_proto::ws::frame::encode_frame(
                clarion_proto::ws::OpCode::Ping,
                b"",
            )
            .into(),
            sse_keepalive: Arc::from(&b":\n\n"[..]),
            stream_keepalive: {
                let mut v = Vec::new();
                clarion_proto::http1::write_chunk(&mut v, b"\n");
                v.into()
            },
            deflate_settings: DeflateSettings {
                threshold: config.compression_threshold,
                level: config.compression_level,
            },
        }
    }
}
