//! A request's head as the API keeps it: copied out of the read buffer, so the buffer can take
//! the body.

use clarion_proto::http1::{self, Body};

use crate::reply::Answer;

/// A request's head, copied out of the read buffer.
pub(super) struct Request {
    pub(super) method: String,
    /// Percent-decoded.
    pub(super) path: String,
    pub(super) query: String,
    pub(super) content_type: Option<String>,
    pub(super) authorization: Option<String>,
    /// `Idempotency-Key`, as sent (checked where a publish takes it).
    pub(super) idempotency_key: Option<String>,
    /// `Host`, `Origin` and `Sec-Fetch-Site`: whether a browser sent it from another site.
    pub(super) host: Option<String>,
    pub(super) origin: Option<String>,
    pub(super) fetch_site: Option<String>,
    pub(super) expect_continue: bool,
    pub(super) keep_alive: bool,
    pub(super) body: Body,
}

/// The head copied, its path percent-decoded once (by the decoder the client listener's query
/// strings go through), so a topic in `/publish/{topic}` or `/topics/{topic}` is checked and
/// quoted as the client listener sees it in `?topic=`.
pub(super) fn copy_request(h: &http1::RequestHead<'_>) -> Result<Request, Answer> {
    let body = h
        .body()
        .map_err(|e| Answer::error(e.status(), &e.to_string()))?;
    let path = http1::decode_path(h.path()).map_err(|e| Answer::error(400, &e.to_string()))?;
    Ok(Request {
        method: h.method.to_owned(),
        path: path.into_owned(),
        query: h.query().to_owned(),
        content_type: h.header_str("content-type").map(str::to_owned),
        authorization: h.header_str("authorization").map(str::to_owned),
        idempotency_key: h.header_str("idempotency-key").map(str::to_owned),
        host: h.header_str("host").map(str::to_owned),
        origin: h.header_str("origin").map(str::to_owned),
        fetch_site: h.header_str("sec-fetch-site").map(str::to_owned),
        expect_continue: h.has_token("expect", "100-continue"),
        keep_alive: h.keep_alive(),
        body,
    })
}
