//! Backend hooks (`docs/hooks.md`): the application's `connect`, `subscribe` and `publish`
//! endpoints, the pool that calls them, the signature on each call, the in-flight bound and
//! the answer cache. Shared, behind `Shared::hooks`, by every worker.
//!
//! The calls go through the same blocking HTTP/1.1 pool as GRIP's backend requests
//! ([`crate::grip::backend`], its own threads and limits): a worker hands over a request and
//! a ticket and goes on; the answer comes back in the worker's [`Mailbox`] with a wake-up.
//! What the JSON means is decided in [`clarion_proto::hooks`] (sans-IO); what a connection
//! does while it waits is the worker's business (`worker::transport::hooks`). Nothing here
//! touches a client connection.

use crate::redact::Urls;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clarion_proto::http1::{self, Version};

use crate::config::Config;
use crate::grip::backend::{Backend, Job, Limits, Mailbox};
use crate::hub::{lock, Inbox};
use crate::metrics::Metrics;

pub mod pusher;
pub mod webhook;

/// Which hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// Before a connection is accepted.
    Connect = 0,
    /// A subscription its grants do not cover.
    Subscribe = 1,
    /// A client publish its grants do not cover.
    Publish = 2,
}

/// One hook's endpoint.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host:port`, as the pool connects to it.
    addr: Arc<[String]>,
    /// The `Host` header.
    host: String,
    /// The request path.
    path: String,
}

impl Target {
    /// The URL as a log line shows it: scheme, host and path, without the query (which may
    /// carry a token).
    pub fn shown(&self) -> String {
        let path = self.path.split('?').next().unwrap_or_default();
        format!("http://{}{path}", self.host)
    }

    /// Parses `http://host[:port][/path]` (no TLS: hooks run beside the server).
    pub fn parse(url: &str) -> Result<Target, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("hook URL {:?}: only http:// is supported", Urls(url)))?;
        let (host, path) = match rest.find('/') {
            Some(i) => (rest.get(..i).unwrap_or(""), rest.get(i..).unwrap_or("/")),
            None => (rest, "/"),
        };
        if host.is_empty() || host.contains('@') {
            return Err(format!("hook URL {:?}: no host", Urls(url)));
        }
        let addr = if host.starts_with('[') {
            if host.contains("]:") {
                host.to_owned()
            } else {
                format!("{host}:80")
            }
        } else if host.contains(':') {
            host.to_owned()
        } else {
            format!("{host}:80")
        };
        Ok(Target {
            addr: vec![addr].into(),
            host: host.to_owned(),
            path: path.to_owned(),
        })
    }
}

/// Why a hook call was not made: the caller answers at once instead of waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotCalled {
    /// That hook is not configured (or the worker has no mailbox).
    Unconfigured,
    /// `hook_max_in_flight` calls are queued or in flight, over every worker.
    Busy,
    /// The client's address has `hook_max_in_flight_per_address` calls queued or in flight:
    /// one address may not fill the pool that every client's connect waits on.
    AddressBusy,
    /// The request could not be written (a target path that is not a valid request line).
    Unwritable,
}

/// Hook calls queued or in flight per client address (the worker's address key), and the
/// address of each call by ticket, so that its answer gives the place back.
#[derive(Default)]
struct ByAddress {
    calls: HashMap<u32, usize>,
    of_ticket: HashMap<u64, u32>,
}

/// A cached answer: the backend's body, reused until `until` (Unix seconds).
struct Cached {
    body: Arc<[u8]>,
    until: u64,
}

/// Most cached answers; past it expired entries are swept, and if none expired the cache
/// starts over (a bound on memory, not an eviction policy).
const CACHE_MAX: usize = 100_000;

/// The hooks as configured.
pub struct Hooks {
    /// Endpoints; `None`: that hook is not configured.
    pub connect: Option<Target>,
    /// See [`Hooks::connect`].
    pub subscribe: Option<Target>,
    /// See [`Hooks::connect`].
    pub publish: Option<Target>,
    secret: Option<Vec<u8>>,
    backend: Backend,
    /// One per worker, by worker id.
    pub mailboxes: Vec<Arc<Mailbox>>,
    /// Request headers passed to `connect` (lower-case).
    pub headers: Vec<String>,
    /// `hook_connect_with_token = "call"`.
    pub call_with_token: bool,
    /// `hook_on_failure = "token"`.
    pub fail_to_token: bool,
    cache_ttl: u64,
    refusal_ttl: u64,
    max_in_flight: usize,
    in_flight: AtomicUsize,
    /// `hook_max_in_flight_per_address` (0: no limit, and `by_address` stays empty).
    max_per_address: usize,
    by_address: Mutex<ByAddress>,
    /// Largest answer (and a publish's replacement data).
    pub max_answer: usize,
    cache: Mutex<HashMap<(Hook, Vec<u8>), Cached>>,
    next: AtomicU64,
    metrics: Arc<Metrics>,
    /// Events out, when `webhook_url` is set.
    pub webhooks: Option<webhook::Webhooks>,
    /// Pusher's webhooks, when a Pusher application has a `webhook_url`.
    pub pusher: Option<pusher::PusherWebhooks>,
}

impl Hooks {
    /// The hooks `config` names, with their pool started; `None` when none is configured.
    pub fn from_config(
        config: &Config,
        inboxes: &[Arc<Inbox>],
        metrics: &Arc<Metrics>,
        broker: &crate::broker::Broker,
    ) -> Result<Option<Hooks>, String> {
        let parse = |u: &Option<String>| u.as_deref().map(Target::parse).transpose();
        let (connect, subscribe, publish) = (
            parse(&config.hook_connect_url)?,
            parse(&config.hook_subscribe_url)?,
            parse(&config.hook_publish_url)?,
        );
        if !Hooks::configured(config) {
            return Ok(None);
        }
        let any_hook = connect.is_some() || subscribe.is_some() || publish.is_some();
        let limits = Limits {
            timeout: Duration::from_millis(config.hook_timeout_ms),
            max_body: config.hook_max_answer,
            max_body_setting: "hook_max_answer",
        };
        // Without a hook URL (webhooks only) the pool has no threads and is never used.
        let threads = if any_hook { config.hook_threads } else { 0 };
        let backend = Backend::start_named(threads, limits, "hook")
            .map_err(|e| format!("cannot start hook threads: {e}"))?;
        let mailboxes = inboxes
            .iter()
            .map(|i| Arc::new(Mailbox::new(Arc::clone(i))))
            .collect();
        let mut hooks = Hooks::new(
            config, connect, subscribe, publish, backend, mailboxes, metrics,
        );
        let node = config.node();
        let prefix = format!("{node}.{:x}", crate::auth::unix_now());
        hooks.pusher = pusher::PusherWebhooks::start(config, metrics, broker, limits, &prefix)?;
        if let Some(url) = &config.webhook_url {
            let cluster = broker.occupancy(&prefix);
            let settings = webhook::Settings {
                target: Target::parse(url)?,
                format: webhook::Format::Clarion {
                    secret: config.hook_secret.clone().map(String::into_bytes),
                },
                max: config.webhook_queue,
                batch_max: config.webhook_batch_max,
                batch_wait: Duration::from_millis(config.webhook_batch_ms),
                limits,
                prefix,
            };
            hooks.webhooks = Some(
                webhook::Webhooks::start(settings, metrics, cluster)
                    .map_err(|e| format!("cannot start the webhook thread: {e}"))?,
            );
        }
        Ok(Some(hooks))
    }

    /// Whether `config` turns hooks on: a hook URL, or a webhook alone. The server and the
    /// engine test kit decide it here, the same way.
    pub fn configured(config: &Config) -> bool {
        config.hook_connect_url.is_some()
            || config.hook_subscribe_url.is_some()
            || config.hook_publish_url.is_some()
            || config.webhook_url.is_some()
            || config.pusher_all().iter().any(|a| a.webhook_url.is_some())
    }

    /// Hooks over an existing pool (tests give a pool without threads).
    pub(crate) fn new(
        config: &Config,
        connect: Option<Target>,
        subscribe: Option<Target>,
        publish: Option<Target>,
        backend: Backend,
        mailboxes: Vec<Arc<Mailbox>>,
        metrics: &Arc<Metrics>,
    ) -> Hooks {
        Hooks {
            connect,
            subscribe,
            publish,
            secret: config.hook_secret.clone().map(String::into_bytes),
            backend,
            mailboxes,
            headers: config
                .hook_headers
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
            call_with_token: config.hook_connect_with_token == "call",
            fail_to_token: config.hook_on_failure == "token",
            cache_ttl: config.hook_cache_ttl,
            refusal_ttl: config.hook_cache_refusal_ttl.min(config.hook_cache_ttl),
            max_in_flight: config.hook_max_in_flight,
            in_flight: AtomicUsize::new(0),
            max_per_address: config.hook_max_in_flight_per_address,
            by_address: Mutex::new(ByAddress::default()),
            max_answer: config.hook_max_answer,
            cache: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            metrics: Arc::clone(metrics),
            webhooks: None,
            pusher: None,
        }
    }

    /// The endpoint of `hook`, if configured.
    pub fn target(&self, hook: Hook) -> Option<&Target> {
        match hook {
            Hook::Connect => self.connect.as_ref(),
            Hook::Subscribe => self.subscribe.as_ref(),
            Hook::Publish => self.publish.as_ref(),
        }
    }

    /// A fresh ticket: matches an answer to the question (slab keys are reused).
    pub fn ticket(&self) -> u64 {
        self.next.fetch_add(1, Relaxed)
    }

    /// Sends `body` to `hook` for connection `key` of worker `worker`, whose client address
    /// key is `peer`, signed at `unix_now`. When it cannot be sent (not configured, an
    /// in-flight bound) the caller answers at once, as [`NotCalled`] says.
    #[allow(clippy::too_many_arguments)]
    pub fn call(
        &self,
        worker: usize,
        key: u32,
        peer: u32,
        ticket: u64,
        hook: Hook,
        body: &[u8],
        unix_now: u64,
    ) -> Result<(), NotCalled> {
        let Some(target) = self.target(hook) else {
            return Err(NotCalled::Unconfigured);
        };
        let Some(mailbox) = self.mailboxes.get(worker) else {
            return Err(NotCalled::Unconfigured);
        };
        if self.in_flight.fetch_add(1, Relaxed) >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Relaxed);
            return Err(NotCalled::Busy);
        }
        if self.max_per_address > 0 {
            let mut by = lock(&self.by_address);
            let n = by.calls.entry(peer).or_insert(0);
            if *n >= self.max_per_address {
                drop(by);
                self.in_flight.fetch_sub(1, Relaxed);
                self.metrics.hooks.address_limited.fetch_add(1, Relaxed);
                return Err(NotCalled::AddressBusy);
            }
            *n += 1;
            by.of_ticket.insert(ticket, peer);
        }
        self.metrics.hooks.in_flight.fetch_add(1, Relaxed);
        let mut request = Vec::with_capacity(256 + body.len());
        let written = (|| {
            http1::write_request_line(&mut request, "POST", &target.path, Version::Http11)?;
            http1::write_header(&mut request, "Host", target.host.as_bytes())?;
            http1::write_header(&mut request, "Content-Type", b"application/json")?;
            http1::write_header(&mut request, "User-Agent", b"clarion-hooks")?;
            http1::write_header(
                &mut request,
                "Content-Length",
                body.len().to_string().as_bytes(),
            )?;
            if let Some(secret) = &self.secret {
                let sig = clarion_proto::hooks::signature(secret, unix_now, body);
                http1::write_header(
                    &mut request,
                    clarion_proto::hooks::SIGNATURE_HEADER,
                    sig.as_bytes(),
                )?;
            }
            http1::end_head(&mut request);
            Ok::<(), http1::HeadWriteError>(())
        })();
        if written.is_err() {
            self.done(ticket);
            return Err(NotCalled::Unwritable);
        }
        request.extend_from_slice(body);
        self.backend.submit(Job {
            reply: Some(Arc::clone(mailbox)),
            key,
            ticket,
            targets: Arc::clone(&target.addr),
            request,
            head_only: false,
        });
        Ok(())
    }

    /// The answer of call `ticket` was taken by its worker: it no longer counts against the
    /// bounds.
    pub fn done(&self, ticket: u64) {
        self.in_flight.fetch_sub(1, Relaxed);
        self.metrics.hooks.in_flight.fetch_sub(1, Relaxed);
        if self.max_per_address > 0 {
            let mut by = lock(&self.by_address);
            if let Some(peer) = by.of_ticket.remove(&ticket) {
                if let Some(n) = by.calls.get_mut(&peer) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        by.calls.remove(&peer);
                    }
                }
            }
        }
    }

    /// Counts a call's outcome (0 allow, 1 refuse, 2 failure) and its latency.
    pub fn count(&self, hook: Hook, outcome: usize, elapsed_us: u64) {
        let h = &self.metrics.hooks;
        if let Some(c) = h.calls.get(hook as usize).and_then(|c| c.get(outcome)) {
            c.fetch_add(1, Relaxed);
        }
        if let Some(c) = h.latency_us.get(hook as usize) {
            c.fetch_add(elapsed_us, Relaxed);
        }
    }

    /// A cached answer to the question `key`, if one is still fresh at `unix_now`.
    pub fn cached(&self, hook: Hook, key: &[u8], unix_now: u64) -> Option<Arc<[u8]>> {
        if self.cache_ttl == 0 {
            return None;
        }
        let cache = lock(&self.cache);
        let hit = cache
            .get(&(hook, key.to_vec()))
            .filter(|c| c.until > unix_now)
            .map(|c| Arc::clone(&c.body));
        drop(cache);
        if hit.is_some() {
            if let Some(c) = self.metrics.hooks.cache_hits.get(hook as usize) {
                c.fetch_add(1, Relaxed);
            }
        }
        hit
    }

    /// Keeps an answer for the question `key`: `hook_cache_ttl` seconds, at most
    /// `hook_cache_refusal_ttl` for a refusal.
    pub fn remember(&self, hook: Hook, key: Vec<u8>, body: &[u8], refused: bool, unix_now: u64) {
        let ttl = if refused {
            self.refusal_ttl
        } else {
            self.cache_ttl
        };
        if ttl == 0 {
            return;
        }
        let mut cache = lock(&self.cache);
        if cache.len() >= CACHE_MAX {
            cache.retain(|_, c| c.until > unix_now);
            if cache.len() >= CACHE_MAX {
                cache.clear();
            }
        }
        cache.insert(
            (hook, key),
            Cached {
                body: body.into(),
                until: unix_now + ttl,
            },
        );
    }

    /// A pool without threads whose jobs are handed to the test instead.
    #[cfg(test)]
    pub(crate) fn detached(
        config: &Config,
        inbox: &Arc<Inbox>,
        metrics: &Arc<Metrics>,
    ) -> (
        Hooks,
        std::sync::mpsc::Receiver<crate::grip::backend::Queued>,
    ) {
        let (backend, jobs) = Backend::detached();
        let parse = |u: &Option<String>| u.as_deref().and_then(|u| Target::parse(u).ok());
        let hooks = Hooks::new(
            config,
            parse(&config.hook_connect_url),
            parse(&config.hook_subscribe_url),
            parse(&config.hook_publish_url),
            backend,
            vec![Arc::new(Mailbox::new(Arc::clone(inbox)))],
            metrics,
        );
        (hooks, jobs)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = Target::parse("http://127.0.0.1:8000/hooks/connect").unwrap();
        assert_eq!(&*t.addr, ["127.0.0.1:8000".to_owned()]);
        assert_eq!(t.path, "/hooks/connect");
        assert_eq!(t.host, "127.0.0.1:8000");
        let t = Target::parse("http://app").unwrap();
        assert_eq!(&*t.addr, ["app:80".to_owned()]);
        assert_eq!(t.path, "/");
        assert!(Target::parse("https://app/x").is_err());
        assert!(Target::parse("http:///x").is_err());
        assert!(Target::parse("http://u@app/x").is_err());
    }

    /// Connect hooks with `cap` calls in flight per address, detached from any pool; the
    /// third value keeps the inbox's poller and the job queue alive for the test.
    #[allow(clippy::type_complexity)]
    fn capped_hooks(cap: usize) -> (Hooks, Arc<Metrics>, (mio::Poll, Box<dyn std::any::Any>)) {
        let config = Config {
            hook_connect_url: Some("http://127.0.0.1:9/connect".into()),
            hook_max_in_flight_per_address: cap,
            ..Config::default()
        };
        let poll = mio::Poll::new().unwrap();
        let waker = mio::Waker::new(poll.registry(), mio::Token(0)).unwrap();
        let inbox = Arc::new(Inbox::new(waker));
        let metrics = Arc::new(Metrics::default());
        let (hooks, jobs) = Hooks::detached(&config, &inbox, &metrics);
        (hooks, metrics, (poll, Box::new(jobs)))
    }

    #[test]
    fn one_address_holds_at_most_its_share_of_hook_calls() {
        let (hooks, metrics, _kept) = capped_hooks(2);
        let (a, b) = (1, 2);
        let call = |peer, ticket| hooks.call(0, 7, peer, ticket, Hook::Connect, b"{}", 0);
        assert_eq!(call(a, 1), Ok(()));
        assert_eq!(call(a, 2), Ok(()));
        assert_eq!(call(a, 3), Err(NotCalled::AddressBusy));
        // Another address is not held back, and the refused call holds no place.
        assert_eq!(call(b, 4), Ok(()));
        assert_eq!(metrics.hooks.address_limited.load(Relaxed), 1);
        assert_eq!(metrics.hooks.in_flight.load(Relaxed), 3);
        // An answer gives its address's place back.
        hooks.done(1);
        assert_eq!(call(a, 5), Ok(()));
        assert_eq!(call(a, 6), Err(NotCalled::AddressBusy));
        for t in [2, 4, 5] {
            hooks.done(t);
        }
        assert!(lock(&hooks.by_address).calls.is_empty());
        assert!(lock(&hooks.by_address).of_ticket.is_empty());
    }

    #[test]
    fn no_per_address_limit_at_zero() {
        let (hooks, _metrics, _kept) = capped_hooks(0);
        for t in 0..100 {
            assert_eq!(hooks.call(0, 7, 1, t, Hook::Connect, b"{}", 0), Ok(()));
        }
        assert!(lock(&hooks.by_address).of_ticket.is_empty());
    }
}
