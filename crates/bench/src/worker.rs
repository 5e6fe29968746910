//! One load-generating process: opens its share of the connections from one source address,
//! reads everything they receive, checks every delivery and measures latency.
//!
//! What a connection does with the bytes it reads (the answer, frames, events, polls, the
//! checks) is its life, a stream per subscriber over HTTP/2, and a connection is driven by
//! `worker_conn.rs` (its socket, TLS and meters); this file is the process around them: the
//! poll loop, the connect pace, and the latency and clump sums. The messages are
//! `worker_msg.rs`'s.
//!
//! It talks to the coordinator over stdin/stdout, one JSON object per line: a [`Job`] in, then
//! progress lines and a final [`Report`] out; a [`Finish`] on stdin says how many messages each
//! topic got, and the worker reports once every connection has them (or a deadline passes).
//! It then holds its connections until its stdin closes: the coordinator reads the server's CPU
//! for the publishing before the server has any closes to handle.

use std::collections::HashMap;
use std::io::{self, BufRead, Write};
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token};

use crate::conn_life::{Payloads, Setup};
use crate::h2_life::H2Setup;
use crate::proc_stat::own_cpu_seconds;
use crate::source_ports::SourcePorts;
use crate::stats::{unix_micros, Latency};
use crate::worker_conn::{drive, open, Conn, Shared, MAX_FRAME};

pub use crate::worker_msg::{Finish, Job, Progress, Report, TlsJob, Transport};

/// How often a worker reports progress: often enough that a run of a few seconds plots its
/// connections and deliveries.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

const STDIN: Token = Token(usize::MAX - 1);

/// Most handshakes one worker has in flight at once.
const MAX_IN_FLIGHT: usize = 256;

/// Runs a worker: the job comes as the first line of stdin.
pub fn main() -> anyhow::Result<()> {
    let stdin = io::stdin();
    let mut first = String::new();
    stdin.lock().read_line(&mut first)?;
    if let Ok(job) = serde_json::from_str::<crate::million_worker::Job>(&first) {
        return crate::million_worker::main(job);
    }
    if let Ok(job) = serde_json::from_str::<crate::soak_worker::Job>(&first) {
        return crate::soak_worker::main(job);
    }
    let job: Job = serde_json::from_str(&first)?;
    let setup = Setup {
        transport: job.transport,
        target: job.target,
        payloads: Payloads::Peers,
        max_frame: MAX_FRAME,
        hello: job.hello.as_deref(),
    };
    let h2 = H2Setup {
        target: job.target,
        tls: job.tls.is_some(),
        websocket: job.transport == Transport::Ws,
    };
    // Subscribers per connection.
    let per_conn = if job.http2 {
        job.streams_per_conn.max(1) as usize
    } else {
        1
    };
    let tls = job.tls.as_ref().map(TlsJob::setup).transpose()?;
    let mut poll = Poll::new()?;
    let (_waker, rx) = crate::worker_proc::commands::<Finish>(&poll, STDIN)?;
    let mut topic_ids: HashMap<String, u32> = HashMap::new();
    let mut topic_names: Vec<String> = Vec::new();
    let plan: Vec<u32> = job
        .topics
        .iter()
        .map(|t| {
            let next = topic_names.len() as u32;
            *topic_ids.entry(t.clone()).or_insert_with(|| {
                topic_names.push(t.clone());
                next
            })
        })
        .collect();
    // Connection k carries the subscribers `plan[k * per_conn..]`, `per_conn` of them.
    let planned_conns = plan.len().div_ceil(per_conn);
    let mut conns: Vec<Conn> = Vec::with_capacity(planned_conns);
    let mut ports = SourcePorts::new();
    let mut report = Report::default();
    let mut latency = Latency::default();
    let mut events = Events::with_capacity(4096);
    let mut read_buf = vec![0u8; 64 * 1024];
    // Plaintext of one read over TLS, before it is parsed.
    let mut plain = Vec::new();
    let started = Instant::now();
    let mut next_progress = Instant::now();
    let mut finish: Option<(Finish, Instant)> = None;
    let mut ready_sent = false;
    // Plan entries tried so far, and the topics of those that could not even get a socket.
    let mut planned = 0usize;
    let mut never_opened: Vec<u32> = Vec::new();
    let out = io::stdout();
    loop {
        // Open more connections, at the configured rate.
        let allowed = if job.connect_rate == 0 {
            planned_conns
        } else {
            ((started.elapsed().as_secs_f64() * f64::from(job.connect_rate)) as usize + 1)
                .min(planned_conns)
        };
        // Handshakes in flight are capped, as a real client fleet's would be spread out: a
        // server is entitled to refuse a storm of simultaneous handshakes (Clarion's
        // `max_handshakes`). Counted only while connections remain to be opened: once they
        // are, an iteration's work is its events alone (a scan of every connection per wake-up
        // would make the client, not the server, the cost of a ticker).
        let mut in_flight = if planned < allowed {
            conns.iter().filter(|c| c.handshaking()).count()
        } else {
            0
        };
        while planned < allowed && in_flight < MAX_IN_FLIGHT {
            in_flight += 1;
            let subs = plan
                .get(planned * per_conn..((planned + 1) * per_conn).min(plan.len()))
                .unwrap_or_default();
            planned += 1;
            match open(&job, &poll, &mut ports, conns.len(), subs, tls.as_ref()) {
                Ok(c) => conns.push(c),
                Err(e) => {
                    *report
                        .errors
                        .entry(format!("connect: {}", e.kind()))
                        .or_default() += 1;
                    never_opened.extend_from_slice(subs);
                }
            }
            if job.connect_rate != 0 {
                break;
            }
        }
        poll.poll(&mut events, Some(Duration::from_millis(100)))?;
        let now_us = unix_micros();
        for ev in events.iter() {
            if ev.token() == STDIN {
                if let Ok(f) = rx.try_recv() {
                    let deadline = Instant::now() + Duration::from_millis(f.deadline_ms);
                    finish = Some((f, deadline));
                }
                continue;
            }
            let Some(c) = conns.get_mut(ev.token().0) else {
                continue;
            };
            let closing = ev.is_read_closed() || ev.is_error();
            let shared = Shared {
                job: &job,
                setup: &setup,
                h2: &h2,
                topics: &topic_names,
            };
            let step = drive(
                c,
                &shared,
                (&mut read_buf, &mut plain),
                now_us,
                (&mut latency, &mut report.errors),
                closing,
            );
            if let Err(kind) = step {
                *report.errors.entry(kind).or_default() += 1;
                c.fail();
                let _ = poll.registry().deregister(&mut c.stream);
            }
        }
        let opened = || conns.iter().map(Conn::opened).sum::<u64>();
        let became_ready =
            !ready_sent && planned == planned_conns && !conns.iter().any(Conn::handshaking);
        if became_ready {
            ready_sent = true;
            report.opened = opened();
            report.tcp_connections = conns.iter().filter(|c| c.connected()).count() as u64;
            report.connect_seconds = started.elapsed().as_secs_f64();
        }
        // Readiness is told at once: the coordinator waits for it before publishing.
        if Instant::now() >= next_progress || became_ready {
            next_progress = Instant::now() + PROGRESS_EVERY;
            let opened = opened();
            let received = conns.iter().map(Conn::received).sum();
            let p = Progress {
                opened,
                received,
                ready: ready_sent,
            };
            let mut o = out.lock();
            writeln!(o, "{}", serde_json::to_string(&p)?)?;
            o.flush()?;
        }
        if let Some((f, deadline)) = &finish {
            let expected = |topic: u32| {
                topic_names
                    .get(topic as usize)
                    .and_then(|t| f.published.get(t))
                    .copied()
                    .unwrap_or(0)
            };
            let all = conns
                .iter()
                .flat_map(Conn::subs)
                .all(|s| !s.open || s.check.received() >= expected(s.topic));
            if all || Instant::now() >= *deadline {
                let mut means = Latency::default();
                for s in conns.iter().flat_map(Conn::subs) {
                    // A subscriber that never received anything is all missing (its checker
                    // says so too).
                    report.verdict.add(&s.check.finish(expected(s.topic)));
                    report.clumped += s.meter.clumps.clumped;
                    if let Some(mean) = s.meter.latency_sum.checked_div(s.check.received()) {
                        means.record(mean);
                    }
                }
                report.connection_means = means.buckets();
                for t in &never_opened {
                    report.verdict.missing += topic_names
                        .get(*t as usize)
                        .and_then(|t| f.published.get(t))
                        .copied()
                        .unwrap_or(0);
                }
                report.opened = report.opened.max(opened());
                report.latency = latency.buckets();
                report.cpu_seconds = own_cpu_seconds();
                let mut o = out.lock();
                writeln!(o, "{}", serde_json::to_string(&report)?)?;
                o.flush()?;
                drop(o);
                // The reader thread ends, and drops its sender, when stdin closes.
                while rx.recv().is_ok() {}
                return Ok(());
            }
        }
    }
}
