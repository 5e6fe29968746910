//! GRIP proxy mode: Clarion in front of a backend, the way Pushpin is (`docs/grip.md`).
//!
//! - [`Proxy`]: what the workers share: the routes, the backend pool, signing settings.
//! - [`backend`]: the threads that talk to backends.
//! - [`GripContent`]: what a Pushpin-format publish carries for held connections, built once per
//!   message and shared like every other encoding, as the message's
//!   [`crate::message::Attachment`].
//!
//! The per-connection runtime (forwarding, holds, the WebSocket-over-HTTP bridge) is run by the
//! worker's engine, in `worker::grip`. The protocol's bytes are parsed by `clarion_proto::grip`.

pub mod backend;
pub mod wire;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use clarion_proto::grip::publish::{
    HttpResponse, HttpResponseFormat, HttpStreamFormat, WsMessage, WsMessageFormat,
};
use clarion_proto::grip::{Item, Route};
use clarion_proto::http1;
use clarion_proto::ws::close::encode_close_frame;
use clarion_proto::ws::frame::encode_frame;
use clarion_proto::ws::{CloseCode, DataKind, OpCode};

use backend::{Backend, Mailbox};

use crate::message::{Attachment, Published};

/// Shared by every worker in proxy mode.
pub struct Proxy {
    /// The routes file, parsed.
    pub routes: Vec<Route>,
    /// Each route's backend addresses, shared with the jobs that use them.
    pub targets: Vec<Arc<[String]>>,
    /// The backend request pool.
    pub backend: Backend,
    /// One per worker, by worker id.
    pub mailboxes: Vec<Arc<Mailbox>>,
    /// Default `Grip-Sig` key and issuer (a route may have its own key).
    pub sig_key: Option<Vec<u8>>,
    /// Issuer claim.
    pub sig_iss: String,
    next: AtomicU64,
}

impl Proxy {
    /// Proxy state over `routes`.
    pub fn new(
        routes: Vec<Route>,
        backend: Backend,
        mailboxes: Vec<Arc<Mailbox>>,
        sig_key: Option<Vec<u8>>,
        sig_iss: String,
    ) -> Proxy {
        let targets = routes
            .iter()
            .map(|r| r.targets.iter().map(|t| t.addr.clone()).collect())
            .collect();
        Proxy {
            targets,
            routes,
            backend,
            mailboxes,
            sig_key,
            sig_iss,
            next: AtomicU64::new(1),
        }
    }

    /// Reads the routes file and starts the backend pool, with one mailbox per worker inbox.
    pub fn load(
        path: &std::path::Path,
        config: &crate::config::Config,
        inboxes: &[Arc<crate::hub::Inbox>],
    ) -> anyhow::Result<Proxy> {
        use anyhow::Context as _;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read GRIP routes {}", path.display()))?;
        let routes = clarion_proto::grip::parse_routes(&text)
            .with_context(|| format!("invalid GRIP routes {}", path.display()))?;
        if routes.is_empty() {
            anyhow::bail!("GRIP routes {} has no route", path.display());
        }
        let backend = Backend::start(
            config.grip_backend_threads,
            backend::Limits {
                timeout: std::time::Duration::from_secs(config.grip_backend_timeout),
                max_body: config.grip_max_body,
                max_body_setting: "grip_max_body",
            },
        )
        .context("cannot start GRIP backend threads")?;
        let mailboxes = inboxes
            .iter()
            .map(|i| Arc::new(Mailbox::new(Arc::clone(i))))
            .collect();
        crate::log::info(format_args!(
            "GRIP proxy: {} routes from {}",
            routes.len(),
            path.display()
        ));
        Ok(Proxy::new(
            routes,
            backend,
            mailboxes,
            config.grip_sig_key.as_ref().map(|k| k.as_bytes().to_vec()),
            config.grip_sig_iss.clone(),
        ))
    }

    /// A process-unique number: tickets for backend answers and connection ids.
    pub fn ticket(&self) -> u64 {
        self.next.fetch_add(1, Relaxed)
    }

    /// `Grip-Sig` for a request of the route at `index` in [`Proxy::routes`], made at `now`.
    pub fn route_signature(&self, index: u32, now: u64) -> Option<String> {
        self.signature(self.routes.get(index as usize)?, now)
    }

    /// `Grip-Sig` for a request of `route` made at `now` (Unix seconds, from the caller's
    /// clock: the engine passes its own), valid for an hour, or `None` when nothing signs.
    pub fn signature(&self, route: &Route, now: u64) -> Option<String> {
        let key = route.sig_key.as_deref().or(self.sig_key.as_deref())?;
        let iss = route.sig_iss.as_deref().unwrap_or(&self.sig_iss);
        Some(clarion_proto::grip::sig::sign(
            key,
            iss,
            now + crate::config::limits::GRIP_SIG_LIFETIME_SECS,
        ))
    }
}

/// An `http-stream` item.
pub enum StreamPart {
    /// Content to append: as is (close-delimited streams) and as one chunk (chunked streams).
    Send {
        /// The content.
        raw: Arc<[u8]>,
        /// The content as one chunk of a chunked body.
        chunk: Arc<[u8]>,
    },
    /// End the stream.
    Close,
}

/// A `ws-message` item.
pub enum WsPart {
    /// A frame to send (text, binary, ping or pong).
    Frame(Arc<[u8]>),
    /// Close the WebSocket with this Close frame.
    Close(Arc<[u8]>),
}

/// What one publish item carries for GRIP-held connections, by format. A format absent here
/// does not reach connections held in that mode.
pub struct GripContent {
    /// The item's `id`, which a later hold's `prev-id` may name.
    pub id: Option<Box<str>>,
    /// For `Grip-Hold: stream`.
    pub stream: Option<StreamPart>,
    /// For `Grip-Hold: response`.
    pub response: Option<Box<HttpResponse>>,
    /// For WebSocket connections.
    pub ws: Option<WsPart>,
}

impl GripContent {
    /// The GRIP content `m` carries, if it was published in Pushpin's format.
    pub fn of(m: &Published) -> Option<&GripContent> {
        m.attachment()
    }
}

impl Attachment for GripContent {
    /// Bytes this content holds, for the history's memory cap.
    fn cost(&self) -> usize {
        let stream = match &self.stream {
            Some(StreamPart::Send { raw, chunk }) => raw.len() + chunk.len(),
            _ => 0,
        };
        let response = self.response.as_ref().map_or(0, |r| {
            r.body.len()
                + r.headers
                    .iter()
                    .map(|(n, v)| n.len() + v.len() + 48)
                    .sum::<usize>()
                + 64
        });
        let ws = match &self.ws {
            Some(WsPart::Frame(f) | WsPart::Close(f)) => f.len(),
            None => 0,
        };
        std::mem::size_of::<GripContent>()
            + stream
            + response
            + ws
            + self.id.as_ref().map_or(0, |i| i.len())
    }

    /// The item's `id`, which a later hold's `prev-id` may name.
    fn publisher_id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The content for the other nodes of a cluster ([`wire`]).
    fn encode(&self) -> Option<Vec<u8>> {
        Some(self.to_wire())
    }
}

/// GRIP content that came from another node (registered with the cluster broker).
pub fn decode_attachment(bytes: &[u8]) -> Option<Arc<dyn Attachment>> {
    wire::decode(bytes)
}

/// Why an item cannot be published.
pub fn unsupported(item: &Item) -> Option<&'static str> {
    if matches!(item.http_response, Some(HttpResponseFormat::Hint))
        || matches!(item.http_stream, Some(HttpStreamFormat::Hint))
        || matches!(item.ws_message, Some(WsMessageFormat::Hint))
    {
        return Some("action \"hint\" is not supported (publish the content itself)");
    }
    if matches!(item.ws_message, Some(WsMessageFormat::Refresh)) {
        return Some("action \"refresh\" is not supported");
    }
    None
}

impl GripContent {
    /// The content of `item` (checked with [`unsupported`] first), and the payload and kind
    /// that Clarion's own subscribers of the channel receive: the WebSocket message if there
    /// is one, else the stream content, else the response body.
    pub fn from_item(item: &Item) -> (GripContent, Vec<u8>, DataKind) {
        let mut payload: Option<(Vec<u8>, DataKind)> = None;
        let ws = match &item.ws_message {
            Some(WsMessageFormat::Send { message, .. }) => {
                let (op, data, kind) = match message {
                    WsMessage::Text(t) => (OpCode::Text, t.as_bytes(), Some(DataKind::Text)),
                    WsMessage::Binary(b) => (OpCode::Binary, &b[..], Some(DataKind::Binary)),
                    WsMessage::Ping(p) => (OpCode::Ping, &p[..], None),
                    WsMessage::Pong(p) => (OpCode::Pong, &p[..], None),
                };
                if let Some(kind) = kind {
                    payload = Some((data.to_vec(), kind));
                }
                Some(WsPart::Frame(encode_frame(op, data).into()))
            }
            Some(WsMessageFormat::Close { code, reason }) => Some(WsPart::Close(match code {
                Some(c) => encode_close_frame(*c, reason).into(),
                // Pushpin closes with 1000 when the item gives no code.
                None => encode_close_frame(CloseCode::Normal, reason).into(),
            })),
            _ => None,
        };
        let stream = match &item.http_stream {
            Some(HttpStreamFormat::Send { content, .. }) => {
                let mut chunk = Vec::with_capacity(content.len() + 16);
                http1::write_chunk(&mut chunk, content);
                if payload.is_none() {
                    payload = Some((content.clone(), kind_of(content)));
                }
                Some(StreamPart::Send {
                    raw: Arc::from(&content[..]),
                    chunk: chunk.into(),
                })
            }
            Some(HttpStreamFormat::Close) => Some(StreamPart::Close),
            _ => None,
        };
        let response = match &item.http_response {
            Some(HttpResponseFormat::Send(r)) => {
                if payload.is_none() {
                    payload = Some((r.body.clone(), kind_of(&r.body)));
                }
                Some(Box::new(r.clone()))
            }
            _ => None,
        };
        let (payload, kind) = payload.unwrap_or((Vec::new(), DataKind::Text));
        (
            GripContent {
                id: item.id.as_deref().map(Into::into),
                stream,
                response,
                ws,
            },
            payload,
            kind,
        )
    }
}

fn kind_of(b: &[u8]) -> DataKind {
    if std::str::from_utf8(b).is_ok() {
        DataKind::Text
    } else {
        DataKind::Binary
    }
}

/// The complete answer for an `http-response` item: its code (200 unless given), reason,
/// headers and body, with `Content-Length`; `Connection: close` unless `keep`. The item's
/// hop-by-hop headers (and those its `Connection` header names) are left out.
pub fn response_bytes(r: &HttpResponse, keep: bool) -> Vec<u8> {
    let hop = http1::HopByHop::new(&r.headers);
    let mut headers: Vec<(&str, &str)> = r
        .headers
        .iter()
        .filter(|(n, _)| hop.forwards(n) && !n.eq_ignore_ascii_case("content-length"))
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    if !keep {
        headers.push(("Connection", "close"));
    }
    let mut out = Vec::with_capacity(128 + r.body.len());
    http1::write_status_head(
        &mut out,
        http1::Version::Http11,
        r.code,
        r.reason.as_deref(),
        &headers,
        Some(r.body.len()),
    );
    out.extend_from_slice(&r.body);
    out
}

/// GRIP instruction headers, which the proxy consumes and never passes to clients.
pub fn is_grip_header(name: &str) -> bool {
    name.len() > 5
        && name
            .get(..5)
            .is_some_and(|p| p.eq_ignore_ascii_case("grip-"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clarion_proto::grip::{decode_publish, PublishLimits};

    fn items(json: &str) -> Vec<Item> {
        decode_publish(
            json.as_bytes(),
            &PublishLimits {
                max_body: 1 << 20,
                max_items: 100,
            },
        )
        .unwrap()
    }

    #[test]
    fn content_by_format() {
        let it = items(
            r#"{"items":[{"channel":"c","id":"7","formats":{
                "http-stream":{"content":"hi\n"},
                "http-response":{"code":201,"headers":{"X-A":"1"},"body":"done"},
                "ws-message":{"content":"ws"}}}]}"#,
        );
        let (c, payload, kind) = GripContent::from_item(&it[0]);
        assert_eq!(c.id.as_deref(), Some("7"));
        assert_eq!((payload.as_slice(), kind), (&b"ws"[..], DataKind::Text));
        match c.stream {
            Some(StreamPart::Send { raw, chunk }) => {
                assert_eq!(&*raw, b"hi\n");
                assert_eq!(&*chunk, b"3\r\nhi\n\r\n");
            }
            _ => panic!("stream"),
        }
        let r = response_bytes(c.response.as_deref().unwrap(), false);
        assert_eq!(
            r,
            b"HTTP/1.1 201 Created\r\nX-A: 1\r\nConnection: close\r\nContent-Length: 4\r\n\r\ndone"
        );
        assert!(matches!(c.ws, Some(WsPart::Frame(f)) if &f[..] == b"\x81\x02ws"));
        // Headers the item's `Connection` header names stay behind, with the hop-by-hop ones.
        let it = items(
            r#"{"items":[{"channel":"c","formats":{"http-response":{"code":200,
                "headers":{"Connection":"close, X-Foo","X-Foo":"1","Keep-Alive":"5","X-B":"2"},
                "body":""}}}]}"#,
        );
        let (c, _, _) = GripContent::from_item(&it[0]);
        let r = response_bytes(c.response.as_deref().unwrap(), true);
        assert_eq!(r, b"HTTP/1.1 200 OK\r\nX-B: 2\r\nContent-Length: 0\r\n\r\n");
        let it = items(
            r#"{"items":[{"channel":"c","formats":{"http-stream":{"action":"close"},"ws-message":{"action":"close","code":4000}}}]}"#,
        );
        let (c, payload, _) = GripContent::from_item(&it[0]);
        assert!(payload.is_empty());
        assert!(matches!(c.stream, Some(StreamPart::Close)));
        assert!(matches!(c.ws, Some(WsPart::Close(_))));
        let it =
            items(r#"{"items":[{"channel":"c","formats":{"http-stream":{"action":"hint"}}}]}"#);
        assert!(unsupported(&it[0]).is_some());
    }

    #[test]
    fn header_classes() {
        assert!(is_grip_header("Grip-Hold"));
        assert!(!is_grip_header("Grip"));
    }
}
