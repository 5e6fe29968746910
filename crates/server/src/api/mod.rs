//! The API listener: `POST /publish/{topic}`, `POST /publish` (JSON batch), `GET /healthz` and
//! `GET /metrics`; and the dashboard's routes, handed to [`crate::dashboard`].
//!
//! Publishing is a backend's job, done over few long-lived keep-alive connections, so this
//! listener uses plain blocking I/O with one thread per connection (at most
//! [`API_MAX_CONNECTIONS`]) rather than the client event loops. It shares the request-head
//! parser and limits with the client listener, and answers errors as JSON `{"error": "..."}`.

use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::http1::authorization::{
    constant_time_eq, parse_authorization, AuthorizationError, Credentials,
};
use clarion_proto::http1::{self, Body, BodyError, ChunkedDecoder};
use clarion_proto::pubsub::{decode_batch, validate_event_name, validate_topic};
use clarion_proto::ws::DataKind;

use crate::broker::{Outgoing, Receipt};
use crate::config::limits::{
    API_ACCEPT_RETRY, API_IDLE, API_MAX_CONNECTIONS, API_MAX_PER_ADDRESS, API_REQUEST_DEADLINE,
    API_RESERVE_DEADLINE, HELPER_THREAD_STACK,
};
use crate::dashboard::{Dashboard, FeedStream};
use crate::log;
use crate::message::Attachment;
use crate::reply::Answer;
use crate::worker::Shared;

mod triage;

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
/// which get one request served ([`API_RESERVE`] at once); the rest are answered `503`.
pub fn serve(listener: TcpListener, shared: Arc<Shared>, scope: Scope) {
    let taken = Arc::new(std::sync::Mutex::new(Occupancy::default()));
    let dashboard = Dashboard::start(&shared);
    // The triage reads plain HTTP heads; a TLS API keeps the plain cap (503 past it).
    let tls = shared.config.tls_api && shared.tls.is_some() && !matches!(scope, Scope::Node);
    let overflow = if tls {
        None
    } else {
        let (s1, s2, d, sc) = (
            Arc::clone(&shared),
            Arc::clone(&shared),
            dashboard.clone(),
            scope.clone(),
        );
        let admits = move |head: &http1::RequestHead<'_>| {
            copy_request(head).is_ok_and(|r| reserve_may_serve(&r, &s1))
        };
        let serve: triage::Serve = Box::new(move |stream, first| {
            if let Err(e) = handle(stream, &s2, d.as_deref(), &sc, true, first) {
                log::debug(format_args!("api connection: {e}"));
            }
        });
        match triage::Triage::start(shared.config.head_limits(), admits, serve) {
            Ok(t) => Some(t),
            Err(e) => {
                log::warn(format_args!(
                    "api: no triage thread ({e}); past the cap, 503"
                ));
                None
            }
        }
    };
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

/// A request's head, copied out of the read buffer.
struct Request {
    method: String,
    path: String,
    query: String,
    content_type: Option<String>,
    authorization: Option<String>,
    /// `Host`, `Origin` and `Sec-Fetch-Site`: whether a browser sent it from another site.
    host: Option<String>,
    origin: Option<String>,
    fetch_site: Option<String>,
    expect_continue: bool,
    keep_alive: bool,
    body: Body,
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
    match shared.tls.as_ref().filter(|_| tls) {
        // A blocking thread per API connection: rustls' buffered stream is the simple fit.
        Some(tls) => {
            let conn = rustls::ServerConnection::new(Arc::clone(tls.config()))
                .map_err(io::Error::other)?;
            let mut s = rustls::StreamOwned::new(conn, stream);
            let res = requests(&mut s, shared, dashboard, scope, reserve, first);
            s.conn.send_close_notify();
            let _ = s.flush();
            res
        }
        None => {
            let mut stream = stream;
            requests(&mut stream, shared, dashboard, scope, reserve, first)
        }
    }
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
                        return Answer::error(408, "the request did not arrive in time")
                            .send(stream, false);
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
            // Past the pool's caps: one request, and only a health check or a caller with
            // credentials.
            if !reserve_may_serve(&req, shared) {
                return Answer::error(503, "too many API connections").send(stream, false);
            }
            req.keep_alive = false;
        }
        if let Some(dashboard) = dashboard.filter(|_| Dashboard::owns(&req.path)) {
            let key_ok = admin_ok(req.authorization.as_deref(), shared);
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
                return Answer::error(408, "the request did not arrive in time")
                    .send(stream, false);
            }
            Err(e) => return Err(e),
        };
        DEADLINE.set(None);
        let a = dispatch(&req, body, shared, &permit, scope);
        a.send(stream, req.keep_alive)?;
        if !req.keep_alive {
            return Ok(());
        }
    }
}

fn copy_request(h: &http1::RequestHead<'_>) -> Result<Request, Answer> {
    let body = h
        .body()
        .map_err(|e| Answer::error(e.status(), &e.to_string()))?;
    Ok(Request {
        method: h.method.to_owned(),
        path: h.path().to_owned(),
        query: h.query().to_owned(),
        content_type: h.header_str("content-type").map(str::to_owned),
        authorization: h.header_str("authorization").map(str::to_owned),
        host: h.header_str("host").map(str::to_owned),
        origin: h.header_str("origin").map(str::to_owned),
        fetch_site: h.header_str("sec-fetch-site").map(str::to_owned),
        expect_continue: h.has_token("expect", "100-continue"),
        keep_alive: h.keep_alive(),
        body,
    })
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

/// What a browser must not do on the API (docs/security.md): reach it under a name that is not
/// the API's (DNS rebinding: `421`), or make a state-changing request from another site's page
/// (CSRF: `403`), whatever credentials it carries along (a cached dashboard login, say).
/// Requests not from a browser carry no `Origin` or `Sec-Fetch-Site` and pass.
fn browser_check(
    req: &Request,
    shared: &Shared,
    local: Option<std::net::SocketAddr>,
) -> Option<Answer> {
    let host = req.host.as_deref().map(str::trim).unwrap_or_default();
    let name = host_name(host);
    let allowed: &[String] = &shared.config.api_hosts;
    let loopback_api = local.is_some_and(|a| a.ip().is_loopback());
    let listed = allowed.iter().any(|h| h.eq_ignore_ascii_case(name));
    // A browser always sends `Host`; a request without one (HTTP/1.0 probes) is no rebinding.
    let known = name.is_empty()
        || listed
        || (allowed.is_empty() && !loopback_api)
        || is_loopback_name(name);
    if !known {
        return Some(Answer::error(
            421,
            &format!("this API does not answer to {name:?} (api_hosts)"),
        ));
    }
    if req.method == "GET" || req.method == "HEAD" {
        return None;
    }
    let origins = &shared.config.allowed_origins;
    let origin_ok = |o: &str| {
        let o = o.trim();
        origins
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(o))
            || o.split_once("://")
                .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host))
    };
    let foreign_site = req
        .fetch_site
        .as_deref()
        .is_some_and(|s| !matches!(s.trim(), "same-origin" | "none"));
    let foreign_origin = req.origin.as_deref().is_some_and(|o| !origin_ok(o));
    let allowed_anyway = req.origin.as_deref().is_some_and(origin_ok);
    if foreign_origin || (foreign_site && !allowed_anyway) {
        shared.metrics.auth_failed("origin");
        return Some(Answer::error(
            403,
            "a page of another origin may not publish here (allowed_origins)",
        ));
    }
    None
}

/// The name part of a `Host` value: `[::1]` of `[::1]:8081`, `localhost` of `localhost:8081`.
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    host.rsplit_once(':').map_or(host, |(n, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            n
        } else {
            host
        }
    })
}

/// `localhost`, `*.localhost`, `127.x.y.z`, `[::1]`: names that can only mean this machine.
fn is_loopback_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "localhost"
        || lower.ends_with(".localhost")
        || lower == "[::1]"
        || lower
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether a request on a reserve connection is served: `/healthz`, or a caller with the API
/// key or a valid token. An open API (neither configured) has no credentials to tell its
/// publishers from anyone else: past its caps only `/healthz` is served.
fn reserve_may_serve(req: &Request, shared: &Shared) -> bool {
    if req.path == "/healthz" {
        return true;
    }
    let header = req.authorization.as_deref();
    let key = shared.config.api_key.as_deref();
    if key.is_some_and(|k| authorized(header, k)) {
        return true;
    }
    shared.auth.as_ref().is_some_and(|auth| {
        token_of(header).is_some_and(|t| auth.verify(&t, crate::auth::unix_now()).is_ok())
    })
}

/// Answers that need no body: unknown routes, wrong methods, missing credentials, oversized
/// declared lengths.
fn precheck(req: &Request, shared: &Shared) -> Option<Answer> {
    let publish = req.path == "/publish" || req.path.starts_with("/publish/");
    let allowed: &[&str] = match req.path.as_str() {
        "/healthz" | "/metrics" => &["GET"],
        _ if publish => &["POST"],
        p if p.starts_with("/topics/") => &["GET"],
        _ => return Some(Answer::error(404, "not found")),
    };
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
                return Some(Answer::error(401, "missing or wrong bearer key"));
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

/// What a publish request may publish to.
enum Permit {
    /// Any topic: the API key, or no authentication configured.
    All,
    /// The topics a client token's `publish` list covers.
    Token(clarion_proto::auth::Grants),
}

impl Permit {
    /// `Ok` when `topic` may be published to, else the `403` answer.
    fn check(&self, topic: &str, shared: &Shared) -> Result<(), Answer> {
        match self {
            Permit::All => Ok(()),
            Permit::Token(g) if g.may_publish(topic) => Ok(()),
            Permit::Token(_) => {
                shared.metrics.auth_failed("forbidden");
                Err(Answer::error(
                    403,
                    &format!("the token does not allow publishing to {topic:?}"),
                ))
            }
        }
    }
}

/// With authentication configured, a publish request needs the API key (when one is set), a
/// token with the `admin` claim (any topic), or a token whose `publish` list will be checked
/// against each topic (as `Bearer`, or as the password of `Basic` credentials); `401` otherwise.
/// Without authentication, everything is as before (`precheck` checks the API key).
fn permit(req: &Request, shared: &Shared) -> Result<Permit, Answer> {
    let publish = req.path == "/publish" || req.path.starts_with("/publish/");
    let Some(auth) = shared.auth.as_ref().filter(|_| publish) else {
        return Ok(Permit::All);
    };
    let header = req.authorization.as_deref();
    if let Some(key) = shared.config.api_key.as_deref() {
        if authorized(header, key) {
            return Ok(Permit::All);
        }
    }
    let refusal = match token_of(header) {
        Some(token) => match auth.verify(&token, crate::auth::unix_now()) {
            Ok(claims) if claims.admin => return Ok(Permit::All),
            Ok(claims) => return Ok(Permit::Token(claims.grants)),
            Err(r) => r,
        },
        None => crate::auth::Refusal::MISSING,
    };
    refusal.count(&shared.metrics);
    let why = if refusal == crate::auth::Refusal::MISSING {
        "the API key or a token is required"
    } else {
        refusal.reason
    };
    Err(Answer::error(401, why))
}

/// `GET /topics/{topic}/presence[?limit=N&after=SUB]` (a page of members with the counts) and
/// `GET /topics/{topic}/presence/count`. Allowed to whoever may subscribe to the topic: the
/// API key, an admin token, or a token (or public topic) that grants it; without
/// authentication, as the rest of the API (the API key when one is set).
fn presence(req: &Request, shared: &Shared) -> Answer {
    let rest = req.path.strip_prefix("/topics/").unwrap_or_default();
    let (topic, count_only) = if let Some(t) = rest.strip_suffix("/presence/count") {
        (t, true)
    } else if let Some(t) = rest.strip_suffix("/presence") {
        (t, false)
    } else {
        return Answer::error(404, "not found");
    };
    if let Err(e) = clarion_proto::pubsub::validate_topic(topic) {
        return Answer::error(400, &format!("invalid topic {topic:?}: {e}"));
    }
    let header = req.authorization.as_deref();
    let key = shared.config.api_key.as_deref();
    let by_key = key.is_some_and(|key| authorized(header, key));
    if !by_key {
        if let Some(auth) = shared.auth.as_ref() {
            let grants = match token_of(header).map(|t| auth.verify(&t, crate::auth::unix_now())) {
                Some(Ok(claims)) if claims.admin => None,
                Some(Ok(claims)) => Some(Some(claims.grants)),
                Some(Err(r)) => {
                    r.count(&shared.metrics);
                    return Answer::error(401, r.reason);
                }
                None => Some(None),
            };
            if let Some(grants) = grants {
                if let Err(r) = auth.may_subscribe(grants.as_ref(), topic) {
                    r.count(&shared.metrics);
                    let why = if r.status == 403 {
                        "the token does not grant this topic"
                    } else {
                        "the API key or a token that grants this topic is required"
                    };
                    return Answer::error(r.status, why);
                }
            }
        } else if key.is_some() {
            return Answer::error(401, "missing or wrong bearer key");
        }
    }
    let Some(p) = shared.presence.as_ref() else {
        return Answer::error(404, "presence is not kept on this server (presence_topics)");
    };
    if !p.tracks(topic) {
        return Answer::error(
            404,
            &format!("presence is not kept for {topic:?} (presence_topics)"),
        );
    }
    if count_only {
        let (count, connections) = match p.count(&shared.broker, topic) {
            Ok(c) => c,
            Err(why) => return Answer::error(503, &why),
        };
        let body =
            format!("{{\"topic\":\"{topic}\",\"count\":{count},\"connections\":{connections}}}\n");
        return Answer::new(200, "application/json", body);
    }
    let mut limit = p.max_members;
    let mut after = None;
    for pair in http1::query_pairs(&req.query) {
        let Ok((k, v)) = pair else {
            return Answer::error(400, "invalid query string");
        };
        match &*k {
            "limit" => match v.parse::<usize>() {
                Ok(n) if n >= 1 => limit = n.min(p.max_members),
                _ => {
                    return Answer::error(
                        400,
                        &format!("invalid limit {v:?}: 1 to {}", p.max_members),
                    )
                }
            },
            "after" => after = Some(v.into_owned()),
            _ => {}
        }
    }
    let mut body = match p.list(&shared.broker, topic, after.as_deref(), limit) {
        Ok(listing) => listing.api_json(topic),
        Err(why) => return Answer::error(503, &why),
    };
    body.push('\n');
    Answer::new(200, "application/json", body)
}

/// Whether a dashboard request's credentials open it. Without authentication configured, as the
/// rest of the API: the API key when one is set, else anyone. With authentication configured,
/// the API key (when set) or a token whose `clarion` claim has `"admin": true`, sent as `Bearer`
/// or as the password of `Basic` credentials (what a browser's sign-in prompt sends).
fn admin_ok(header: Option<&str>, shared: &Shared) -> bool {
    let key = shared.config.api_key.as_deref();
    let Some(auth) = shared.auth.as_ref() else {
        return key.is_none_or(|key| authorized(header, key));
    };
    if key.is_some_and(|key| authorized(header, key)) {
        return true;
    }
    let Some(token) = token_of(header) else {
        return false;
    };
    match auth.verify(&token, crate::auth::unix_now()) {
        Ok(claims) if claims.admin => true,
        Ok(_) => {
            shared.metrics.auth_failed("forbidden");
            false
        }
        Err(refusal) => {
            refusal.count(&shared.metrics);
            false
        }
    }
}

/// The token an `Authorization` header carries: `Bearer TOKEN`, or the password of `Basic`
/// credentials (a browser on the dashboard signs in that way).
fn token_of(header: Option<&str>) -> Option<std::borrow::Cow<'_, str>> {
    match header.map(parse_authorization) {
        Some(Ok(Credentials::Bearer(token))) => Some(token.into()),
        Some(Ok(Credentials::Basic { password })) => {
            String::from_utf8(password).ok().map(Into::into)
        }
        _ => None,
    }
}

/// Whether `Authorization` carries the API key: `Bearer KEY`; or, as GRIP publishers send it, a
/// `Bearer` JWT signed with the key (HS256, unexpired), or `Basic` with the key as password.
fn authorized(header: Option<&str>, key: &str) -> bool {
    match header.map(parse_authorization) {
        Some(Ok(Credentials::Bearer(token))) => {
            if constant_time_eq(token.as_bytes(), key.as_bytes()) {
                return true;
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            clarion_proto::grip::sig::verify(token, key.as_bytes(), now).is_ok()
        }
        Some(Ok(Credentials::Basic { password })) => constant_time_eq(&password, key.as_bytes()),
        // Malformed Basic credentials have always counted as an empty password (which only an
        // empty key matches).
        Some(Err(AuthorizationError::Base64 | AuthorizationError::NoPassword)) => {
            constant_time_eq(b"", key.as_bytes())
        }
        Some(Err(AuthorizationError::Scheme)) | None => false,
    }
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

/// The `413` for a body over `max_publish_size`, stating the limit (and the size, when the
/// request declared it), so the publisher knows what to cut or which setting to raise.
fn too_large(declared: Option<u64>, max: usize) -> Answer {
    let size = declared.map_or_else(String::new, |n| format!(" of {n} bytes"));
    Answer::error(
        413,
        &format!("message{size} larger than max_publish_size ({max} bytes)"),
    )
}

fn dispatch(
    req: &Request,
    body: Vec<u8>,
    shared: &Shared,
    permit: &Permit,
    scope: &Scope,
) -> Answer {
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/healthz") => {
            let stopping = shared.stopping.load(Relaxed);
            // A node whose cluster broker is unreachable cannot publish or follow new topics:
            // a load balancer should send clients elsewhere (readiness, not liveness).
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
                Scope::Process | Scope::Node => shared.metrics.render(),
            },
        ),
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
        (_, path) if path.starts_with("/topics/") => presence(req, shared),
        (_, path) => {
            let topic = path.strip_prefix("/publish/").unwrap_or_default();
            if let Err(a) = permit.check(topic, shared) {
                return a;
            }
            let mut event = None;
            for pair in http1::query_pairs(&req.query) {
                match pair {
                    Ok((k, v)) if k == "event" => event = Some(v),
                    Ok(_) => {}
                    Err(e) => return Answer::error(400, &format!("invalid query string: {e}")),
                }
            }
            publish_one(
                topic,
                event.as_deref(),
                req.content_type.as_deref(),
                &body,
                shared,
            )
        }
    }
}

fn publish_one(
    topic: &str,
    event: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
    shared: &Shared,
) -> Answer {
    if let Err(e) = validate_topic(topic) {
        return Answer::error(400, &format!("invalid topic {topic:?}: {e}"));
    }
    if let Some(Err(e)) = event.map(validate_event_name) {
        return Answer::error(400, &format!("invalid event name: {e}"));
    }
    if let Some(a) = reserved_event(topic, event, shared) {
        return a;
    }
    let binary = content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/octet-stream"))
    });
    let kind = if binary {
        DataKind::Binary
    } else if std::str::from_utf8(body).is_ok() {
        DataKind::Text
    } else {
        return Answer::error(
            400,
            "text message is not valid UTF-8 (send binary as application/octet-stream)",
        );
    };
    let receipts = shared.broker.publish(&[Outgoing {
        topic,
        kind,
        payload: body,
        event,
        attachment: None,
    }]);
    let receipts = match receipts {
        Ok(r) => r,
        Err(e) => return unavailable(&e),
    };
    match receipts.first() {
        Some(r) => Answer::json(200, &receipt_json(topic, r)),
        None => Answer::error(500, "publish produced no receipt"),
    }
}

/// On a presence topic the SSE event names `presence`, `join` and `leave` are the server's
/// (an EventSource listening for `join` must not mistake a message for a member): `400`.
fn reserved_event(topic: &str, event: Option<&str>, shared: &Shared) -> Option<Answer> {
    let event = event?;
    let reserved = matches!(event, "presence" | "join" | "leave")
        && shared.presence.as_ref().is_some_and(|p| p.tracks(topic));
    reserved.then(|| {
        Answer::error(
            400,
            &format!("the event name {event:?} is reserved for presence on this topic"),
        )
    })
}

fn publish_batch(body: &[u8], shared: &Shared, permit: &Permit) -> Answer {
    let batch = match decode_batch(body) {
        Ok(b) => b,
        Err(why) => return Answer::error(400, &why.to_string()),
    };
    // All or nothing: a batch with one forbidden topic publishes nothing.
    for m in &batch {
        if let Err(a) = permit.check(&m.topic, shared) {
            return a;
        }
        if let Some(a) = reserved_event(&m.topic, m.event.as_deref(), shared) {
            return a;
        }
    }
    let out: Vec<Outgoing<'_>> = batch
        .iter()
        .map(|m| Outgoing {
            topic: &m.topic,
            kind: m.kind,
            payload: &m.payload,
            event: m.event.as_deref(),
            attachment: None,
        })
        .collect();
    let receipts = match shared.broker.publish(&out) {
        Ok(r) => r,
        Err(e) => return unavailable(&e),
    };
    let results: Vec<serde_json::Value> = out
        .iter()
        .zip(&receipts)
        .map(|(m, r)| receipt_json(m.topic, r))
        .collect();
    Answer::json(200, &serde_json::json!({ "results": results }))
}

/// Pushpin's publish API: `{"items": [...]}` with `http-stream`, `http-response` and
/// `ws-message` formats. Validated whole before anything is published; answered like Pushpin
/// (`200 Published`).
/// `Err` carries the reason a body that is not a valid Pushpin publish was refused (the caller
/// words the `400`); other refusals are answered here.
fn publish_grip(body: &[u8], shared: &Shared, permit: &Permit) -> Result<Answer, String> {
    let limits = shared.config.grip_publish_limits();
    let items = clarion_proto::grip::decode_publish(body, &limits).map_err(|e| e.to_string())?;
    let mut contents = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if let Some(why) = crate::grip::unsupported(item) {
            return Ok(Answer::error(400, &format!("item {i}: {why}")));
        }
        if let Err(e) = validate_topic(&item.channel) {
            return Ok(Answer::error(
                400,
                &format!("item {i}: channel {:?}: {e}", item.channel),
            ));
        }
        if let Err(a) = permit.check(&item.channel, shared) {
            return Ok(a);
        }
        let (content, payload, kind) = crate::grip::GripContent::from_item(item);
        let content: Arc<dyn Attachment> = Arc::new(content);
        contents.push((content, payload, kind));
    }
    let outgoing: Vec<Outgoing<'_>> = items
        .iter()
        .zip(&contents)
        .map(|(item, (content, payload, kind))| Outgoing {
            topic: &item.channel,
            kind: *kind,
            payload: payload.as_slice(),
            event: None,
            attachment: Some(Arc::clone(content)),
        })
        .collect();
    if let Err(e) = shared.broker.publish(&outgoing) {
        return Ok(unavailable(&e));
    }
    Ok(Answer::new(200, "text/plain", &b"Published\n"[..]))
}

/// `503` for a publish the broker could not take: the message went nowhere.
fn unavailable(e: &crate::broker::Unavailable) -> Answer {
    crate::log::warn(format_args!("publish refused: {e}"));
    Answer::error(
        503,
        &format!("broker unavailable, message not published: {e}"),
    )
}

fn receipt_json(topic: &str, r: &Receipt) -> serde_json::Value {
    serde_json::json!({ "topic": topic, "id": r.id, "subscribers": r.subscribers })
}

#[cfg(test)]
mod tests {
    use super::{host_name, is_loopback_name};

    #[test]
    fn host_names_and_loopback_names() {
        assert_eq!(host_name("127.0.0.1:8081"), "127.0.0.1");
        assert_eq!(host_name("[::1]:8081"), "[::1]");
        assert_eq!(host_name("localhost"), "localhost");
        assert_eq!(host_name("evil.example:80"), "evil.example");
        for n in [
            "localhost",
            "LOCALHOST",
            "a.localhost",
            "127.0.0.1",
            "127.9.8.7",
            "[::1]",
        ] {
            assert!(is_loopback_name(n), "{n}");
        }
        for n in [
            "evil.example",
            "localhost.evil.example",
            "10.0.0.1",
            "0.0.0.0",
            "",
        ] {
            assert!(!is_loopback_name(n), "{n}");
        }
    }
}
