//! The million scenario's report: the text table and the self-contained HTML with its plots.

use std::fmt::Write as _;

use crate::check::Verdict;
use crate::million_outcome::{CpuSplit, Outcome, Sample};

fn mib(b: Option<u64>) -> String {
    b.map_or_else(
        || "n/a".into(),
        |v| format!("{:.0} MiB", v as f64 / 1048576.0),
    )
}

fn opt(x: Option<f64>, unit: &str) -> String {
    x.map_or_else(|| "n/a".into(), |v| format!("{v:.0}{unit}"))
}

fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1000.0)
}

/// `p50 / p99 / max` of a latency summary, in milliseconds.
fn latency(l: &crate::stats::Summary) -> String {
    format!("{} / {} / {}", ms(l.p50), ms(l.p99), ms(l.max))
}

/// The summary rows, shared by the text and HTML reports.
pub fn rows(o: &Outcome) -> Vec<(String, String)> {
    let cpu = |c: &CpuSplit| {
        format!(
            "{:.0} s wall: server {:.1}, clients {:.1}, broker {:.1}, whole machine {:.1} CPU-s (of {:.0} available)",
            c.seconds, c.server, c.clients, c.broker, c.machine, c.seconds * 2.0
        )
    };
    let v = |x: &Verdict, e: u64| {
        format!(
            "{} of {e} in order; missing {}, duplicated {}, reordered {}",
            x.in_order, x.missing, x.duplicated, x.reordered
        )
    };
    vec![
        (
            "connections open".into(),
            format!(
                "{} / {} {}({} worker processes)",
                o.opened,
                o.connections,
                if o.tls {
                    "WebSockets over TLS 1.3 "
                } else {
                    ""
                },
                o.workers
            ),
        ),
        (
            "connect rate".into(),
            format!(
                "{:.0}/s over {:.0} s (limit {})",
                o.connect_rate,
                o.connect_seconds,
                if o.connect_rate_limit == 0 {
                    "none".into()
                } else {
                    format!("{}/s", o.connect_rate_limit)
                }
            ),
        ),
        (
            "closed by the server".into(),
            o.closed_by_server.to_string(),
        ),
        (
            "errors".into(),
            if o.errors.is_empty() {
                "none".into()
            } else {
                format!("{:?}", o.errors)
            },
        ),
        (
            "held".into(),
            format!(
                "{} rounds of {} s; {} rooms{}",
                o.rounds,
                o.interval_ms / 1000,
                o.rooms,
                if o.broadcast_expected == 0 {
                    " (pings only: nothing published)"
                } else {
                    ""
                }
            ),
        ),
        (
            "broadcast deliveries".into(),
            v(&o.broadcast, o.broadcast_expected),
        ),
        ("room deliveries".into(), v(&o.chat, o.chat_expected)),
        (
            "pings / pongs / unanswered / late".into(),
            format!(
                "{} / {} / {} / {}",
                o.pings, o.pongs, o.pongs_missing, o.pongs_late
            ),
        ),
        (
            "broadcast to all: p50 / p99 / max ms".into(),
            latency(&o.broadcast_latency),
        ),
        (
            "room messages: p50 / p99 / max ms".into(),
            latency(&o.chat_latency),
        ),
        (
            "ping round trip: p50 / p99 / max ms".into(),
            latency(&o.ping_rtt),
        ),
        (
            "server user-space bytes/conn (all processes)".into(),
            format!(
                "{} open, {} after the rounds (RSS {} before, {} open, {} end)",
                opt(o.server_bytes_per_connection, " B"),
                opt(o.server_bytes_per_connection_end, " B"),
                mib(o.server_rss_before),
                mib(o.server_rss_open),
                mib(o.server_rss_end)
            ),
        ),
        (
            "client user-space bytes/conn".into(),
            format!(
                "{} growth, {} with the workers' fixed cost",
                opt(o.client_bytes_per_connection, " B"),
                opt(o.client_total_bytes_per_connection, " B")
            ),
        ),
        (
            "kernel bytes/conn (loopback pair)".into(),
            opt(o.kernel_bytes_per_connection, " B"),
        ),
        (
            "server CPU while idle".into(),
            opt(
                o.server_idle_cpu_percent
                    .map(|p| p * 10.0)
                    .map(|p| p / 10.0),
                " % of a core",
            ),
        ),
        (
            "server CPU-s per 1M deliveries".into(),
            o.server_cpu_per_million
                .map_or_else(|| "n/a".into(), |v| format!("{v:.2}")),
        ),
        (
            "messages/s during the rounds (deliveries + pings + pongs)".into(),
            format!("{:.0}", o.messages_per_second),
        ),
        ("broker RSS".into(), mib(o.broker_rss)),
        (
            "publish batches retried after a refusal".into(),
            o.publish_retries.to_string(),
        ),
        ("CPU while connecting".into(), cpu(&o.cpu_connect)),
        ("CPU while quiet".into(), cpu(&o.cpu_quiet)),
        ("CPU during the rounds".into(), cpu(&o.cpu_rounds)),
    ]
}

/// Prints the summary.
pub fn print_text(o: &Outcome) {
    for (k, v) in rows(o) {
        println!("{k:>58}: {v}");
    }
    println!(
        "{:>58}: {}",
        "verdict",
        if o.clean() {
            "clean: 0 lost"
        } else {
            "NOT CLEAN"
        }
    );
}

const W: f64 = 720.0;
const H: f64 = 200.0;
const PAD: f64 = 30.0;

fn chart(out: &mut String, title: &str, points: &[(f64, f64)], unit: &str) {
    let _ = write!(out, "<h2>{title}</h2>");
    if points.len() < 2 {
        out.push_str("<p>not enough samples</p>");
        return;
    }
    let t_max = points.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-3);
    let y_max = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9);
    let line: Vec<String> = points
        .iter()
        .map(|&(t, y)| {
            format!(
                "{:.1},{:.1}",
                PAD + t / t_max * (W - 2.0 * PAD),
                H - PAD - y / y_max * (H - 2.0 * PAD)
            )
        })
        .collect();
    let _ = write!(
        out,
        "<svg width={W} height={H}><polyline fill=none stroke=#36c stroke-width=2 points=\"{}\"/>\
         <text x=4 y={PAD}>{y_max:.1}{unit}</text><text x=4 y={b}>0</text>\
         <text x={r} y={b}>{t_max:.0} s</text></svg>",
        line.join(" "),
        b = H - PAD + 16.0,
        r = W - PAD - 30.0,
    );
}

/// A self-contained HTML report: the summary and plots over time.
pub fn html(o: &Outcome) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let title = format!(
        "clarion bench: {} WebSocket connections held {} rounds of {} s",
        o.connections,
        o.rounds,
        o.interval_ms / 1000
    );
    let _ = write!(
        out,
        "<!doctype html><meta charset=utf-8><title>{title}</title>\
         <style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:70em}}\
         td,th{{padding:2px 10px;text-align:left}}\
         svg{{background:#fafafa;border:1px solid #ddd;margin:8px 0}}</style><h1>{title}</h1><table>"
    );
    for (k, v) in rows(o) {
        let v = v.replace('&', "&amp;").replace('<', "&lt;");
        let _ = write!(out, "<tr><th>{k}<td>{v}");
    }
    let _ = write!(
        out,
        "<tr><th>verdict<td>{}</table>",
        if o.clean() {
            "clean: 0 lost"
        } else {
            "NOT CLEAN"
        }
    );
    let s = &o.samples;
    let series = |f: &dyn Fn(&Sample) -> f64| s.iter().map(|x| (x.t, f(x))).collect::<Vec<_>>();
    let rate = |f: &dyn Fn(&Sample) -> f64| {
        s.windows(2)
            .filter_map(|w| match w {
                [x, y] if y.t > x.t => Some((y.t, (f(y) - f(x)) / (y.t - x.t))),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    chart(
        &mut out,
        "Connections held",
        &series(&|x| x.opened as f64),
        "",
    );
    chart(
        &mut out,
        "Deliveries per second",
        &rate(&|x| x.received as f64),
        "/s",
    );
    chart(
        &mut out,
        "Pongs per second",
        &rate(&|x| x.pongs as f64),
        "/s",
    );
    chart(
        &mut out,
        "Server RSS, all processes",
        &series(&|x| x.server_rss as f64 / 1048576.0),
        " MiB",
    );
    chart(
        &mut out,
        "Bench workers' RSS",
        &series(&|x| x.client_rss as f64 / 1048576.0),
        " MiB",
    );
    chart(
        &mut out,
        "Kernel socket memory",
        &series(&|x| x.kernel as f64 / 1048576.0),
        " MiB",
    );
    chart(&mut out, "Server CPU (cores)", &rate(&|x| x.server_cpu), "");
    chart(
        &mut out,
        "Bench workers' CPU (cores)",
        &rate(&|x| x.client_cpu),
        "",
    );
    chart(&mut out, "Broker CPU (cores)", &rate(&|x| x.broker_cpu), "");
    chart(
        &mut out,
        "Whole machine CPU (cores, every process)",
        &rate(&|x| x.machine_cpu),
        "",
    );
    out
}
