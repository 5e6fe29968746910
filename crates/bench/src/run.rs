//! The coordinator: plans the connections, starts the worker processes, publishes, and reports.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::check::Verdict;
use crate::outcome::{per_connection, Churn, Outcome, Sample, Step};
use crate::plan::{stages, topic_of, BenchArgs, Scenario, TransportArg};
use crate::proc_stat;
use crate::publisher::Api;
use crate::stats::Latency;
use crate::worker::{Finish, Job, Progress, Report, Transport};

use crate::worker_proc::Worker;

/// Runs a benchmark and prints its report.
pub fn main(mut a: BenchArgs) -> anyhow::Result<()> {
    crate::scenario::apply_scenario(&mut a);
    a.check_http2()?;
    if a.scenario == Some(Scenario::Million) {
        return crate::million::main(&a);
    }
    if a.scenario == Some(Scenario::Soak) {
        return crate::soak::main(&a);
    }
    if a.scenario == Some(Scenario::Streams) {
        return crate::streams::main(&a);
    }
    let outcome = if a.scenario == Some(Scenario::Churn) {
        churn(&a)?
    } else {
        run(&a)?
    };
    crate::report::print_text(&a, &outcome);
    if let Some(path) = &a.report {
        let transport = match a.transport {
            TransportArg::Ws => "WebSocket",
            TransportArg::Sse => "SSE",
            TransportArg::Poll => "long-poll",
        };
        let title = if a.http2 {
            format!(
                "clarion bench: {} {transport} streams over HTTP/2, {} per connection, {} topics, {} rounds",
                a.connections, a.streams_per_conn, a.topics, a.messages
            )
        } else {
            format!(
                "clarion bench: {} {transport} connections, {} topics, {} rounds",
                a.connections, a.topics, a.messages
            )
        };
        std::fs::write(path, crate::report::html(&title, &outcome))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&outcome)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if outcome
        .churn
        .as_ref()
        .is_some_and(|c| c.fds_after.is_some() && !c.fds_returned)
    {
        eprintln!("LEAK: the server's open files did not return to the baseline after churn");
    }
    if !outcome.verdict.perfect()
        || outcome.verdict.in_order + outcome.verdict.reordered < outcome.expected
    {
        eprintln!("LOSSES: not every message reached every subscriber once, in order");
    }
    Ok(())
}

/// Connect/disconnect cycles: `--rounds` full runs of N connections (each ends with every
/// worker process exiting, which closes its sockets), then the server's RSS and open files
/// compared with what they were before the first.
fn churn(a: &BenchArgs) -> anyhow::Result<Outcome> {
    let pids = &a.server_pid;
    let rss_baseline = proc_stat::sum_over(pids, proc_stat::rss_bytes);
    let fds_baseline = proc_stat::sum_over(pids, proc_stat::open_fds);
    let (mut opened, mut connect_rates) = (Vec::new(), Vec::new());
    let mut rss_peak = rss_baseline;
    let mut total: Option<Outcome> = None;
    for round in 0..a.rounds.max(1) {
        eprintln!("churn: cycle {}/{}", round + 1, a.rounds.max(1));
        let cycle = BenchArgs {
            topic_prefix: format!("{}-churn{round}-", a.topic_prefix),
            ..a.clone()
        };
        let o = run(&cycle)?;
        opened.push(o.opened);
        connect_rates.push(o.connect_rate);
        let peak = o.samples.iter().map(|s| s.rss).max();
        rss_peak = rss_peak.max(peak);
        total = Some(match total {
            None => o,
            Some(mut t) => {
                t.verdict.add(&o.verdict);
                t.expected += o.expected;
                t.latency = o.latency;
                for (k, v) in o.errors {
                    *t.errors.entry(k).or_default() += v;
                }
                t.bench_cpu_seconds += o.bench_cpu_seconds;
                let sum = |(x, y): (f64, f64)| x + y;
                t.bench_publish_cpu_seconds = t
                    .bench_publish_cpu_seconds
                    .zip(o.bench_publish_cpu_seconds)
                    .map(sum);
                t.server_cpu_seconds = t.server_cpu_seconds.zip(o.server_cpu_seconds).map(sum);
                t.bench_wakeups = t.bench_wakeups.zip(o.bench_wakeups).map(|(x, y)| x + y);
                t.samples = o.samples;
                t
            }
        });
    }
    let mut total = total.context("no churn cycle ran")?;
    // The server learns of each close when it reads the FIN; give it time, and stop waiting as
    // soon as the count is back.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut fds_after = proc_stat::sum_over(pids, proc_stat::open_fds);
    while fds_after > fds_baseline && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        fds_after = proc_stat::sum_over(pids, proc_stat::open_fds);
    }
    // RSS: let allocators give memory back (glibc trims on free; others on a timer).
    std::thread::sleep(Duration::from_secs(1));
    let rss_after = proc_stat::sum_over(pids, proc_stat::rss_bytes);
    total.churn = Some(Churn {
        rounds: a.rounds.max(1),
        opened,
        connect_rates,
        rss_baseline,
        rss_after,
        rss_peak,
        fds_baseline,
        fds_returned: matches!((fds_baseline, fds_after), (Some(b), Some(f)) if f <= b),
        fds_after,
    });
    Ok(total)
}

/// Starts one worker process for the connections `conns` (indices into `plan`), numbered `w`
/// (which picks its source address and its progress slot).
#[allow(clippy::too_many_arguments)]
fn spawn_worker(
    a: &BenchArgs,
    exe: &std::path::Path,
    w: usize,
    conns: &[usize],
    plan: &[usize],
    names: &[String],
    per_proc_rate: u32,
    progress: &Arc<Mutex<Vec<Progress>>>,
) -> anyhow::Result<Worker> {
    let topics: Vec<String> = conns
        .iter()
        .filter_map(|&i| plan.get(i))
        .filter_map(|&t| names.get(t).cloned())
        .collect();
    let job = Job {
        target: a.target,
        // 127.0.0.1 to .254, wrapping: never the broadcast .255.
        source: std::net::Ipv4Addr::new(
            127,
            0,
            0,
            (1 + (usize::from(a.source_base) - 1 + w) % 254) as u8,
        )
        .into(),
        transport: match a.transport {
            TransportArg::Ws => Transport::Ws,
            TransportArg::Sse => Transport::Sse,
            TransportArg::Poll => Transport::Poll,
        },
        topics,
        connect_rate: per_proc_rate,
        interval_us: a.interval_ms * 1000,
        hello: a.ws_hello.clone(),
        tls: a.tls_job()?,
        jwt_secret: a.jwt_secret.clone(),
        http2: a.http2,
        streams_per_conn: a.streams_per_conn,
    };
    crate::worker_proc::spawn(exe, w, &job, progress)
}

fn run(a: &BenchArgs) -> anyhow::Result<Outcome> {
    let stages = stages(&a.steps, a.connections);
    let staged = stages.len() > 1;
    // Worker processes per step: connections are spread over them round robin.
    let mut procs_per_stage = Vec::new();
    let mut lo = 0;
    for &hi in &stages {
        let n = hi.saturating_sub(lo);
        let procs = a.procs.unwrap_or_else(|| n.div_ceil(10_000).max(2)).max(1);
        if n / procs > 18_000 {
            bail!("more than 18,000 connections per worker: raise --procs");
        }
        procs_per_stage.push(procs);
        lo = hi;
    }
    let total_procs: usize = procs_per_stage.iter().sum();
    let names: Vec<String> = (0..a.topics.max(1))
        .map(|t| format!("{}{t}", a.topic_prefix))
        .collect();
    let plan: Vec<usize> = (0..a.connections)
        .map(|i| topic_of(i, a.topics, a.distribution))
        .collect();
    let mut subscribers = vec![0u64; names.len()];
    for &t in &plan {
        if let Some(s) = subscribers.get_mut(t) {
            *s += 1;
        }
    }
    let exe = std::env::current_exe()?;
    // The workers' latest progress lines, kept up to date by one reader thread per worker.
    let progress: Arc<Mutex<Vec<Progress>>> = Arc::new(Mutex::new(
        (0..total_procs)
            .map(|_| Progress {
                opened: 0,
                received: 0,
                ready: false,
            })
            .collect(),
    ));
    let pids = a.server_pid.clone();
    let cpu_of = |pids: &[u32]| proc_stat::sum_over(pids, proc_stat::cpu_seconds);
    let rss_of = |pids: &[u32]| proc_stat::sum_over(pids, proc_stat::rss_bytes);
    let woken_of = |pids: &[u32]| proc_stat::sum_over(pids, proc_stat::voluntary_switches);
    let started = Instant::now();
    let cpu0 = cpu_of(&pids);
    let rss0 = rss_of(&pids);
    let before = crate::trust::Before {
        rss: rss0,
        peak_rss: proc_stat::sum_over(&pids, proc_stat::peak_rss_bytes),
    };
    let kern0 = proc_stat::tcp_kernel_bytes();
    let samples = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (progress, samples, stop, pids) = (
            Arc::clone(&progress),
            Arc::clone(&samples),
            Arc::clone(&stop),
            pids.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let (opened, received) = progress
                    .lock()
                    .map(|p| {
                        (
                            p.iter().map(|x| x.opened).sum(),
                            p.iter().map(|x| x.received).sum(),
                        )
                    })
                    .unwrap_or((0, 0));
                let s = Sample {
                    t: started.elapsed().as_secs_f64(),
                    cpu: proc_stat::sum_over(&pids, proc_stat::cpu_seconds).unwrap_or(0.0),
                    rss: proc_stat::sum_over(&pids, proc_stat::rss_bytes).unwrap_or(0),
                    tcp_kernel: proc_stat::tcp_kernel_bytes().unwrap_or(0),
                    opened,
                    received,
                };
                if let Ok(mut v) = samples.lock() {
                    v.push(s);
                }
                // Fine steps at first, so a run of a few seconds still plots what happened.
                let every = if started.elapsed() < SAMPLE_FINE_FOR {
                    100
                } else {
                    500
                };
                std::thread::sleep(Duration::from_millis(every));
            }
        })
    };
    let mut workers = Vec::new();
    let mut steps = Vec::new();
    let mut connect_secs = 0.0;
    let (mut lo, mut w_base) = (0, 0);
    let (mut prev_rss, mut prev_opened) = (rss0, 0u64);
    let mut rss_open = rss0;
    let mut kern_open = kern0;
    for (&hi, &procs) in stages.iter().zip(&procs_per_stage) {
        let stage_start = Instant::now();
        let rate = a.connect_rate.div_ceil(procs as u32);
        for k in 0..procs {
            let conns: Vec<usize> = (lo..hi).filter(|i| (i - lo) % procs == k).collect();
            workers.push(spawn_worker(
                a,
                &exe,
                w_base + k,
                &conns,
                &plan,
                &names,
                rate,
                &progress,
            )?);
        }
        w_base += procs;
        lo = hi;
        // Wait until every worker so far has attempted all its connections.
        let mut last_print = Instant::now();
        while !progress
            .lock()
            .map(|p| p.iter().take(w_base).all(|x| x.ready))
            .unwrap_or(false)
        {
            if last_print.elapsed() >= Duration::from_secs(1) {
                last_print = Instant::now();
                let opened: u64 = progress
                    .lock()
                    .map(|p| p.iter().map(|x| x.opened).sum())
                    .unwrap_or(0);
                eprintln!("connecting: {opened}/{hi} open");
            }
            std::thread::sleep(Duration::from_millis(20));
            if stage_start.elapsed() > Duration::from_secs(600) {
                bail!("connections were not all attempted within 10 minutes");
            }
        }
        connect_secs += stage_start.elapsed().as_secs_f64();
        let opened_now: u64 = progress
            .lock()
            .map(|p| p.iter().map(|x| x.opened).sum())
            .unwrap_or(0);
        if staged {
            // Let the server finish what the last handshakes started before reading its RSS.
            std::thread::sleep(Duration::from_secs(1));
        }
        rss_open = rss_of(&pids);
        kern_open = proc_stat::tcp_kernel_bytes();
        eprintln!("{opened_now} connections open");
        steps.push(Step {
            opened: opened_now,
            rss: rss_open,
            server_bytes_per_connection: per_connection(rss0, rss_open, opened_now),
            marginal_bytes_per_connection: per_connection(
                prev_rss,
                rss_open,
                opened_now.saturating_sub(prev_opened),
            ),
            kernel_bytes_per_connection: per_connection(kern0, kern_open, opened_now),
        });
        prev_rss = rss_open;
        prev_opened = opened_now;
    }
    if a.hold > 0 {
        eprintln!("holding idle for {} s", a.hold);
        std::thread::sleep(Duration::from_secs(a.hold));
    }
    // Publish: every round, one message to every topic.
    let pub_cpu0 = cpu_of(&pids);
    let worker_pids: Vec<u32> = workers.iter().map(|w| w.child.id()).collect();
    let bench_cpu0 = cpu_of(&worker_pids);
    let woken0 = woken_of(&worker_pids);
    let pub_start = Instant::now();
    let mut target = a.api.clone();
    if let Some(secret) = &a.jwt_secret {
        target.authorization = Some(format!("Bearer {}", crate::wire::admin_token(secret)));
    }
    let mut api = Api::connect(&target)?;
    for round in 0..a.messages {
        let t0 = Instant::now();
        for chunk in names.chunks(200) {
            api.publish_batch(chunk, round, a.size)?;
        }
        if a.interval_ms > 0 {
            let next = t0 + Duration::from_millis(a.interval_ms);
            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            eprintln!("round {}/{}", round + 1, a.messages);
        }
    }
    let published: HashMap<String, u64> = names.iter().map(|n| (n.clone(), a.messages)).collect();
    let finish = Finish {
        published,
        deadline_ms: a.drain * 1000,
    };
    for w in &mut workers {
        writeln!(w.stdin, "{}", serde_json::to_string(&finish)?)?;
    }
    let mut reports = Vec::new();
    for w in &mut workers {
        loop {
            let line = w
                .lines
                .recv_timeout(Duration::from_secs(a.drain + 60))
                .context("a worker did not report")?;
            if let Ok(r) = serde_json::from_str::<Report>(&line) {
                reports.push(r);
                break;
            }
        }
    }
    // Every worker has reported and still holds its connections: the publishing ends here,
    // before the server handles 15,000 closes (70 ms of a TLS server's CPU, 3 % of a ticker's).
    let pub_secs = pub_start.elapsed().as_secs_f64();
    let pub_cpu = match (pub_cpu0, cpu_of(&pids)) {
        (Some(a0), Some(a1)) => Some(a1 - a0),
        _ => None,
    };
    let woken = woken0
        .zip(woken_of(&worker_pids))
        .map(|(w0, w1)| w1.saturating_sub(w0));
    workers.into_iter().for_each(Worker::let_go);
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let mut samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let mut latency = Latency::default();
    let mut means = Latency::default();
    let mut verdict = Verdict::default();
    let mut errors: HashMap<String, u64> = HashMap::new();
    let (mut clumped, mut opened, mut bench_cpu, mut tcp) = (0, 0, 0.0, 0);
    for r in &reports {
        latency.merge(&r.latency);
        means.merge(&r.connection_means);
        verdict.add(&r.verdict);
        for (k, v) in &r.errors {
            *errors.entry(k.clone()).or_default() += v;
        }
        clumped += r.clumped;
        opened += r.opened;
        tcp += r.tcp_connections;
        bench_cpu += r.cpu_seconds;
    }
    let expected: u64 = subscribers.iter().map(|s| s * a.messages).sum();
    let delivered = verdict.in_order + verdict.reordered;
    // The workers' own final counts close the plots, which a run shorter than their progress
    // interval would otherwise leave at zero.
    samples.push(Sample {
        t: started.elapsed().as_secs_f64(),
        cpu: cpu_of(&pids).unwrap_or(0.0),
        rss: rss_of(&pids).unwrap_or(0),
        tcp_kernel: proc_stat::tcp_kernel_bytes().unwrap_or(0),
        opened,
        received: delivered + verdict.duplicated,
    });
    let mut outcome = Outcome {
        connections: a.connections,
        opened,
        connect_rate: opened as f64 / f64::max(connect_secs, 1e-3),
        errors,
        expected,
        verdict,
        latency: latency.summary(),
        connection_means: means.summary(),
        clumped,
        deliveries_per_second: delivered as f64 / pub_secs.max(1e-3),
        server_cpu_per_million: pub_cpu
            .filter(|_| delivered > 0)
            .map(|c| c / delivered as f64 * 1e6),
        server_bytes_per_connection: per_connection(rss0, rss_open, opened),
        kernel_bytes_per_connection: per_connection(kern0, kern_open, opened),
        bench_cpu_seconds: bench_cpu,
        // Each worker's last report comes as it ends: its CPU then, less its CPU when
        // publishing began.
        bench_publish_cpu_seconds: bench_cpu0.map(|c0| (bench_cpu - c0).max(0.0)),
        bench_wakeups: woken,
        server_cpu_seconds: match (cpu0, cpu_of(&pids)) {
            (Some(x), Some(y)) => Some(y - x),
            _ => None,
        },
        samples,
        steps: if staged { steps } else { Vec::new() },
        churn: None,
        warnings: Vec::new(),
        http2: a.http2.then(|| crate::outcome::Http2 {
            protocol: if a.tls_ca.is_some() { "h2" } else { "h2c" },
            stream: if a.transport == TransportArg::Ws {
                "WebSocket"
            } else {
                "SSE stream"
            },
            streams_per_connection: a.streams_per_conn,
            tcp_connections: tcp,
        }),
    };
    outcome.warnings = crate::trust::warnings(&outcome, before, pub_cpu);
    Ok(outcome)
}

/// How long the sampler reads the server every 100 ms before slowing to every 500 ms.
const SAMPLE_FINE_FOR: Duration = Duration::from_secs(10);
