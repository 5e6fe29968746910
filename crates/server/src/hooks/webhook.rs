//! Webhooks: events out to the application (`connected`, `disconnected`, `topic_occupied`,
//! `topic_vacated`), batched, signed, retried (`docs/hooks.md`).
//!
//! Workers only append encoded events to one bounded queue (a lock and a push; when it is
//! full the event is dropped and counted). One sender thread takes a batch when it holds
//! `webhook_batch_max` events or `webhook_batch_ms` after the first one arrived, posts it, and
//! retries the same batch (same event ids) with doubling backoff until the application answers
//! 2xx: delivery is at-least-once and in order, and ids let the receiver drop duplicates. A 4xx
//! other than 408 and 429 is the application refusing the events (a wrong URL, a signature it
//! does not accept): retrying cannot change that answer, so the batch is dropped, counted and
//! logged with the URL and the answer.
//!
//! The same sender speaks Pusher's webhooks for a Pusher application ([`Format::Pusher`]): its
//! events are encoded by the caller (`clarion_proto::pusher::webhook`), the body carries the
//! time of each attempt and is signed with the application's secret.
//!
//! Topic occupancy is counted here per process (connection subscriptions per topic), so a
//! topic held by several workers is occupied once. With the Redis broker, `cluster` turns the
//! process's transitions into cluster-wide ones (see [`crate::broker::occupancy`]).

use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use clarion_proto::hooks::{encode_batch, signature, Event};
use clarion_proto::http1::{self, Version};

use super::Target;
use crate::grip::backend::{exchange_blocking, Failure, Job, Limits};
use crate::hub::lock;
use crate::metrics::Metrics;

/// The first retry waits this long; each failure doubles it, up to [`RETRY_MAX`]. Short enough
/// that a restarting backend gets its events within a second, capped so a long outage is polled
/// every few seconds rather than hammered.
const RETRY_FIRST: Duration = Duration::from_millis(100);
/// See [`RETRY_FIRST`].
const RETRY_MAX: Duration = Duration::from_secs(5);
/// The longest `Retry-After` (408, 429, 503) that is obeyed: a larger value is taken as this.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);
/// How much of a refusing answer's body the log line quotes.
const LOGGED_BODY: usize = 200;

/// Why a batch was not delivered.
#[derive(Debug, PartialEq)]
enum PostError {
    /// No answer: the request could not be written, the application could not be reached or
    /// did not answer in time, or its answer was not HTTP. Retried.
    Transport(String),
    /// The application answered with a status other than 2xx.
    Status {
        status: u16,
        /// The start of the answer's body, printable.
        body: String,
        /// Its `Retry-After`, in seconds.
        retry_after: Option<u64>,
    },
}

impl PostError {
    /// Whether the same batch is tried again: a 4xx other than 408 (timeout) and 429 (too many
    /// requests) is final.
    fn retried(&self) -> bool {
        match self {
            PostError::Transport(_) => true,
            PostError::Status { status, .. } => {
                !(400..500).contains(status) || matches!(status, 408 | 429)
            }
        }
    }

    /// How long to wait before the next try: the backoff, or the answer's `Retry-After` when
    /// it asks for longer (bounded by [`RETRY_AFTER_MAX`]).
    fn wait(&self, backoff: Duration) -> Duration {
        match self {
            PostError::Status {
                retry_after: Some(s),
                ..
            } => backoff.max(Duration::from_secs(*s).min(RETRY_AFTER_MAX)),
            PostError::Status { .. } | PostError::Transport(_) => backoff,
        }
    }
}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PostError::Transport(why) => f.write_str(why),
            PostError::Status { status, body, .. } if body.is_empty() => {
                write!(f, "answered {status}")
            }
            PostError::Status { status, body, .. } => write!(f, "answered {status} {body}"),
        }
    }
}

/// The start of `body` as one printable line: control characters become spaces.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body.get(..LOGGED_BODY).unwrap_or(body));
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if body.len() > LOGGED_BODY {
        out.push_str("...");
    }
    out.trim().to_owned()
}

pub use crate::broker::occupancy::Occupancy;

/// How often the sender wakes when idle, to keep the node's liveness fresh (a third of
/// [`crate::broker::occupancy::ALIVE_TTL`]).
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(5);

/// How batches are written and signed.
pub enum Format {
    /// Clarion's: `{"events": [...]}`, signed with `hook_secret` when set (`Clarion-Signature`).
    Clarion {
        /// `hook_secret`.
        secret: Option<Vec<u8>>,
    },
    /// Pusher's: `{"time_ms": ..., "events": [...]}` with `X-Pusher-Key` and
    /// `X-Pusher-Signature` (the application's).
    Pusher {
        /// The application's key.
        key: String,
        /// The application's secret.
        secret: Vec<u8>,
    },
}

/// The event a cluster-wide transition makes, once the cluster confirms it.
enum Pending {
    /// Clarion's `topic_occupied` / `topic_vacated` of the transition's key.
    Topic,
    /// An event encoded by the caller.
    Encoded(String),
}

/// A transition still to settle with the cluster.
struct Transition {
    key: Arc<str>,
    occupied: bool,
    event: Pending,
}

struct Queue {
    events: VecDeque<String>,
    /// Occupancy transitions still to settle with the cluster (decided on the sender thread,
    /// which may wait on Redis; workers never do).
    transitions: VecDeque<Transition>,
    first_at: Option<Instant>,
    stopping: bool,
}

struct Inner {
    target: Target,
    format: Format,
    queue: Mutex<Queue>,
    wake: Condvar,
    max: usize,
    batch_max: usize,
    batch_wait: Duration,
    limits: Limits,
    prefix: String,
    next: AtomicU64,
    metrics: Arc<Metrics>,
    /// Connection subscriptions per topic in this process.
    topics: Mutex<HashMap<Arc<str>, u32>>,
    cluster: Option<Box<dyn Occupancy>>,
}

/// The webhook queue and its sender.
pub struct Webhooks {
    inner: Arc<Inner>,
}

/// How the webhook is set up.
pub struct Settings {
    /// The URL.
    pub target: Target,
    /// How batches are written and signed.
    pub format: Format,
    /// Most events queued.
    pub max: usize,
    /// Most events per request.
    pub batch_max: usize,
    /// Longest an event waits for its batch.
    pub batch_wait: Duration,
    /// One request's limits.
    pub limits: Limits,
    /// Unique per process run: starts every id.
    pub prefix: String,
}

impl Webhooks {
    /// Starts the sender thread.
    pub fn start(
        s: Settings,
        metrics: &Arc<Metrics>,
        cluster: Option<Box<dyn Occupancy>>,
    ) -> std::io::Result<Webhooks> {
        let inner = Arc::new(Inner {
            target: s.target,
            format: s.format,
            queue: Mutex::new(Queue {
                events: VecDeque::new(),
                transitions: VecDeque::new(),
                first_at: None,
                stopping: false,
            }),
            wake: Condvar::new(),
            max: s.max,
            batch_max: s.batch_max.max(1),
            batch_wait: s.batch_wait,
            limits: s.limits,
            prefix: s.prefix,
            next: AtomicU64::new(1),
            metrics: Arc::clone(metrics),
            topics: Mutex::new(HashMap::new()),
            cluster,
        });
        let run = Arc::clone(&inner);
        std::thread::Builder::new()
            .name("clarion-webhook".into())
            .stack_size(crate::config::limits::HELPER_THREAD_STACK)
            .spawn(move || sender(&run))?;
        Ok(Webhooks { inner })
    }

    /// A new connection id (unique per process run).
    pub fn conn_id(&self) -> Arc<str> {
        let n = self.inner.next.fetch_add(1, Relaxed);
        format!("{}-c{n}", self.inner.prefix).into()
    }

    /// Queues `event` at `time` (Unix seconds); dropped and counted when the queue is full.
    pub fn emit(&self, event: &Event<'_>, time: u64) {
        let n = self.inner.next.fetch_add(1, Relaxed);
        let id = format!("{}-{n}", self.inner.prefix);
        let text = event.encode(&id, time);
        self.push(text);
    }

    /// Queues an event its caller encoded (Pusher's); dropped and counted when the queue is
    /// full.
    pub fn push(&self, text: String) {
        let w = &self.inner.metrics.hooks;
        let mut q = lock(&self.inner.queue);
        if q.events.len() >= self.inner.max {
            drop(q);
            w.webhook_dropped.fetch_add(1, Relaxed);
            return;
        }
        q.events.push_back(text);
        w.webhook_queued.store(q.events.len() as u64, Relaxed);
        if q.first_at.is_none() {
            q.first_at = Some(Instant::now());
            self.inner.wake.notify_one();
        } else if q.events.len() >= self.inner.batch_max {
            self.inner.wake.notify_one();
        }
    }

    /// A subscriber of `topic` arrived from the process this one replaced: counted, with no
    /// event (the topic was occupied already).
    pub fn count_topic(&self, topic: &Arc<str>) {
        *lock(&self.inner.topics)
            .entry(Arc::clone(topic))
            .or_insert(0) += 1;
    }

    /// A connection subscribed to `topic` (`joined`) or left it; emits `topic_occupied` /
    /// `topic_vacated` when this process's count goes from 0 or to 0 (and, in a cluster, the
    /// cluster's).
    pub fn topic(&self, topic: &Arc<str>, joined: bool, time: u64) {
        self.occupancy(topic, joined, time, |_| Pending::Topic);
    }

    /// Counts a holder of `key` in or out (a Pusher channel's subscriptions, a presence
    /// member's connections); when this process's count goes from 0 or to 0, and in a cluster
    /// the cluster's, queues `event(occupied)`.
    pub fn keyed(&self, key: &Arc<str>, joined: bool, event: impl FnOnce(bool) -> String) {
        self.occupancy(key, joined, 0, |occupied| Pending::Encoded(event(occupied)));
    }

    fn occupancy(
        &self,
        topic: &Arc<str>,
        joined: bool,
        time: u64,
        event: impl FnOnce(bool) -> Pending,
    ) {
        let mut topics = lock(&self.inner.topics);
        let transition = if joined {
            let n = topics.entry(Arc::clone(topic)).or_insert(0);
            *n += 1;
            *n == 1
        } else {
            match topics.get_mut(topic) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    topics.remove(topic);
                    true
                }
                None => false,
            }
        };
        if !transition {
            return;
        }
        let event = event(joined);
        if self.inner.cluster.is_some() {
            // Settled with the cluster on the sender thread, in order, under the same lock as
            // the count so two transitions of one topic cannot swap.
            let mut q = lock(&self.inner.queue);
            q.transitions.push_back(Transition {
                key: Arc::clone(topic),
                occupied: joined,
                event,
            });
            drop(topics);
            if q.first_at.is_none() {
                q.first_at = Some(Instant::now());
            }
            self.inner.wake.notify_one();
            return;
        }
        drop(topics);
        match event {
            Pending::Topic if joined => self.emit(&Event::TopicOccupied { topic }, time),
            Pending::Topic => self.emit(&Event::TopicVacated { topic }, time),
            Pending::Encoded(text) => self.push(text),
        }
    }

    /// Stops the sender after it has tried what is queued (bounded by one request's timeout).
    pub fn stop(&self) {
        lock(&self.inner.queue).stopping = true;
        self.inner.wake.notify_one();
    }
}

fn unix_now() -> u64 {
    crate::auth::unix_now()
}

/// Milliseconds since the Unix epoch (Pusher's `time_ms`).
fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn sender(inner: &Inner) {
    let mut idle: HashMap<String, TcpStream> = HashMap::new();
    let w = &inner.metrics.hooks;
    loop {
        let (batch, transitions) = {
            let mut q = lock(&inner.queue);
            loop {
                if q.stopping && q.events.is_empty() && q.transitions.is_empty() {
                    return;
                }
                match q.first_at {
                    None => {
                        let (g, timed_out) = inner
                            .wake
                            .wait_timeout(q, KEEP_ALIVE_EVERY)
                            .map(|(g, t)| (g, t.timed_out()))
                            .unwrap_or_else(|e| {
                                let (g, t) = e.into_inner();
                                (g, t.timed_out())
                            });
                        q = g;
                        if timed_out {
                            if let Some(c) = &inner.cluster {
                                drop(q);
                                c.keep_alive();
                                q = lock(&inner.queue);
                            }
                        }
                    }
                    Some(first) => {
                        let due = first + inner.batch_wait;
                        let now = Instant::now();
                        if q.events.len() >= inner.batch_max || now >= due || q.stopping {
                            break;
                        }
                        q = inner
                            .wake
                            .wait_timeout(q, due - now)
                            .map(|(g, _)| g)
                            .unwrap_or_else(|e| e.into_inner().0);
                    }
                }
            }
            let n = q.events.len().min(inner.batch_max);
            let batch: Vec<String> = q.events.drain(..n).collect();
            let transitions: Vec<Transition> = q.transitions.drain(..).collect();
            q.first_at = (!q.events.is_empty()).then(Instant::now);
            w.webhook_queued.store(q.events.len() as u64, Relaxed);
            (batch, transitions)
        };
        let mut batch = batch;
        if let Some(cluster) = &inner.cluster {
            for t in transitions {
                if !cluster.transition(&t.key, t.occupied) {
                    continue;
                }
                match t.event {
                    Pending::Topic => {
                        let n = inner.next.fetch_add(1, Relaxed);
                        let id = format!("{}-{n}", inner.prefix);
                        let event = if t.occupied {
                            Event::TopicOccupied { topic: &t.key }
                        } else {
                            Event::TopicVacated { topic: &t.key }
                        };
                        batch.push(event.encode(&id, unix_now()));
                    }
                    Pending::Encoded(text) => batch.push(text),
                }
            }
        }
        if batch.is_empty() {
            continue;
        }
        let mut wait = RETRY_FIRST;
        loop {
            // Written afresh for each attempt: Pusher's body carries the time it is sent.
            let body = match &inner.format {
                Format::Clarion { .. } => encode_batch(batch.iter().map(String::as_str)),
                Format::Pusher { .. } => clarion_proto::pusher::webhook::body(
                    unix_millis(),
                    batch.iter().map(String::as_str),
                ),
            };
            match post(inner, &body, &mut idle) {
                Ok(()) => {
                    w.webhook_sent.fetch_add(batch.len() as u64, Relaxed);
                    w.webhook_batches.fetch_add(1, Relaxed);
                    break;
                }
                Err(why) if !why.retried() => {
                    crate::log::warn(format_args!(
                        "webhook: {} {why}; dropping {} events: a 4xx other than 408 and 429 \
                         is the application refusing them, and is not retried (docs/hooks.md, \
                         Webhooks)",
                        inner.target.shown(),
                        batch.len(),
                    ));
                    w.webhook_rejected.fetch_add(batch.len() as u64, Relaxed);
                    break;
                }
                Err(why) => {
                    let pause = why.wait(wait);
                    crate::log::warn(format_args!(
                        "webhook: {} {why}; retrying {} events in {} ms",
                        inner.target.shown(),
                        batch.len(),
                        pause.as_millis()
                    ));
                    w.webhook_retries.fetch_add(1, Relaxed);
                    if lock(&inner.queue).stopping {
                        w.webhook_dropped.fetch_add(batch.len() as u64, Relaxed);
                        break;
                    }
                    std::thread::sleep(pause);
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
    }
}

fn post(
    inner: &Inner,
    body: &[u8],
    idle: &mut HashMap<String, TcpStream>,
) -> Result<(), PostError> {
    let t = &inner.target;
    let mut request = Vec::with_capacity(256 + body.len());
    let head = (|| {
        http1::write_request_line(&mut request, "POST", &t.path, Version::Http11)?;
        http1::write_header(&mut request, "Host", t.host.as_bytes())?;
        http1::write_header(&mut request, "Content-Type", b"application/json")?;
        http1::write_header(&mut request, "User-Agent", b"clarion-webhooks")?;
        http1::write_header(
            &mut request,
            "Content-Length",
            body.len().to_string().as_bytes(),
        )?;
        match &inner.format {
            Format::Clarion { secret: None } => {}
            Format::Clarion {
                secret: Some(secret),
            } => {
                let sig = signature(secret, unix_now(), body);
                http1::write_header(
                    &mut request,
                    clarion_proto::hooks::SIGNATURE_HEADER,
                    sig.as_bytes(),
                )?;
            }
            Format::Pusher { key, secret } => {
                for (name, value) in clarion_proto::pusher::webhook::headers(key, secret, body) {
                    http1::write_header(&mut request, name, value.as_bytes())?;
                }
            }
        }
        http1::end_head(&mut request);
        Ok::<(), http1::HeadWriteError>(())
    })();
    head.map_err(|e| PostError::Transport(format!("cannot write the request: {e}")))?;
    request.extend_from_slice(body);
    let job = Job {
        reply: None,
        key: 0,
        ticket: 0,
        targets: Arc::clone(&t.addr),
        request,
        head_only: false,
    };
    match exchange_blocking(&job, idle, inner.limits) {
        Ok(r) if (200..300).contains(&r.status) => Ok(()),
        Ok(r) => Err(PostError::Status {
            status: r.status,
            body: excerpt(&r.body),
            retry_after: r.header("retry-after").and_then(|v| v.trim().parse().ok()),
        }),
        Err(Failure::Unreachable(why)) => Err(PostError::Transport(format!("unreachable: {why}"))),
        Err(Failure::Timeout) => Err(PostError::Transport(format!(
            "no answer within {} ms",
            inner.limits.timeout.as_millis()
        ))),
        Err(Failure::Invalid(why)) => Err(PostError::Transport(format!("invalid answer: {why}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, retry_after: Option<u64>) -> PostError {
        PostError::Status {
            status,
            body: String::new(),
            retry_after,
        }
    }

    /// A sender whose batches wait an hour (so the queue can be looked at), Pusher's format.
    fn held() -> Webhooks {
        let settings = Settings {
            target: Target::parse("http://127.0.0.1:9/h").expect("URL"),
            format: Format::Pusher {
                key: "k".into(),
                secret: b"s".to_vec(),
            },
            max: 100,
            batch_max: 100,
            batch_wait: Duration::from_secs(3600),
            limits: Limits {
                timeout: Duration::from_millis(100),
                max_body: 1024,
                max_body_setting: "hook_max_answer",
            },
            prefix: "t".into(),
        };
        Webhooks::start(settings, &Arc::new(Metrics::default()), None).expect("thread")
    }

    #[test]
    fn keyed_holders_make_an_event_on_the_first_in_and_the_last_out_only() {
        let w = held();
        let key: Arc<str> = "pusher/1/c/orders".into();
        let event = |occupied: bool| (if occupied { "in" } else { "out" }).to_owned();
        w.keyed(&key, true, event);
        w.keyed(&key, true, event);
        w.keyed(&key, false, event);
        assert_eq!(Vec::from(lock(&w.inner.queue).events.clone()), ["in"]);
        w.keyed(&key, false, event);
        w.keyed(&key, false, event); // one too many: nothing
        assert_eq!(
            Vec::from(lock(&w.inner.queue).events.clone()),
            ["in", "out"]
        );
        w.stop();
    }

    #[test]
    fn a_4xx_other_than_408_and_429_is_final_and_the_rest_are_retried() {
        for final_status in [400, 401, 403, 404, 410, 413, 422] {
            assert!(!status(final_status, None).retried(), "{final_status}");
        }
        for retried in [408, 429, 500, 502, 503, 504, 302] {
            assert!(status(retried, None).retried(), "{retried}");
        }
        assert!(PostError::Transport("unreachable".into()).retried());
    }

    #[test]
    fn retry_after_lengthens_the_wait_within_a_bound() {
        let backoff = Duration::from_millis(100);
        assert_eq!(status(503, None).wait(backoff), backoff);
        assert_eq!(status(503, Some(3)).wait(backoff), Duration::from_secs(3));
        assert_eq!(status(429, Some(86_400)).wait(backoff), RETRY_AFTER_MAX);
        assert_eq!(status(503, Some(0)).wait(backoff), backoff);
    }

    #[test]
    fn the_log_quotes_the_answer_on_one_line_and_briefly() {
        let e = PostError::Status {
            status: 404,
            body: excerpt(b"{\"error\":\"no such hook\"}\r\n"),
            retry_after: None,
        };
        assert_eq!(e.to_string(), "answered 404 {\"error\":\"no such hook\"}");
        assert_eq!(status(500, None).to_string(), "answered 500");
        let long = excerpt(&[b'x'; 1000]);
        assert_eq!(long.len(), LOGGED_BODY + 3);
        assert!(long.ends_with("..."));
    }
}
