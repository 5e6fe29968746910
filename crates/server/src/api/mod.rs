//! The API listener: `POST /publish/{topic}`, `POST /publish` (JSON batch), `GET /healthz` and
//! `GET /metrics`; and the dashboard's routes, handed to [`crate::dashboard`].
//!
//! Publishing is a backend's job, done over few long-lived keep-alive connections, so this
//! listener uses plain blocking I/O with one thread per connection (at most
//! [`API_MAX_CONNECTIONS`]) rather than the client event loops. It shares the request-head
//! parser and limits with the client listener, and answers errors as JSON `{"error": "..."}`.
//!
//! This file holds the connection (accept, the pool's caps, reading a request within its
//! deadline) and the routing; `access` says who may ask what, `publish` and `presence`
//! answer their endpoints, `triage` holds connections past the caps.

use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use clarion_proto::http1::{self, Body, BodyError, ChunkedDecoder};

use crate::config::limits::{
    API_ACCEPT_RETRY, API_IDLE, API_MAX_CONNECTIONS, API_MAX_PER_ADDRESS, API_REQUEST_DEADLINE,
    API_RESERVE_DEADLINE, HELPER_THREAD_STACK,
};
use crate::dashboard::{Dashboard, FeedStream};
use crate::log;
use crate::reply::Answer;
use crate::worker::Shared;

mod access;
mod batch;
mod h2;
mod latest;
mod presence;
mod publish;
mod pusher;
mod request;
mod stream;
mod topics;
mod triage;

use self::h2::{H2Serial, Sniffed};
use access::{admin_ok, authorized, browser_check, credentialed, permit, refused, Permit};
use batch::publish_batch;
use publish::{publish_grip, publish_one};
use request::{copy_request, Request};

/// Which view of the server an API listener gives.
#[derive(Debug, Clone)]
pub enum Scope {
    /// A lone server's API: everything about this process.
    Process,
    /// The shared API port of a `--processes` group member: publishing as usual (through this
    /// member), `/metrics` and `/healthz` for the whole group ([`crate::group::scrape`]).
    Group(Arc<crate::group::Member>),
    /// A group member's private loopback address, scraped by the group's view: this process
    /// only, always plain HTTP.
    Node,
}

thread_local! {
    /// When the request being read on this API thread must have arrived whole (`None` while
    /// waiting for a request to begin). One thread serves one connection, so this is that
    /// connection's.
    static DEADLINE: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
}

/// Connections being served by the pool, in all and per client address.
#[derive(Default)]
struct Occupancy {
    pool: usize,
    per_address: std::collections::HashMap<std::net::IpAddr, usize>,
}

/// Accepts API connections until the process exits. A connection takes a place in the pool
/// (at most [`API_MAX_CONNECTIONS`], [`API_MAX_PER_ADDRESS`] from one address); past either
/// cap it waits in the triage ([`triage`]) until its head shows a health check or credentials,
/// which get one request served ([`crate::config::limits::API_RESERVE`] at once); the rest
/// are answered `503`.
pub fn serve(listener: TcpListener, shared: Arc<Shared>, scope: Scope, set_up: Sender<()>) {
    let taken = Arc::new(std::sync::Mutex::new(Occupancy::default()));
    let group = match &scope {
        Scope::Group(member) => Some(Arc::clone(member)),
        Scope::Process | Scope::Node => None,
    };
    let dashboard = Dashboard::start(&shared, group);
    // The triage reads plain HTTP heads; a TLS API keeps the plain cap (503 past it).
    let tls = shared.config.tls_api && shared.tls.is_some() && !matches!(scope, Scope::Node);
    let overflow = if tls {
        None
    } else {
        let (s1, s2, d, sc, sc1) = (
            Arc::clone(&shared),
            Arc::clone(&shared),
            dashboard.clone(),
            scope.clone(),
            scope.clone(),
        );
        let judge = move |head: &http1::RequestHead<'_>, local| {
            let req = match copy_request(head) {
                Ok(r) => r,
                Err(a) => return triage::Verdict::Answer(a),
            };
            triage_verdict(&req, &s1, &sc1, local)
        };
        let serve: triage::Serve = Box::new(move |stream, first| {
            if let Err(e) = handle(stream, &s2, d.as_deref(), &sc, true, first) {
                log::debug(format_args!("api connection: {e}"));
            }
        });
        match triage::Triage::start(shared.config.head_limits(), Box::new(judge), serve) {
            Ok(t) => Some(t),
            Err(e) => {
                log::warn(format_args!(
                    "api: no triage thread ({e}); past the cap, 503"
                ));
                None
            }
        }
    };
    // The dashboard's sampler and the triage poller exist before the server says it is ready.
    let _ = set_up.send(());
    drop(set_up);
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                log::debug(format_args!("api accept: {e}"));
                std::thread::sleep(API_ACCEPT_RETRY);
                continue;
            }
        };
        let ip = stream
            .peer_addr()
            .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.ip());
        let room = {
            let mut t = crate::hub::lock(&taken);
            let from_ip = t.per_address.get(&ip).copied().unwrap_or(0);
            let room = t.pool < API_MAX_CONNECTIONS && from_ip < API_MAX_PER_ADDRESS;
            if room {
                t.pool += 1;
                *t.per_address.entry(ip).or_default() += 1;
            }
            room
        };
        if !room {
            match &overflow {
                Some(t) => t.admit(stream),
                None => {
                    let _ =
                        Answer::error(503, "too many API connections").send(&mut &stream, false);
                }
            }
            continue;
        }
        let (shared, taken2) = (Arc::clone(&shared), Arc::clone(&taken));
        let dashboard = dashboard.clone();
        let scope = scope.clone();
        let release = move |t: &std::sync::Mutex<Occupancy>| {
            let mut t = crate::hub::lock(t);
            t.pool = t.pool.saturating_sub(1);
            if let Some(n) = t.per_address.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    t.per_address.remove(&ip);
                }
            }
        };
        let spawned = std::thread::Builder::new()
            .name("clarion-api".into())
            .stack_size(HELPER_THREAD_STACK)
            .spawn(move || {
                let first = Vec::new();
                if let Err(e) = handle(stream, &shared, dashboard.as_deref(), &scope, false, first)
                {
                    log::debug(format_args!("api connection: {e}"));
                }
                release(&taken2);
            });
        if let Err(e) = spawned {
            release(&taken);
            log::warn(format_args!("cannot start API thread: {e}"));
        }
    }
}

/// What the triage does with a request past the pool's caps: a health check (or a request the
/// browser checks refuse) is answered from its head, a caller with credentials gets a reserve
/// thread, anything else `503`.
fn triage_verdict(
    req: &Request,
    shared: &Arc<Shared>,
    scope: &Scope,
    local: Option<std::net::SocketAddr>,
) -> triage::Verdict {
    if let Some(a) = browser_check(req, shared, local) {
        return triage::Verdict::Answer(a);
    }
    if req.path == "/healthz" {
        if req.method != "GET" {
            return triage::Verdict::Answer(Answer::error(405, "use GET"));
        }
        return match scope {
            Scope::Group(_) => {
                let (shared, scope) = (Arc::clone(shared), scope.clone());
                triage::Verdict::Compute(Box::new(move || health(&shared, &scope)))
            }
            Scope::Process | Scope::Node => triage::Verdict::Answer(health(shared, scope)),
        };
    }
    if credentialed(req, shared) {
        triage::Verdict::Serve
    } else {
        triage::Verdict::Refuse
    }
}

fn handle(
    stream: TcpStream,
    shared: &Shared,
    dashboard: Option<&Dashboard>,
    scope: &Scope,
    reserve: bool,
    first: Vec<u8>,
) -> io::Result<()> {
    // A reserve connection's one request must arrive within its short deadline, counted from
    // the accept (its TLS handshake included).
    DEADLINE.set(reserve.then(|| std::time::Instant::now() + API_RESERVE_DEADLINE));
    stream.set_read_timeout(Some(API_IDLE))?;
    stream.set_write_timeout(Some(API_IDLE))?;
    let _ = stream.set_nodelay(true);
    let tls = shared.config.tls_api && !matches!(scope, Scope::Node);
    // A reserve connection (past the pool's caps) came through the triage, which reads
    // HTTP/1.1 heads only: its one request is HTTP/1.1.
    let h2_on = shared.config.http2 && !reserve;
    match shared.tls.as_ref().filter(|_| tls) {
        // A blocking thread per API connection: rustls' buffered stream is the simple fit.
        Some(tls) => {
            let mut first_byte = [0u8; 1];
            match stream.peek(&mut first_byte)? {
                0 => return Ok(()),
                _ if crate::tls::starts_plain_http(first_byte[0]) => {
                    shared.metrics.tls_failed("plaintext");
                    return refuse_plaintext(stream);
                }
                _ => {}
            }
            let conn = rustls::ServerConnection::new(Arc::clone(tls.config()))
                .map_err(io::Error::other)?;
            let mut s = rustls::StreamOwned::new(conn, stream);
            // The API's TLS offers what the client listener's does: h2 when http2 is on.
            let res = if h2_on && h2::negotiated(&mut s)? {
                serve_h2(&mut s, Vec::new(), shared, dashboard, scope)
            } else {
                requests(&mut s, shared, dashboard, scope, reserve, first)
            };
            s.conn.send_close_notify();
            let _ = s.flush();
            res
        }
        None => {
            let (mut stream, mut first) = (stream, first);
            if h2_on {
                match h2::sniff(&mut stream, &mut first)? {
                    Sniffed::Http2 => {
                        return serve_h2(&mut stream, first, shared, dashboard, scope)
                    }
                    Sniffed::Broken => {
                        log::debug(format_args!("api: bad HTTP/2 preface"));
                        return Ok(());
                    }
                    Sniffed::Http1 => {}
                }
            }
            requests(&mut stream, shared, dashboard, scope, reserve, first)
        }
    }
}

/// Answers a plain HTTP request on the TLS API listener as the TLS client listener does: `400`
/// in plain text. The request is read first and the connection drained after the answer (for
/// at most [`API_REQUEST_DEADLINE`]), so closing does not reset it before the client has read
/// the answer.
fn refuse_plaintext(mut stream: TcpStream) -> io::Result<()> {
    use std::io::Read as _;
    log::debug(format_args!("plain HTTP on the TLS API listener"));
    let mut sink = [0u8; 4096];
    let _ = stream.read(&mut sink)?;
    let answer = Answer::new(
        400,
        "text/plain; charset=utf-8",
        crate::tls::PLAINTEXT_REFUSAL,
    );
    answer.send(&mut stream, false)?;
    stream.shutdown(std::net::Shutdown::Write)?;
    let until = std::time::Instant::now() + API_REQUEST_DEADLINE;
    while std::time::Instant::now() < until && matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
    Ok(())
}

/// Serves an HTTP/2 connection ([`H2Serial`]): its requests one after another, each through
/// [`requests`] as on an HTTP/1.1 connection, until the connection ends. An answer that would
/// close an HTTP/1.1 connection (an error before the body was read) ends only its stream.
fn serve_h2<S: FeedStream>(
    stream: &mut S,
    first: Vec<u8>,
    shared: &Shared,
    dashboard: Option<&Dashboard>,
    scope: &Scope,
) -> io::Result<()> {
    let cfg = &shared.config;
    let mut h2 = H2Serial::new(stream, cfg.max_head_size, cfg.max_publish_size, first)?;
    let res = loop {
        let res = requests(&mut h2, shared, dashboard, scope, false, Vec::new());
        match h2.finish_current() {
            // A request was served, or its stream reset under it: on to the next.
            Some(reset) if h2.may_continue() && (res.is_ok() || reset) => {}
            _ => break res,
        }
    };
    let m = &shared.metrics;
    m.h2_stream_errors
        .fetch_add(u64::from(h2.stream_errors()), Relaxed);
    if let Some(fatal) = h2.fatal() {
        log::debug(format_args!("api HTTP/2: {fatal}"));
        if fatal.code != clarion_proto::h2::frame::ErrorCode::NoError {
            shared.metrics.h2_errors.fetch_add(1, Relaxed);
        }
    }
    h2.close();
    res
}

/// Serves requests on one connection until it closes or asks to.
fn requests<S: FeedStream>(
    stream: &mut S,
    shared: &Shared,
    dashboard: Option<&Dashboard>,
    scope: &Scope,
    reserve: bool,
    first: Vec<u8>,
) -> io::Result<()> {
    let cfg = &shared.config;
    let limits = cfg.head_limits();
    let mut buf: Vec<u8> = first;
    loop {
        // Read one request head: once its first byte is here, all of it (and its body) must
        // arrive within the request deadline.
        if !reserve {
            // A new request: its deadline starts with its first byte.
            DEADLINE.set(None);
        }
        let (req, head_len) = loop {
            if !buf.is_empty() && DEADLINE.get().is_none() {
                DEADLINE.set(Some(std::time::Instant::now() + API_REQUEST_DEADLINE));
            }
            match http1::parse_head(&buf, &limits) {
                Ok(Some(h)) => break (copy_request(&h), h.head_len),
                Ok(None) => match read_more(stream, &mut buf) {
                    Ok(true) => {}
                    Ok(false) => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::TimedOut && !buf.is_empty() => {
                        return too_late().send(stream, false);
                    }
                    Err(e) => return Err(e),
                },
                Err(e) => {
                    let a = Answer::error(e.status(), &e.to_string());
                    return a.send(stream, false);
                }
            }
        };
        buf.drain(..head_len);
        let mut req = match req {
            Ok(r) => r,
            Err(a) => return a.send(stream, false),
        };
        let local = stream.socket().local_addr().ok();
        if let Some(a) = browser_check(&req, shared, local) {
            let keep = req.keep_alive && req.body == Body::None;
            a.send(stream, keep)?;
            if !keep {
                return Ok(());
            }
            continue;
        }
        if reserve {
            // Past the pool's caps: one request, and only from a caller with credentials (the
            // triage answered health checks itself).
            if !credentialed(&req, shared) {
                return Answer::error(503, "too many API connections").send(stream, false);
            }
            req.keep_alive = false;
        }
        if let Some(dashboard) = dashboard.filter(|_| Dashboard::owns(&req.path)) {
            // A member's own sample on its private loopback address is read by the group's
            // dashboard, which checked the credentials (as `/metrics` there).
            let private =
                matches!(scope, Scope::Node) && req.path == crate::dashboard::group::SAMPLE_PATH;
            let key_ok = private || admin_ok(req.authorization.as_deref(), shared);
            let dreq = crate::dashboard::Request {
                method: &req.method,
                path: &req.path,
                query: &req.query,
                authorization: req.authorization.as_deref(),
                api_key_ok: key_ok,
                has_body: req.body != Body::None,
                keep_alive: req.keep_alive,
            };
            if !dashboard.serve(stream, &dreq, shared)? {
                return Ok(());
            }
            continue;
        }
        // Refuse before reading a body, so unauthorized or misrouted uploads cost nothing.
        let permit = match permit(&req, shared) {
            Ok(p) => p,
            Err(a) => {
                let keep = req.keep_alive && req.body == Body::None;
                a.send(stream, keep)?;
                if !keep {
                    return Ok(());
                }
                continue;
            }
        };
        if let Some(a) = precheck(&req, shared) {
            let keep = req.keep_alive && req.body == Body::None;
            a.send(stream, keep)?;
            if !keep {
                return Ok(());
            }
            continue;
        }
        if req.expect_continue && req.body != Body::None {
            stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        }
        let body = match read_body(stream, &mut buf, req.body, cfg.max_publish_size) {
            Ok(Ok(b)) => b,
            Ok(Err(a)) => return a.send(stream, false),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                return too_late().send(stream, false);
            }
            Err(e) => return Err(e),
        };
        DEADLINE.set(None);
        let a = dispatch(&req, body, shared, &permit, scope);
        // Once a hand-over has begun this process is going: each answer (a 503 during the
        // freeze) ends its connection, so the publisher's next request opens one the new
        // process serves, rather than reusing one that closes under it when this one exits.
        let keep = req.keep_alive && !shared.handover.requested();
        a.send(stream, keep)?;
        if !keep {
            return Ok(());
        }
    }
}

/// Reads once more into `buf`; `false` at EOF. Waits at most until the request's deadline
/// (then `TimedOut`), else [`API_IDLE`].
fn read_more<S: FeedStream>(stream: &mut S, buf: &mut Vec<u8>) -> io::Result<bool> {
    let wait = match DEADLINE.get() {
        Some(d) => {
            let left = d.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            left.min(API_IDLE)
        }
        None => API_IDLE,
    };
    stream.socket().set_read_timeout(Some(wait))?;
    let mut chunk = [0u8; 8192];
    let n = match stream.read(&mut chunk) {
        Ok(n) => n,
        // A read timeout is WouldBlock on Unix: report the deadline (or the idle limit).
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            return Err(io::ErrorKind::TimedOut.into())
        }
        Err(e) => return Err(e),
    };
    buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    Ok(n > 0)
}

/// What `GET /` says: the endpoints of this listener and how a publisher gets in (names of
/// settings only, nothing secret).
fn index(shared: &Shared) -> String {
    let c = &shared.config;
    let access = match (c.api_key.is_some(), shared.auth.is_some()) {
        (false, false) => "nothing: it is open (no api_key is set)",
        (true, false) => "the API key: Authorization: Bearer KEY",
        (true, true) => "the API key, or a token that grants the topic (Authorization: Bearer)",
        (false, true) => {
            "a token that grants the topic, or an admin token (clarion token --admin); no \
             api_key is set"
        }
    };
    let dashboard = if c.dashboard {
        "/dashboard"
    } else {
        "off (dashboard = false)"
    };
    let pusher = if c.pusher_enabled() {
        "on"
    } else {
        "off (no pusher_apps)"
    };
    format!(
        "Clarion {version}: this is the API listener.\n\
         \n\
         \x20 POST /publish/TOPIC       publish the body to TOPIC (?event=NAME for SSE)\n\
         \x20 POST /publish            a JSON batch: {{\"messages\": [...]}}\n\
         \x20 GET  /topics             the topics, with subscribers (?cursor=&limit=)\n\
         \x20 GET  /topics/TOPIC/presence  who is in a presence topic\n\
         \x20 GET  /healthz             health\n\
         \x20 GET  /metrics             Prometheus metrics\n\
         \x20 GET  /dashboard           the live dashboard: {dashboard}\n\
         \x20 *    /apps/ID/...           Pusher's HTTP API (docs/pusher.md): {pusher}\n\
         \n\
         Publishing needs {access}.\n\
         Subscribers connect to the client listener (listen, :8080 by default).\n\
         Docs: docs/protocol.md, docs/configuration.md.\n",
        version = env!("CARGO_PKG_VERSION"),
    )
}

/// Answers that need no body: unknown routes, wrong methods, missing credentials, oversized
/// declared lengths.
fn precheck(req: &Request, shared: &Shared) -> Option<Answer> {
    let publish = req.path == "/publish" || req.path.starts_with("/publish/");
    let allowed: &[&str] = match req.path.as_str() {
        "/" | "/healthz" | "/metrics" | "/topics" => &["GET"],
        _ if publish => &["POST"],
        p if p.starts_with("/topics/") => &["GET"],
        p if pusher::owns(p) => {
            if !shared.config.pusher_enabled() {
                return Some(Answer::error(
                    404,
                    "no Pusher application is configured (pusher_apps, pusher_app_id)",
                ));
            }
            match pusher::methods(p) {
                Some(m) => m,
                None => return Some(Answer::error(404, "not found")),
            }
        }
        _ => return Some(Answer::error(404, "not found")),
    };
    if pusher::owns(&req.path) {
        if let Body::Length(n) = req.body {
            if n > shared.config.max_publish_size as u64 {
                return Some(too_large(Some(n), shared.config.max_publish_size));
            }
        }
    }
    if !allowed.contains(&req.method.as_str()) {
        return Some(Answer::error(405, &format!("use {}", allowed.join(" or "))));
    }
    if publish {
        // With authentication configured, `permit` decided already.
        if let Some(key) = shared
            .config
            .api_key
            .as_deref()
            .filter(|_| shared.auth.is_none())
        {
            if !authorized(req.authorization.as_deref(), key) {
                return Some(refused(req.authorization.as_deref(), None, shared));
            }
        }
        if let Body::Length(n) = req.body {
            if n > shared.config.max_publish_size as u64 {
                return Some(too_large(Some(n), shared.config.max_publish_size));
            }
        }
    }
    None
}

fn read_body<S: FeedStream>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    framing: Body,
    max: usize,
) -> io::Result<Result<Vec<u8>, Answer>> {
    match framing {
        Body::None => Ok(Ok(Vec::new())),
        Body::Length(n) => {
            // `precheck` bounded n by max.
            let n = usize::try_from(n).unwrap_or(usize::MAX).min(max);
            while buf.len() < n {
                if !read_more(stream, buf)? {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            }
            let rest = buf.split_off(n);
            Ok(Ok(std::mem::replace(buf, rest)))
        }
        Body::Chunked => {
            let mut dec = ChunkedDecoder::new(max);
            let mut body = Vec::new();
            loop {
                match dec.decode(buf, &mut body) {
                    Ok((used, done)) => {
                        buf.drain(..used.min(buf.len()));
                        if done {
                            return Ok(Ok(body));
                        }
                    }
                    Err(BodyError::TooLarge) => return Ok(Err(too_large(None, max))),
                    Err(BodyError::Malformed) => {
                        return Ok(Err(Answer::error(400, "malformed chunked body")))
                    }
                }
                if !read_more(stream, buf)? {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            }
        }
    }
}

/// The `408` for a request that did not arrive whole by its deadline.
pub(super) fn too_late() -> Answer {
    Answer::error(408, "the request did not arrive in time")
}

/// The `413` for a body over `max_publish_size`, stating the limit (and the size, when the
/// request declared it), so the publisher knows what to cut or which setting to raise.
fn too_large(declared: Option<u64>, max: usize) -> Answer {
    let size = declared.map_or_else(String::new, |n| format!(" of {n} bytes"));
    Answer::error(
        413,
        &format!("message{size} larger than max_publish_size ({max} bytes)"),
    )
}

/// `GET /healthz`: readiness, not liveness. A node whose cluster broker is unreachable cannot
/// publish or follow new topics: a load balancer should send clients elsewhere.
fn health(shared: &Shared, scope: &Scope) -> Answer {
    let stopping = shared.stopping.load(Relaxed);
    let (status, text) = match scope {
        _ if stopping => (503, "stopping\n".to_owned()),
        Scope::Group(member) => crate::group::scrape::health(member),
        Scope::Process | Scope::Node if !shared.broker.healthy() => {
            (503, "broker unavailable\n".to_owned())
        }
        Scope::Process | Scope::Node => (200, "ok\n".to_owned()),
    };
    Answer::new(status, "text/plain; charset=utf-8", text)
}

fn dispatch(
    req: &Request,
    body: Vec<u8>,
    shared: &Shared,
    permit: &Permit,
    scope: &Scope,
) -> Answer {
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/") => Answer::new(200, "text/plain; charset=utf-8", index(shared)),
        ("GET", "/healthz") => health(shared, scope),
        ("GET", "/topics") => topics::answer(req, shared),
        ("GET", "/metrics")
            if shared.config.metrics_auth
                && !matches!(scope, Scope::Node)
                && !admin_ok(req.authorization.as_deref(), shared) =>
        {
            Answer::error(
                401,
                "/metrics needs the API key or an admin token (metrics_auth is on)",
            )
        }
        ("GET", "/metrics") => Answer::new(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            match scope {
                Scope::Group(member) => {
                    crate::group::scrape::metrics(member, shared.config.processes)
                }
                Scope::Process | Scope::Node => {
                    let mut text = shared.metrics.render();
                    shared.handover.render(&mut text);
                    text
                }
            },
        ),
        (_, "/publish" | "/publish/") if req.idempotency_key.is_some() => {
            shared.metrics.idempotency_key_errors.fetch_add(1, Relaxed);
            Answer::error(
                400,
                "Idempotency-Key applies to one message (POST /publish/{topic}), not to a batch",
            )
        }
        (_, "/publish") => publish_batch(&body, shared, permit),
        (_, "/publish/") => publish_grip(&body, shared, permit).unwrap_or_else(|why| {
            if shared.config.grip_routes.is_some() {
                return Answer::error(400, &why);
            }
            // Outside GRIP mode, an empty topic is the likelier mistake than a bad Pushpin body.
            Answer::error(
                400,
                &format!(
                    "missing topic: publish to /publish/{{topic}} (or a Pushpin-format \
                     {{\"items\": [...]}} body to /publish/, which this is not: {why})"
                ),
            )
        }),
        (_, path) if latest::owns(path) => latest::answer(req, shared),
        (_, path) if path.starts_with("/topics/") => presence::answer(req, shared),
        (_, path) if pusher::owns(path) => pusher::answer(req, &body, shared),
        (_, path) => {
            let topic = path.strip_prefix("/publish/").unwrap_or_default();
            if let Err(a) = permit.check(topic, shared) {
                return a;
            }
            let mut event = None;
            let mut tags: Vec<(String, String)> = Vec::new();
            let mut conflation_key = None;
            let mut stream = stream::StreamQuery::default();
            for pair in http1::query_pairs(&req.query) {
                match pair {
                    Ok((k, v)) if matches!(&*k, "stream" | "append_to" | "done") => {
                        if let Err(why) = stream.take(&k, &v) {
                            shared.metrics.stream_refusals.fetch_add(1, Relaxed);
                            return Answer::error(400, &why);
                        }
                    }
                    Ok((k, v)) if k == "event" => event = Some(v),
                    Ok((k, v)) if k == "conflation_key" => conflation_key = Some(v),
                    Ok((k, v)) if k.starts_with("tag.") => {
                        let key = k.strip_prefix("tag.").unwrap_or_default();
                        tags.push((key.to_owned(), v.into_owned()));
                    }
                    Ok(_) => {}
                    Err(e) => return Answer::error(400, &format!("invalid query string: {e}")),
                }
            }
            if stream.asked() {
                let ct = req.content_type.as_deref();
                let key = req.idempotency_key.as_deref();
                return stream::publish_fragment(topic, &stream, ct, key, &body, shared);
            }
            publish_one(
                topic,
                event.as_deref(),
                req.content_type.as_deref(),
                req.idempotency_key.as_deref(),
                &body,
                &publish::Labels {
                    tags: &tags,
                    conflation_key: conflation_key.as_deref(),
                },
                shared,
            )
        }
    }
}
