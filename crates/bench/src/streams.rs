//! The streams scenario (issue 52's AI token streams): `--topics` streams of `--fragments`
//! fragments each, `--fragment-rate` fragments a second per stream, `--subscribers` clarion.v1
//! WebSockets per stream; `--resumers` of them close at a random fragment and resume from the
//! last id they saw. Each repeat runs a stream phase and a plain phase of the same shape (the
//! same fragments published as plain messages, on fresh topics), in alternating order, and the
//! server's CPU per delivery of each is compared. Every event every subscriber receives is
//! checked ([`crate::streams_check`]); any mismatch fails the run.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::plan::BenchArgs;
use crate::proc_stat;
use crate::publisher::{Api, ApiTarget};
use crate::streams_check::{fragments, Resumed, Rng};
use crate::streams_subs::{SubsJob, SubsOutcome};

/// The most sockets one bench process opens: the subscribers, the resumers' second
/// connections and the publishers, under the 20,000 open files a process is allowed here.
const MAX_SOCKETS: usize = 19_000;

/// One phase's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Phase {
    /// `stream` or `plain`.
    pub kind: &'static str,
    pub repeat: u32,
    /// Fragments (or plain messages) published, and the rate the publishers held (per second,
    /// all streams together), from the first publish to the last answer.
    pub published: u64,
    pub publish_rate: f64,
    /// Frames delivered (messages and appends), and what a perfect run delivers live.
    pub deliveries: u64,
    pub subscribers: usize,
    pub complete: usize,
    /// Server CPU seconds from the first publish to the last delivery, and per delivery.
    pub server_cpu_seconds: Option<f64>,
    pub server_cpu_per_delivery_us: Option<f64>,
    /// This process's CPU seconds over the same time (publishers and subscribers).
    pub bench_cpu_seconds: f64,
    /// Each resume, summed: how many, messages, `data` bytes, frame bytes, text so far.
    pub resumes: u64,
    pub resume: Resumed,
    pub failures: Vec<String>,
    pub failure_count: usize,
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StreamsOutcome {
    pub streams: usize,
    pub fragments: usize,
    pub fragment_rate: f64,
    pub subscribers_per_stream: usize,
    pub resumers: usize,
    pub publishers: usize,
    /// Fragments per publish request (1: each its own request).
    pub fragment_batch: usize,
    /// The subscribers negotiated permessage-deflate: frame bytes are as received, compressed.
    pub deflate: bool,
    pub phases: Vec<Phase>,
    /// Per repeat: stream CPU per delivery / plain CPU per delivery; and their median.
    pub cpu_ratios: Vec<f64>,
    pub cpu_ratio_median: Option<f64>,
    /// Over every stream phase's resumes: messages per resume, `data` bytes and whole frame
    /// bytes per byte of the text so far.
    pub resume_messages_per_resume: Option<f64>,
    pub resume_data_vs_text: Option<f64>,
    pub resume_frame_vs_text: Option<f64>,
    /// The plain phases' resumes, for comparison: messages per resume.
    pub plain_resume_messages_per_resume: Option<f64>,
    /// Every delivery checked and every resume exact.
    pub passed: bool,
}

/// Runs the scenario, prints its report, writes `--json`; fails when any check failed.
pub fn main(a: &BenchArgs) -> anyhow::Result<()> {
    let subs = a.topics.saturating_mul(a.subscribers);
    if subs + a.resumers + a.publishers > MAX_SOCKETS {
        bail!(
            "{} subscribers, {} resumers and {} publishers pass the {MAX_SOCKETS} sockets one \
             process may open: fewer --topics or --subscribers",
            subs,
            a.resumers,
            a.publishers
        );
    }
    if a.fragments < 2 || a.topics == 0 || a.subscribers == 0 || a.publishers == 0 {
        bail!("the streams scenario needs --fragments >= 2, and --topics, --subscribers and --publishers >= 1");
    }
    if a.resumers > subs {
        bail!(
            "--resumers {} is more than the {subs} subscribers",
            a.resumers
        );
    }
    if !(a.fragment_rate > 0.0 && a.fragment_rate.is_finite()) {
        bail!("--fragment-rate must be a positive number of fragments a second");
    }
    let scripts: Arc<Vec<Vec<String>>> = Arc::new(
        (0..a.topics)
            .map(|i| fragments(a.seed, i, a.fragments))
            .collect(),
    );
    let mut target = a.api.clone();
    if let Some(secret) = &a.jwt_secret {
        target.authorization = Some(format!("Bearer {}", crate::wire::admin_token(secret)));
    }
    let mut phases = Vec::new();
    let mut ratios = Vec::new();
    let mut rng = Rng::new(a.seed);
    let base = u32::from(a.source_base);
    for r in 0..a.repeats.max(1) {
        let order = if r % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        let mut cpu = [None, None];
        for (k, &stream) in order.iter().enumerate() {
            // A source address per phase: the last phase's closed ports wait in TIME_WAIT.
            let ip = 1 + (base - 1 + r * 2 + k as u32) % 254;
            let source = IpAddr::from([127, 0, 0, ip as u8]);
            eprintln!(
                "repeat {}/{}: {} phase",
                r + 1,
                a.repeats.max(1),
                if stream { "stream" } else { "plain" }
            );
            let p = phase(a, &target, &scripts, stream, r, source, &mut rng)?;
            eprintln!(
                "  {} deliveries, {}/{} subscribers complete, published {:.0}/s, server CPU {} us per delivery",
                p.deliveries,
                p.complete,
                p.subscribers,
                p.publish_rate,
                p.server_cpu_per_delivery_us
                    .map_or("?".into(), |c| format!("{c:.2}"))
            );
            cpu[usize::from(!stream)] = p.server_cpu_per_delivery_us;
            phases.push(p);
            // Let the server close the phase's connections before the next one is measured.
            std::thread::sleep(Duration::from_secs(1));
        }
        if let [Some(s), Some(p)] = cpu {
            if p > 0.0 {
                ratios.push(s / p);
            }
        }
    }
    let outcome = summary(a, phases, ratios);
    print_text(&outcome);
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&outcome)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if !outcome.passed {
        bail!("FAILED: not every subscriber received exactly what was published (see above)");
    }
    Ok(())
}

/// One phase: subscribers open, then the publishers publish every fragment at the pace asked
/// for, and the subscribers read until they have everything.
fn phase(
    a: &BenchArgs,
    target: &ApiTarget,
    scripts: &Arc<Vec<Vec<String>>>,
    stream: bool,
    repeat: u32,
    source: IpAddr,
    rng: &mut Rng,
) -> anyhow::Result<Phase> {
    let kind = if stream { "stream" } else { "plain" };
    let topics: Vec<String> = (0..a.topics)
        .map(|i| format!("{}.{repeat}.{kind}.{i}", a.topic_prefix))
        .collect();
    let subs = a.topics * a.subscribers;
    // Distinct subscribers, each closing after a random fragment short of the last and coming
    // back once a later one (up to the last) has been published.
    let mut resumers: Vec<(usize, usize, usize)> = Vec::new();
    let mut chosen = vec![false; subs];
    let mut tries = 0;
    while resumers.len() < a.resumers && tries < a.resumers * 100 + 1000 {
        tries += 1;
        let i = rng.below(subs);
        if let Some(c) = chosen.get_mut(i).filter(|c| !**c) {
            *c = true;
            let at = 1 + rng.below(a.fragments - 1);
            resumers.push((i, at, at + 1 + rng.below(a.fragments - at)));
        }
    }
    let acked: Arc<Vec<AtomicUsize>> =
        Arc::new((0..a.topics).map(|_| AtomicUsize::new(0)).collect());
    let published = Arc::new(AtomicBool::new(false));
    let planned = a.fragments as f64 / a.fragment_rate;
    let job = SubsJob {
        target: a.target,
        source,
        topics: topics.clone(),
        scripts: Arc::clone(scripts),
        per_topic: a.subscribers,
        stream,
        resumers,
        acked: Arc::clone(&acked),
        published: Arc::clone(&published),
        drain: a.drain,
        bound: (planned * 10.0) as u64 + a.drain + 600,
        server_pids: a.server_pid.clone(),
        deflate: a.deflate,
    };
    let (ready_tx, ready_rx) = mpsc::channel();
    let subscribers = std::thread::spawn(move || crate::streams_subs::run(&job, &ready_tx));
    match ready_rx.recv_timeout(Duration::from_secs(600)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => bail!("{e}"),
        Err(_) => bail!("the subscribers did not open within 10 minutes"),
    }
    let cpu0 = proc_stat::sum_over(&a.server_pid, proc_stat::cpu_seconds);
    let bench0 = proc_stat::own_cpu_seconds();
    let start = Instant::now();
    let mut handles = Vec::new();
    for p in 0..a.publishers {
        let mine: Vec<usize> = (0..a.topics).filter(|i| i % a.publishers == p).collect();
        let (topics, scripts, acked) = (topics.clone(), Arc::clone(scripts), Arc::clone(&acked));
        let target = target.clone();
        let pace = (a.fragment_rate, a.fragment_batch);
        handles.push(std::thread::spawn(move || {
            publish(
                &target, &mine, &topics, &scripts, &acked, stream, pace, start,
            )
        }));
    }
    let mut count = 0u64;
    let mut errors = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(n)) => count += n,
            Ok(Err(e)) => errors.push(format!("publisher: {e:#}")),
            Err(_) => errors.push("a publisher panicked".into()),
        }
    }
    let publish_secs = start.elapsed().as_secs_f64();
    published.store(true, Ordering::Relaxed);
    let out: SubsOutcome = subscribers
        .join()
        .map_err(|_| anyhow::anyhow!("the subscriber thread panicked"))?;
    let bench_cpu = proc_stat::own_cpu_seconds() - bench0;
    let server_cpu = cpu0.zip(out.server_cpu_end).map(|(x, y)| y - x);
    let mut resume = Resumed::default();
    for r in &out.resumes {
        resume.messages += r.messages;
        resume.data_bytes += r.data_bytes;
        resume.frame_bytes += r.frame_bytes;
        resume.text_bytes += r.text_bytes;
    }
    let mut failures = errors.clone();
    failures.extend(out.failures.iter().cloned());
    Ok(Phase {
        kind,
        repeat,
        published: count,
        publish_rate: count as f64 / publish_secs.max(1e-9),
        deliveries: out.deliveries,
        subscribers: out.subscribers,
        complete: out.complete,
        server_cpu_seconds: server_cpu,
        server_cpu_per_delivery_us: server_cpu
            .filter(|_| out.deliveries > 0)
            .map(|c| c * 1e6 / out.deliveries as f64),
        bench_cpu_seconds: bench_cpu,
        resumes: out.resumes.len() as u64,
        resume,
        failure_count: out.failure_count + errors.len(),
        failures,
    })
}

/// What the server answers for one fragment (or message).
#[derive(serde::Deserialize)]
struct Answer {
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    seq: Option<usize>,
    #[serde(default)]
    error: Option<String>,
}

/// A batch's answer.
#[derive(serde::Deserialize)]
struct BatchAnswer {
    results: Vec<Answer>,
}

/// One publisher: the streams `mine`, fragment by fragment at `rate` a second each, over one
/// kept-alive connection, `batch` fragments per request; answers how many it published. Past
/// the pace it publishes as fast as the server answers (the achieved rate is reported).
#[allow(clippy::too_many_arguments)]
fn publish(
    target: &ApiTarget,
    mine: &[usize],
    topics: &[String],
    scripts: &[Vec<String>],
    acked: &[AtomicUsize],
    stream: bool,
    (rate, batch): (f64, usize),
    start: Instant,
) -> anyhow::Result<u64> {
    let mut api = Api::connect(target)?;
    let mut ids: Vec<String> = vec![String::new(); mine.len()];
    let fragments = scripts.first().map_or(0, Vec::len);
    let mut count = 0;
    for j in 0..fragments {
        let due = start + Duration::from_secs_f64(j as f64 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        // (k: the stream's place in `mine`, i: its topic's index, topic, text)
        let due: Vec<(usize, usize, &str, &str)> = mine
            .iter()
            .enumerate()
            .filter_map(|(k, &i)| {
                let topic = topics.get(i)?;
                let text = scripts.get(i)?.get(j)?;
                Some((k, i, topic.as_str(), text.as_str()))
            })
            .collect();
        for chunk in due.chunks(batch.max(1)) {
            let answers: Vec<Answer> = if batch <= 1 {
                let mut out = Vec::new();
                for &(k, _, topic, text) in chunk {
                    let id = ids.get(k).map_or("", String::as_str);
                    let path = single_path(stream, j, fragments, topic, id);
                    let body = api.post_text(&path, text)?;
                    out.push(
                        serde_json::from_slice(body)
                            .with_context(|| format!("the answer to {path} is not JSON"))?,
                    );
                }
                out
            } else {
                let items: Vec<serde_json::Value> = chunk
                    .iter()
                    .map(|&(k, _, topic, text)| {
                        let id = ids.get(k).map_or("", String::as_str);
                        batch_item(stream, j, fragments, topic, text, id)
                    })
                    .collect();
                let body = serde_json::json!({ "messages": items }).to_string();
                let answer: BatchAnswer = serde_json::from_slice(api.post_batch(&body)?)
                    .context("the answer to a batch is not its results")?;
                answer.results
            };
            if answers.len() != chunk.len() {
                bail!("{} answers to {} fragments", answers.len(), chunk.len());
            }
            for (&(k, i, topic, _), answer) in chunk.iter().zip(answers) {
                if let Some(e) = answer.error {
                    bail!("fragment {} of {topic} was refused: {e}", j + 1);
                }
                if stream {
                    if answer.seq != Some(j + 1) {
                        bail!(
                            "fragment {} of {topic} was answered seq {:?}",
                            j + 1,
                            answer.seq
                        );
                    }
                    if j == 0 {
                        if let (Some(id), Some(s)) = (ids.get_mut(k), answer.stream) {
                            *id = s;
                        }
                    }
                }
                if let Some(a) = acked.get(i) {
                    a.store(j + 1, Ordering::Release);
                }
                count += 1;
            }
        }
    }
    Ok(count)
}

/// The path of fragment `j` (of `fragments`) published alone: a plain publish, the open, an
/// append, the last append.
fn single_path(stream: bool, j: usize, fragments: usize, topic: &str, id: &str) -> String {
    match (stream, j) {
        (false, _) => format!("/publish/{topic}"),
        (true, 0) => format!("/publish/{topic}?stream=open"),
        (true, _) => {
            let done = if j + 1 == fragments { "&done=1" } else { "" };
            format!("/publish/{topic}?append_to={id}{done}")
        }
    }
}

/// Fragment `j` as a batch's item.
fn batch_item(
    stream: bool,
    j: usize,
    fragments: usize,
    topic: &str,
    text: &str,
    id: &str,
) -> serde_json::Value {
    match (stream, j) {
        (false, _) => serde_json::json!({ "topic": topic, "data": text }),
        (true, 0) => serde_json::json!({ "topic": topic, "data": text, "stream": "open" }),
        (true, _) => serde_json::json!({
            "topic": topic, "data": text, "append_to": id, "done": j + 1 == fragments
        }),
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => v.get(n / 2).copied(),
        _ => Some((v.get(n / 2 - 1)? + v.get(n / 2)?) / 2.0),
    }
}

fn summary(a: &BenchArgs, phases: Vec<Phase>, ratios: Vec<f64>) -> StreamsOutcome {
    let sum = |stream: bool| {
        let mut r = (0u64, Resumed::default());
        for p in phases.iter().filter(|p| (p.kind == "stream") == stream) {
            r.0 += p.resumes;
            r.1.messages += p.resume.messages;
            r.1.data_bytes += p.resume.data_bytes;
            r.1.frame_bytes += p.resume.frame_bytes;
            r.1.text_bytes += p.resume.text_bytes;
        }
        r
    };
    let (n, s) = sum(true);
    let (pn, ps) = sum(false);
    let per = |x: u64, y: u64| (y > 0).then(|| x as f64 / y as f64);
    let passed = phases
        .iter()
        .all(|p| p.failure_count == 0 && p.complete == p.subscribers);
    StreamsOutcome {
        streams: a.topics,
        fragments: a.fragments,
        fragment_rate: a.fragment_rate,
        subscribers_per_stream: a.subscribers,
        resumers: a.resumers,
        publishers: a.publishers,
        fragment_batch: a.fragment_batch.max(1),
        deflate: a.deflate,
        cpu_ratio_median: median(ratios.clone()),
        cpu_ratios: ratios,
        resume_messages_per_resume: per(s.messages, n),
        resume_data_vs_text: per(s.data_bytes, s.text_bytes),
        resume_frame_vs_text: per(s.frame_bytes, s.text_bytes),
        plain_resume_messages_per_resume: per(ps.messages, pn),
        passed,
        phases,
    }
}

fn print_text(o: &StreamsOutcome) {
    println!(
        "streams: {} streams x {} fragments at {} /s each, {} subscribers per stream{}, {} resumers, {} publishers, {} per request",
        o.streams, o.fragments, o.fragment_rate, o.subscribers_per_stream,
        if o.deflate { " (permessage-deflate)" } else { "" },
        o.resumers, o.publishers, o.fragment_batch
    );
    let asked = o.streams as f64 * o.fragment_rate;
    for p in &o.phases {
        println!(
            "repeat {} {:6}: published {} at {:.0}/s (asked {asked:.0}/s), {} deliveries, {}/{} subscribers complete, server CPU {}, bench CPU {:.2} s",
            p.repeat + 1,
            p.kind,
            p.published,
            p.publish_rate,
            p.deliveries,
            p.complete,
            p.subscribers,
            p.server_cpu_per_delivery_us
                .map_or("not sampled (--server-pid)".into(), |c| format!("{c:.2} us per delivery")),
            p.bench_cpu_seconds
        );
        for f in &p.failures {
            println!("  FAILED: {f}");
        }
        if p.failure_count > p.failures.len() {
            println!("  ... {} failures in all", p.failure_count);
        }
    }
    let f = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.3}"));
    println!(
        "server CPU per delivered fragment / per plain message: median {} (repeats: {})",
        f(o.cpu_ratio_median),
        o.cpu_ratios
            .iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "resume inside a stream: {} messages per resume, data bytes / text so far {}, whole frame{} / text so far {} (plain messages: {} messages per resume)",
        f(o.resume_messages_per_resume),
        f(o.resume_data_vs_text),
        if o.deflate { " as received (compressed)" } else { "" },
        f(o.resume_frame_vs_text),
        f(o.plain_resume_messages_per_resume)
    );
    println!(
        "verdict: {}",
        if o.passed {
            "PASS (every delivery and every resume exact)"
        } else {
            "FAIL"
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
