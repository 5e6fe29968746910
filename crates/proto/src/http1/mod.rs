//! HTTP/1.1 (RFC 9112), the parts a push server needs from a client.
//!
//! - [`base_url`]: where an HTTP API lives, as users type it (`host:port`, `http://host:port/`).
//! - [`authorization`]: `Authorization` header credentials (`Bearer`, `Basic`).
//! - [`head`]: request heads, parsed with limits enforced on partial input, and body framing.
//! - [`query`]: `key=value` pairs of a query string, percent-decoded.
//! - [`chunked`]: a sans-IO decoder for `Transfer-Encoding: chunked` request bodies.
//! - [`response`]: reason phrases, chunked response bodies, and parsing response heads.
//! - [`mod@write`]: writing request heads (refusing header injection) and response heads.
//! - [`hop`]: which header fields a proxy forwards (RFC 9110 hop-by-hop fields).

pub mod authorization;
pub mod base_url;
pub mod chunked;
pub mod head;
pub mod hop;
pub mod query;
pub mod response;
pub mod write;

pub use chunked::{BodyError, ChunkedDecoder};
pub use head::{parse_head, Body, HeadError, HeadLimits, RequestHead};
pub use hop::{is_connection_field, HopByHop};
pub use query::{decode_path, query_pairs, PathError, QueryError};
pub use response::{
    parse_response_head, reason, write_chunk, ResponseBody, ResponseError, ResponseHead, LAST_CHUNK,
};
pub use write::{
    end_head, is_token, write_content_length, write_header, write_request_head, write_request_line,
    write_response_head, write_status_head, HeadWriteError, Version,
};
