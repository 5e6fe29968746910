//! The dashboard of a `--processes` group: the sample on the group's shared API port is the
//! whole group's, whichever member accepted the feed. Each second the member asks every
//! member's private address for its own sample (`GET /dashboard/sample`, as the group's
//! `/metrics` scrapes `/metrics`), and [`merge`] makes one: totals summed as `/metrics` sums
//! them, one row per process, and the busiest topics of all.
//!
//! [`merge`] is pure (JSON in, JSON out) and tested on fixed inputs; [`sample`] does the asking.

use std::cmp::Ordering;
use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::group::nodes::{self, State};
use crate::group::scrape;
use crate::group::Member;

/// The private route a member's own sample is read from.
pub const SAMPLE_PATH: &str = "/dashboard/sample";

/// Fields that are not added up over members: the time and uptime (the latest and longest),
/// ratios (recomputed), and the lists merged on their own.
const NOT_SUMMED: &[&str] = &[
    "t",
    "uptime_s",
    "rss_bytes_per_connection",
    "top_topics",
    "nodes",
    "scope",
];

/// One member as asked: its name, its state in the supervisor's list, its pid, and its sample
/// (`None` when it did not answer).
pub struct Part {
    /// Its node name.
    pub name: String,
    /// `up`, `starting` or `down` (the supervisor's view).
    pub state: &'static str,
    /// Its process id (`0` when not running).
    pub pid: u32,
    /// Its sample, when it answered.
    pub sample: Option<Value>,
}

/// The group's sample now, and whether it lists the busiest topics (asked for when `topics`,
/// at most `top` of them).
pub fn sample(member: &Member, topics: bool, top: usize) -> (Value, bool) {
    let list = nodes::read(&member.dir).unwrap_or_default();
    let path = if topics {
        format!("{SAMPLE_PATH}?topics=1")
    } else {
        SAMPLE_PATH.to_owned()
    };
    let parts: Vec<Part> = std::thread::scope(|scope| {
        let asks: Vec<_> = list
            .iter()
            .map(|n| {
                let path = path.as_str();
                scope.spawn(move || match (n.state, n.api) {
                    (State::Up, Some(addr)) => scrape::get(addr, path)
                        .ok()
                        .filter(|(status, _)| *status == 200)
                        .and_then(|(_, body)| serde_json::from_str(&body).ok()),
                    _ => None,
                })
            })
            .collect();
        list.iter()
            .zip(asks)
            .map(|(n, ask)| Part {
                name: n.name.clone(),
                state: match n.state {
                    State::Up => "up",
                    State::Starting => "starting",
                    State::Down => "down",
                },
                pid: n.pid,
                sample: ask.join().ok().flatten(),
            })
            .collect()
    });
    let value = merge(&parts, list.len(), top);
    let has_top = value.get("top_topics").is_some_and(Value::is_array);
    (value, has_top)
}

/// One sample for the group: numeric fields summed over the members that answered (nested
/// objects field by field), `t` and `uptime_s` their largest, RSS per connection recomputed, a
/// `nodes` row per member (answered or not), and the busiest topics merged by name (subscribers
/// added; rate and count the largest, since each member sees the same topic's messages through
/// the broker), at most `top`. `top_topics` is `null` unless every member that answered listed
/// its own.
pub fn merge(parts: &[Part], processes: usize, top: usize) -> Value {
    let answered: Vec<&Value> = parts.iter().filter_map(|p| p.sample.as_ref()).collect();
    let mut out = Map::new();
    for s in &answered {
        if let Value::Object(fields) = s {
            for (k, v) in fields {
                if !NOT_SUMMED.contains(&k.as_str()) {
                    add(out.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
    }
    let largest = |k: &str| answered.iter().filter_map(|s| s.get(k)?.as_u64()).max();
    out.insert("t".into(), json!(largest("t").unwrap_or(0)));
    out.insert("uptime_s".into(), json!(largest("uptime_s").unwrap_or(0)));
    let u = |k: &str| out.get(k).and_then(Value::as_u64).unwrap_or(0);
    let per_conn = u("rss_bytes")
        .checked_div(u("connections_total"))
        .unwrap_or(0);
    out.insert("rss_bytes_per_connection".into(), json!(per_conn));
    let rows: Vec<Value> = parts
        .iter()
        .map(|p| match &p.sample {
            Some(s) => {
                let mine = s.get("nodes").and_then(|n| n.get(0));
                let field = |k: &str| mine.and_then(|m| m.get(k)).cloned().unwrap_or(json!(0));
                json!({
                    "name": p.name,
                    "state": mine.and_then(|m| m.get("state")).cloned().unwrap_or(json!("up")),
                    "pid": p.pid,
                    "last_report_ms": field("last_report_ms"),
                    "connections": s.get("connections_total").cloned().unwrap_or(json!(0)),
                    "rss_bytes": s.get("rss_bytes").cloned().unwrap_or(json!(0)),
                })
            }
            None => json!({
                "name": p.name,
                "state": if p.state == "up" { "down" } else { p.state },
                "pid": p.pid,
                "last_report_ms": null,
                "connections": 0,
                "rss_bytes": 0,
            }),
        })
        .collect();
    out.insert("nodes".into(), Value::Array(rows));
    let lists: Option<Vec<&Vec<Value>>> = answered
        .iter()
        .map(|s| s.get("top_topics").and_then(Value::as_array))
        .collect();
    let top = match lists {
        Some(lists) if !answered.is_empty() => Value::Array(merge_topics(&lists, top)),
        _ => Value::Null,
    };
    out.insert("top_topics".into(), top);
    let up = answered.len();
    out.insert(
        "scope".into(),
        json!(format!(
            "a group of {processes} processes (--processes), {up} answering: totals are the \
             group's, one row per process"
        )),
    );
    Value::Object(out)
}

/// `into += v` for numbers (integers stay integers), field by field for objects.
fn add(into: &mut Value, v: &Value) {
    match (&mut *into, v) {
        (Value::Null, _) => *into = v.clone(),
        (Value::Object(a), Value::Object(b)) => {
            for (k, bv) in b {
                add(a.entry(k.clone()).or_insert(Value::Null), bv);
            }
        }
        (Value::Number(a), Value::Number(b)) => {
            *into = match (a.as_u64(), b.as_u64()) {
                (Some(x), Some(y)) => json!(x.saturating_add(y)),
                _ => {
                    let sum = a.as_f64().unwrap_or(0.0) + b.as_f64().unwrap_or(0.0);
                    json!((sum * 10.0).round() / 10.0)
                }
            };
        }
        _ => {}
    }
}

/// The members' busiest topics as one list, busiest first, at most `top`.
fn merge_topics(lists: &[&Vec<Value>], top: usize) -> Vec<Value> {
    let mut by_name: HashMap<String, (u64, f64, u64)> = HashMap::new();
    for row in lists.iter().flat_map(|l| l.iter()) {
        let Some(name) = row.get("topic").and_then(Value::as_str) else {
            continue;
        };
        let e = by_name.entry(name.to_owned()).or_default();
        e.0 += row.get("subscribers").and_then(Value::as_u64).unwrap_or(0);
        e.1 =
            e.1.max(row.get("rate").and_then(Value::as_f64).unwrap_or(0.0));
        e.2 =
            e.2.max(row.get("published").and_then(Value::as_u64).unwrap_or(0));
    }
    let mut rows: Vec<(String, (u64, f64, u64))> = by_name.into_iter().collect();
    rows.sort_by(|(an, a), (bn, b)| {
        b.1.total_cmp(&a.1)
            .then(b.0.cmp(&a.0))
            .then_with(|| an.cmp(bn))
            .then(Ordering::Equal)
    });
    rows.into_iter()
        .take(top)
        .map(|(name, (subscribers, rate, published))| {
            json!({ "topic": name, "subscribers": subscribers, "rate": rate, "published": published })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn part(name: &str, sample: Option<Value>) -> Part {
        Part {
            name: name.into(),
            state: "up",
            pid: 7,
            sample,
        }
    }

    fn member(conns: u64, ws: u64, rate: f64, topics: Value) -> Value {
        json!({
            "t": 1000 + conns, "uptime_s": conns, "connections_total": conns,
            "connections": { "ws": ws, "sse": conns - ws }, "rss_bytes": 1000,
            "delivered_per_s": rate, "rss_bytes_per_connection": 1,
            "nodes": [{ "name": "x", "state": "up", "last_report_ms": 5 }],
            "top_topics": topics,
        })
    }

    #[test]
    fn totals_are_summed_and_each_process_has_a_row() {
        let a = member(
            4,
            3,
            1.5,
            json!([{ "topic": "news", "subscribers": 4, "rate": 2.0, "published": 9 }]),
        );
        let b = member(
            2,
            0,
            0.5,
            json!([
                { "topic": "news", "subscribers": 2, "rate": 2.0, "published": 9 },
                { "topic": "quiet", "subscribers": 1, "rate": 0.0, "published": 1 },
            ]),
        );
        let m = merge(
            &[
                part("g-0", Some(a)),
                part("g-1", Some(b)),
                part("g-2", None),
            ],
            3,
            20,
        );
        assert_eq!(m["connections_total"], 6);
        assert_eq!(m["connections"], json!({ "ws": 3, "sse": 3 }));
        assert_eq!(m["delivered_per_s"], 2.0);
        assert_eq!(
            (m["t"].as_u64(), m["uptime_s"].as_u64()),
            (Some(1004), Some(4))
        );
        assert_eq!(m["rss_bytes_per_connection"], 2000 / 6);
        let rows = m["nodes"].as_array().unwrap();
        let names: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r["name"].as_str().unwrap(),
                    r["connections"].as_u64().unwrap(),
                    r["state"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![("g-0", 4, "up"), ("g-1", 2, "up"), ("g-2", 0, "down")]
        );
        assert_eq!(
            m["top_topics"],
            json!([
                { "topic": "news", "subscribers": 6, "rate": 2.0, "published": 9 },
                { "topic": "quiet", "subscribers": 1, "rate": 0.0, "published": 1 },
            ])
        );
        assert!(m["scope"].as_str().unwrap().contains("3 processes"));
    }

    #[test]
    fn topics_are_listed_only_when_every_answer_has_them() {
        let a = member(1, 1, 0.0, json!([]));
        let b = member(1, 1, 0.0, Value::Null);
        assert_eq!(
            merge(&[part("a", Some(a.clone())), part("b", Some(b))], 2, 20)["top_topics"],
            Value::Null
        );
        assert_eq!(merge(&[part("a", Some(a))], 1, 20)["top_topics"], json!([]));
        assert_eq!(merge(&[part("a", None)], 1, 20)["top_topics"], Value::Null);
    }
}
