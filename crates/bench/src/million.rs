//! `clarion bench --scenario million`: N WebSocket subscriptions (a million on one machine)
//! held for a while under the keep-alive load of the published million-socket runs.
//!
//! Every connection follows one topic all N follow and one of `--topics` chat rooms, and sends
//! one Ping per `--interval-ms` (60 s by default) that the server answers. Once per interval a
//! message goes to the topic all follow (its latency to reach every connection is the headline),
//! and every room gets one message per interval, spread evenly over it (chat-like traffic).
//! Workers ([`crate::million_worker`]) each hold under the 20,000 open-files limit of one process
//! and connect from their own loopback source address.
//!
//! Phases: connect at a bounded rate; settle and measure memory; a quiet window (server CPU with
//! N idle connections); the rounds; then every delivery and every Pong is checked. The report
//! says how many connections the server closed (must be 0) and which processes used the CPU (the
//! machine's two cores are shared by clients, servers and Redis).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::check::Verdict;
use crate::million_outcome::{CpuSplit, Outcome, Sample};
use crate::million_report::{html, print_text};
use crate::million_worker::{self as mw, Progress, Report, Shape};
use crate::outcome::per_connection;
use crate::plan::BenchArgs;
use crate::proc_stat;
use crate::publisher::Api;
use crate::stats::{Latency, Summary};

/// Connections per worker process: under the 20,000 open files one process may hold here, with
/// room for the poll instance, pipes and the binary's own files.
const PER_WORKER: u64 = 19_000;
/// Seconds of the quiet window in which the server's idle CPU is measured.
const QUIET_SECONDS: u64 = 10;
/// Topics per publish request.
const BATCH: usize = 200;

struct Worker {
    child: Child,
    stdin: ChildStdin,
    reports: std::sync::mpsc::Receiver<Report>,
}

/// Kills the workers still running when the run ends early (an error, a publish that failed):
/// nothing the bench started outlives it.
struct Fleet(Vec<Worker>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for w in &mut self.0 {
            if matches!(w.child.try_wait(), Ok(None)) {
                let _ = w.child.kill();
            }
            let _ = w.child.wait();
        }
    }
}

/// Shared state the sampler reads.
struct Live {
    progress: Mutex<Vec<Progress>>,
    worker_pids: Mutex<Vec<u32>>,
}

/// Runs the scenario, prints the summary, writes `--json` and `--report`; fails when the run
/// was not clean.
pub fn main(a: &BenchArgs) -> anyhow::Result<()> {
    let o = run(a)?;
    print_text(&o);
    if let Some(path) = &a.report {
        std::fs::write(path, html(&o))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&o)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if !o.clean() {
        bail!("the run was not clean: see the report (errors, missing, closed by server)");
    }
    Ok(())
}

/// Machine-wide busy CPU seconds (all cores, every process) from /proc/stat.
fn machine_busy_seconds() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let Some(line) = s.lines().next() else {
        return 0.0;
    };
    // cpu user nice system idle iowait irq softirq steal ...
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let g = |i: usize| f.get(i).copied().unwrap_or(0.0);
    (g(0) + g(1) + g(2) + g(5) + g(6) + g(7)) / 100.0
}

fn sample(started: Instant, a: &BenchArgs, live: &Live) -> Sample {
    let (opened, received, pongs, client_rss) = live
        .progress
        .lock()
        .map(|p| {
            (
                p.iter().map(|x| x.opened).sum(),
                p.iter().map(|x| x.received).sum(),
                p.iter().map(|x| x.pongs).sum(),
                p.iter().map(|x| x.rss).sum(),
            )
        })
        .unwrap_or_default();
    let worker_pids = live
        .worker_pids
        .lock()
        .map(|p| p.clone())
        .unwrap_or_default();
    Sample {
        t: started.elapsed().as_secs_f64(),
        opened,
        received,
        pongs,
        server_cpu: proc_stat::sum_over(&a.server_pid, proc_stat::cpu_seconds).unwrap_or(0.0),
        server_rss: proc_stat::sum_over(&a.server_pid, proc_stat::rss_bytes).unwrap_or(0),
        client_rss,
        kernel: proc_stat::tcp_kernel_bytes().unwrap_or(0),
        broker_cpu: a.broker_pid.and_then(proc_stat::cpu_seconds).unwrap_or(0.0),
        broker_rss: a.broker_pid.and_then(proc_stat::rss_bytes).unwrap_or(0),
        machine_cpu: machine_busy_seconds(),
        client_cpu: worker_pids
            .iter()
            .filter_map(|&p| proc_stat::cpu_seconds(p))
            .sum(),
    }
}

fn split(x: &Sample, y: &Sample) -> CpuSplit {
    CpuSplit {
        seconds: y.t - x.t,
        server: y.server_cpu - x.server_cpu,
        clients: y.client_cpu - x.client_cpu,
        broker: y.broker_cpu - x.broker_cpu,
        machine: y.machine_cpu - x.machine_cpu,
    }
}

fn open_files_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(1024)
}

/// Sleeps until `at`, or not at all when it has passed.
fn sleep_until(at: Instant) {
    if let Some(d) = at.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

fn payload(kind: char, seq: u64, size: usize) -> String {
    let mut data = format!("{kind} {seq} {} ", crate::stats::unix_micros());
    while data.len() < size {
        data.push('x');
    }
    data
}

/// The publishing connection, reopened after a refusal.
struct Publisher {
    addr: crate::publisher::ApiTarget,
    api: Api,
    /// Publishes retried after a refusal (`503` when the broker did not answer in time).
    retries: u64,
}

/// Publishes message `seq` to every topic of `topics`, in batches. A refused batch went nowhere
/// (the server says so with `503`), so it is sent again, as a publisher would, at most 5 times
/// a second apart; the retries are reported.
fn publish(
    p: &mut Publisher,
    topics: &[String],
    kind: char,
    seq: u64,
    size: usize,
) -> anyhow::Result<()> {
    for chunk in topics.chunks(BATCH) {
        let data = payload(kind, seq, size);
        let messages: Vec<serde_json::Value> = chunk
            .iter()
            .map(|t| serde_json::json!({ "topic": t, "data": data }))
            .collect();
        let body = serde_json::json!({ "messages": messages }).to_string();
        let mut tries = 0;
        loop {
            match p.api.post(&body) {
                Ok(()) => break,
                Err(e) if tries < 5 => {
                    tries += 1;
                    p.retries += 1;
                    eprintln!("publish refused ({e}); again in 1 s");
                    std::thread::sleep(Duration::from_secs(1));
                    p.api = Api::connect(&p.addr)?;
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

fn run(a: &BenchArgs) -> anyhow::Result<Outcome> {
    let n = a.connections as u64;
    let per_worker = PER_WORKER
        .min(open_files_limit().saturating_sub(200))
        .max(1);
    let procs = a
        .procs
        .map_or_else(|| n.div_ceil(per_worker), |p| p as u64)
        .max(1);
    if n.div_ceil(procs) > per_worker {
        bail!("{} connections per worker is over the {per_worker} one process may hold here: raise --procs", n.div_ceil(procs));
    }
    let interval_ms = a.interval_ms.max(1000);
    let rounds = (a.hold * 1000 / interval_ms).max(1);
    let rooms = a.topics.max(1) as u64;
    let all_topic = format!("{}-all", a.topic_prefix);
    let room_prefix = format!("{}-room", a.topic_prefix);
    let room_names: Vec<String> = (0..rooms).map(|r| format!("{room_prefix}{r}")).collect();
    eprintln!(
        "million: {n} connections from {procs} worker processes (at most {} each), {rooms} rooms, \
         {rounds} rounds of {} s{}, connect rate {}",
        n.div_ceil(procs),
        interval_ms / 1000,
        if a.pings_only { " (pings only)" } else { "" },
        if a.connect_rate == 0 {
            "unbounded".to_owned()
        } else {
            format!("{}/s", a.connect_rate)
        }
    );
    let live = Arc::new(Live {
        progress: Mutex::new(vec![Progress::default(); procs as usize]),
        worker_pids: Mutex::new(Vec::new()),
    });
    let started = Instant::now();
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (live, samples, stop, a) = (
            Arc::clone(&live),
            Arc::clone(&samples),
            Arc::clone(&stop),
            a.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let s = sample(started, &a, &live);
                if let Ok(mut v) = samples.lock() {
                    v.push(s);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let result = drive(
        a,
        n,
        procs,
        interval_ms,
        rounds,
        rooms,
        &all_topic,
        &room_prefix,
        &room_names,
        &live,
        started,
    );
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let (mut o, marks) = result?;
    o.samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let [s0, s_open, s_quiet, s_end] = marks;
    o.cpu_connect = split(&s0, &s_open);
    o.cpu_quiet = split(&s_open, &s_quiet);
    o.cpu_rounds = split(&s_quiet, &s_end);
    o.server_idle_cpu_percent = (!a.server_pid.is_empty() && o.cpu_quiet.seconds > 0.0)
        .then(|| o.cpu_quiet.server / o.cpu_quiet.seconds * 100.0);
    let delivered =
        o.broadcast.in_order + o.broadcast.reordered + o.chat.in_order + o.chat.reordered;
    o.server_cpu_per_million = (!a.server_pid.is_empty() && delivered > 0)
        .then(|| o.cpu_rounds.server / delivered as f64 * 1e6);
    o.messages_per_second = (delivered + o.pings + o.pongs) as f64 / o.cpu_rounds.seconds.max(1e-3);
    Ok(o)
}

#[allow(clippy::too_many_arguments)]
fn drive(
    a: &BenchArgs,
    n: u64,
    procs: u64,
    interval_ms: u64,
    rounds: u64,
    rooms: u64,
    all_topic: &str,
    room_prefix: &str,
    room_names: &[String],
    live: &Arc<Live>,
    started: Instant,
) -> anyhow::Result<(Outcome, [Sample; 4])> {
    let exe = std::env::current_exe()?;
    let server_rss_before = proc_stat::sum_over(&a.server_pid, proc_stat::rss_bytes);
    let kern0 = proc_stat::tcp_kernel_bytes();
    let s0 = sample(started, a, live);
    let mut fleet = Fleet(Vec::new());
    let rate = a.connect_rate.div_ceil(procs as u32);
    let tls = a.tls_job()?;
    for w in 0..procs {
        let shape = Shape {
            target: a.target,
            // 127.0.0.2 and up: each worker has its own source address, so its ~19,000
            // connections have a whole ephemeral port range to themselves.
            source: std::net::Ipv4Addr::new(127, 0, (w / 250) as u8, (2 + w % 250) as u8).into(),
            first: w,
            stride: procs,
            count: (n + procs - 1 - w) / procs,
            rooms,
            all_topic: all_topic.to_owned(),
            room_prefix: room_prefix.to_owned(),
            connect_rate: rate,
            ping_interval_ms: interval_ms,
            tls: tls.clone(),
        };
        fleet.0.push(spawn(&exe, w as usize, shape, live)?);
    }
    if let Ok(mut p) = live.worker_pids.lock() {
        *p = fleet.0.iter().map(|w| w.child.id()).collect();
    }
    // Connect, bounded: at the asked rate every connection gets twice its share, and never
    // less than 10 minutes.
    let limit = Duration::from_secs(if a.connect_rate > 0 {
        (n / u64::from(a.connect_rate) * 2).max(600)
    } else {
        600
    });
    let connect_start = Instant::now();
    let mut last_print = Instant::now();
    loop {
        let (ready, opened) = live
            .progress
            .lock()
            .map(|p| {
                (
                    p.iter().all(|x| x.ready),
                    p.iter().map(|x| x.opened).sum::<u64>(),
                )
            })
            .unwrap_or((false, 0));
        if ready {
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(5) {
            last_print = Instant::now();
            let secs = connect_start.elapsed().as_secs_f64();
            eprintln!(
                "connecting: {opened}/{n} open after {secs:.0} s ({:.0}/s)",
                opened as f64 / secs.max(1e-3)
            );
        }
        if connect_start.elapsed() > limit {
            bail!(
                "connections were not all attempted within {} s",
                limit.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let connect_seconds = connect_start.elapsed().as_secs_f64();
    // Let the last handshakes' buffers be released before reading memory.
    std::thread::sleep(Duration::from_secs(2));
    let s_open = sample(started, a, live);
    let (rss_before_clients, rss_open_clients): (u64, u64) = live
        .progress
        .lock()
        .map(|p| {
            (
                p.iter().map(|x| x.rss_before).sum(),
                p.iter().map(|x| x.rss).sum(),
            )
        })
        .unwrap_or_default();
    let server_rss_open = proc_stat::sum_over(&a.server_pid, proc_stat::rss_bytes);
    let kern_open = proc_stat::tcp_kernel_bytes();
    eprintln!(
        "{} connections open in {connect_seconds:.0} s; quiet for {QUIET_SECONDS} s",
        s_open.opened
    );
    std::thread::sleep(Duration::from_secs(QUIET_SECONDS));
    let s_quiet = sample(started, a, live);
    for w in &mut fleet.0 {
        writeln!(w.stdin, "{}", serde_json::to_string(&mw::Command::Start)?)?;
    }
    // The rounds: each interval is cut in one-second slots; slot k publishes the k-th share of
    // the rooms, and the middle slot the message to the topic all follow.
    let mut api = Publisher {
        addr: a.api.clone(),
        api: Api::connect(&a.api)?,
        retries: 0,
    };
    let slots = (interval_ms / 1000).max(1);
    let per_slot = (room_names.len() as u64).div_ceil(slots).max(1) as usize;
    let rounds_start = Instant::now();
    let all = [all_topic.to_owned()];
    for r in 0..rounds {
        for k in 0..slots {
            sleep_until(
                rounds_start + Duration::from_millis(r * interval_ms + k * interval_ms / slots),
            );
            if a.pings_only {
                continue;
            }
            if k == slots / 2 {
                publish(&mut api, &all, 'b', r, a.size)?;
            }
            let lo = (k as usize * per_slot).min(room_names.len());
            let hi = (lo + per_slot).min(room_names.len());
            if let Some(chunk) = room_names.get(lo..hi) {
                publish(&mut api, chunk, 'c', r, a.size)?;
            }
        }
        eprintln!("round {}/{rounds}", r + 1);
    }
    sleep_until(rounds_start + Duration::from_millis(rounds * interval_ms));
    let server_rss_end = proc_stat::sum_over(&a.server_pid, proc_stat::rss_bytes);
    // What each connection must have received: one message a round on each of its topics.
    let published = if a.pings_only { 0 } else { rounds };
    let finish = mw::Command::Finish {
        broadcasts: published,
        room_messages: published,
        deadline_ms: a.drain * 1000,
    };
    for w in &mut fleet.0 {
        writeln!(w.stdin, "{}", serde_json::to_string(&finish)?)?;
    }
    let mut reports = Vec::new();
    for w in &mut fleet.0 {
        let r = w
            .reports
            .recv_timeout(Duration::from_secs(a.drain + 60))
            .context("a worker did not report")?;
        reports.push(r);
        let _ = w.child.wait();
    }
    let mut s_end = sample(started, a, live);
    // The workers have exited: their own last word on their CPU replaces /proc.
    s_end.client_cpu = reports.iter().map(|r| r.cpu_seconds).sum();
    let (mut bl, mut cl, mut rtt) = (Latency::default(), Latency::default(), Latency::default());
    let mut o = Outcome {
        connections: n,
        opened: 0,
        tls: a.tls_ca.is_some(),
        workers: procs,
        connect_seconds,
        connect_rate: s_open.opened as f64 / connect_seconds.max(1e-3),
        connect_rate_limit: a.connect_rate,
        errors: HashMap::new(),
        closed_by_server: 0,
        rounds,
        interval_ms,
        rooms,
        broadcast_expected: n * published,
        broadcast: Verdict::default(),
        chat_expected: n * published,
        chat: Verdict::default(),
        broadcast_latency: Summary::default(),
        chat_latency: Summary::default(),
        ping_rtt: Summary::default(),
        pings: 0,
        pongs: 0,
        pongs_missing: 0,
        pongs_late: 0,
        server_rss_before,
        server_rss_open,
        server_rss_end,
        server_bytes_per_connection: per_connection(
            server_rss_before,
            server_rss_open,
            s_open.opened,
        ),
        server_bytes_per_connection_end: per_connection(
            server_rss_before,
            server_rss_end,
            s_open.opened,
        ),
        client_bytes_per_connection: per_connection(
            Some(rss_before_clients),
            Some(rss_open_clients),
            s_open.opened,
        ),
        client_total_bytes_per_connection: per_connection(
            Some(0),
            Some(rss_open_clients),
            s_open.opened,
        ),
        kernel_bytes_per_connection: per_connection(kern0, kern_open, s_open.opened),
        server_idle_cpu_percent: None,
        server_cpu_per_million: None,
        messages_per_second: 0.0,
        broker_rss: a.broker_pid.and_then(proc_stat::rss_bytes),
        publish_retries: api.retries,
        cpu_connect: CpuSplit::default(),
        cpu_quiet: CpuSplit::default(),
        cpu_rounds: CpuSplit::default(),
        samples: Vec::new(),
    };
    for r in &reports {
        o.opened += r.opened;
        o.broadcast.add(&r.broadcast);
        o.chat.add(&r.chat);
        bl.merge(&r.broadcast_latency);
        cl.merge(&r.chat_latency);
        rtt.merge(&r.ping_rtt);
        o.pings += r.pings;
        o.pongs += r.pongs;
        o.pongs_missing += r.pongs_missing;
        o.pongs_late += r.pongs_late;
        for (k, v) in &r.errors {
            *o.errors.entry(k.clone()).or_default() += v;
        }
    }
    // Per-room expectations: room r has the connections i with i % rooms == r.
    o.chat_expected = n * published;
    o.closed_by_server = o.errors.get("closed by server").copied().unwrap_or(0);
    o.broadcast_latency = bl.summary();
    o.chat_latency = cl.summary();
    o.ping_rtt = rtt.summary();
    Ok((o, [s0, s_open, s_quiet, s_end]))
}

fn spawn(
    exe: &std::path::Path,
    w: usize,
    shape: Shape,
    live: &Arc<Live>,
) -> anyhow::Result<Worker> {
    let (child, stdin, stdout) = crate::worker_proc::start(exe, &mw::Job { million: shape })?;
    let (tx, rx) = std::sync::mpsc::channel();
    let live = Arc::clone(live);
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(r) = serde_json::from_str::<Report>(&line) {
                if line.contains("\"broadcast\"") {
                    let _ = tx.send(r);
                    continue;
                }
            }
            if let Ok(p) = serde_json::from_str::<Progress>(&line) {
                if let Ok(mut all) = live.progress.lock() {
                    if let Some(s) = all.get_mut(w) {
                        *s = p;
                    }
                }
            }
        }
    });
    Ok(Worker {
        child,
        stdin,
        reports: rx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_seconds_grow_and_reports_render() {
        let a = machine_busy_seconds();
        assert!(a > 0.0);
        let o = Outcome {
            connections: 2,
            opened: 2,
            tls: true,
            workers: 1,
            connect_seconds: 1.0,
            connect_rate: 2.0,
            connect_rate_limit: 0,
            errors: HashMap::new(),
            closed_by_server: 0,
            rounds: 1,
            interval_ms: 1000,
            rooms: 1,
            broadcast_expected: 2,
            broadcast: Verdict {
                in_order: 2,
                ..Verdict::default()
            },
            chat_expected: 2,
            chat: Verdict {
                in_order: 2,
                ..Verdict::default()
            },
            broadcast_latency: Summary::default(),
            chat_latency: Summary::default(),
            ping_rtt: Summary::default(),
            pings: 2,
            pongs: 2,
            pongs_missing: 0,
            pongs_late: 0,
            server_rss_before: None,
            server_rss_open: None,
            server_rss_end: None,
            server_bytes_per_connection: None,
            server_bytes_per_connection_end: None,
            client_bytes_per_connection: None,
            client_total_bytes_per_connection: None,
            kernel_bytes_per_connection: None,
            server_idle_cpu_percent: None,
            server_cpu_per_million: None,
            messages_per_second: 0.0,
            broker_rss: None,
            publish_retries: 0,
            cpu_connect: CpuSplit::default(),
            cpu_quiet: CpuSplit::default(),
            cpu_rounds: CpuSplit::default(),
            samples: vec![
                Sample::default(),
                Sample {
                    t: 1.0,
                    opened: 2,
                    ..Sample::default()
                },
            ],
        };
        assert!(o.clean());
        let page = html(&o);
        assert!(page.contains("Connections held") && page.contains("clean: 0 lost"));
        let mut lossy = o.clone();
        lossy.chat.missing = 1;
        assert!(!lossy.clean());
        let mut closed = o;
        closed.closed_by_server = 1;
        assert!(!closed.clean());
    }
}
