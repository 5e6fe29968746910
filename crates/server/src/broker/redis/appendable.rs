//! Appendable messages through Redis (`docs/cluster.md`, "Appendable messages"): a stream's
//! state lives in Redis, and one script ([`STREAM_SCRIPT`]) checks it, takes the fragment's
//! offset, publishes it live and moves the stream's one folded entry in history, atomically. So
//! a stream opened on one node can be appended to on any other, and every node delivers and
//! resumes it the same.
//!
//! What nodes receive is a [`clarion_proto::pubsub::append_wire`] body, turned into the same
//! `append` event (live) or folded message (history) as the in-memory broker's
//! ([`Core::message`](super::Core)). Timeouts: every node sweeps the partitions about once a
//! second; the script closes a stale stream once, whichever node runs it first.

use std::sync::atomic::Ordering::Relaxed;

use clarion_proto::pubsub::append::AppendError;
use clarion_proto::pubsub::Recorded;
use clarion_proto::resp::Value;

use super::epoch::sha1_hex;
use super::layout::{idempotency_key, partition};
use super::{conn, RedisBroker, META_TTL_SECS, PARTITIONS};
use crate::broker::local::streams::repeat_receipt;
use crate::broker::{Fragment, StreamOp, StreamReceipt, StreamRefusal, Unavailable};

/// The appendable-message script: the offset rule, then the stream's own.
pub const STREAM_SCRIPT: &str = concat!(include_str!("offset.lua"), include_str!("stream.lua"));

/// The script's SHA-1, computed once.
fn script_sha() -> &'static str {
    static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHA.get_or_init(|| sha1_hex(STREAM_SCRIPT.as_bytes()))
}

/// The key prefix of partition `p`: every key of its topics starts so (one slot).
fn prefix(p: u32) -> String {
    format!("clarion:{{p{p}}}:")
}

impl RedisBroker {
    /// The command calling the script on partition `p` (see `stream.lua` for the arguments).
    fn stream_command(&self, p: u32, call: Call<'_>) -> Vec<Vec<u8>> {
        let core = &self.core;
        let Call {
            op,
            topic,
            stream,
            fragment,
            done,
            key,
        } = call;
        let size = if core.limits.enabled() {
            core.limits.per_topic
        } else {
            0
        };
        let ttl = u64::from(core.limits.ttl).max(1);
        let limits = self.streams.limits;
        let mut cmd: Vec<Vec<u8>> = vec![
            b"EVALSHA".to_vec(),
            script_sha().as_bytes().to_vec(),
            if key.is_some() { b"2" } else { b"1" }.to_vec(),
            format!("{}streams", prefix(p)).into_bytes(),
        ];
        if let Some(k) = key {
            cmd.push(idempotency_key(topic, k).into_bytes());
        }
        cmd.extend([
            op.as_bytes().to_vec(),
            prefix(p).into_bytes(),
            topic.as_bytes().to_vec(),
            stream.as_bytes().to_vec(),
            fragment.as_bytes().to_vec(),
            if done { b"1" } else { b"0" }.to_vec(),
            size.to_string().into_bytes(),
            ttl.to_string().into_bytes(),
            core.fresh_epoch().into_bytes(),
            ttl.max(META_TTL_SECS).to_string().into_bytes(),
            conn::REPLID_ARG.to_vec(),
            limits.max_fragments.to_string().into_bytes(),
            limits.max_bytes.to_string().into_bytes(),
            limits.max_open_per_topic.to_string().into_bytes(),
            (u64::from(self.streams.timeout) * 1000)
                .to_string()
                .into_bytes(),
            core.idempotency
                .window
                .as_millis()
                .max(1)
                .to_string()
                .into_bytes(),
        ]);
        cmd.extend(core.accepted_replids());
        cmd
    }

    /// Opens or appends to a stream of `topic` with `fragment` (see
    /// [`crate::broker::Broker::stream`]): the same limits and answers as the in-memory broker.
    pub fn stream(
        &self,
        topic: &str,
        op: StreamOp<'_>,
        fragment: &str,
        key: Option<&str>,
    ) -> Result<StreamReceipt, StreamRefusal> {
        let one = Fragment {
            topic,
            op,
            text: fragment,
            key,
        };
        self.stream_many(&[one])
            .pop()
            .unwrap_or_else(|| Err(StreamRefusal::Unavailable(no_answer())))
    }

    /// [`RedisBroker::stream`] for each fragment of a run (no stream twice), in one pipeline
    /// per shard: one round trip for a batch's fragments, however many streams they feed.
    pub fn stream_many(&self, run: &[Fragment<'_>]) -> Vec<Result<StreamReceipt, StreamRefusal>> {
        if let Err(e) = self.refuse_if_frozen() {
            return run
                .iter()
                .map(|_| Err(StreamRefusal::Unavailable(e.clone())))
                .collect();
        }
        let mut answers: Vec<Option<Result<StreamReceipt, StreamRefusal>>> = Vec::new();
        let mut calls = Vec::new();
        for f in run {
            let (op, stream, done) = match f.op {
                StreamOp::Open => ("open", "", false),
                StreamOp::Append { stream, .. }
                    if clarion_proto::event_id::parse(stream).is_err() =>
                {
                    answers.push(Some(Err(StreamRefusal::Unknown)));
                    continue;
                }
                StreamOp::Append { stream, done } => ("append", stream, done),
            };
            let call = Call {
                op,
                topic: f.topic,
                stream,
                fragment: f.text,
                done,
                key: f.key.filter(|_| !self.core.idempotency.window.is_zero()),
            };
            let p = partition(f.topic);
            calls.push((p, self.stream_command(p, call)));
            answers.push(None);
        }
        let mut replies = match self.core.run_routed(STREAM_SCRIPT, &calls) {
            Ok(r) => r.into_iter(),
            Err(e) => {
                return answers
                    .into_iter()
                    .map(|a| a.unwrap_or_else(|| Err(StreamRefusal::Unavailable(e.clone()))))
                    .collect()
            }
        };
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| match replies.next() {
                    Some(v) => self.stream_answer(v),
                    None => Err(StreamRefusal::Unavailable(no_answer())),
                })
            })
            .collect()
    }

    /// The script's answer to one fragment, as a receipt or a refusal.
    fn stream_answer(&self, reply: Value) -> Result<StreamReceipt, StreamRefusal> {
        let parts = match reply {
            Value::Array(parts) => parts,
            Value::Error(e) => {
                self.core.metrics.broker_errors.fetch_add(1, Relaxed);
                return Err(StreamRefusal::Unavailable(Unavailable(format!(
                    "the broker refused the fragment: {e}"
                ))));
            }
            other => {
                return Err(StreamRefusal::Unavailable(Unavailable(format!(
                    "unexpected answer {other:?}"
                ))))
            }
        };
        let text = |i: usize| parts.get(i).and_then(Value::as_str).unwrap_or_default();
        let int = |i: usize| parts.get(i).and_then(Value::as_int).unwrap_or(0);
        let limit = || text(1).parse::<u64>().unwrap_or(0);
        match text(0) {
            "ok" => {
                self.core.metrics.stream_fragments.fetch_add(1, Relaxed);
                Ok(StreamReceipt {
                    id: text(1).to_owned(),
                    stream: text(2).to_owned(),
                    seq: u32::try_from(int(3)).unwrap_or(0),
                    subscribers: u64::try_from(int(4)).unwrap_or(0),
                    done: int(5) == 1,
                    repeat: false,
                })
            }
            "repeat" => {
                self.core.metrics.publish_repeats.fetch_add(1, Relaxed);
                Ok(repeat_receipt(Recorded::parse_redis(text(1))))
            }
            "unknown" => Err(StreamRefusal::Unknown),
            "closed" => Err(StreamRefusal::Closed),
            "fragments" => Err(StreamRefusal::TooLarge(
                AppendError::Fragments(u32::try_from(limit()).unwrap_or(u32::MAX)).to_string(),
            )),
            "bytes" => Err(StreamRefusal::TooLarge(
                AppendError::Bytes(usize::try_from(limit()).unwrap_or(usize::MAX)).to_string(),
            )),
            "open" => Err(StreamRefusal::TooManyOpen(
                usize::try_from(limit()).unwrap_or(usize::MAX),
            )),
            other => Err(StreamRefusal::Unavailable(Unavailable(format!(
                "unexpected answer {other:?} from the stream script"
            )))),
        }
    }

    /// Closes, across the cluster, every stream without a fragment for `stream_timeout`
    /// seconds (each with an empty last fragment whose event says `"reason":"timeout"`). Called
    /// by the workers about once a second each; runs at most once a second per node, one
    /// script call per partition in one pipeline per shard. Not while a shard is unreachable:
    /// the sweep would fail there anyway, and trying would add a connection attempt and a log
    /// line every second to the outage the reader threads already retry and report.
    pub fn close_stale_streams(&self) {
        if !self.connected() {
            return;
        }
        let now = self.core.clock();
        let last = self.swept.load(Relaxed);
        if now == last
            || self
                .swept
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_err()
        {
            return;
        }
        let sweep = Call {
            op: "sweep",
            topic: "",
            stream: "",
            fragment: "",
            done: false,
            key: None,
        };
        let calls: Vec<(u32, Vec<Vec<u8>>)> = (0..PARTITIONS)
            .map(|p| (p, self.stream_command(p, sweep)))
            .collect();
        let replies = match self.core.run_routed(STREAM_SCRIPT, &calls) {
            Ok(r) => r,
            Err(e) => {
                // Tried again at the next sweep (on this node or another).
                crate::log::warn(format_args!("broker: stream timeouts not swept: {e}"));
                return;
            }
        };
        for r in replies {
            match r {
                Value::Integer(n) => {
                    let n = u64::try_from(n).unwrap_or(0);
                    self.core.metrics.streams_timed_out.fetch_add(n, Relaxed);
                    self.core.metrics.stream_fragments.fetch_add(n, Relaxed);
                }
                Value::Error(e) => {
                    crate::log::warn(format_args!("broker: stream timeouts not swept: {e}"));
                }
                Value::Simple(_) | Value::Bulk(_) | Value::Array(_) | Value::Nil => {}
            }
        }
    }
}

/// One call of the stream script.
#[derive(Clone, Copy)]
struct Call<'a> {
    /// `open`, `append` or `sweep`.
    op: &'a str,
    topic: &'a str,
    /// The stream's id (`append`).
    stream: &'a str,
    fragment: &'a str,
    done: bool,
    /// The publisher's `Idempotency-Key` (open, append), when keys are remembered.
    key: Option<&'a str>,
}

/// A pipeline that came back short.
fn no_answer() -> Unavailable {
    Unavailable("no answer from the broker".to_owned())
}
