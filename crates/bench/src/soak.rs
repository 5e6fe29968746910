//! The soak coordinator (`clarion bench --scenario soak`): starts the soak workers
//! ([`crate::soak_worker`]), publishes at a steady rate over many topics for `--duration`
//! seconds, tells the workers what was published, and checks what every logical client
//! received across its reconnects: published, delivered, lost (outside announced gaps),
//! announced by gap notices, duplicated, reordered; reconnect latencies; reconnects and drops
//! per second. What the server goes through meanwhile (processes killed, Redis restarted, a
//! rolling restart) is up to the caller: `bench/soak.sh` does it.
//!
//! Each message carries its number within its topic. A publish the API did not answer `200`
//! (its process killed mid-request, Redis away) may or may not have reached Redis; it is not
//! sent again (that would put the same message in the stream twice) and its number is kept as
//! *unconfirmed*: a client that never got it has lost nothing. Every other number a client
//! skipped without a gap notice is lost.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde::Serialize;

use crate::plan::BenchArgs;
use crate::publisher::Api;
use crate::soak_check::SoakCounts;
use crate::soak_worker::{Finish, Job, Progress, Report, Shape};
use crate::stats::{unix_micros, Latency, Summary};

/// Publishing rounds per second: the rate is spread over them.
const ROUNDS_PER_SECOND: u64 = 10;

/// Examples of lost messages kept for the report.
const LOST_EXAMPLES: usize = 20;

/// What a soak measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SoakOutcome {
    /// Logical clients.
    pub clients: u64,
    /// Worker processes.
    pub procs: usize,
    /// Topics.
    pub topics: usize,
    /// Seconds of publishing.
    pub duration_s: u64,
    /// Mean connection life, seconds.
    pub life_s: u64,
    /// Messages per second asked for.
    pub rate: u64,
    /// Publishes answered `200`.
    pub published: u64,
    /// Publishes not answered `200` (unconfirmed: they may or may not have reached Redis).
    pub unconfirmed: u64,
    /// Why publishes failed, by kind.
    pub publish_errors: HashMap<String, u64>,
    /// Publish round trips (one API call per round), µs.
    pub publish_latency: Summary,
    /// What the clients received, summed.
    pub counts: SoakCounts,
    /// Messages lost: skipped without a gap notice, not unconfirmed.
    pub lost: u64,
    /// Unconfirmed messages some client did not receive (not a loss).
    pub unconfirmed_not_received: u64,
    /// Some lost messages: (topic, number).
    pub lost_examples: Vec<(String, u64)>,
    /// Clients that never received a message.
    pub never_received: u64,
    /// Clients still behind when the drain deadline passed.
    pub not_caught_up: u64,
    /// Reconnects at the end of a connection's life: closed to subscribed, µs.
    pub planned_reconnect: Summary,
    /// Reconnects after the server dropped a connection: dropped to subscribed, µs.
    pub dropped_reconnect: Summary,
    /// Publish-to-receive latency, µs (replays included).
    pub latency: Summary,
    /// Per Unix second: (second, reconnects completed, connections dropped, publishes failed).
    pub timeline: Vec<(u64, u32, u32, u32)>,
    /// Ends and failures of client connections, by kind.
    pub errors: HashMap<String, u64>,
    /// The first arrivals that were not in order, from every worker (duplicates, late ones,
    /// holes: a hole may still be an unconfirmed publish).
    pub odd: Vec<crate::soak_worker::Odd>,
    /// The workers' CPU seconds.
    pub bench_cpu_seconds: f64,
    /// When publishing started and ended, Unix seconds.
    pub publishing: (u64, u64),
    /// The same, by client kind ([`crate::soak_mix`]).
    pub kinds: Vec<crate::soak_mix::KindOutcome>,
}

impl SoakOutcome {
    /// Nothing lost outside announced gaps, nothing twice, nothing out of order.
    pub fn passed(&self) -> bool {
        self.lost == 0 && self.counts.duplicated == 0 && self.counts.reordered == 0
    }
}

use crate::worker_proc::Worker;

/// What the publisher knows of each topic.
#[derive(Default)]
struct Published {
    /// Next number per topic.
    next: Vec<u64>,
    /// Last number answered `200` per topic.
    confirmed: Vec<Option<u64>>,
    /// Numbers not answered `200`.
    unconfirmed: HashSet<(u32, u64)>,
    ok: u64,
    errors: HashMap<String, u64>,
    latency: Latency,
    /// Unix second -> failed publishes.
    failures: HashMap<u64, u32>,
}

/// Runs the soak and prints its report; fails when anything was lost, duplicated or reordered.
pub fn main(a: &BenchArgs) -> anyhow::Result<()> {
    let o = run(a)?;
    print_text(&o);
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&o)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if !o.passed() {
        bail!(
            "LOSSES: {} lost outside announced gaps, {} duplicated, {} reordered",
            o.lost,
            o.counts.duplicated,
            o.counts.reordered
        );
    }
    Ok(())
}

fn run(a: &BenchArgs) -> anyhow::Result<SoakOutcome> {
    let topics = a.topics.max(1);
    let names: Vec<String> = (0..topics)
        .map(|t| format!("{}{t}", a.topic_prefix))
        .collect();
    let procs = a
        .procs
        .unwrap_or_else(|| a.connections.div_ceil(5_000).max(2))
        .max(1);
    if a.connections / procs > 18_000 {
        bail!("more than 18,000 clients per worker: raise --procs");
    }
    let transports = if a.soak_transport.is_empty() {
        vec![crate::soak_life::SoakTransport::Ws]
    } else {
        a.soak_transport.clone()
    };
    let connect_rate = if a.connect_rate == 0 {
        2000
    } else {
        a.connect_rate
    };
    let tls = match (a.tls_job()?, a.tls_target) {
        (Some(job), Some(target)) => Some((job, target)),
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => bail!("--tls-ca and --tls-target go together"),
    };
    let mix = crate::soak_mix::Mix {
        plain: transports,
        browser_share: u64::from(a.soak_browser_share),
        tls: tls.is_some(),
        h2_streams: a.soak_h2_streams,
        topics,
    };
    let exe = std::env::current_exe()?;
    let progress: Arc<Mutex<Vec<Progress>>> =
        Arc::new(Mutex::new(vec![Progress::default(); procs]));
    let mut workers = Vec::new();
    for w in 0..procs {
        let clients: Vec<(Vec<u32>, crate::soak_life::SoakTransport)> = (0..a.connections)
            .filter(|i| i % procs == w)
            .map(|i| mix.client(i))
            .collect();
        let job = Job {
            soak: Shape {
                target: a.target,
                source: std::net::Ipv4Addr::new(
                    127,
                    0,
                    0,
                    (1 + (usize::from(a.source_base) - 1 + w) % 254) as u8,
                )
                .into(),
                topics: names.clone(),
                clients,
                life_ms: a.life * 1000,
                connect_rate: connect_rate.div_ceil(procs as u32),
                tls: tls.clone(),
            },
        };
        workers.push(spawn(&exe, w, &job, &progress)?);
    }
    let sum = |f: fn(&Progress) -> u64| {
        progress
            .lock()
            .map(|p| p.iter().map(f).sum::<u64>())
            .unwrap_or(0)
    };
    // The first connections: the ramp, and some time for stragglers.
    let ramp = Duration::from_secs_f64(a.connections as f64 / f64::from(connect_rate));
    let ready_by = Instant::now() + ramp + Duration::from_secs(60);
    while !progress
        .lock()
        .map(|p| p.iter().all(|x| x.ready))
        .unwrap_or(false)
        && Instant::now() < ready_by
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    eprintln!(
        "soak: {} clients connected, publishing {} messages/s over {topics} topics for {} s",
        sum(|p| p.connected),
        a.rate,
        a.duration
    );
    let mut pubs = Published {
        next: vec![0; topics],
        confirmed: vec![None; topics],
        ..Published::default()
    };
    let started_unix = unix_micros() / 1_000_000;
    publish_for(a, &names, &mut pubs, |elapsed, ok, unconfirmed| {
        eprintln!(
            "soak: {elapsed:>5.0} s  clients {}  delivered {}  reconnects {}  drops {}  published {ok}  unconfirmed {unconfirmed}",
            sum(|p| p.connected),
            sum(|p| p.delivered),
            sum(|p| p.reconnects),
            sum(|p| p.drops),
        );
    });
    let ended_unix = unix_micros() / 1_000_000;
    eprintln!(
        "soak: publishing done ({} confirmed, {} unconfirmed); waiting up to {} s for clients to catch up",
        pubs.ok,
        pubs.unconfirmed.len(),
        a.drain
    );
    let finish = Finish {
        last_confirmed: pubs.confirmed.clone(),
        last_attempted: pubs.next.iter().map(|&n| n.checked_sub(1)).collect(),
        deadline_ms: a.drain * 1000,
    };
    let line = serde_json::to_string(&finish)?;
    for w in &mut workers {
        writeln!(w.stdin, "{line}")?;
    }
    let mut reports = Vec::new();
    let wait = Duration::from_secs(a.drain + 60);
    for w in &mut workers {
        let r = w
            .lines
            .recv_timeout(wait)
            .context("a soak worker did not report")?;
        reports.push(serde_json::from_str::<Report>(&r).context("a soak worker's report")?);
        let _ = w.child.wait();
    }
    let mut o = merge(a, &names, &pubs, reports);
    o.procs = procs;
    o.publishing = (started_unix, ended_unix);
    Ok(o)
}

/// Publishes `--rate` messages a second, round robin over the topics, for `--duration`
/// seconds; `status` every ten seconds.
fn publish_for(
    a: &BenchArgs,
    names: &[String],
    p: &mut Published,
    mut status: impl FnMut(f64, u64, usize),
) {
    let per_round = (a.rate / ROUNDS_PER_SECOND).max(1) as usize;
    let round = Duration::from_micros(1_000_000 / ROUNDS_PER_SECOND);
    let start = Instant::now();
    let end = start + Duration::from_secs(a.duration);
    let mut next_round = start;
    let mut next_status = start + Duration::from_secs(10);
    let mut cursor = 0usize;
    let mut api: Option<Api> = None;
    while Instant::now() < end {
        let now = Instant::now();
        if now < next_round {
            std::thread::sleep(next_round - now);
        }
        // Behind by more than a second (a publish that waited out a timeout): start the
        // schedule again rather than catch up in a burst.
        next_round += round;
        if Instant::now() > next_round + Duration::from_secs(1) {
            next_round = Instant::now() + round;
        }
        let mut batch = Vec::with_capacity(per_round);
        let ts = unix_micros();
        for _ in 0..per_round {
            let t = cursor % names.len();
            cursor += 1;
            let Some(seq) = p.next.get_mut(t) else {
                continue;
            };
            let mut data = format!("{seq} {ts} ");
            while data.len() < a.size {
                data.push('x');
            }
            batch.push((t as u32, *seq, data));
            *seq += 1;
        }
        let messages: Vec<serde_json::Value> = batch
            .iter()
            .map(
                |(t, _, data)| serde_json::json!({ "topic": names.get(*t as usize), "data": data }),
            )
            .collect();
        let body = serde_json::json!({ "messages": messages }).to_string();
        let sent = Instant::now();
        let result = match api.as_mut() {
            Some(api) => api.post(&body),
            None => Api::connect(&a.api).and_then(|mut c| {
                c.set_read_timeout(Duration::from_secs(5))?;
                let r = c.post(&body);
                api = Some(c);
                r
            }),
        };
        match result {
            Ok(()) => {
                p.latency.record(sent.elapsed().as_micros() as u64);
                p.ok += batch.len() as u64;
                for (t, seq, _) in &batch {
                    if let Some(c) = p.confirmed.get_mut(*t as usize) {
                        *c = Some(*seq);
                    }
                }
            }
            Err(e) => {
                // The connection may be broken or hold a late answer: a new one next round.
                api = None;
                let kind = error_kind(&e);
                *p.errors.entry(kind).or_default() += batch.len() as u64;
                *p.failures.entry(unix_micros() / 1_000_000).or_default() += batch.len() as u32;
                for (t, seq, _) in &batch {
                    p.unconfirmed.insert((*t, *seq));
                }
            }
        }
        if Instant::now() >= next_status {
            next_status += Duration::from_secs(10);
            status(start.elapsed().as_secs_f64(), p.ok, p.unconfirmed.len());
        }
    }
}

/// A publish error's kind, without the parts that differ each time.
fn error_kind(e: &anyhow::Error) -> String {
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        return format!("io: {}", io.kind());
    }
    let text = e.to_string();
    text.split(':').next().unwrap_or("error").to_string()
        + text
            .find("HTTP/1.")
            .and_then(|i| text.get(i + 9..i + 12))
            .map(|s| format!(" {s}"))
            .unwrap_or_default()
            .as_str()
}

fn spawn(
    exe: &std::path::Path,
    w: usize,
    job: &Job,
    progress: &Arc<Mutex<Vec<Progress>>>,
) -> anyhow::Result<Worker> {
    crate::worker_proc::spawn(exe, w, job, progress).context("cannot start a soak worker")
}

/// Sums the workers' reports and sets the unconfirmed publishes aside from the holes.
fn merge(a: &BenchArgs, names: &[String], p: &Published, reports: Vec<Report>) -> SoakOutcome {
    let mut o = SoakOutcome {
        topics: names.len(),
        duration_s: a.duration,
        life_s: a.life,
        rate: a.rate,
        published: p.ok,
        unconfirmed: p.unconfirmed.len() as u64,
        publish_errors: p.errors.clone(),
        publish_latency: p.latency.summary(),
        ..SoakOutcome::default()
    };
    let (mut planned, mut dropped, mut latency) =
        (Latency::default(), Latency::default(), Latency::default());
    let mut timeline: HashMap<u64, (u32, u32, u32)> = HashMap::new();
    for (s, n) in &p.failures {
        timeline.entry(*s).or_default().2 += n;
    }
    for r in reports {
        o.clients += r.clients;
        o.never_received += r.never_received;
        o.not_caught_up += r.not_caught_up;
        o.counts.add(&r.counts);
        for k in r.kinds {
            crate::soak_mix::add(&mut o.kinds, k);
        }
        for (t, seq, kind) in r.holes {
            if p.unconfirmed.contains(&(t, seq)) {
                o.unconfirmed_not_received += 1;
            } else {
                o.lost += 1;
                if let Some(k) = o.kinds.iter_mut().find(|k| k.kind == kind.name()) {
                    k.lost += 1;
                }
                if o.lost_examples.len() < LOST_EXAMPLES {
                    let name = names.get(t as usize).cloned().unwrap_or_default();
                    o.lost_examples.push((name, seq));
                }
            }
        }
        // Holes no list kept: lost, whatever the publisher knows.
        o.lost += r.holes_unlisted;
        planned.merge(&r.planned_reconnect);
        dropped.merge(&r.dropped_reconnect);
        latency.merge(&r.latency);
        for (s, rec, drops) in r.timeline {
            let e = timeline.entry(s).or_default();
            e.0 += rec;
            e.1 += drops;
        }
        for (k, v) in r.errors {
            *o.errors.entry(k).or_default() += v;
        }
        o.bench_cpu_seconds += r.cpu_seconds;
        o.odd.extend(r.odd);
    }
    o.odd.sort_by_key(|x| x.unix_ms);
    crate::soak_mix::finish(&mut o.kinds);
    o.lost += o.counts.holes_unlisted;
    o.planned_reconnect = planned.summary();
    o.dropped_reconnect = dropped.summary();
    o.latency = latency.summary();
    let mut t: Vec<(u64, u32, u32, u32)> = timeline
        .into_iter()
        .map(|(s, (a, b, c))| (s, a, b, c))
        .collect();
    t.sort_unstable();
    o.timeline = t;
    o
}

fn print_text(o: &SoakOutcome) {
    let ms = |us: u64| us as f64 / 1000.0;
    println!(
        "soak: {} clients ({} procs), {} topics, {} s at {}/s, connection life ~{} s",
        o.clients, o.procs, o.topics, o.duration_s, o.rate, o.life_s
    );
    println!(
        "published {} (+{} unconfirmed: {:?}); delivered {}; lost {}; duplicated {}; reordered {}; \
         announced by {} gap notices: {}; unconfirmed not received {}",
        o.published,
        o.unconfirmed,
        o.publish_errors,
        o.counts.delivered,
        o.lost,
        o.counts.duplicated,
        o.counts.reordered,
        o.counts.gap_notices,
        o.counts.announced,
        o.unconfirmed_not_received
    );
    if !o.lost_examples.is_empty() {
        println!("lost (topic, number): {:?}", o.lost_examples);
    }
    println!(
        "reconnects: planned {} (p50 {:.1} ms, p99 {:.1} ms), after a drop {} (p50 {:.1} ms, p99 {:.1} ms)",
        o.planned_reconnect.count,
        ms(o.planned_reconnect.p50),
        ms(o.planned_reconnect.p99),
        o.dropped_reconnect.count,
        ms(o.dropped_reconnect.p50),
        ms(o.dropped_reconnect.p99)
    );
    println!(
        "never received {}; not caught up {}; connection ends: {:?}",
        o.never_received, o.not_caught_up, o.errors
    );
    for k in &o.kinds {
        println!(
            "  {:<15} clients {:>6}  subscriptions {:>6}  delivered {:>10}  lost {}  duplicated {}  reordered {}  drops {}",
            k.kind,
            k.clients,
            k.subscriptions,
            k.counts.delivered,
            k.lost,
            k.counts.duplicated,
            k.counts.reordered,
            k.drops.iter().map(|d| u64::from(d.1)).sum::<u64>()
        );
    }
}
