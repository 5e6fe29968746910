//! What one GRIP connection keeps in the engine's `grip` table, whichever part runs it
//! ([`super::forward`], [`super::hold`], [`super::bridge`]): the phase it is in with that
//! phase's state, and the few pure helpers every part uses on it (the bridge of a connection,
//! the event request to the backend, the backend headers a client may see, `Set-Meta-*`).

use std::sync::Arc;

use clarion_proto::http1::{self, HopByHop, Version};

use crate::grip::backend::Response;
use crate::grip::is_grip_header;

/// A GRIP connection's state beyond its record.
pub(crate) struct GripConn {
    /// Matches backend answers to this connection (slab keys are reused).
    pub(crate) ticket: u64,
    /// Index of its route in the proxy's table.
    pub(crate) route: u32,
    pub(crate) phase: Phase,
}

pub(crate) enum Phase {
    /// A forwarded request waits for the backend.
    Waiting(Box<Waiting>),
    /// A held stream's keep-alive (a stream without one has no entry at all: the record's
    /// `StreamMode::Grip` state says everything it needs).
    Stream(Box<KeepAlive>),
    /// A held long-poll.
    Response(Box<ResponseHold>),
    /// A WebSocket bridged with WebSocket-over-HTTP.
    Ws(Box<Bridge>),
}

pub(crate) struct Waiting {
    pub(crate) keep: bool,
    pub(crate) head_only: bool,
    pub(crate) http10: bool,
    /// For a WebSocket upgrade: what accepting it needs.
    pub(crate) upgrade: Option<Upgrade>,
}

/// When a held long-poll times out, what it then answers, and the backend's headers (a
/// published `http-response` is sent with them, its own headers overriding).
pub(crate) struct ResponseHold {
    pub(crate) deadline: u32,
    pub(crate) timeout: Arc<[u8]>,
    pub(crate) headers: Box<[(Box<str>, Box<str>)]>,
}

pub(crate) struct KeepAlive {
    pub(crate) data: Arc<[u8]>,
    pub(crate) every: u32,
    pub(crate) interval: bool,
    pub(crate) last: u32,
}

/// A WebSocket upgrade waiting for the backend's OPEN: the client's key and offered
/// subprotocols, and the bridge to start.
pub(crate) struct Upgrade {
    pub(crate) key: Box<[u8]>,
    pub(crate) offered: Vec<String>,
    pub(crate) bridge: Box<Bridge>,
}

pub(crate) struct Bridge {
    /// The request line and fixed headers of every event request, up to the meta.
    pub(crate) head: Box<[u8]>,
    pub(crate) meta: Vec<(String, String)>,
    /// The `grip` extension's message prefix, when the backend accepted it.
    pub(crate) prefix: Option<Box<str>>,
    /// Events waiting for the request in flight to finish.
    pub(crate) pending: Vec<u8>,
    pub(crate) in_flight: bool,
    pub(crate) detached: bool,
    /// The backend has been told the connection ended (CLOSE or DISCONNECT sent).
    pub(crate) told: bool,
    /// The client sent a Close frame (a CLOSE event is queued for the backend).
    pub(crate) client_closed: bool,
    /// `Keep-Alive-Interval`: seconds between requests when nothing else is sent.
    pub(crate) interval: u32,
    pub(crate) last_request: u32,
    /// A keep-alive the backend set with a control message: frame and seconds.
    pub(crate) keep_alive: Option<(Arc<[u8]>, u32, u32)>,
}

/// A backend's first answer as the client sees it, for starting a hold.
pub(crate) struct Answered<'a> {
    /// Status and reason (the backend's, or `Grip-Status`).
    pub(crate) status: u16,
    pub(crate) reason: &'a str,
    /// The backend's headers the client may see ([`client_headers`]).
    pub(crate) passed: &'a [(&'a str, String)],
    pub(crate) body: &'a [u8],
    /// The connection's GRIP ticket and route, for its side entry.
    pub(crate) ticket: u64,
    pub(crate) route: u32,
    /// The client allows keep-alive.
    pub(crate) keep: bool,
    /// The status line's version: the client's (HTTP/1.0 clients get HTTP/1.0, as Pushpin
    /// answers them).
    pub(crate) version: Version,
}

/// The backend's headers a client may see: not hop-by-hop, not GRIP instructions, not the
/// length (set again for what is sent).
pub(crate) fn client_headers(r: &Response) -> Vec<(&str, String)> {
    let hop = HopByHop::new(&r.headers);
    r.headers
        .iter()
        .filter(|(n, _)| {
            hop.forwards(n) && !is_grip_header(n) && !n.eq_ignore_ascii_case("content-length")
        })
        .map(|(n, v)| (n.as_str(), String::from_utf8_lossy(v).into_owned()))
        .collect()
}

/// The bridge of connection `k`, if it is a bridged WebSocket (a function of the table, not of
/// the worker, so the rest of the worker stays usable while it is borrowed).
pub(crate) fn bridge<H: std::hash::BuildHasher>(
    grip: &mut std::collections::HashMap<u32, GripConn, H>,
    k: u32,
) -> Option<&mut Bridge> {
    match grip.get_mut(&k) {
        Some(GripConn {
            phase: Phase::Ws(b),
            ..
        }) => Some(b),
        _ => None,
    }
}

/// `Set-Meta-*` headers update the connection's meta (an empty value removes it).
pub(crate) fn apply_meta(b: &mut Bridge, r: &Response) {
    for (name, value) in &r.headers {
        let Some(key) = name
            .get(..9)
            .filter(|p| p.eq_ignore_ascii_case("set-meta-"))
            .and_then(|_| name.get(9..))
        else {
            if name.eq_ignore_ascii_case("keep-alive-interval") {
                b.interval = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.trim().parse::<u32>().ok())
                    .unwrap_or(0);
            }
            continue;
        };
        let value = String::from_utf8_lossy(value).trim().to_string();
        if value.contains(['\r', '\n']) || key.is_empty() {
            continue;
        }
        b.meta.retain(|(n, _)| !n.eq_ignore_ascii_case(key));
        if !value.is_empty() {
            b.meta.push((key.to_string(), value));
        }
    }
}

/// A WebSocket-over-HTTP request carrying `events`.
pub(crate) fn event_request(b: &Bridge, sig: Option<&str>, events: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.head.len() + 128 + events.len());
    out.extend_from_slice(&b.head);
    for (name, value) in &b.meta {
        // `apply_meta` keeps only values without line breaks; a field that is still not valid
        // is left out rather than written.
        let _ = http1::write_header(&mut out, &format!("Meta-{name}"), value.as_bytes());
    }
    if let Some(sig) = sig {
        // A JWT is base64url and dots: always a valid value.
        let _ = http1::write_header(&mut out, "Grip-Sig", sig.as_bytes());
    }
    http1::write_content_length(&mut out, events.len());
    http1::end_head(&mut out);
    out.extend_from_slice(events);
    out
}
