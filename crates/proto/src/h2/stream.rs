//! One stream's state, shared by the two directions of [`super::server::Connection`]: what
//! the client may still send and what of the answer has gone out.

use crate::http1::ChunkedDecoder;

/// No handle bound.
pub const NO_USER: u32 = u32::MAX;

/// One stream, as long as either side may still send on it.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) id: u32,
    /// The layer above's handle for it; `NO_USER` until bound, and after it let go.
    pub(crate) user: u32,
    pub(crate) send_window: i32,
    pub(crate) recv_window: i32,
    pub(crate) remote_closed: bool,
    pub(crate) local_closed: bool,
    pub(crate) websocket: bool,
    pub(crate) head_only: bool,
    /// Request body bytes still announced by `content-length` (`u64::MAX`: none announced).
    pub(crate) expect: u64,
    pub(crate) out: Out,
}

/// Where a stream's answer is.
#[derive(Debug, Default)]
pub(crate) enum Out {
    /// Waiting for the head; the part of it that has arrived, if it came in pieces.
    #[default]
    Head,
    PartialHead(Box<[u8]>),
    /// This many body bytes left.
    Length(u64),
    /// A chunked body (boxed: rare, and larger than the rest).
    Chunked(Box<Chunked>),
    /// Until the layer above ends it.
    Close,
    /// Sent in full.
    Done,
}

/// A chunked body being de-chunked.
#[derive(Debug)]
pub(crate) struct Chunked {
    pub(crate) decoder: ChunkedDecoder,
    /// Decoded bytes not sent yet (window closed).
    pub(crate) pending: Vec<u8>,
    /// The last chunk has been decoded.
    pub(crate) complete: bool,
}
