//! Fan-out: messages handed to this worker by the hub are written to its local subscribers, a
//! run of messages to one topic in one `writev` per subscriber, each in the form its transport
//! and options call for (plain or enveloped frames, deflated frames, SSE events, stream lines,
//! long-poll answers, GRIP content).
//!
//! What each subscriber gets is its transport's decision ([`Framing::delivery`], the transport
//! seam); this module does not encode messages (that is done once per message in
//! [`crate::message`]).
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::Arc;

use clarion_proto::ws::OpCode;

use super::conflation::RunKeys;
use super::delta::{as_delta, delta_frame};
use super::filters::Pass;
use super::socket::Socket;
use super::Engine;
use crate::message::{DeflateSettings, Encoding, Published};
use crate::worker::transport::frame::{opcode_of, pick, Delivery, Form, Framing};
use crate::worker::transport::poll::{advance_cursor, messages_body};

impl<S: Socket> Engine<S> {
    /// Writes every message waiting in the inbox to its local subscribers.
    pub(crate) fn drain_inbox(&mut self) {
        let mut batch = std::mem::take(&mut self.fanout.spare);
        self.inbox.take(&mut batch);
        if !batch.is_empty() {
            self.deliver_batch(&mut batch);
        }
        self.fanout.spare = batch;
    }

    /// Delivers `batch` (in publish order) to local subscribers and empties it. A single message
    /// is written straight away, or, when the worker has an io_uring, to all its subscribers in
    /// one submission; a run of messages to one topic goes to each subscriber in one `writev`.
    /// Held long-polls are answered with the whole run.
    pub(crate) fn deliver_batch(&mut self, batch: &mut Vec<Arc<Published>>) {
        self.deliver_batch_to(batch, None);
    }

    /// [`Engine::deliver_batch`], to subscriber `only` alone when given (a connection taken
    /// over from another process, catching up on what it missed while it moved: `batch` then
    /// holds only messages of its own topics).
    pub(crate) fn deliver_batch_to(&mut self, batch: &mut Vec<Arc<Published>>, only: Option<u32>) {
        // Runs are taken in publish order, so a subscriber of several topics still receives
        // everything in order.
        let mut targets: Vec<u32> = Vec::new();
        let mut polls: Vec<u32> = Vec::new();
        // Long-polls with a filter that passed part of a run: answered with their part.
        let mut filtered_polls: Vec<(u32, Vec<Arc<Published>>)> = Vec::new();
        let mut frames: Vec<&Arc<[u8]>> = Vec::new();
        let shared = Arc::clone(&self.shared);
        // A message that replaced others while debounced (`max_rate`) is a run of its own: it
        // goes after its `conflated` notice.
        let same_run = |a: &Arc<Published>, b: &Arc<Published>| {
            a.topic == b.topic
                && a.presence == b.presence
                && a.debounce_skipped() == 0
                && b.debounce_skipped() == 0
        };
        for run in batch.chunk_by(same_run) {
            let Some(first) = run.first() else { continue };
            if first.presence {
                self.deliver_presence(run);
                continue;
            }
            targets.clear();
            if let Some(only) = only {
                // The batch is what `only`'s own subscription read: no need to look it up among
                // the topic's subscribers (thousands may be arriving, each with its batch).
                targets.push(only);
            } else {
                // Each fan-out starts somewhere else in the list, so that over a ticker's
                // messages no subscriber is always first (or always last, a whole fan-out behind).
                let subs = self.index.subscribers(&first.topic);
                let start = fanout_start(self.fanout.turn, subs.len());
                self.fanout.turn = self.fanout.turn.wrapping_add(1);
                targets.extend_from_slice(subs.get(start..).unwrap_or_default());
                targets.extend_from_slice(subs.get(..start).unwrap_or_default());
            }
            let batched = self.fanout.batch.is_some() && targets.len() > 1;
            // Filters: each distinct one answers once for this run (worker/filters.rs).
            // A conflating topic: its slow subscribers take (their part of) the run into
            // their backlog (worker/conflation.rs).
            let conflate = match shared.conflate.is_empty() {
                true => None,
                false => shared.conflate.for_topic(&first.topic),
            };
            let tid = match self.filters.is_empty() && conflate.is_none() {
                true => None,
                false => self.index.id_of(&first.topic),
            };
            self.filters.begin_run();
            let whole = run;
            let mut keys = RunKeys::default();
            // Decided once per run: whether it holds a message that replaced others while
            // debounced, and whether any subscriber can be a Pusher connection (an
            // application configured).
            let debounced = whole.iter().any(|m| m.debounce_skipped() > 0);
            let pusher = shared.pusher.any();
            for &k in &targets {
                if pusher && self.pusher_deliver_excluding(k, run) {
                    continue;
                }
                let part;
                let filtered = match self.filters.is_empty() {
                    true => None,
                    false => tid.map(|tid| {
                        self.filters
                            .pass(k, tid, whole, &self.shared.metrics.filters)
                    }),
                };
                let run = match filtered {
                    None | Some(Pass::All) => whole,
                    Some(Pass::Nothing) => continue,
                    Some(Pass::Some(p)) => {
                        part = p;
                        part.as_slice()
                    }
                };
                if let (Some(rule), Some(tid)) = (conflate, tid) {
                    // The keys are computed once per run, for the subscribers that take it whole.
                    let mut own = RunKeys::default();
                    let keys = if run.len() == whole.len() {
                        &mut keys
                    } else {
                        &mut own
                    };
                    if self.conflate_run(k, tid, rule, run, keys) {
                        continue;
                    }
                }
                if let (true, [m]) = (debounced, run) {
                    let skipped = m.debounce_skipped();
                    let cap = Some(self.shared.config.max_backlog);
                    if skipped > 0 && self.write_noticed(k, &m.topic, skipped, m, cap) {
                        // In full (never a delta: its base was not sent).
                        continue;
                    }
                }
                let dedicated = self
                    .conns
                    .get(k as usize)
                    .and_then(|c| c.state.ws()?.deflate)
                    .is_some_and(|ext| ext.dedicated())
                    && self.may_dedicate(k);
                let Some(conn) = self.conns.get_mut(k as usize) else {
                    continue;
                };
                // The one dispatch on a subscriber's framing for deliveries.
                let framing = Framing::of(conn.state);
                let form = match framing.delivery(dedicated) {
                    Delivery::Write(form) => form,
                    Delivery::Grip => {
                        self.deliver_grip(k, run);
                        continue;
                    }
                    Delivery::Answer => {
                        if run.len() == whole.len() {
                            polls.push(k);
                        } else {
                            filtered_polls.push((k, run.to_vec()));
                        }
                        continue;
                    }
                    Delivery::Skip => continue,
                };
                if framing.output_is_activity() {
                    // Output counts as activity for the keep-alive timer of HTTP streams.
                    conn.last_seen = self.now;
                }
                let settings = self.frames.deflate_settings;
                // Which of the run go as deltas (`super::delta`); none for most subscribers.
                let deltas = if self.side.delta().is_empty() {
                    0
                } else {
                    self.side.delta_mut().plan(k, run)
                };
                if let Form::Dedicated { envelope } = form {
                    // Compressed for this connection alone, in order, with its own context.
                    let own: Vec<Arc<[u8]>> = run
                        .iter()
                        .enumerate()
                        .map(|(i, m)| {
                            let delta = as_delta(deltas, i)
                                .then(|| m.delta_encoded(Encoding::WsEnvelope))
                                .flatten();
                            let (base, op) = if let Some(d) = delta.filter(|_| envelope) {
                                (d, OpCode::Text)
                            } else if envelope {
                                (m.encoded(Encoding::WsEnvelope), OpCode::Text)
                            } else {
                                (&m.frame, opcode_of(m.kind))
                            };
                            self.compress_for(k, base, op)
                        })
                        .collect();
                    let refs: Vec<&Arc<[u8]>> = own.iter().collect();
                    self.deliver_all(k, &refs);
                } else if let [msg] = run {
                    let frame = pick_delta(msg, form, &settings, as_delta(deltas, 0));
                    if batched && conn.sends_directly() {
                        // Written with the rest of the fan-out, below.
                        self.fanout.pending.push((k, Arc::clone(frame)));
                    } else if batched && conn.seals_directly() {
                        // Encrypted now, written with the rest of the fan-out.
                        self.gather_sealed(k, frame);
                    } else if conn.stream.is_some() || !self.h2_deliver_now(k, &[frame], batched) {
                        // (An HTTP/2 stream has no socket of its own: framed now into its
                        // connection's write when it can be.)
                        self.deliver(k, frame);
                    }
                } else if run.len() == whole.len() {
                    frames.clear();
                    frames.extend(
                        whole
                            .iter()
                            .enumerate()
                            .map(|(i, m)| pick_delta(m, form, &settings, as_delta(deltas, i))),
                    );
                    if conn.stream.is_some() || !self.h2_deliver_now(k, &frames, batched) {
                        self.deliver_all(k, &frames);
                    }
                } else {
                    // What this subscriber's filter passed of the run.
                    let own: Vec<&Arc<[u8]>> = run
                        .iter()
                        .enumerate()
                        .map(|(i, m)| pick_delta(m, form, &settings, as_delta(deltas, i)))
                        .collect();
                    self.deliver_all(k, &own);
                }
                self.scratch.tally.delivered += run.len() as u64;
            }
            let run = whole;
            // Before the next run: a subscriber of both topics gets this run's message first.
            self.write_fanout();
            for (k, part) in filtered_polls.drain(..) {
                self.answer_run_polls(&mut vec![k], run, &part);
            }
            if !polls.is_empty() {
                self.answer_run_polls(&mut polls, run, run);
            }
        }
        batch.clear();
    }

    /// Answers held long-polls `ks` with `part` of run `whole` (all of it, or what their filter
    /// passed): their cursor moves past the whole run, since a message filtered out is not
    /// missed.
    fn answer_run_polls(
        &mut self,
        ks: &mut Vec<u32>,
        whole: &[Arc<Published>],
        part: &[Arc<Published>],
    ) {
        let Some(first) = whole.first() else { return };
        let cursor = whole.last().map(|m| m.id_string()).unwrap_or_default();
        // Live gap notices (clustered brokers) go in "gaps", not among the messages.
        let gaps: Vec<String> = part
            .iter()
            .filter(|m| m.notice)
            .map(|m| String::from_utf8_lossy(m.payload()).into_owned())
            .collect();
        let body_with = |cursor: &str| -> Arc<[u8]> {
            messages_body(
                part.iter().filter(|m| !m.notice).map(|m| m.json()),
                cursor,
                &gaps,
            )
            .into()
        };
        let body = body_with(&cursor);
        for k in ks.drain(..) {
            // A poll on several topics of a clustered broker carries one id per topic.
            let own = self
                .side
                .polls()
                .get(&k)
                .and_then(|h| advance_cursor(&h.cursor, &first.topic, &cursor));
            match own {
                Some(c) => self.answer_poll(k, &body_with(&c)),
                None => self.answer_poll(k, &body),
            }
            self.scratch.tally.delivered += part.len() as u64;
        }
    }
}

/// Where fan-out number `turn` starts in a list of `len` subscribers: `len` times the
/// fractional part of `turn` × the golden ratio, a sequence that spreads successive starts
/// evenly over the list whatever its length (each new start falls into the largest gap left).
pub(crate) fn fanout_start(turn: u32, len: usize) -> usize {
    let frac = u64::from(turn.wrapping_mul(0x9E37_79B9));
    ((frac * len as u64) >> 32) as usize
}

/// The shared bytes of `m` a subscriber gets ([`pick`]), or its delta when `delta` and the
/// form has one.
fn pick_delta<'m>(
    m: &'m Published,
    form: Form,
    settings: &DeflateSettings,
    delta: bool,
) -> &'m Arc<[u8]> {
    match delta.then(|| delta_frame(m, form, settings)).flatten() {
        Some(d) => d,
        None => pick(m, form, settings),
    }
}

#[cfg(test)]
mod tests {
    use super::{advance_cursor, fanout_start};

    #[test]
    fn fan_outs_start_all_over_the_list() {
        assert_eq!(fanout_start(0, 10), 0);
        assert_eq!(fanout_start(7, 0), 0);
        for len in [1usize, 2, 3, 100, 15_000] {
            for turn in [0u32, 1, 2, 1000, u32::MAX] {
                assert!(fanout_start(turn, len) < len);
            }
        }
        // Over 100 fan-outs to 100 subscribers, the start visits every tenth of the list
        // about equally (a fixed start would put all 100 in the first).
        let mut tenths = [0u32; 10];
        for turn in 0..100 {
            tenths[fanout_start(turn, 100) / 10] += 1;
        }
        assert!(tenths.iter().all(|&n| (8..=12).contains(&n)), "{tenths:?}");
    }

    #[test]
    fn per_topic_cursors_move_one_topic() {
        assert_eq!(advance_cursor("e-5", "a", "e-6"), None);
        assert_eq!(
            advance_cursor("a:x-1,b.c:y-2,a.b:z-0", "b.c", "y-9").as_deref(),
            Some("a:x-1,b.c:y-9,a.b:z-0")
        );
    }
}
