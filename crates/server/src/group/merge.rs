//! Merging the Prometheus text of a group's members into one exposition.
//!
//! Every family appears once (one `# HELP`, one `# TYPE`, its samples together, as the text
//! format requires). Within it come first the group's totals, each sample summed over the
//! members that have it and written without a `node` label, then every member's samples as it
//! wrote them with `node="<name>"` added (replacing a `node` label it wrote itself, which
//! names the same node). Counters, gauges, histogram buckets, sums and counts all add up this
//! way; a summary's quantiles and ratios ([`NO_TOTAL`]) do not, so they get no total. A member
//! that did not answer is simply absent: its last counts drop out of the totals until it is
//! back, as they would for a restarted process.
//!
//! Pure text in, text out: no I/O, so it is tested on fixed inputs.

use std::collections::HashMap;
use std::fmt::Write as _;

/// Families whose samples are ratios: their sum over members means nothing, so they have
/// per-member lines only.
pub const NO_TOTAL: &[&str] = &["clarion_rss_bytes_per_connection"];

/// A sample's labels as written (values still escaped).
type Labels = Vec<(String, String)>;

/// One sample line, split.
#[derive(Debug, Clone)]
struct Sample {
    /// The sample's name (`x_bucket` for a histogram `x`).
    name: String,
    /// Its labels as written (values still escaped), without any `node` label.
    labels: Vec<(String, String)>,
    /// Its value as written.
    value: String,
    /// Which input it came from.
    source: usize,
}

/// A metric family: its description and the samples of every member.
#[derive(Debug, Default)]
struct Family {
    name: String,
    help: Option<String>,
    kind: Option<String>,
    samples: Vec<Sample>,
}

/// The families of all inputs in order of first appearance.
#[derive(Default)]
struct Families {
    list: Vec<Family>,
    by_name: HashMap<String, usize>,
}

impl Families {
    fn get(&mut self, name: &str) -> &mut Family {
        let i = match self.by_name.get(name) {
            Some(i) => *i,
            None => {
                self.list.push(Family {
                    name: name.to_owned(),
                    ..Family::default()
                });
                self.by_name.insert(name.to_owned(), self.list.len() - 1);
                self.list.len() - 1
            }
        };
        // `i` was just looked up or pushed.
        #[allow(clippy::indexing_slicing)]
        &mut self.list[i]
    }

    /// The family a sample belongs to: its own name, or the histogram or summary it is a
    /// `_bucket`, `_sum` or `_count` line of.
    fn of_sample(&mut self, sample: &str) -> &mut Family {
        for suffix in ["_bucket", "_sum", "_count", "_created"] {
            if let Some(base) = sample.strip_suffix(suffix) {
                let composite = self
                    .by_name
                    .get(base)
                    .and_then(|i| self.list.get(*i))
                    .is_some_and(|f| matches!(f.kind.as_deref(), Some("histogram" | "summary")));
                if composite {
                    return self.get(base);
                }
            }
        }
        self.get(sample)
    }
}

/// Merges the expositions of `inputs`, each `(node name, text)`, in that order.
pub fn merge(inputs: &[(&str, &str)]) -> String {
    let mut families = Families::default();
    for (source, (_, text)) in inputs.iter().enumerate() {
        for line in text.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                families
                    .get(name)
                    .help
                    .get_or_insert_with(|| help.to_owned());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
                families
                    .get(name)
                    .kind
                    .get_or_insert_with(|| kind.trim().to_owned());
            } else if line.is_empty() || line.starts_with('#') {
                continue;
            } else if let Some((name, labels, value)) = parse_sample(line) {
                let labels = labels.into_iter().filter(|(k, _)| k != "node").collect();
                let sample = Sample {
                    name: name.to_owned(),
                    labels,
                    value: value.to_owned(),
                    source,
                };
                families.of_sample(name).samples.push(sample);
            }
        }
    }
    let mut out = String::with_capacity(4096 * inputs.len().max(1));
    for f in &families.list {
        write_family(&mut out, f, inputs);
    }
    out
}

fn write_family(out: &mut String, f: &Family, inputs: &[(&str, &str)]) {
    if let Some(help) = &f.help {
        let _ = writeln!(out, "# HELP {} {help}", f.name);
    }
    if let Some(kind) = &f.kind {
        let _ = writeln!(out, "# TYPE {} {kind}", f.name);
    }
    if !NO_TOTAL.contains(&f.name.as_str()) {
        // Totals keyed by sample name and labels, in order of first appearance.
        let mut totals: Vec<(&Sample, f64)> = Vec::new();
        let mut index: HashMap<(&str, &Labels), usize> = HashMap::new();
        for s in &f.samples {
            let quantile = f.kind.as_deref() == Some("summary") && s.name == f.name;
            let Ok(v) = s.value.parse::<f64>() else {
                continue;
            };
            if quantile {
                continue;
            }
            match index.get(&(s.name.as_str(), &s.labels)) {
                Some(i) => {
                    if let Some(t) = totals.get_mut(*i) {
                        t.1 += v;
                    }
                }
                None => {
                    index.insert((s.name.as_str(), &s.labels), totals.len());
                    totals.push((s, v));
                }
            }
        }
        for (s, sum) in totals {
            let _ = writeln!(
                out,
                "{}{} {}",
                s.name,
                label_set(None, &s.labels),
                number(sum)
            );
        }
    }
    for (source, (node, _)) in inputs.iter().enumerate() {
        for s in f.samples.iter().filter(|s| s.source == source) {
            let _ = writeln!(
                out,
                "{}{} {}",
                s.name,
                label_set(Some(node), &s.labels),
                s.value
            );
        }
    }
}

/// `{node="...",k="v",...}`, or nothing for no labels.
fn label_set(node: Option<&str>, labels: &[(String, String)]) -> String {
    let mut parts: Vec<String> = Vec::with_capacity(labels.len() + 1);
    if let Some(node) = node {
        parts.push(format!("node=\"{}\"", escape_label(node)));
    }
    parts.extend(labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")));
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// A label value escaped as the text format requires (backslash, quote, line feed).
pub fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A sum written as a whole number when it is one (counters stay integers), else as the
/// shortest decimal that reads back the same.
fn number(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

/// `name{labels} value [timestamp]` split into its name, labels (values kept escaped) and
/// value; `None` when it does not parse.
fn parse_sample(line: &str) -> Option<(&str, Labels, &str)> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let (name, mut rest) = line.split_at(name_end);
    if name.is_empty() {
        return None;
    }
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(inner)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next()?;
    Some((name, labels, value))
}

/// The labels up to the closing `}` and the text after it.
fn parse_labels(mut s: &str) -> Option<(Labels, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let (key, rest) = s.split_at(eq);
        let rest = rest.strip_prefix("=")?.trim_start().strip_prefix('"')?;
        // The value runs to the first quote not escaped by a backslash.
        let mut escaped = false;
        let mut end = None;
        for (i, c) in rest.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end?;
        let (value, after) = rest.split_at(end);
        labels.push((key.trim().to_owned(), value.to_owned()));
        s = after.strip_prefix('"')?;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    const A: &str = "\
# HELP clarion_connections Open client connections by transport.
# TYPE clarion_connections gauge
clarion_connections{transport=\"ws\"} 3
clarion_connections{transport=\"sse\"} 1
# HELP clarion_messages_delivered_total Messages handed to subscriber sockets.
# TYPE clarion_messages_delivered_total counter
clarion_messages_delivered_total 10
# HELP clarion_rss_bytes_per_connection RSS per connection.
# TYPE clarion_rss_bytes_per_connection gauge
clarion_rss_bytes_per_connection 500
# HELP clarion_latency_seconds Delivery latency.
# TYPE clarion_latency_seconds histogram
clarion_latency_seconds_bucket{le=\"0.1\"} 4
clarion_latency_seconds_bucket{le=\"+Inf\"} 5
clarion_latency_seconds_sum 0.25
clarion_latency_seconds_count 5
# HELP clarion_process_cpu_seconds_total CPU.
# TYPE clarion_process_cpu_seconds_total counter
clarion_process_cpu_seconds_total 1.5
";

    const B: &str = "\
# HELP clarion_connections Open client connections by transport.
# TYPE clarion_connections gauge
clarion_connections{transport=\"ws\"} 4
clarion_connections{transport=\"sse\"} 0
# HELP clarion_messages_delivered_total Messages handed to subscriber sockets.
# TYPE clarion_messages_delivered_total counter
clarion_messages_delivered_total 32
# HELP clarion_rss_bytes_per_connection RSS per connection.
# TYPE clarion_rss_bytes_per_connection gauge
clarion_rss_bytes_per_connection 700
# HELP clarion_latency_seconds Delivery latency.
# TYPE clarion_latency_seconds histogram
clarion_latency_seconds_bucket{le=\"0.1\"} 1
clarion_latency_seconds_bucket{le=\"+Inf\"} 3
clarion_latency_seconds_sum 1.5
clarion_latency_seconds_count 3
# HELP clarion_process_cpu_seconds_total CPU.
# TYPE clarion_process_cpu_seconds_total counter
clarion_process_cpu_seconds_total 2.25
# HELP clarion_broker_connected Whether the broker is reachable.
# TYPE clarion_broker_connected gauge
clarion_broker_connected{node=\"b\",broker=\"redis\"} 1
";

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn totals_and_per_node_lines_for_counters_and_gauges() {
        let out = merge(&[("a", A), ("b", B)]);
        let l = lines(&out);
        for expected in [
            "clarion_connections{transport=\"ws\"} 7",
            "clarion_connections{transport=\"sse\"} 1",
            "clarion_connections{node=\"a\",transport=\"ws\"} 3",
            "clarion_connections{node=\"b\",transport=\"sse\"} 0",
            "clarion_messages_delivered_total 42",
            "clarion_messages_delivered_total{node=\"a\"} 10",
            "clarion_messages_delivered_total{node=\"b\"} 32",
            "clarion_process_cpu_seconds_total 3.75",
        ] {
            assert!(l.contains(&expected), "missing {expected} in\n{out}");
        }
    }

    #[test]
    fn histogram_buckets_sums_and_counts_add_up_per_bucket() {
        let out = merge(&[("a", A), ("b", B)]);
        let l = lines(&out);
        for expected in [
            "clarion_latency_seconds_bucket{le=\"0.1\"} 5",
            "clarion_latency_seconds_bucket{le=\"+Inf\"} 8",
            "clarion_latency_seconds_sum 1.75",
            "clarion_latency_seconds_count 8",
            "clarion_latency_seconds_bucket{node=\"b\",le=\"+Inf\"} 3",
        ] {
            assert!(l.contains(&expected), "missing {expected} in\n{out}");
        }
        assert_eq!(out.matches("# TYPE clarion_latency_seconds ").count(), 1);
    }

    #[test]
    fn ratios_get_no_total_and_a_members_own_node_label_is_replaced() {
        let out = merge(&[("a", A), ("b", B)]);
        let l = lines(&out);
        assert!(!l
            .iter()
            .any(|x| x.starts_with("clarion_rss_bytes_per_connection ")));
        assert!(l.contains(&"clarion_rss_bytes_per_connection{node=\"a\"} 500"));
        // Only b has this family; its own node label is replaced, and the total is b's.
        assert!(l.contains(&"clarion_broker_connected{broker=\"redis\"} 1"));
        assert!(l.contains(&"clarion_broker_connected{node=\"b\",broker=\"redis\"} 1"));
        assert_eq!(out.matches("node=\"b\",node").count(), 0);
    }

    #[test]
    fn every_family_is_described_once_and_kept_together() {
        let out = merge(&[("a", A), ("b", B), ("c", A)]);
        let mut seen: Vec<&str> = Vec::new();
        let mut current = "";
        for line in out.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(!seen.contains(&name), "{name} described twice");
                seen.push(name);
                current = name;
            } else if !line.starts_with('#') {
                assert!(
                    line.starts_with(current),
                    "{line} outside its family {current}"
                );
            }
        }
        assert_eq!(out.matches("# HELP ").count(), seen.len());
        assert!(out.contains("clarion_messages_delivered_total 52"));
    }

    #[test]
    fn node_names_and_label_values_are_escaped_and_kept() {
        let text = "# TYPE x counter\nx{path=\"a\\\"b,c}\"} 2 1700000000\n";
        let out = merge(&[("we\"ird\\node", text)]);
        assert!(out.contains("x{path=\"a\\\"b,c}\"} 2\n"), "{out}");
        assert!(
            out.contains("x{node=\"we\\\"ird\\\\node\",path=\"a\\\"b,c}\"} 2\n"),
            "{out}"
        );
    }

    #[test]
    fn summaries_keep_quantiles_per_node_only_and_junk_is_skipped() {
        let s = "# TYPE rpc summary\nrpc{quantile=\"0.5\"} 0.2\nrpc_sum 4\nrpc_count 8\n{broken 1\nnovalue\n";
        let out = merge(&[("a", s), ("b", s)]);
        let l = lines(&out);
        assert!(!l.contains(&"rpc{quantile=\"0.5\"} 0.4"));
        assert!(l.contains(&"rpc{node=\"a\",quantile=\"0.5\"} 0.2"));
        assert!(l.contains(&"rpc_sum 8"));
        assert!(l.contains(&"rpc_count 16"));
        assert!(!out.contains("broken") && !out.contains("novalue"));
    }

    #[test]
    fn numbers_read_back() {
        assert_eq!(number(42.0), "42");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(merge(&[]), "");
    }
}
