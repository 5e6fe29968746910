//! HTTP/1.1 (RFC 9112), the parts a push server needs from a client.
//!
//! - [`authorization`]: `Authorization` header credentials (`Bearer`, `Basic`).
//! - [`head`]: request heads, parsed with limits enforced on partial input, and body framing.
//! - [`query`]: `key=value` pairs of a query string, percent-decoded.
//! - [`chunked`]: a sans-IO decoder for `Transfer-Encoding: chunked` request bodies.
//! - [`response`]: reason phrases, response heads and chunked response bodies.

pub mod authorization;
pub mod chunked;
pub mod head;
pub mod query;
pub mod response;

pub use chunked::{BodyError, ChunkedDecoder};
pub use head::{parse_head, Body, HeadError, HeadLimits, RequestHead};
pub use query::{query_pairs, QueryError};
pub use response::{
    parse_response_head, reason, write_chunk, write_response_head, ResponseBody, ResponseError,
    ResponseHead, LAST_CHUNK,
};
