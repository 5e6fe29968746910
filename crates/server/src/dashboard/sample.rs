//! The once-a-second samples behind the dashboard: one thread reads the process's counters,
//! turns totals into rates, keeps the last `dashboard_window` seconds for the plots, and (only
//! while a feed is open, or the group asked for them) computes the busiest topics. Every open
//! feed sends the same rendered sample, so ten open tabs cost one computation a second, not ten.
//! A feed that opens while the latest sample has no busiest topics asks for a sample at once,
//! so a fresh page never shows the list empty.
//!
//! On the shared API port of a `--processes` group, the sample is the group's: each tick asks
//! every member's private address for its own sample ([`super::group`]) and merges them.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::topics;
use crate::group::Member;
use crate::hub::lock;
use crate::log;
use crate::metrics::{process_cpu_seconds, process_rss_bytes, CloseReason, Metrics};
use crate::worker::Shared;

/// How often the sampler runs: the feed's period.
pub const PERIOD: Duration = Duration::from_secs(1);

pub use super::topics::TOP_TOPICS;

/// A node the dashboard lists: today this process only. Cluster brokers will report theirs
/// with `last_report` set when their report arrives.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// How it is called on the page.
    pub name: String,
    /// When it last reported.
    pub last_report: Instant,
}

/// A node's state as the page shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Reported within [`NODE_STALE_AFTER`].
    Up,
    /// Silent for longer: its numbers are old, and the page marks the row stale.
    Stale,
}

/// A node that has not reported for this long is marked stale: three missed once-a-second
/// reports, so one late report on a busy machine does not flap the marker.
pub const NODE_STALE_AFTER: Duration = Duration::from_secs(3);

impl Node {
    /// Its state at `now`.
    pub fn state(&self, now: Instant) -> NodeState {
        if now.saturating_duration_since(self.last_report) > NODE_STALE_AFTER {
            NodeState::Stale
        } else {
            NodeState::Up
        }
    }
}

/// The counters read at one instant.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    published: u64,
    delivered: u64,
    bytes_in: u64,
    bytes_out: u64,
    cpu: f64,
}

/// What the plots keep per second.
#[derive(Debug, Clone, Copy)]
struct Point {
    /// Unix milliseconds.
    t: u64,
    connections: u64,
    deliveries: f64,
    rss: u64,
}

impl Point {
    /// The plotted figures of a rendered sample.
    fn of(sample: &Value) -> Point {
        let u = |k: &str| sample.get(k).and_then(Value::as_u64).unwrap_or(0);
        Point {
            t: u("t"),
            connections: u("connections_total"),
            deliveries: sample
                .get("delivered_per_s")
                .and_then(Value::as_f64)
                .unwrap_or(0.0),
            rss: u("rss_bytes"),
        }
    }
}

/// The latest sample, as every feed sends it, and the plot window.
struct Latest {
    /// Increases with every sample; a feed waits for it to change.
    seq: u64,
    /// The `stats` event's JSON.
    json: Arc<str>,
    /// Whether `json` lists the busiest topics (computed only while someone looks).
    has_top: bool,
    /// A sample is wanted now, not at the next tick (a feed opened without busiest topics).
    wanted: bool,
    /// When `json` was made (a group's view is made only while someone looks, so it may be
    /// old).
    made: Instant,
    points: VecDeque<Point>,
}

/// How long the busiest topics keep being computed after the group last asked for them: three
/// of the group's once-a-second asks, so one late ask does not drop them.
const TOPICS_ASKED_FOR: Duration = Duration::from_secs(3);

/// The sampler's shared state.
pub struct Sampler {
    latest: Mutex<Latest>,
    ticked: Condvar,
    /// Wakes the sampler thread before its tick.
    wake: Condvar,
    window: usize,
    /// Feeds open (the busiest topics are computed only while one is).
    pub(super) watchers: std::sync::atomic::AtomicUsize,
    /// When the group's dashboard last asked this member for its busiest topics.
    topics_asked: Mutex<Option<Instant>>,
    /// On a group's shared API port: the member, whose sample is the group's.
    group: Option<Arc<Member>>,
}

impl Sampler {
    /// Starts the sampler thread; `None` (logged) if it cannot start. With `group`, each sample
    /// is the whole group's.
    pub fn start(shared: Arc<Shared>, group: Option<Arc<Member>>) -> Option<Arc<Sampler>> {
        let window = usize::try_from(shared.config.dashboard_window).unwrap_or(usize::MAX);
        let sampler = Arc::new(Sampler {
            latest: Mutex::new(Latest {
                seq: 0,
                json: "{}".into(),
                has_top: false,
                wanted: false,
                made: Instant::now(),
                points: VecDeque::with_capacity(window.min(4096)),
            }),
            ticked: Condvar::new(),
            wake: Condvar::new(),
            window,
            watchers: std::sync::atomic::AtomicUsize::new(0),
            topics_asked: Mutex::new(None),
            group,
        });
        let s = Arc::clone(&sampler);
        let started = std::thread::Builder::new()
            .name("clarion-dashboard".into())
            .stack_size(crate::config::limits::HELPER_THREAD_STACK)
            .spawn(move || s.run(&shared));
        match started {
            Ok(_) => Some(sampler),
            Err(e) => {
                log::warn(format_args!("dashboard off: cannot start its sampler: {e}"));
                None
            }
        }
    }

    fn run(&self, shared: &Shared) {
        let start = Instant::now();
        let mut before = totals(&shared.metrics);
        let mut at = Instant::now();
        let mut rates = topics::Rates::default();
        loop {
            let l = lock(&self.latest);
            let (mut l, _) = self
                .wake
                .wait_timeout_while(l, PERIOD.saturating_sub(at.elapsed()), |l| !l.wanted)
                .unwrap_or_else(|p| p.into_inner());
            let wanted = std::mem::take(&mut l.wanted);
            drop(l);
            let now = Instant::now();
            let secs = now.duration_since(at).as_secs_f64().max(0.001);
            at = now;
            let watched = self.watchers.load(Relaxed) > 0;
            if self.group.is_some() && !watched && !wanted {
                // The group's view asks every member: only while a feed is open or a sample
                // was asked for, so an idle group costs no requests, threads or memory for it.
                continue;
            }
            let (json, point, has_top) = match &self.group {
                Some(member) => {
                    let (value, has_top) = super::group::sample(member, watched, TOP_TOPICS);
                    let point = Point::of(&value);
                    (value.to_string(), point, has_top)
                }
                None => {
                    let t = totals(&shared.metrics);
                    let asked = lock(&self.topics_asked)
                        .is_some_and(|a| now.saturating_duration_since(a) < TOPICS_ASKED_FOR);
                    let top =
                        (watched || asked).then(|| rates.sample(&shared.broker, now, TOP_TOPICS));
                    let has_top = top.is_some();
                    let node = Node {
                        name: shared.config.node(),
                        last_report: now,
                    };
                    let (json, point) = render(shared, &before, &t, secs, start, top, &[node], now);
                    before = t;
                    (json, point, has_top)
                }
            };
            let mut l = lock(&self.latest);
            l.seq += 1;
            l.json = json.into();
            l.has_top = has_top;
            l.made = now;
            if l.points.len() >= self.window {
                l.points.pop_front();
            }
            l.points.push_back(point);
            drop(l);
            self.ticked.notify_all();
        }
    }

    /// The latest sample; with `topics`, one that lists the busiest topics: the latest when it
    /// does, else a fresh one asked for now, waiting up to `timeout`. Asking with `topics` (a
    /// feed opening, or the group's dashboard) keeps them computed for [`TOPICS_ASKED_FOR`].
    pub fn first(&self, timeout: Duration, topics: bool) -> Option<(u64, Arc<str>)> {
        if topics {
            *lock(&self.topics_asked) = Some(Instant::now());
        }
        let mut l = lock(&self.latest);
        let fresh = l.made.elapsed() < PERIOD * 2;
        if l.seq > 0 && (l.has_top || !topics) && fresh {
            return Some((l.seq, Arc::clone(&l.json)));
        }
        let seen = l.seq;
        l.wanted = true;
        drop(l);
        self.wake.notify_all();
        self.next(seen, timeout)
    }

    /// The plot window as a `window` event's JSON.
    pub fn window_json(&self) -> String {
        let l = lock(&self.latest);
        let pts: Vec<Value> = l
            .points
            .iter()
            .map(|p| {
                json!([
                    p.t,
                    p.connections,
                    (p.deliveries * 10.0).round() / 10.0,
                    p.rss
                ])
            })
            .collect();
        json!({ "columns": ["t", "connections", "deliveries_per_s", "rss_bytes"], "points": pts })
            .to_string()
    }

    /// The newest sample after `seen`, waiting up to `timeout` for it.
    pub fn next(&self, seen: u64, timeout: Duration) -> Option<(u64, Arc<str>)> {
        let l = lock(&self.latest);
        let (l, _) = self
            .ticked
            .wait_timeout_while(l, timeout, |l| l.seq <= seen)
            .unwrap_or_else(|p| p.into_inner());
        (l.seq > seen).then(|| (l.seq, Arc::clone(&l.json)))
    }
}

fn totals(m: &Metrics) -> Totals {
    Totals {
        published: m.published.load(Relaxed),
        delivered: m.delivered.load(Relaxed),
        bytes_in: m.bytes_in.load(Relaxed),
        bytes_out: m.bytes_out.load(Relaxed),
        cpu: process_cpu_seconds().unwrap_or(0.0),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One `stats` event: the same figures `/metrics` shows (named like its families), rates over
/// the last `secs`, the busiest topics and the nodes.
#[allow(clippy::too_many_arguments)]
fn render(
    shared: &Shared,
    a: &Totals,
    b: &Totals,
    secs: f64,
    start: Instant,
    top: Option<Vec<topics::TopicRow>>,
    nodes: &[Node],
    now: Instant,
) -> (String, Point) {
    let m = &shared.metrics;
    let l = |x: &std::sync::atomic::AtomicU64| x.load(Relaxed);
    let rate = |x: u64, y: u64| (y.saturating_sub(x) as f64 / secs * 10.0).round() / 10.0;
    let conns = [
        ("http", l(&m.http_connections)),
        ("ws", l(&m.ws_connections)),
        ("sse", l(&m.sse_connections)),
        ("stream", l(&m.stream_connections)),
        ("poll", l(&m.polls_held)),
    ];
    let total: u64 = conns.iter().map(|(_, n)| n).sum();
    let rss = process_rss_bytes().unwrap_or(0);
    let deliveries = rate(a.delivered, b.delivered);
    let failures: u64 = crate::metrics::TLS_FAILURES
        .iter()
        .map(|r| m.tls_failures(r))
        .sum();
    let scope = scope_text(shared, nodes.first().map_or("", |n| n.name.as_str()));
    let nodes: Vec<Value> = nodes
        .iter()
        .map(|n| {
            json!({
                "name": n.name,
                "state": match n.state(now) { NodeState::Up => "up", NodeState::Stale => "stale" },
                "last_report_ms": now.saturating_duration_since(n.last_report).as_millis() as u64,
                "pid": std::process::id(),
                "connections": total,
                "rss_bytes": rss,
            })
        })
        .collect();

    let t = unix_ms();
    let value = json!({
        "t": t,
        "uptime_s": start.elapsed().as_secs(),
        "connections": conns.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "connections_total": total,
        "tls_connections": l(&m.tls_connections),
        "h2_connections": l(&m.h2_connections),
        "h2_streams": l(&m.h2_streams),
        "subscriptions": l(&m.subscriptions),
        "topics": l(&m.topics),
        "published_total": b.published,
        "delivered_total": b.delivered,
        "published_per_s": rate(a.published, b.published),
        "delivered_per_s": deliveries,
        "bytes_in_total": b.bytes_in,
        "bytes_out_total": b.bytes_out,
        "bytes_in_per_s": rate(a.bytes_in, b.bytes_in),
        "bytes_out_per_s": rate(a.bytes_out, b.bytes_out),
        "rss_bytes": rss,
        "rss_bytes_per_connection": rss.checked_div(total).unwrap_or(0),
        "cpu_seconds_total": (b.cpu * 100.0).round() / 100.0,
        "cpu_percent": ((b.cpu - a.cpu).max(0.0) / secs * 1000.0).round() / 10.0,
        "refused": {
            "capacity": l(&m.refused_capacity),
            "address": l(&m.refused_address),
            "handshakes": l(&m.refused_handshakes),
        },
        "slow_consumers_total": m.closes(CloseReason::SlowConsumer),
        "history_messages": l(&m.history_messages),
        "history_bytes": l(&m.history_bytes),
        "tls_handshakes_total": l(&m.tls_handshakes),
        "tls_handshake_failures_total": failures,
        "dashboard_feeds": l(&m.dashboard_feeds),
        "top_topics": top.map(|rows| rows.iter().map(topics::TopicRow::json).collect::<Vec<_>>()),
        "nodes": nodes,
        "scope": scope,
    });
    let point = Point {
        t,
        connections: total,
        deliveries,
        rss,
    };
    (value.to_string(), point)
}

/// Which server the figures are of, said plainly: one process, or one node of a cluster
/// whose other nodes this one does not list.
fn scope_text(shared: &Shared, node: &str) -> String {
    let broker = shared.config.broker.as_deref().map(|url| {
        if url.starts_with("nats") {
            "NATS"
        } else {
            "Redis"
        }
    });
    match broker {
        None => format!("one process ({node}), no broker: every figure is this server's"),
        Some(b) => format!(
            "node {node} of a {b} cluster: the figures are this node's only; the other nodes \
             are not listed here (open their dashboards, or scrape each node's /metrics)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_turns_stale_after_three_silent_seconds() {
        let t0 = Instant::now();
        let n = Node {
            name: "a".into(),
            last_report: t0,
        };
        assert_eq!(n.state(t0), NodeState::Up);
        assert_eq!(n.state(t0 + Duration::from_secs(3)), NodeState::Up);
        assert_eq!(n.state(t0 + Duration::from_millis(3001)), NodeState::Stale);
    }
}
