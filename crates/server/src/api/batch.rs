//! `POST /publish`: a JSON batch of messages and fragments of appendable messages, to one
//! topic or many, each answered in place (`docs/protocol.md`, "Batch publishing").
//!
//! The items are validated first: a refused one holds back its topic's other items (a topic
//! sees all of a batch or none of it). What may go is then applied in the order sent: each run
//! of consecutive messages in one broker call (no other publish falls between them), each
//! fragment in turn. A fragment the broker refuses (no such stream, closed, over a limit)
//! holds back the later fragments of its stream, which would otherwise leave a hole in its
//! text.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;

use clarion_proto::pubsub::{decode_batch, held_back, BatchMessage, FragmentOp, ItemError};
use clarion_proto::ws::DataKind;

use super::access::Permit;
use super::publish::{receipt_json, reserved_event, unavailable};
use super::stream::{fragment_receipt, refusal_answer};
use crate::broker::{Fragment, Outgoing, StreamOp, StreamRefusal, Unavailable};
use crate::reply::Answer;
use crate::worker::Shared;

/// `POST /publish`: `400` only when the body is not a batch; otherwise `200` with one result
/// per item, in order: its receipt, or `{"error", "status"}` when it was refused (invalid:
/// `400`; a topic the caller may not publish to: `403`; a fragment the broker refused: as one
/// fragment's answer) or held back (`424`). `503` for the whole request when the broker could
/// take nothing.
pub(super) fn publish_batch(body: &[u8], shared: &Shared, permit: &Permit) -> Answer {
    let batch = match decode_batch(body) {
        Ok(b) => b,
        Err(why) => return Answer::error(400, &why.to_string()),
    };
    let refusals: Vec<Option<serde_json::Value>> = batch
        .iter()
        .map(|item| match item {
            Err(r) => {
                count_refusal(&r.error, shared);
                Some(item_error(400, &r.error.to_string()))
            }
            Ok(m) => permit
                .check(&m.topic, shared)
                .err()
                .or_else(|| reserved_event(&m.topic, m.event.as_deref(), shared))
                .map(|a| answer_as_item(&a)),
        })
        .collect();
    let topics: Vec<Option<&str>> = batch
        .iter()
        .map(|item| match item {
            Ok(m) => Some(m.topic.as_str()),
            Err(r) => r.topic.as_deref(),
        })
        .collect();
    let refused: Vec<bool> = refusals.iter().map(Option::is_some).collect();
    let held = held_back(&topics, &refused);
    let mut results: Vec<Option<serde_json::Value>> = refusals
        .into_iter()
        .zip(&held)
        .map(|(refusal, held)| {
            refusal.or_else(|| {
                held.map(|j| {
                    item_error(
                        424,
                        &format!("not published: messages[{j}] of the same topic was refused"),
                    )
                })
            })
        })
        .collect();
    let go: Vec<(usize, &BatchMessage)> = batch
        .iter()
        .enumerate()
        .filter_map(|(i, item)| match item {
            Ok(m) if results.get(i).is_some_and(Option::is_none) => Some((i, m)),
            Ok(_) | Err(_) => None,
        })
        .collect();
    if let Err(e) = apply(&go, shared, &mut results) {
        return unavailable(&e);
    }
    let mut not_published = 0;
    let results: Vec<serde_json::Value> = results
        .into_iter()
        .map(|r| match r {
            Some(r) => {
                if r.get("error").is_some() {
                    not_published += 1;
                }
                r
            }
            None => item_error(500, "publish produced no receipt"),
        })
        .collect();
    shared
        .metrics
        .batch_items_refused
        .fetch_add(not_published, Relaxed);
    Answer::json(200, &serde_json::json!({ "results": results }))
}

/// A batch being applied: each item's result so far, and what later items depend on.
struct Progress<'a, 'r> {
    /// One per item; `None` until it is answered.
    results: &'r mut [Option<serde_json::Value>],
    /// Streams whose fragment the broker refused, with that fragment's index.
    stopped: HashMap<&'a str, usize>,
    /// Whether the broker took anything yet.
    applied: bool,
}

impl Progress<'_, '_> {
    fn answer(&mut self, i: usize, result: serde_json::Value) {
        if let Some(slot) = self.results.get_mut(i) {
            *slot = Some(result);
        }
    }
}

/// Applies the items that may go, in order, and writes each one's result. `Err` only when the
/// broker took nothing at all (the request is then answered `503` whole); once something was
/// published, an unavailable broker is answered `503` in place for every item not applied.
fn apply(
    go: &[(usize, &BatchMessage)],
    shared: &Shared,
    results: &mut [Option<serde_json::Value>],
) -> Result<(), Unavailable> {
    let mut progress = Progress {
        results,
        stopped: HashMap::new(),
        applied: false,
    };
    let mut rest = go;
    while let Some(((_, first), _)) = rest.split_first() {
        let is_fragment = first.fragment.is_some();
        let len = rest
            .iter()
            .position(|(_, m)| m.fragment.is_some() != is_fragment)
            .unwrap_or(rest.len());
        let (run, after) = rest.split_at(len);
        rest = after;
        let outcome = if is_fragment {
            append_run(run, shared, &mut progress)
        } else {
            publish_run(run, shared, &mut progress)
        };
        if let Err(e) = outcome {
            if !progress.applied {
                return Err(e);
            }
            let why = format!("not published: the broker became unavailable: {e}");
            for &(i, _) in run.iter().chain(rest) {
                if let Some(slot @ None) = progress.results.get_mut(i) {
                    *slot = Some(item_error(503, &why));
                }
            }
            return Ok(());
        }
    }
    Ok(())
}

/// A run of messages, published in one broker call.
fn publish_run(
    run: &[(usize, &BatchMessage)],
    shared: &Shared,
    progress: &mut Progress<'_, '_>,
) -> Result<(), Unavailable> {
    let out: Vec<Outgoing<'_>> = run
        .iter()
        .map(|(_, m)| Outgoing {
            topic: &m.topic,
            kind: m.kind,
            payload: &m.payload,
            event: m.event.as_deref(),
            attachment: None,
            key: m.key.as_deref(),
            tags: &m.tags,
            conflation_key: m.conflation_key.as_deref(),
        })
        .collect();
    let receipts = shared.broker.publish(&out)?;
    progress.applied = true;
    for (&(i, m), r) in run.iter().zip(&receipts) {
        progress.answer(i, receipt_json(&m.topic, r));
    }
    Ok(())
}

/// A run of fragments, appended in order; a refused one stops its stream's later fragments
/// (`424`). The run goes to the broker in waves that name no stream twice (Redis pipelines a
/// wave in one round trip), so a refusal is known before its stream's next fragment is sent.
/// `Err` when the broker is unavailable (the caller answers what is left).
fn append_run<'a>(
    run: &[(usize, &'a BatchMessage)],
    shared: &Shared,
    progress: &mut Progress<'a, '_>,
) -> Result<(), Unavailable> {
    let mut rest = run;
    while !rest.is_empty() {
        let (wave, after) = rest.split_at(wave_len(rest));
        rest = after;
        append_wave(wave, shared, progress)?;
    }
    Ok(())
}

/// How many of `run`'s first fragments name no stream twice (at least one).
fn wave_len(run: &[(usize, &BatchMessage)]) -> usize {
    let mut named: HashSet<&str> = HashSet::new();
    run.iter()
        .position(|(_, m)| stream_of(m).is_some_and(|s| !named.insert(s)))
        .unwrap_or(run.len())
        .max(1)
}

/// One wave of [`append_run`]: fragments of distinct streams.
fn append_wave<'a>(
    wave: &[(usize, &'a BatchMessage)],
    shared: &Shared,
    progress: &mut Progress<'a, '_>,
) -> Result<(), Unavailable> {
    let mut send: Vec<(usize, &'a BatchMessage, Fragment<'a>)> = Vec::new();
    for &(i, m) in wave {
        if let Some(j) = stream_of(m).and_then(|s| progress.stopped.get(s)) {
            let why = format!("not appended: messages[{j}] of the same stream was refused");
            progress.answer(i, item_error(424, &why));
            continue;
        }
        // A batch's text data is a JSON string, so UTF-8 (`encoding` was refused).
        let Some(text) = std::str::from_utf8(&m.payload)
            .ok()
            .filter(|_| m.kind == DataKind::Text)
        else {
            progress.answer(i, item_error(400, "a stream's fragments are UTF-8 text"));
            continue;
        };
        let op = match &m.fragment {
            Some(FragmentOp::Append { stream, done }) => StreamOp::Append {
                stream,
                done: *done,
            },
            Some(FragmentOp::Open) | None => StreamOp::Open,
        };
        let (topic, key) = (m.topic.as_str(), m.key.as_deref());
        send.push((
            i,
            m,
            Fragment {
                topic,
                op,
                text,
                key,
            },
        ));
    }
    let run: Vec<Fragment<'_>> = send.iter().map(|(_, _, f)| *f).collect();
    let mut lost = None;
    for ((i, m, _), outcome) in send.into_iter().zip(shared.broker.stream_many(&run)) {
        let answer = match outcome {
            Ok(r) => {
                progress.applied = true;
                fragment_receipt(&m.topic, &r)
            }
            Err(StreamRefusal::Unavailable(e)) => {
                lost.get_or_insert(e);
                continue;
            }
            Err(refusal) => {
                let named = stream_of(m);
                if let Some(s) = named {
                    progress.stopped.entry(s).or_insert(i);
                }
                answer_as_item(&refusal_answer(&m.topic, named, refusal, shared))
            }
        };
        progress.answer(i, answer);
    }
    lost.map_or(Ok(()), Err)
}

/// The stream a fragment appends to (`None` for an open, or a message).
fn stream_of(m: &BatchMessage) -> Option<&str> {
    match &m.fragment {
        Some(FragmentOp::Append { stream, .. }) => Some(stream),
        Some(FragmentOp::Open) | None => None,
    }
}

/// Counts a refused item where its kind of refusal is counted for single publishes.
fn count_refusal(error: &ItemError, shared: &Shared) {
    match error {
        ItemError::Tags(_) => shared.metrics.filters.refused("tags"),
        ItemError::ConflationKey(_) => {
            shared.metrics.conflation_key_refusals.fetch_add(1, Relaxed);
        }
        ItemError::Fragment(_) => {
            shared.metrics.stream_refusals.fetch_add(1, Relaxed);
        }
        ItemError::Json(_)
        | ItemError::Topic { .. }
        | ItemError::EventName(_)
        | ItemError::Key(_)
        | ItemError::Base64
        | ItemError::Encoding(_) => {}
    }
}

/// One item's refusal in a batch's results.
fn item_error(status: u16, why: &str) -> serde_json::Value {
    serde_json::json!({ "error": why, "status": status })
}

/// A refusal worded as an answer (`{"error": ...}`), as one item's result.
fn answer_as_item(a: &Answer) -> serde_json::Value {
    let why = serde_json::from_slice::<serde_json::Value>(&a.body)
        .ok()
        .and_then(|v| Some(v.get("error")?.as_str()?.to_owned()))
        .unwrap_or_default();
    item_error(a.status, &why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wave_ends_where_a_stream_comes_again() {
        let body = br#"{"messages":[
            {"topic":"t","data":"a","append_to":"e-1"},
            {"topic":"t","data":"b","stream":"open"},
            {"topic":"t","data":"c","append_to":"e-2"},
            {"topic":"t","data":"d","stream":"open"},
            {"topic":"t","data":"e","append_to":"e-1"},
            {"topic":"t","data":"f","append_to":"e-1"}]}"#;
        let items: Vec<BatchMessage> = decode_batch(body)
            .ok()
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        let run: Vec<(usize, &BatchMessage)> = items.iter().enumerate().collect();
        assert_eq!(wave_len(&run), 4);
        assert_eq!(wave_len(&run[4..]), 1);
        assert_eq!(wave_len(&run[5..]), 1);
        assert_eq!(wave_len(&run[1..4]), 3);
    }
}
