//! One soak worker process: its share of the soak's logical clients, from one source address. Each
//! client holds one connection at a time; at the end of a random life (about `--life` seconds) it
//! closes it and connects again at once, resuming with its last id; when the server drops it (a
//! process killed, a restart) it reconnects after a jittered backoff, as a careful client would.
//! Every message is checked per client across its connections ([`ResumeCheck`]); the protocol of
//! each connection is a [`crate::soak_life::SoakLife`]. This file is the process around them:
//! sockets, the poll loop, timers and what is measured (reconnect latencies, reconnects and drops
//! per second).
//!
//! It talks to the coordinator ([`crate::soak`]) over stdin/stdout, one JSON object per line:
//! a [`Job`] in, [`Progress`] lines out every second, a [`Finish`] in when publishing is over,
//! and the final [`Report`] out once every client has caught up (or the deadline passes).

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token};
use serde::{Deserialize, Serialize};

use crate::proc_stat::own_cpu_seconds;
use crate::soak_check::{Arrival, ResumeCheck, SoakCounts};
use crate::soak_conn::{Conn, TlsSetups};
use crate::soak_life::{Got, SoakTransport};
use crate::source_ports::SourcePorts;
use crate::stats::{unix_micros, Buckets, Latency};
use crate::tls_client::TlsJob;
use crate::wire::rand16;

/// What one soak worker does (the `soak` field tells it from the other workers' jobs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    /// The clients.
    pub soak: Shape,
}

/// The clients of one worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Shape {
    /// The server's client listener.
    pub target: SocketAddr,
    /// Local address to connect from.
    pub source: IpAddr,
    /// Every topic's name; clients refer to them by index.
    pub topics: Vec<String>,
    /// Each client: its topics' indexes (one per subscription: several for the HTTP/2 kinds)
    /// and its kind.
    pub clients: Vec<(Vec<u32>, SoakTransport)>,
    /// TLS for the TLS kinds: the certificates to trust and the server's TLS listener.
    #[serde(default)]
    pub tls: Option<(TlsJob, SocketAddr)>,
    /// Mean life of a connection, milliseconds (each is uniform in half to one and a half
    /// times this).
    pub life_ms: u64,
    /// First connections per second of this worker.
    pub connect_rate: u32,
}

/// The coordinator's last word, per topic index: the last publish answered `200` (every
/// client following the topic waits for it) and the last attempted (holes are counted up to
/// it; the coordinator sets aside the unconfirmed ones).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Finish {
    /// Last confirmed number per topic.
    pub last_confirmed: Vec<Option<u64>>,
    /// Last attempted number per topic.
    pub last_attempted: Vec<Option<u64>>,
    /// Milliseconds to wait for clients to catch up.
    pub deadline_ms: u64,
}

/// A progress line.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Progress {
    /// Clients subscribed now.
    pub connected: u64,
    /// Messages delivered so far.
    pub delivered: u64,
    /// Reconnects completed so far.
    pub reconnects: u64,
    /// Connections the server ended or that failed, so far.
    pub drops: u64,
    /// Every client has had its first connection.
    pub ready: bool,
}

/// What a worker measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// Clients.
    pub clients: u64,
    /// Clients that never received a message (nothing was checked for them).
    pub never_received: u64,
    /// Clients that had not caught up when the deadline passed.
    pub not_caught_up: u64,
    /// Deliveries, summed over clients.
    pub counts: SoakCounts,
    /// Numbers skipped without a gap notice: (topic index, number, the client's kind), at most
    /// [`MAX_LISTED`].
    pub holes: Vec<(u32, u64, SoakTransport)>,
    /// Holes past [`MAX_LISTED`].
    pub holes_unlisted: u64,
    /// From closing a connection at the end of its life to the next one subscribed, µs.
    pub planned_reconnect: Buckets,
    /// From the server dropping a connection to the next one subscribed (the client's jittered
    /// backoff and failed attempts included), µs.
    pub dropped_reconnect: Buckets,
    /// Publish-to-receive latency, µs (replayed messages included).
    pub latency: Buckets,
    /// Per Unix second: (second, reconnects completed, connections dropped by the server).
    pub timeline: Vec<(u64, u32, u32)>,
    /// Ends and failures of connections, by kind.
    pub errors: HashMap<String, u64>,
    /// The first arrivals that were not in order (duplicates, late, after a hole), with what
    /// is needed to find out why.
    pub odd: Vec<Odd>,
    /// This process's CPU seconds.
    pub cpu_seconds: f64,
    /// The same, by client kind.
    pub kinds: Vec<KindReport>,
}

/// What the clients of one kind measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KindReport {
    /// The kind.
    pub kind: SoakTransport,
    /// Clients (connections at a time).
    pub clients: u64,
    /// Subscriptions (an HTTP/2 client has several streams).
    pub subscriptions: u64,
    /// Subscriptions that never received a message.
    pub never_received: u64,
    /// Deliveries.
    pub counts: SoakCounts,
    /// Per Unix second: connections the server ended or that failed (the upgrade's window is
    /// looked up in these by `bench/soak_report.py`).
    pub drops: Vec<(u64, u32)>,
    /// Ends and failures of connections by why, with the Unix second: (second, why, count).
    pub errors: Vec<(u64, String, u32)>,
}

/// An arrival that was not in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Odd {
    /// When, Unix milliseconds.
    pub unix_ms: u64,
    /// `duplicate`, `reordered` or `hole N` (N numbers skipped without a gap notice).
    pub kind: String,
    /// The topic.
    pub topic: String,
    /// The message's number within its topic.
    pub seq: u64,
    /// Its id.
    pub id: String,
    /// The transport of the connection that carried it.
    pub transport: SoakTransport,
    /// The id the client had before it.
    pub previous_id: Option<String>,
    /// The id this connection resumed from (`None`: it did not resume).
    pub resumed_from: Option<String>,
    /// Milliseconds since this connection was answered.
    pub connection_age_ms: u64,
    /// Gap notices this client had received.
    pub gap_notices: u64,
}

/// Odd arrivals kept per worker.
const MAX_ODD: usize = 200;

/// Holes listed per worker.
pub const MAX_LISTED: usize = 50_000;

/// Handshakes in flight per worker: a storm of reconnects after a process dies is paced, as a
/// fleet of real clients' would be spread.
const MAX_IN_FLIGHT: usize = 512;

/// A connection that has not been answered after this long is given up and tried again.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A subscription counts as made once its connection has stayed open this long after the
/// answer: an SSE answer during a broker outage is a `200` that ends at once with an
/// `unavailable` event, which is no reconnect.
const SETTLED: Duration = Duration::from_secs(1);

/// How often the timers of every client are looked at.
const TICK: Duration = Duration::from_millis(50);

const STDIN: Token = Token(usize::MAX - 1);

/// Why a client is between connections.
#[derive(Clone, Copy)]
struct Down {
    since: Instant,
    /// It closed its connection at the end of its life (else the server or the network ended
    /// it).
    planned: bool,
}

/// One subscription of a client: its topic, last id and checks.
struct Sub {
    topic: u32,
    last_id: Option<Box<str>>,
    check: ResumeCheck,
}

/// One logical client: its subscriptions and its current connection.
struct Client {
    transport: SoakTransport,
    subs: Vec<Sub>,
    conn: Option<Conn>,
    /// When its current connection's life ends (set when it is answered).
    life_ends: Option<Instant>,
    /// Between connections since then (`None`: the first connection, or subscribed).
    down: Option<Down>,
    /// When the current connection was answered, until it has [`SETTLED`].
    answered: Option<Instant>,
    /// When to connect next, while it has no connection.
    retry_at: Option<Instant>,
    /// Attempts that failed in a row.
    failures: u32,
}

/// A small random-number generator for lives and jitter (no need for more).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `lo..hi` milliseconds.
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % hi.saturating_sub(lo).max(1))
    }
}

/// Runs a soak worker.
pub fn main(job: Job) -> anyhow::Result<()> {
    let shape = job.soak;
    let mut poll = Poll::new()?;
    let (_waker, rx) = crate::worker_proc::commands::<Finish>(&poll, STDIN)?;
    let r = rand16();
    let mut rng = Rng(u64::from_le_bytes([
        r[0],
        r[1],
        r[2],
        r[3],
        r[4],
        r[5],
        r[6],
        r[7] | 1,
    ]));
    let started = Instant::now();
    let rate = f64::from(shape.connect_rate.max(1));
    let mut clients: Vec<Client> = shape
        .clients
        .iter()
        .enumerate()
        .map(|(i, (topics, transport))| Client {
            transport: *transport,
            subs: topics
                .iter()
                .map(|&topic| Sub {
                    topic,
                    last_id: None,
                    check: ResumeCheck::default(),
                })
                .collect(),
            conn: None,
            life_ends: None,
            down: None,
            answered: None,
            retry_at: Some(started + Duration::from_secs_f64(i as f64 / rate)),
            failures: 0,
        })
        .collect();
    let tls = match &shape.tls {
        Some((job, target)) => Some(TlsSetups {
            h1: TlsJob {
                h2: false,
                ..job.clone()
            }
            .setup()?,
            h2: TlsJob {
                h2: true,
                ..job.clone()
            }
            .setup()?,
            target: *target,
        }),
        None => None,
    };
    let mut ports = SourcePorts::new();
    let mut m = Measures::default();
    let mut events = Events::with_capacity(4096);
    let mut read_buf = vec![0u8; 64 * 1024];
    let mut finish: Option<(Finish, Instant)> = None;
    let mut next_tick = Instant::now();
    let mut next_progress = Instant::now();
    let out = io::stdout();
    loop {
        poll.poll(&mut events, Some(TICK))?;
        let now = Instant::now();
        let now_us = unix_micros();
        for ev in events.iter() {
            if ev.token() == STDIN {
                if let Ok(f) = rx.try_recv() {
                    let deadline = now + Duration::from_millis(f.deadline_ms);
                    finish = Some((f, deadline));
                }
                continue;
            }
            let Some(c) = clients.get_mut(ev.token().0) else {
                continue;
            };
            if let Err(kind) = drive(
                c,
                &shape,
                tls.as_ref(),
                &mut read_buf,
                (now, now_us),
                &mut rng,
                &mut m,
            ) {
                end(c, &poll, kind, now, &mut rng, &mut m);
            }
        }
        if now >= next_tick {
            next_tick = now + TICK;
            let finishing = finish.is_some();
            let mut in_flight = clients
                .iter()
                .filter(|c| c.conn.as_ref().is_some_and(|k| !k.is_open()))
                .count();
            for (i, c) in clients.iter_mut().enumerate() {
                tick(
                    c,
                    i,
                    (&shape, tls.as_ref()),
                    (&poll, &mut ports),
                    now,
                    finishing,
                    &mut in_flight,
                    &mut rng,
                    &mut m,
                );
            }
        }
        if now >= next_progress {
            next_progress = now + Duration::from_secs(1);
            let p = Progress {
                connected: clients
                    .iter()
                    .filter(|c| c.conn.as_ref().is_some_and(|k| k.is_open()))
                    .count() as u64,
                delivered: m.delivered,
                reconnects: m.reconnects,
                drops: m.drops,
                ready: started.elapsed().as_secs_f64() * rate >= clients.len() as f64,
            };
            let mut o = out.lock();
            writeln!(o, "{}", serde_json::to_string(&p)?)?;
            o.flush()?;
        }
        let Some((f, deadline)) = &finish else {
            continue;
        };
        let caught_up = caught_up_count(f);
        if clients
            .iter()
            .all(|c| c.subs.iter().all(|s| caught_up(&s.check, s.topic)))
            || now >= *deadline
        {
            let report = m.report(clients, f, caught_up_count(f));
            let mut o = out.lock();
            writeln!(o, "{}", serde_json::to_string(&report)?)?;
            o.flush()?;
            return Ok(());
        }
    }
}

/// The check that a client has everything up to its topic's last confirmed publish.
fn caught_up_count(f: &Finish) -> impl Fn(&ResumeCheck, u32) -> bool + '_ {
    move |check, topic| {
        let last = f.last_confirmed.get(topic as usize).copied().flatten();
        last.is_none_or(|l| check.caught_up(l))
    }
}

/// What the worker sums while it runs.
#[derive(Default)]
struct Measures {
    delivered: u64,
    reconnects: u64,
    drops: u64,
    planned: Latency,
    dropped: Latency,
    latency: Latency,
    /// Unix second -> (reconnects, drops).
    timeline: HashMap<u64, (u32, u32)>,
    errors: HashMap<String, u64>,
    odd: Vec<Odd>,
    /// By kind: Unix second -> drops, and (second, why) -> count.
    kind_drops: HashMap<(SoakTransport, u64), u32>,
    kind_errors: HashMap<(SoakTransport, u64, String), u32>,
}

impl Measures {
    fn report(
        self,
        clients: Vec<Client>,
        f: &Finish,
        caught_up: impl Fn(&ResumeCheck, u32) -> bool,
    ) -> Report {
        let mut r = Report {
            clients: clients.len() as u64,
            ..Report::default()
        };
        let mut kinds: HashMap<SoakTransport, KindReport> = HashMap::new();
        for c in clients {
            let k = kinds.entry(c.transport).or_insert_with(|| KindReport {
                kind: c.transport,
                clients: 0,
                subscriptions: 0,
                never_received: 0,
                counts: SoakCounts::default(),
                drops: Vec::new(),
                errors: Vec::new(),
            });
            k.clients += 1;
            let mut behind = false;
            for s in c.subs {
                k.subscriptions += 1;
                behind |= !caught_up(&s.check, s.topic);
                if !s.check.started() {
                    r.never_received += 1;
                    k.never_received += 1;
                }
                let last = f.last_attempted.get(s.topic as usize).copied().flatten();
                let (counts, holes) = s.check.finish(last);
                r.counts.add(&counts);
                k.counts.add(&counts);
                for seq in holes {
                    if r.holes.len() < MAX_LISTED {
                        r.holes.push((s.topic, seq, c.transport));
                    } else {
                        r.holes_unlisted += 1;
                    }
                }
            }
            if behind {
                r.not_caught_up += 1;
            }
        }
        for ((kind, second), n) in self.kind_drops {
            if let Some(k) = kinds.get_mut(&kind) {
                k.drops.push((second, n));
            }
        }
        for ((kind, second, why), n) in self.kind_errors {
            if let Some(k) = kinds.get_mut(&kind) {
                k.errors.push((second, why, n));
            }
        }
        r.kinds = SoakTransport::ALL
            .iter()
            .filter_map(|t| kinds.remove(t))
            .map(|mut k| {
                k.drops.sort_unstable();
                k.errors.sort_unstable();
                k
            })
            .collect();
        r.planned_reconnect = self.planned.buckets();
        r.dropped_reconnect = self.dropped.buckets();
        r.latency = self.latency.buckets();
        let mut timeline: Vec<(u64, u32, u32)> = self
            .timeline
            .into_iter()
            .map(|(s, (a, b))| (s, a, b))
            .collect();
        timeline.sort_unstable();
        r.timeline = timeline;
        r.errors = self.errors;
        r.odd = self.odd;
        r.cpu_seconds = own_cpu_seconds();
        r
    }

    fn second(&mut self) -> &mut (u32, u32) {
        self.timeline.entry(unix_micros() / 1_000_000).or_default()
    }
}

/// A client's timers: a subscription that has settled, a life that has ended, a connection
/// to make, a handshake that took too long.
#[allow(clippy::too_many_arguments)]
fn tick(
    c: &mut Client,
    index: usize,
    (shape, tls): (&Shape, Option<&TlsSetups>),
    (poll, ports): (&Poll, &mut SourcePorts),
    now: Instant,
    finishing: bool,
    in_flight: &mut usize,
    rng: &mut Rng,
    m: &mut Measures,
) {
    if let Some(at) = c.answered {
        if now.duration_since(at) >= SETTLED && c.conn.is_some() {
            c.answered = None;
            c.failures = 0;
            if let Some(down) = c.down.take() {
                let took = at.saturating_duration_since(down.since).as_micros() as u64;
                if down.planned {
                    m.planned.record(took);
                } else {
                    m.dropped.record(took);
                }
                m.reconnects += 1;
                m.second().0 += 1;
            }
        }
    }
    if let Some(conn) = &c.conn {
        if !conn.is_open() && now.duration_since(conn.started) > HANDSHAKE_TIMEOUT {
            end(c, poll, "handshake timeout".into(), now, rng, m);
            return;
        }
    }
    if let (Some(ends), Some(_), false) = (c.life_ends, &c.conn, finishing) {
        if now >= ends && c.answered.is_none() {
            // The end of its life: close (a FIN, as a browser tab that is closed) and come back
            // at once with the last id.
            if let Some(mut conn) = c.conn.take() {
                let _ = poll.registry().deregister(&mut conn.stream);
            }
            c.life_ends = None;
            c.down = Some(Down {
                since: now,
                planned: true,
            });
            c.retry_at = Some(now);
        }
    }
    if c.conn.is_none() && c.retry_at.is_some_and(|at| now >= at) && *in_flight < MAX_IN_FLIGHT {
        let (target, setup) = match (c.transport.tls(), tls) {
            (false, _) => (shape.target, None),
            (true, Some(t)) if c.transport.h2() => (t.target, Some(&t.h2)),
            (true, Some(t)) => (t.target, Some(&t.h1)),
            (true, None) => {
                c.retry_at = None;
                *m.errors.entry("no TLS listener".into()).or_default() += 1;
                return;
            }
        };
        let conn = ports
            .connect(shape.source, target, poll, index)
            .map_err(|e| format!("connect: {}", e.kind()))
            .and_then(|stream| Conn::new(stream, setup, now));
        match conn {
            Ok(conn) => {
                *in_flight += 1;
                c.retry_at = None;
                c.conn = Some(conn);
            }
            Err(e) => {
                *m.errors.entry(e).or_default() += 1;
                c.failures += 1;
                c.retry_at = Some(now + backoff(c.failures, rng));
            }
        }
    }
}

/// How long a client waits before its next attempt after `failures` in a row: the first at a
/// random moment within a second (a whole process's clients dropped at once do not all come
/// back in the same millisecond), then doubling from 250 ms up to 5 s, jittered.
fn backoff(failures: u32, rng: &mut Rng) -> Duration {
    if failures <= 1 {
        return rng.millis(0, 1000);
    }
    let base = (250u64 << (failures - 2).min(5)).min(5000);
    rng.millis(base / 2, base + base / 2)
}

/// The client's connection ended (`kind` says why): it reconnects after a backoff.
fn end(c: &mut Client, poll: &Poll, kind: String, now: Instant, rng: &mut Rng, m: &mut Measures) {
    let second = unix_micros() / 1_000_000;
    *m.kind_drops.entry((c.transport, second)).or_default() += 1;
    *m.kind_errors
        .entry((c.transport, second, kind.clone()))
        .or_default() += 1;
    *m.errors.entry(kind).or_default() += 1;
    if let Some(mut conn) = c.conn.take() {
        let _ = poll.registry().deregister(&mut conn.stream);
    }
    m.drops += 1;
    m.second().1 += 1;
    c.life_ends = None;
    // A connection that ended before it settled: still down since the first loss.
    c.answered = None;
    if c.down.is_none() {
        c.down = Some(Down {
            since: now,
            planned: false,
        });
    }
    c.failures += 1;
    c.retry_at = Some(now + backoff(c.failures, rng));
}

/// What a read brought for one subscription, kept until the connection's borrow ends.
enum News {
    /// A message: its id, number and publishing time (Unix µs).
    Message(Box<str>, u64, u64),
    /// A gap notice.
    Gap,
}

/// Advances a client's connection on a readiness event; `Err(kind)` when it ended.
fn drive(
    c: &mut Client,
    shape: &Shape,
    tls: Option<&TlsSetups>,
    read_buf: &mut [u8],
    (now, now_us): (Instant, u64),
    rng: &mut Rng,
    m: &mut Measures,
) -> Result<(), String> {
    let Client {
        conn,
        subs,
        transport,
        answered,
        life_ends,
        ..
    } = c;
    let Some(conn) = conn.as_mut() else {
        return Ok(());
    };
    let topic = |t: u32| shape.topics.get(t as usize).map_or("", String::as_str);
    let target = match (transport.tls(), tls) {
        (true, Some(t)) => t.target,
        (true, None) | (false, _) => shape.target,
    };
    let wanted: Vec<(&str, Option<&str>)> = subs
        .iter()
        .map(|s| (topic(s.topic), s.last_id.as_deref()))
        .collect();
    let mut opened = false;
    let since = conn.since.clone();
    let answered_at = conn.answered_at;
    let mut news: Vec<(usize, News)> = Vec::new();
    let result = conn.drive(*transport, target, &wanted, read_buf, &mut |i, g| match g {
        Got::Answered => opened = true,
        Got::Message {
            id,
            seq,
            published_us,
        } => news.push((i, News::Message(id.into(), seq, published_us))),
        Got::Gap => news.push((i, News::Gap)),
        Got::Reply(_) => {}
    });
    drop(wanted);
    for (i, n) in news {
        let Some(sub) = subs.get_mut(i) else {
            continue;
        };
        let (id, seq, published_us) = match n {
            News::Message(id, seq, published_us) => (id, seq, published_us),
            News::Gap => {
                sub.check.gap_notice();
                continue;
            }
        };
        let kind = match sub.check.see(seq) {
            Arrival::InOrder | Arrival::AfterAnnouncedGap(_) => None,
            Arrival::Duplicate => Some("duplicate".to_string()),
            Arrival::Reordered => Some("reordered".to_string()),
            Arrival::AfterHole(n) => Some(format!("hole {n}")),
        };
        if let (Some(kind), true) = (kind, m.odd.len() < MAX_ODD) {
            m.odd.push(Odd {
                unix_ms: now_us / 1000,
                kind,
                topic: topic(sub.topic).to_string(),
                seq,
                id: id.to_string(),
                transport: *transport,
                previous_id: sub.last_id.as_deref().map(str::to_string),
                resumed_from: since.get(i).cloned().flatten().map(Into::into),
                connection_age_ms: answered_at
                    .map_or(0, |a| now.duration_since(a).as_millis() as u64),
                gap_notices: sub.check.gap_notices(),
            });
        }
        sub.last_id = Some(id);
        m.delivered += 1;
        m.latency.record(now_us.saturating_sub(published_us));
    }
    result?;
    if opened {
        conn.answered_at = Some(now);
        *answered = Some(now);
        let mean = shape.life_ms.max(2);
        *life_ends = Some(now + rng.millis(mean / 2, mean + mean / 2));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_spreads_the_first_retry_and_grows_to_five_seconds() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..1000 {
            assert!(backoff(1, &mut rng) < Duration::from_secs(1));
            let d = backoff(2, &mut rng);
            assert!(d >= Duration::from_millis(125) && d < Duration::from_millis(375));
            assert!(backoff(30, &mut rng) < Duration::from_millis(7500));
        }
    }
}
