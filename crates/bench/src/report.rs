//! Reports of a run: the text summary printed at the end ([`print_text`]), and a
//! self-contained HTML report: the summary table and SVG plots over time (connections open,
//! server RSS, deliveries per second, kernel memory) and the latency percentiles. No scripts, no
//! external files: it opens anywhere and can be attached to an issue.

use std::fmt::Write as _;

use crate::outcome::{Http2, Outcome, Sample};
use crate::plan::BenchArgs;

const W: f64 = 640.0;
const H: f64 = 200.0;
const PAD: f64 = 40.0;

/// Renders `o` as an HTML page.
pub fn html(title: &str, o: &Outcome) -> String {
    let mut out = String::with_capacity(32 * 1024);
    let _ = write!(
        out,
        "<!doctype html><meta charset=utf-8><title>{t}</title>\
         <style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:60em}}\
         td,th{{padding:2px 10px;text-align:right}}th{{text-align:left}}\
         svg{{background:#fafafa;border:1px solid #ddd;margin:8px 0}}</style>\
         <h1>{t}</h1>",
        t = escape(title)
    );
    let v = &o.verdict;
    let l = &o.latency;
    let rows: Vec<(&str, String)> = vec![
        (
            "connections open",
            format!("{} / {}", o.opened, o.connections),
        ),
        ("connect rate", format!("{:.0}/s", o.connect_rate)),
        ("deliveries expected", o.expected.to_string()),
        ("in order", v.in_order.to_string()),
        ("missing", v.missing.to_string()),
        ("duplicated", v.duplicated.to_string()),
        ("reordered", v.reordered.to_string()),
        ("clumped", o.clumped.to_string()),
        (
            "latency p50 / p99 / max",
            format!("{:.2} / {:.2} / {:.2} ms", ms(l.p50), ms(l.p99), ms(l.max)),
        ),
        ("deliveries/s", format!("{:.0}", o.deliveries_per_second)),
        (
            "server CPU-s per 1M deliveries",
            opt(o.server_cpu_per_million),
        ),
        (
            "server bytes per connection",
            opt(o.server_bytes_per_connection),
        ),
        (
            "kernel bytes per connection",
            opt(o.kernel_bytes_per_connection),
        ),
        (
            "load generator CPU-s",
            format!("{:.1}", o.bench_cpu_seconds),
        ),
    ];
    let mut rows = rows;
    if let Some(h) = &o.http2 {
        rows.insert(0, ("protocol", protocol(h)));
    }
    out.push_str("<table>");
    for (k, val) in rows {
        let _ = write!(out, "<tr><th>{k}<td>{}", escape(&val));
    }
    out.push_str("</table>");
    if !o.warnings.is_empty() {
        out.push_str("<h2>Warnings</h2><ul>");
        for w in &o.warnings {
            let _ = write!(out, "<li>{}", escape(w));
        }
        out.push_str("</ul>");
    }
    let s = &o.samples;
    chart(&mut out, "Connections open", s, |x| x.opened as f64, "");
    chart(
        &mut out,
        "Server RSS",
        s,
        |x| x.rss as f64 / 1048576.0,
        " MiB",
    );
    // The rate starts from zero at the first sample, so a run with only its first and final
    // samples (well under a second) still draws its deliveries.
    let start = s.first().map(|x| Sample { received: 0, ..*x });
    let rate: Vec<Sample> = start
        .into_iter()
        .chain(s.windows(2).filter_map(|w| match w {
            [a, b] if b.t > a.t => Some(Sample {
                received: ((b.received.saturating_sub(a.received)) as f64 / (b.t - a.t)) as u64,
                ..*b
            }),
            _ => None,
        }))
        .collect();
    chart(
        &mut out,
        "Deliveries per second",
        &rate,
        |x| x.received as f64,
        "/s",
    );
    chart(
        &mut out,
        "Kernel slab + TCP memory",
        s,
        |x| x.tcp_kernel as f64 / 1048576.0,
        " MiB",
    );
    // Latency percentiles as bars.
    let bars = [
        ("p50", l.p50),
        ("p90", l.p90),
        ("p99", l.p99),
        ("p99.9", l.p999),
        ("max", l.max),
    ];
    let top = bars.iter().map(|b| b.1).max().unwrap_or(1).max(1) as f64;
    let _ = write!(out, "<h2>Latency</h2><svg width={W} height={H}>");
    for (i, (name, v)) in bars.iter().enumerate() {
        let h = (*v as f64 / top) * (H - 2.0 * PAD);
        let x = PAD + i as f64 * 110.0;
        let _ = write!(
            out,
            "<rect x={x:.0} y={y:.0} width=80 height={h:.0} fill=#4a7>\
             </rect><text x={x:.0} y={ty:.0}>{name} {ms:.1} ms</text>",
            y = H - PAD - h,
            ty = H - PAD + 16.0,
            ms = ms(*v)
        );
    }
    out.push_str("</svg>");
    out
}

fn chart(out: &mut String, title: &str, s: &[Sample], f: impl Fn(&Sample) -> f64, unit: &str) {
    let _ = write!(out, "<h2>{}</h2>", escape(title));
    if s.len() < 2 {
        out.push_str("<p>not enough samples</p>");
        return;
    }
    let t_max = s.iter().map(|x| x.t).fold(0.0, f64::max).max(1e-3);
    let y_max = s.iter().map(&f).fold(0.0, f64::max).max(1e-9);
    let points: Vec<String> = s
        .iter()
        .map(|x| {
            let px = PAD + x.t / t_max * (W - 2.0 * PAD);
            let py = H - PAD - f(x) / y_max * (H - 2.0 * PAD);
            format!("{px:.1},{py:.1}")
        })
        .collect();
    let _ = write!(
        out,
        "<svg width={W} height={H}><polyline fill=none stroke=#36c stroke-width=2 points=\"{}\"/>\
         <text x=4 y={top}>{y_max:.1}{unit}</text><text x=4 y={bottom}>0</text>\
         <text x={right} y={bottom}>{t_max:.0} s</text></svg>",
        points.join(" "),
        top = PAD,
        bottom = H - PAD + 16.0,
        right = W - PAD - 30.0,
        unit = escape(unit),
    );
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn opt(x: Option<f64>) -> String {
    x.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.1}"))
}

/// The protocol line of an HTTP/2 run: streams per connection and connections.
fn protocol(h: &Http2) -> String {
    format!(
        "{}, {} {}{} per connection, {} connections",
        h.protocol,
        h.streams_per_connection,
        h.stream,
        if h.streams_per_connection == 1 {
            ""
        } else {
            "s"
        },
        h.tcp_connections
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Prints the text report of a run to standard output.
pub fn print_text(a: &BenchArgs, o: &Outcome) {
    let v = &o.verdict;
    let l = &o.latency;
    let opt = |x: Option<f64>, unit: &str| {
        x.map_or_else(|| "n/a".to_owned(), |x| format!("{x:.1}{unit}"))
    };
    println!(
        "connections      {}/{} open, {:.0}/s",
        o.opened, o.connections, o.connect_rate
    );
    if let Some(h) = &o.http2 {
        println!("protocol         {}", protocol(h));
    }
    if !o.errors.is_empty() {
        println!("errors           {:?}", o.errors);
    }
    println!(
        "deliveries       {} expected: {} in order, {} missing, {} duplicated, {} reordered",
        o.expected, v.in_order, v.missing, v.duplicated, v.reordered
    );
    println!(
        "latency (ms)     p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
        l.p50 as f64 / 1e3,
        l.p90 as f64 / 1e3,
        l.p99 as f64 / 1e3,
        l.p999 as f64 / 1e3,
        l.max as f64 / 1e3
    );
    let m = &o.connection_means;
    if m.count > 0 {
        println!(
            "per-connection   mean latency (ms) over connections: p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
            m.p50 as f64 / 1e3,
            m.p90 as f64 / 1e3,
            m.p99 as f64 / 1e3,
            m.max as f64 / 1e3
        );
    }
    if a.interval_ms > 0 {
        println!("clumps           {} messages arrived bunched", o.clumped);
    }
    println!(
        "throughput       {:.0} deliveries/s",
        o.deliveries_per_second
    );
    println!(
        "server CPU       {} per million deliveries",
        opt(o.server_cpu_per_million, " s")
    );
    println!(
        "server memory    {} per connection (user space)",
        opt(o.server_bytes_per_connection, " B")
    );
    println!(
        "kernel TCP mem   {} per connection (both loopback ends)",
        opt(o.kernel_bytes_per_connection, " B")
    );
    for st in &o.steps {
        println!(
            "step {:>7}     {} per connection, {} marginal, RSS {}",
            st.opened,
            opt(st.server_bytes_per_connection, " B"),
            opt(st.marginal_bytes_per_connection, " B"),
            st.rss.map_or_else(
                || "n/a".to_owned(),
                |r| format!("{:.1} MiB", r as f64 / 1048576.0)
            )
        );
    }
    if let Some(c) = &o.churn {
        let mib = |x: Option<u64>| {
            x.map_or_else(
                || "n/a".to_owned(),
                |r| format!("{:.1} MiB", r as f64 / 1048576.0),
            )
        };
        let n = |x: Option<u64>| x.map_or_else(|| "n/a".to_owned(), |v| v.to_string());
        println!(
            "churn            {} cycles of {:?} connections",
            c.rounds, c.opened
        );
        println!(
            "churn RSS        baseline {}, peak {}, after {}",
            mib(c.rss_baseline),
            mib(c.rss_peak),
            mib(c.rss_after)
        );
        println!(
            "churn open files baseline {}, after {}{}",
            n(c.fds_baseline),
            n(c.fds_after),
            match (c.fds_after, c.fds_returned) {
                (None, _) => " (no --server-pid: not measured)",
                (Some(_), true) => " (returned)",
                (Some(_), false) => " (NOT returned)",
            }
        );
    }
    let woken = o
        .bench_wakeups
        .map(|w| format!(", woken {w} times"))
        .unwrap_or_default();
    match o.bench_publish_cpu_seconds {
        Some(p) => println!(
            "bench CPU        {:.1} s ({p:.1} s while publishing{woken})",
            o.bench_cpu_seconds
        ),
        None => println!("bench CPU        {:.1} s", o.bench_cpu_seconds),
    }
    for w in &o.warnings {
        println!("warning          {w}");
    }
    if let Some(server) = o.server_cpu_seconds {
        if o.bench_cpu_seconds > 2.0 * server && o.bench_cpu_seconds > 1.0 {
            println!(
                "warning          the load generator used {:.1}x the server's CPU: it, not the server, may be the bottleneck",
                o.bench_cpu_seconds / server.max(1e-3)
            );
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small outcome for tests of what is made of one.
    pub(crate) fn sample_outcome() -> Outcome {
        Outcome {
            connections: 2,
            opened: 2,
            connect_rate: 10.0,
            errors: Default::default(),
            expected: 4,
            verdict: Default::default(),
            latency: Default::default(),
            connection_means: Default::default(),
            clumped: 0,
            deliveries_per_second: 1.0,
            server_cpu_per_million: None,
            server_bytes_per_connection: Some(80.0),
            kernel_bytes_per_connection: None,
            bench_cpu_seconds: 0.1,
            bench_publish_cpu_seconds: None,
            bench_wakeups: None,
            server_cpu_seconds: None,
            samples: (0..5)
                .map(|i| Sample {
                    t: i as f64,
                    cpu: 0.0,
                    rss: 1 << 20,
                    tcp_kernel: 0,
                    opened: i,
                    received: i * 10,
                })
                .collect(),
            steps: Vec::new(),
            churn: None,
            warnings: Vec::new(),
            http2: None,
        }
    }

    #[test]
    fn renders_tables_and_charts() {
        let mut o = sample_outcome();
        let page = html("run <1>", &o);
        assert!(page.contains("run &lt;1&gt;"));
        assert_eq!(page.matches("<polyline").count(), 4);
        assert!(page.contains("<th>server bytes per connection<td>80.0"));
        assert!(!page.contains("Warnings"));
        // A run over before the sampler's second reading: its first and final samples draw
        // every chart, deliveries included.
        let mut short = sample_outcome();
        short.samples.truncate(2);
        let page = html("short", &short);
        assert_eq!(page.matches("<polyline").count(), 4, "{page}");
        assert!(!page.contains("not enough samples"));
        o.warnings
            .push("server memory per connection: <why>".into());
        assert!(html("run", &o)
            .contains("<h2>Warnings</h2><ul><li>server memory per connection: &lt;why&gt;"));
    }

    #[test]
    fn an_http2_run_names_its_streams_and_connections() {
        let mut o = sample_outcome();
        o.http2 = Some(Http2 {
            protocol: "h2c",
            stream: "SSE stream",
            streams_per_connection: 1,
            tcp_connections: 5,
        });
        let line = "<tr><th>protocol<td>h2c, 1 SSE stream per connection, 5 connections";
        assert!(html("run", &o).contains(line));
        let many = Http2 {
            protocol: "h2",
            stream: "SSE stream",
            streams_per_connection: 100,
            tcp_connections: 2,
        };
        assert_eq!(
            protocol(&many),
            "h2, 100 SSE streams per connection, 2 connections"
        );
        let ws = Http2 {
            stream: "WebSocket",
            streams_per_connection: 10,
            ..many
        };
        assert_eq!(
            protocol(&ws),
            "h2, 10 WebSockets per connection, 2 connections"
        );
    }
}
