//! HTTP/2 (RFC 9113), sans-IO: what the server needs to speak it on its own event loop.
//!
//! - [`frame`]: frames: reading with every check the format allows, writing what a server
//!   sends.
//! - [`hpack`]: header compression (RFC 7541), bounded against HPACK bombs.
//! - [`huffman`]: HPACK's static Huffman code.
//! - [`server`]: one server connection: streams, flow control, limits; requests in and
//!   answers out as HTTP/1.1 bytes ([`request`], [`response`]), so the server's transports
//!   run over HTTP/2 unchanged.
//!
//! Why not the `h2` crate: it is written for tokio's `AsyncRead`/`AsyncWrite` and its own
//! task model, while Clarion's workers run their own epoll/io_uring loops over a slab of
//! connections with per-connection state counted in bytes; see docs/architecture.md.

pub mod events;
pub mod frame;
pub mod hpack;
pub mod huffman;
pub mod request;
pub mod response;
pub mod server;
pub mod settings;
pub mod stream;

#[cfg(test)]
pub(crate) mod tests {
    /// Bytes from the RFCs' hex dumps (`"8286 8441"`).
    #[allow(clippy::unwrap_used, clippy::indexing_slicing)]
    pub(crate) fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
