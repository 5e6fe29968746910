//! What a resuming subscriber missed, read from the topics' streams: positions and ranges of
//! offsets, read as the rule in [`super::missed`] (sans-IO) plans and judges them.

use std::sync::Arc;
use std::time::Instant;

use clarion_proto::event_id;
use clarion_proto::pubsub::append::{append_json, folded_json, StreamEvent};
use clarion_proto::pubsub::{append_wire, wire};
use clarion_proto::resp::Value;

use super::conn::LinkError;
use super::missed::{self, Plan};
use super::{keys, Core};
use crate::broker::Subscribed;
use crate::message::{Gap, GapReason, Published};

/// What [`Core::read_range`] found.
pub(super) struct RangeRead {
    /// The epoch Redis holds now.
    pub now: Option<String>,
    /// The entries read, as messages.
    pub msgs: Vec<Arc<Published>>,
    /// Offsets of the range that are holes a moved appendable-message entry left.
    pub holes: u64,
}

impl Core {
    /// Waits, at most the broker timeout, until this node has delivered the ids a subscriber
    /// resumes from. A client can hold an id this node has not delivered yet: it read it a
    /// moment ago on a node whose link to Redis is faster, or that saw Redis's new epoch first
    /// (after a Redis restart). Taken as it stands, this node's position would make the id look
    /// newer than anything published: an `epoch` gap notice, the topic's history replayed and
    /// then the same messages live, all of which the client already has. Redis is asked first,
    /// so an id nothing published (a stale or made-up one) costs no wait; the usual resume,
    /// an id this node has delivered, costs nothing.
    pub(super) fn catch_up(&self, given: &str, topics: &[&str]) {
        let deadline = Instant::now() + self.timeout;
        for &topic in topics {
            let Some((epoch, seq)) = event_id::resume_id(given, topic, topics.len()) else {
                continue;
            };
            let covered = |st: &super::State| {
                st.topics
                    .get(topic)
                    .is_some_and(|t| match t.seq.position() {
                        (Some(e), last) => &**e == epoch && last >= seq,
                        (None, _) => false,
                    })
            };
            if covered(&crate::hub::lock(&self.state)) {
                continue;
            }
            match self.remote_position(topic) {
                Ok((Some(e), last)) if &*e == epoch && last >= seq => {}
                _ => continue,
            }
            let mut st = crate::hub::lock(&self.state);
            while !covered(&st) {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                st = self
                    .changed
                    .wait_timeout(st, deadline - now)
                    .map_or_else(|p| p.into_inner().0, |(g, _)| g);
            }
        }
    }

    /// The epoch and last offset Redis holds for `topic` (`None` epoch: never published, or
    /// lost).
    pub(super) fn remote_position(
        &self,
        topic: &str,
    ) -> Result<(Option<Arc<str>>, u64), LinkError> {
        let [meta, _, _] = keys(topic);
        let r = self.routed_call(
            topic,
            vec![vec![
                b"HMGET".to_vec(),
                meta.into_bytes(),
                b"e".to_vec(),
                b"s".to_vec(),
            ]],
        )?;
        let (epoch, last) = match r.first() {
            Some(Value::Array(v)) => (
                v.first().and_then(Value::as_str).map(Arc::from),
                v.get(1).and_then(Value::as_int).unwrap_or(0),
            ),
            _ => (None, 0),
        };
        Ok((epoch, u64::try_from(last).unwrap_or(0)))
    }

    /// Reads `topic`'s stream entries with offsets `from..=to`, as messages of `epoch`, the
    /// epoch Redis holds now, and how many offsets of the range are holes an appendable
    /// message's folded entry left when it moved on (not trimmed: see
    /// [`super::layout::holes_key`]). Entries that do not decode are skipped (and so show as a
    /// gap).
    pub(super) fn read_range(
        &self,
        topic: &Arc<str>,
        epoch: &Arc<str>,
        from: u64,
        to: u64,
    ) -> Result<RangeRead, LinkError> {
        let [meta, stream, _] = keys(topic);
        let replies = self.routed_call(
            topic,
            vec![
                vec![
                    b"XRANGE".to_vec(),
                    stream.into_bytes(),
                    format!("{from}-0").into_bytes(),
                    format!("{to}-0").into_bytes(),
                ],
                vec![b"HGET".to_vec(), meta.into_bytes(), b"e".to_vec()],
                vec![
                    b"ZCOUNT".to_vec(),
                    super::layout::holes_key(topic).into_bytes(),
                    from.to_string().into_bytes(),
                    to.to_string().into_bytes(),
                ],
            ],
        )?;
        let now_epoch = replies.get(1).and_then(Value::as_str).map(str::to_owned);
        let holes = replies
            .get(2)
            .and_then(Value::as_int)
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0);
        let mut out = Vec::new();
        if let Some(Value::Array(entries)) = replies.first() {
            for entry in entries {
                let Value::Array(parts) = entry else { continue };
                let Some(offset) = parts
                    .first()
                    .and_then(Value::as_str)
                    .and_then(|id| id.strip_suffix("-0"))
                    .and_then(|n| n.parse::<u64>().ok())
                else {
                    continue;
                };
                let Some(Value::Array(fields)) = parts.get(1) else {
                    continue;
                };
                let Some(body) = fields.get(1).and_then(Value::as_bytes) else {
                    continue;
                };
                if let Some(m) = self.message(topic, epoch, offset, body) {
                    out.push(Arc::new(m));
                }
            }
        }
        Ok(RangeRead {
            now: now_epoch,
            msgs: out,
            holes,
        })
    }

    /// Commands on `topic`'s keys at the master serving them (following redirections). An
    /// error reply (a refusal) counts as a failure: a position or range must not be taken
    /// from it.
    fn routed_call(&self, topic: &str, cmds: Vec<Vec<Vec<u8>>>) -> Result<Vec<Value>, LinkError> {
        let p = super::layout::partition(topic);
        let calls: Vec<(u32, Vec<Vec<u8>>)> = cmds.into_iter().map(|c| (p, c)).collect();
        let replies = self
            .run_routed(super::SCRIPT, &calls)
            .map_err(|e| LinkError::Routed(e.0))?;
        if let Some(Value::Error(e)) = replies.iter().find(|r| matches!(r, Value::Error(_))) {
            return Err(LinkError::Routed(format!("Redis refused a read: {e}")));
        }
        Ok(replies)
    }

    /// A message from its body as Redis holds it.
    pub(super) fn message(
        &self,
        topic: &Arc<str>,
        epoch: &Arc<str>,
        offset: u64,
        body: &[u8],
    ) -> Option<Published> {
        if append_wire::is_stream_body(body) {
            return self.stream_message(topic, epoch, offset, body);
        }
        let b = match wire::decode(body) {
            Ok(b) => b,
            Err(e) => {
                crate::log::warn(format_args!(
                    "broker: message {epoch}-{offset} on {topic}: {e}"
                ));
                return None;
            }
        };
        let mut m = Published::new(
            Arc::clone(topic),
            offset,
            Arc::clone(epoch),
            b.kind,
            b.event.map(Into::into),
            self.clock(),
            b.payload,
        );
        m.tags = crate::message::decode_tags(b.tags);
        m.conflation_key = b.conflation_key.map(Into::into);
        if let (Some(bytes), Some(decode)) = (b.attachment, self.decode_attachment) {
            m.attachment = decode(bytes);
        }
        Some(m)
    }

    /// An appendable message's event from its body ([`append_wire`]): a live fragment's
    /// `append` event, or the folded message history holds for a stream (as the in-memory
    /// broker makes them).
    fn stream_message(
        &self,
        topic: &Arc<str>,
        epoch: &Arc<str>,
        offset: u64,
        body: &[u8],
    ) -> Option<Published> {
        let b = match append_wire::decode(body) {
            Ok(b) => b,
            Err(e) => {
                crate::log::warn(format_args!(
                    "broker: stream event {epoch}-{offset} on {topic}: {e}"
                ));
                return None;
            }
        };
        let id = format!("{epoch}-{offset}");
        let event = StreamEvent {
            topic,
            id: &id,
            stream: b.stream,
            seq: b.seq,
            data: b.data,
            closed: b.closed,
        };
        let json = if b.folded {
            folded_json(&event)
        } else {
            append_json(&event)
        };
        Some(Published::stream_event(
            Arc::clone(topic),
            offset,
            Arc::clone(epoch),
            self.clock(),
            b.folded,
            &json,
        ))
    }

    /// Fills `out` with what a subscriber resuming from `given` missed on each topic, up to the
    /// position it was counted at. `given` holds one id, or one per topic (comma-separated);
    /// each id applies to the topic whose epoch it carries (epochs are random per topic).
    pub(super) fn read_missed(
        &self,
        given: &str,
        names: &[Arc<str>],
        positions: &[(Option<Arc<str>>, u64)],
        out: &mut Subscribed,
    ) {
        let ids = missed::entries(given);
        for (name, (epoch, last)) in names.iter().zip(positions) {
            let gap = |reason| Gap {
                topic: Arc::clone(name),
                since: given.to_owned(),
                reason,
            };
            let mine = missed::entry_for(&ids, name, epoch.as_deref());
            let (from, to, plan_gap) = match missed::plan(mine, epoch.as_deref(), *last) {
                Plan::Nothing => continue,
                Plan::Gap(reason) => {
                    out.gaps.push(gap(reason));
                    continue;
                }
                Plan::Read { from, to, gap } => (from, to, gap),
            };
            let Some(epoch) = epoch else {
                continue;
            };
            match self.read_range(name, epoch, from, to) {
                Ok(RangeRead { now, msgs, holes }) => {
                    let (owed, replay) = missed::judge(
                        plan_gap,
                        epoch,
                        now.as_deref(),
                        (from, to),
                        msgs.len(),
                        holes,
                    );
                    if let Some(r) = owed {
                        out.gaps.push(gap(r));
                    }
                    if replay {
                        out.replay.extend(msgs);
                    }
                }
                Err(e) => {
                    crate::log::warn(format_args!("broker: cannot read history of {name}: {e}"));
                    out.gaps.push(gap(GapReason::Trimmed));
                }
            }
        }
    }

    /// Adds to `out.replay` what each topic's stream holds after the message whose publisher
    /// gave it the id `prev` (GRIP's `prev-id`), up to the position the subscriber was counted
    /// at; nothing when the stream no longer holds that message (as Pushpin: live only).
    pub(super) fn read_after_publisher_id(
        &self,
        prev: &str,
        names: &[Arc<str>],
        positions: &[(Option<Arc<str>>, u64)],
        out: &mut Subscribed,
    ) {
        for (name, (epoch, last)) in names.iter().zip(positions) {
            let Some(epoch) = epoch else { continue };
            if *last == 0 {
                continue;
            }
            match self.read_range(name, epoch, 1, *last) {
                Ok(RangeRead { now, msgs, .. }) if now.as_deref() == Some(&**epoch) => {
                    let found = msgs.iter().rposition(|m| {
                        m.attachment
                            .as_ref()
                            .and_then(|a| a.publisher_id())
                            .is_some_and(|id| id == prev)
                    });
                    if let Some(i) = found {
                        out.replay.extend(msgs.into_iter().skip(i + 1));
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    crate::log::warn(format_args!("broker: cannot read history of {name}: {e}"));
                }
            }
        }
    }

    /// What a subscriber of `out.names` (counted at `positions`) missed since `since`: the
    /// one rule for subscribing and for reading.
    pub(super) fn read_since_into(
        &self,
        since: crate::broker::Since<'_>,
        positions: &[(Option<Arc<str>>, u64)],
        out: &mut Subscribed,
    ) {
        let names = out.names.clone();
        match since {
            crate::broker::Since::Id(given) => self.read_missed(given, &names, positions, out),
            crate::broker::Since::PublisherId(prev) => {
                self.read_after_publisher_id(prev, &names, positions, out);
            }
            crate::broker::Since::Latest => self.read_latest(&names, positions, out),
            crate::broker::Since::Now => {}
        }
    }

    /// Adds to `out.replay` each topic's message at the position the subscriber was counted at
    /// (the last one this node delivered before it): every later one reaches the subscriber
    /// live, so the two meet exactly. Nothing for a topic never published, or whose stream no
    /// longer holds that message (trimmed, or Redis lost it: a new epoch).
    fn read_latest(
        &self,
        names: &[Arc<str>],
        positions: &[(Option<Arc<str>>, u64)],
        out: &mut Subscribed,
    ) {
        for (name, (epoch, last)) in names.iter().zip(positions) {
            let Some(epoch) = epoch else { continue };
            if *last == 0 {
                continue;
            }
            match self.read_range(name, epoch, *last, *last) {
                Ok(RangeRead { now, msgs, .. }) if now.as_deref() == Some(&**epoch) => {
                    out.replay.extend(msgs)
                }
                Ok(_) => {}
                Err(e) => {
                    crate::log::warn(format_args!(
                        "broker: cannot read the latest of {name}: {e}"
                    ));
                }
            }
        }
    }
}
