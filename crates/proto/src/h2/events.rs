//! What a server connection ([`super::server::Connection`]) tells the layer above: the events of
//! its streams, in the order their frames came, and why it ended.

use super::frame::ErrorCode;
use super::request::Request;

/// What the layer above must act on, in the order the frames came.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A new stream's request. `end_stream`: it has no body.
    Request {
        stream: u32,
        request: Request,
        end_stream: bool,
    },
    /// Body bytes of a stream's request (WebSocket frames, on a WebSocket stream).
    Data {
        stream: u32,
        user: u32,
        data: &'a [u8],
        end_stream: bool,
    },
    /// The stream is gone (the client reset it, or it was reset for an error): whatever
    /// serves it must stop. `user` is what [`super::server::Connection::bind`] gave it, if anything.
    Reset { stream: u32, user: Option<u32> },
}

/// Why the connection ends: a GOAWAY with this code has been written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fatal {
    pub code: ErrorCode,
    pub reason: &'static str,
}

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.reason)
    }
}
