//! The coordinator: plans the connections, starts the worker processes, publishes, and reports.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde::Serialize;

use crate::check::Verdict;
use crate::proc_stat;
use crate::publisher::Api;
use crate::stats::{Latency, Summary};
use crate::worker::{Finish, Job, Progress, Report, Transport};

/// `clarion bench` options.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// A preset: idle (hold connections), burst (100 messages to one topic), ticker (one
    /// message every 2 s), topics (chat rooms: many topics, few subscribers each), churn
    /// (connect and disconnect in cycles, then check the server returns to its baseline).
    #[arg(long, value_enum)]
    pub scenario: Option<Scenario>,
    /// The server's client listener.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub target: SocketAddr,
    /// The server's API listener: host:port or http://host:port[/prefix].
    #[arg(long, default_value = "127.0.0.1:8081", value_parser = crate::publisher::parse_api)]
    pub api: crate::publisher::ApiTarget,
    /// Sample this server process's CPU, memory and open files; a comma-separated list samples
    /// several processes summed (nginx's master and workers, Pushpin's processes).
    #[arg(long, alias = "server-pids", value_delimiter = ',')]
    pub server_pid: Vec<u32>,
    /// Connections to open.
    #[arg(long, short = 'n', default_value_t = 1000)]
    pub connections: usize,
    /// ws, sse or poll.
    #[arg(long, value_enum, default_value = "ws")]
    pub transport: TransportArg,
    /// Topics the connections are spread over.
    #[arg(long, default_value_t = 1)]
    pub topics: usize,
    /// How connections pick topics: uniform (round robin) or skewed (a few popular topics).
    #[arg(long, value_enum, default_value = "uniform")]
    pub distribution: Distribution,
    /// Publishing rounds; each round sends one message to every topic.
    #[arg(long, short = 'm', default_value_t = 100)]
    pub messages: u64,
    /// Message size in bytes.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Milliseconds between rounds (0: as fast as the API accepts).
    #[arg(long, default_value_t = 0)]
    pub interval_ms: u64,
    /// Seconds to hold the connections idle before publishing.
    #[arg(long, default_value_t = 0)]
    pub hold: u64,
    /// New connections per second, all workers together (0: as fast as they complete).
    #[arg(long, default_value_t = 0)]
    pub connect_rate: u32,
    /// Open the connections in steps and measure the server's memory per connection at each,
    /// e.g. `--steps 1000,5000,15000` (the last step replaces --connections).
    #[arg(long, value_delimiter = ',')]
    pub steps: Vec<usize>,
    /// Topic names are this prefix and a number (churn gives each cycle its own, so a server
    /// that replays a topic's history to new subscribers cannot hand one cycle another's).
    #[arg(long, default_value = "bench", hide = true)]
    pub topic_prefix: String,
    /// Connect/disconnect cycles of the churn scenario.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// Worker processes (default: one per 10,000 connections, at least 2; per step with --steps).
    #[arg(long)]
    pub procs: Option<usize>,
    /// Seconds to wait for the last deliveries after publishing.
    #[arg(long, default_value_t = 30)]
    pub drain: u64,
    /// Write the full result here as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Write a self-contained HTML report with plots over time here.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
    /// Connect over TLS to --target, trusting the CA certificates in this PEM file (for
    /// `clarion cert --dev`, its `ca.pem`).
    #[arg(long)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The server name to ask for and verify over TLS.
    #[arg(long, default_value = "localhost")]
    pub tls_name: String,
    /// A text message every WebSocket client sends as soon as it is open: a peer's own
    /// protocol greeting, such as Centrifuge's connect command `{"id":1,"connect":{}}`.
    #[arg(long)]
    pub ws_hello: Option<String>,
    /// Worker processes connect from 127.0.0.B, 127.0.0.B+1, ...: another B keeps this run's
    /// source ports apart from another bench's on the same machine.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=250))]
    pub source_base: u8,
    /// Sample this broker process (redis-server) too: its CPU and memory are reported apart
    /// (the million scenario).
    #[arg(long)]
    pub broker_pid: Option<u32>,
}

impl BenchArgs {
    /// TLS for the workers' connections, from `--tls-ca` and `--tls-name`.
    pub fn tls_job(&self) -> anyhow::Result<Option<crate::tls_client::TlsJob>> {
        let Some(path) = &self.tls_ca else {
            return Ok(None);
        };
        Ok(Some(crate::tls_client::TlsJob {
            ca_pem: std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
            server_name: self.tls_name.clone(),
        }))
    }
}

/// Presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Hold connections idle for 10 s; one message at the end proves they are alive.
    Idle,
    /// 100 messages as fast as possible to one topic.
    Burst,
    /// One message every 2 s to every connection, for 60 s.
    Ticker,
    /// 10,000 topics (chat rooms), 20 rounds of one message per topic.
    Topics,
    /// Open N connections, deliver one message, close them all; repeat --rounds times, then
    /// check that the server's RSS and open files return to where they started.
    Churn,
    /// Hold N WebSocket connections (a million on one machine) for --hold seconds: every
    /// connection pings once a minute, one message a minute to a topic all follow, chat
    /// traffic on 10,000 rooms; every delivery and pong checked (docs/benchmarks.md, Million).
    Million,
}

/// Transports, as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    /// WebSocket.
    Ws,
    /// Server-Sent Events.
    Sse,
    /// Long-polling.
    Poll,
}

/// Topic choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Distribution {
    /// Connection i follows topic i mod T.
    Uniform,
    /// Topic popularity falls off like 1/rank.
    Skewed,
}

/// One sample of the server process.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Seconds since the run started.
    pub t: f64,
    /// Server CPU seconds so far.
    pub cpu: f64,
    /// Server RSS, bytes.
    pub rss: u64,
    /// Kernel TCP memory (whole machine), bytes.
    pub tcp_kernel: u64,
    /// Connections open (workers' last progress).
    pub opened: u64,
    /// Messages received so far.
    pub received: u64,
}

/// The result of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Connections asked for and opened.
    pub connections: usize,
    /// Opened.
    pub opened: u64,
    /// Connections per second while opening.
    pub connect_rate: f64,
    /// Errors by kind.
    pub errors: HashMap<String, u64>,
    /// Deliveries expected (messages × subscribers).
    pub expected: u64,
    /// Delivery verdicts.
    pub verdict: Verdict,
    /// Latency, microseconds.
    pub latency: Summary,
    /// Messages bunched behind another (ticker feeds).
    pub clumped: u64,
    /// Each connection's mean latency, microseconds, as percentiles over connections: a wide
    /// spread means the fan-out favours some subscribers over others every time.
    pub connection_means: Summary,
    /// Deliveries per second during publishing.
    pub deliveries_per_second: f64,
    /// Server CPU seconds per million deliveries.
    pub server_cpu_per_million: Option<f64>,
    /// Server user-space bytes per connection (RSS growth / opened).
    pub server_bytes_per_connection: Option<f64>,
    /// Kernel TCP bytes per connection (growth / opened; both ends of loopback count).
    pub kernel_bytes_per_connection: Option<f64>,
    /// The workers' own CPU seconds.
    pub bench_cpu_seconds: f64,
    /// The load client's CPU seconds while publishing and draining (the window of
    /// `server_cpu_per_million`).
    pub bench_publish_cpu_seconds: Option<f64>,
    /// Server CPU seconds over the run.
    pub server_cpu_seconds: Option<f64>,
    /// Samples over time.
    pub samples: Vec<Sample>,
    /// Memory per connection at each step of `--steps`.
    pub steps: Vec<Step>,
    /// What connect/disconnect cycles left behind (churn scenario).
    pub churn: Option<Churn>,
    /// Figures measured with too little signal to believe, and why ([`crate::trust`]).
    pub warnings: Vec<String>,
}

/// The server's memory once a step's connections are all open.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Step {
    /// Connections open at this step.
    pub opened: u64,
    /// Server RSS, bytes.
    pub rss: Option<u64>,
    /// Server user-space bytes per connection: (RSS now - RSS before any) / open.
    pub server_bytes_per_connection: Option<f64>,
    /// The growth since the previous step divided by the connections it added.
    pub marginal_bytes_per_connection: Option<f64>,
    /// Kernel TCP bytes per connection (both loopback ends).
    pub kernel_bytes_per_connection: Option<f64>,
}

/// The server before and after connect/disconnect cycles.
#[derive(Debug, Clone, Serialize)]
pub struct Churn {
    /// Cycles run.
    pub rounds: u32,
    /// Connections opened in each cycle.
    pub opened: Vec<u64>,
    /// Connections per second in each cycle.
    pub connect_rates: Vec<f64>,
    /// Server RSS before the first cycle and after the last (settled), bytes.
    pub rss_baseline: Option<u64>,
    /// RSS after the last cycle.
    pub rss_after: Option<u64>,
    /// Highest RSS seen while connections were open.
    pub rss_peak: Option<u64>,
    /// Open files of the server before the first cycle.
    pub fds_baseline: Option<u64>,
    /// Open files after the last cycle (once they stop falling, at most 10 s).
    pub fds_after: Option<u64>,
    /// Whether the open files came back to the baseline.
    pub fds_returned: bool,
}

/// How many bytes `after` is over `before`, per connection; `None` when unmeasured.
pub fn per_connection(before: Option<u64>, after: Option<u64>, connections: u64) -> Option<f64> {
    match (before, after) {
        (Some(x), Some(y)) if connections > 0 => Some((y as f64 - x as f64) / connections as f64),
        _ => None,
    }
}

/// The connection counts of each step: `--steps` (sorted, deduplicated, zero dropped), or one
/// step of all connections.
pub fn stages(steps: &[usize], connections: usize) -> Vec<usize> {
    let mut s: Vec<usize> = steps.iter().copied().filter(|&n| n > 0).collect();
    s.sort_unstable();
    s.dedup();
    if s.is_empty() {
        s.push(connections);
    }
    s
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

/// Runs a benchmark and prints its report.
pub fn main(mut a: BenchArgs) -> anyhow::Result<()> {
    crate::scenario::apply_scenario(&mut a);
    if a.scenario == Some(Scenario::Million) {
        return crate::million::main(&a);
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
        let title = format!(
            "clarion bench: {} {transport} connections, {} topics, {} rounds",
            a.connections, a.topics, a.messages
        );
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

/// The topic of connection `i`.
pub fn topic_of(i: usize, topics: usize, dist: Distribution) -> usize {
    let t = topics.max(1);
    match dist {
        Distribution::Uniform => i % t,
        Distribution::Skewed => {
            // Harmonic weights: topic k gets a share proportional to 1/(k+1).
            let h: f64 = (1..=t).map(|k| 1.0 / k as f64).sum();
            let x = ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11) as f64
                / (1u64 << 53) as f64
                * h;
            let mut acc = 0.0;
            for k in 0..t {
                acc += 1.0 / (k + 1) as f64;
                if x < acc {
                    return k;
                }
            }
            t - 1
        }
    }
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
    };
    let mut child = Command::new(exe)
        .args(["bench-worker"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start a worker process")?;
    let mut stdin = child.stdin.take().context("worker stdin")?;
    writeln!(stdin, "{}", serde_json::to_string(&job)?)?;
    let stdout = child.stdout.take().context("worker stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let slot = Arc::clone(progress);
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(p) = serde_json::from_str::<Progress>(&line) {
                if let Ok(mut all) = slot.lock() {
                    if let Some(s) = all.get_mut(w) {
                        *s = p;
                    }
                }
            } else if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok(Worker {
        child,
        stdin,
        lines: rx,
    })
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
    let pub_start = Instant::now();
    let mut api = Api::connect(&a.api)?;
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
        let _ = w.child.wait();
    }
    let pub_secs = pub_start.elapsed().as_secs_f64();
    let pub_cpu = match (pub_cpu0, cpu_of(&pids)) {
        (Some(a0), Some(a1)) => Some(a1 - a0),
        _ => None,
    };
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let mut samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let mut latency = Latency::default();
    let mut means = Latency::default();
    let mut verdict = Verdict::default();
    let mut errors: HashMap<String, u64> = HashMap::new();
    let (mut clumped, mut opened, mut bench_cpu) = (0, 0, 0.0);
    for r in &reports {
        latency.merge(&r.latency);
        means.merge(&r.connection_means);
        verdict.add(&r.verdict);
        for (k, v) in &r.errors {
            *errors.entry(k.clone()).or_default() += v;
        }
        clumped += r.clumped;
        opened += r.opened;
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
        server_cpu_seconds: match (cpu0, cpu_of(&pids)) {
            (Some(x), Some(y)) => Some(y - x),
            _ => None,
        },
        samples,
        steps: if staged { steps } else { Vec::new() },
        churn: None,
        warnings: Vec::new(),
    };
    outcome.warnings = crate::trust::warnings(&outcome, before, pub_cpu);
    Ok(outcome)
}

/// How long the sampler reads the server every 100 ms before slowing to every 500 ms.
const SAMPLE_FINE_FOR: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skewed_topics_favour_the_first() {
        let mut counts = [0usize; 10];
        for i in 0..10_000 {
            counts[topic_of(i, 10, Distribution::Skewed)] += 1;
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[9], "{counts:?}");
        assert!(counts.iter().all(|&c| c > 0));
        assert_eq!(topic_of(7, 3, Distribution::Uniform), 1);
    }

    #[test]
    fn steps_are_sorted_and_default_to_all_connections() {
        assert_eq!(
            stages(&[15000, 1000, 5000, 1000, 0], 7),
            vec![1000, 5000, 15000]
        );
        assert_eq!(stages(&[], 700), vec![700]);
    }

    #[test]
    fn bytes_per_connection_need_both_readings_and_connections() {
        assert_eq!(per_connection(Some(1000), Some(3000), 10), Some(200.0));
        assert_eq!(per_connection(Some(3000), Some(1000), 10), Some(-200.0));
        assert_eq!(per_connection(None, Some(1000), 10), None);
        assert_eq!(per_connection(Some(1), Some(2), 0), None);
    }

    #[test]
    fn scenarios_set_their_shape() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let parse = |args: &[&str]| {
            let mut a = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
                .map(|c| c.bench);
            if let Ok(a) = a.as_mut() {
                crate::scenario::apply_scenario(a);
            }
            a
        };
        let a = parse(&["--server-pid", "12,34", "--steps", "1000,5000"]).ok();
        assert_eq!(a.as_ref().map(|a| a.server_pid.clone()), Some(vec![12, 34]));
        assert_eq!(a.map(|a| a.connections), Some(5000));
        let a = parse(&["--server-pid", "9", "--scenario", "churn", "-n", "300"]).ok();
        assert_eq!(a.as_ref().map(|a| a.server_pid.clone()), Some(vec![9]));
        assert_eq!(a.map(|a| (a.messages, a.rounds)), Some((1, 5)));
        assert!(parse(&["--server-pid", "x"]).is_err());
        // The ticker's pace is 2 s unless --interval-ms says otherwise (it once overrode it).
        let a = parse(&["--scenario", "ticker"]).ok();
        assert_eq!(a.map(|a| (a.interval_ms, a.messages)), Some((2000, 30)));
        let a = parse(&["--scenario", "ticker", "--interval-ms", "500", "-m", "30"]).ok();
        assert_eq!(a.map(|a| (a.interval_ms, a.messages)), Some((500, 30)));
    }
}
