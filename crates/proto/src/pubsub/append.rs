//! Appendable messages (AI token streams): a message published in fragments, delivered live as
//! `append` events, and kept in history as the text accumulated so far.
//!
//! Pure rules, no clock and no I/O; the server's broker applies them under its lock:
//!
//! - [`Accumulator`]: one stream's text so far, its fragment count (`seq`) and whether it is
//!   closed, with the limits a publisher may not pass ([`StreamLimits`], [`AppendError`]).
//! - [`append_json`] / [`folded_json`]: the two events a subscriber sees. A live fragment is
//!   `{"type":"append","topic","id","stream","seq","data"[,"done":true[,"reason"]]}`; what
//!   history replays for a stream is ONE `{"type":"message",...,"stream","seq","data"}` whose
//!   `data` is the whole text so far and whose `seq` is the fragments it includes.
//! - [`fold`]: the fold rule, stated over a topic's log of messages and fragments: a replay
//!   after cursor `C` yields every message after `C`, and for every stream with a fragment
//!   after `C` one folded message with its text so far, placed at its latest fragment's
//!   position. The broker keeps history in this folded form as it goes (one entry per stream,
//!   moved to its latest fragment); `fold` is the reference it is tested against.
//! - [`Reader`]: what a client does with them: a folded message sets a stream's text and seq,
//!   an append with `seq` at or below the one held is dropped (it is already in the text), the
//!   next one is added, a later one means fragments are missing.
//!
//! Every fragment takes a topic position (an id) like a message does, so a resume cursor
//! stays exact when a stream is interleaved with the topic's other messages. A stream's id is
//! the id of the publish that opened it (its first fragment, `seq` 1).

use std::collections::HashMap;

use super::envelope::push_json_str;

/// How much one stream may hold, and how many may be open on a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Fragments per stream, the opening one and a closing one included.
    pub max_fragments: u32,
    /// Bytes of accumulated text per stream.
    pub max_bytes: usize,
    /// Streams open at once on one topic.
    pub max_open_per_topic: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            max_fragments: 10_000,
            max_bytes: 1 << 20,
            max_open_per_topic: 1000,
        }
    }
}

/// Why a stream was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// Its publisher said `done`.
    Done,
    /// It stayed open past the stream timeout: the server closed it.
    Timeout,
    /// It was open when the server restarted (`history_dir`): history keeps its text up to
    /// the last fragment acknowledged, closed.
    Restart,
}

impl CloseReason {
    /// The `reason` a closing event carries (`None` for a publisher's `done`).
    pub fn wire(self) -> Option<&'static str> {
        match self {
            CloseReason::Done => None,
            CloseReason::Timeout => Some("timeout"),
            CloseReason::Restart => Some("restart"),
        }
    }
}

/// Why a fragment was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// The stream is closed (done, or timed out).
    #[error("the stream is closed")]
    Closed,
    /// The stream already holds `max_fragments` fragments.
    #[error("the stream holds its most fragments ({0}, stream_max_fragments)")]
    Fragments(u32),
    /// The text would pass `max_bytes`.
    #[error("the stream's text would pass its most bytes ({0}, stream_max_bytes)")]
    Bytes(usize),
}

/// One stream's text so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accumulator {
    seq: u32,
    text: String,
    closed: Option<CloseReason>,
}

impl Accumulator {
    /// A stream opened with its first fragment (`seq` 1; it may be empty).
    pub fn open(first: &str, limits: &StreamLimits) -> Result<Accumulator, AppendError> {
        let mut a = Accumulator {
            seq: 0,
            text: String::new(),
            closed: None,
        };
        a.append(first, false, limits)?;
        Ok(a)
    }

    /// An open stream carried on from where another process left it (a hand-over): `seq`
    /// fragments so far, making `text`.
    pub fn resumed(seq: u32, text: String) -> Accumulator {
        Accumulator {
            seq,
            text,
            closed: None,
        }
    }

    /// Adds a fragment (closing the stream when `done`) and returns its `seq`. Nothing changes
    /// when it is refused.
    pub fn append(
        &mut self,
        fragment: &str,
        done: bool,
        limits: &StreamLimits,
    ) -> Result<u32, AppendError> {
        if self.closed.is_some() {
            return Err(AppendError::Closed);
        }
        if self.seq >= limits.max_fragments {
            return Err(AppendError::Fragments(limits.max_fragments));
        }
        if self.text.len() + fragment.len() > limits.max_bytes {
            return Err(AppendError::Bytes(limits.max_bytes));
        }
        self.text.push_str(fragment);
        self.seq += 1;
        if done {
            self.closed = Some(CloseReason::Done);
        }
        Ok(self.seq)
    }

    /// Closes an open stream for `reason` with an empty last fragment (which takes a `seq`,
    /// past any limit: a close is always delivered). `None` when it was closed already.
    pub fn close(&mut self, reason: CloseReason) -> Option<u32> {
        if self.closed.is_some() {
            return None;
        }
        self.seq += 1;
        self.closed = Some(reason);
        Some(self.seq)
    }

    /// Takes back the last [`Accumulator::append`] of `fragment` or the last
    /// [`Accumulator::close`] (`fragment` empty) when it could not be kept (the durable log
    /// refused its record): the stream is as it was before.
    pub fn take_back(&mut self, fragment: &str) {
        let len = self.text.len().saturating_sub(fragment.len());
        if self.text.is_char_boundary(len) {
            self.text.truncate(len);
        }
        self.seq = self.seq.saturating_sub(1);
        self.closed = None;
    }

    /// Fragments included.
    pub fn seq(&self) -> u32 {
        self.seq
    }

    /// The text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Why it was closed, if it is.
    pub fn closed(&self) -> Option<CloseReason> {
        self.closed
    }
}

/// Where an event sits, and what stream and fragment it is.
#[derive(Debug, Clone, Copy)]
pub struct StreamEvent<'a> {
    /// Its topic.
    pub topic: &'a str,
    /// Its position (`EPOCH-SEQ`), the id a resume cursor names.
    pub id: &'a str,
    /// The stream's id (its opening publish's).
    pub stream: &'a str,
    /// Fragments included (for an append: this fragment's number).
    pub seq: u32,
    /// The fragment (append) or the text so far (folded).
    pub data: &'a str,
    /// Set on the event that closes the stream (or a folded closed stream).
    pub closed: Option<CloseReason>,
}

/// A live fragment's event: `{"type":"append",...}`.
pub fn append_json(e: &StreamEvent<'_>) -> String {
    event_json("append", e)
}

/// What history replays for a stream: `{"type":"message",...}` whose `data` is the text so far.
pub fn folded_json(e: &StreamEvent<'_>) -> String {
    event_json("message", e)
}

fn event_json(kind: &str, e: &StreamEvent<'_>) -> String {
    let mut out = String::with_capacity(e.data.len() + e.topic.len() + 96);
    out.push_str("{\"type\":\"");
    out.push_str(kind);
    out.push_str("\",\"topic\":");
    push_json_str(&mut out, e.topic);
    out.push_str(",\"id\":");
    push_json_str(&mut out, e.id);
    out.push_str(",\"stream\":");
    push_json_str(&mut out, e.stream);
    out.push_str(&format!(",\"seq\":{},\"data\":", e.seq));
    push_json_str(&mut out, e.data);
    if let Some(reason) = e.closed {
        out.push_str(",\"done\":true");
        if let Some(r) = reason.wire() {
            out.push_str(",\"reason\":\"");
            out.push_str(r);
            out.push('"');
        }
    }
    out.push('}');
    out
}

/// One entry of a topic's log, in position order: a message, or a stream's fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A plain message at `pos`.
    Message {
        /// Its position.
        pos: u64,
    },
    /// Fragment `seq` of stream `stream` at `pos`.
    Fragment {
        /// Its position.
        pos: u64,
        /// The stream (its first fragment's position).
        stream: u64,
        /// The fragment.
        data: String,
        /// Set on the fragment that closes the stream.
        closed: Option<CloseReason>,
    },
}

/// What a replay yields, in position order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    /// The message at `pos`.
    Message {
        /// Its position.
        pos: u64,
    },
    /// A stream's text so far, at its latest fragment's position.
    Folded {
        /// The latest fragment's position.
        pos: u64,
        /// The stream.
        stream: u64,
        /// Fragments included.
        seq: u32,
        /// The text so far.
        text: String,
        /// Whether (and why) it is closed.
        closed: Option<CloseReason>,
    },
}

/// The fold rule: what a subscriber resuming after position `after` is replayed from `log`.
pub fn fold(log: &[Entry], after: u64) -> Vec<Replayed> {
    // Per stream: (latest position, seq, text, closed).
    let mut streams: HashMap<u64, (u64, u32, String, Option<CloseReason>)> = HashMap::new();
    for e in log {
        match e {
            Entry::Message { .. } => {}
            Entry::Fragment {
                pos,
                stream,
                data,
                closed,
            } => {
                let s = streams
                    .entry(*stream)
                    .or_insert((0, 0, String::new(), None));
                s.0 = *pos;
                s.1 += 1;
                s.2.push_str(data);
                s.3 = *closed;
            }
        }
    }
    let mut out: Vec<Replayed> = log
        .iter()
        .filter_map(|e| match e {
            Entry::Message { pos } if *pos > after => Some(Replayed::Message { pos: *pos }),
            Entry::Message { .. } | Entry::Fragment { .. } => None,
        })
        .collect();
    out.extend(streams.into_iter().filter(|(_, s)| s.0 > after).map(
        |(stream, (pos, seq, text, closed))| Replayed::Folded {
            pos,
            stream,
            seq,
            text,
            closed,
        },
    ));
    out.sort_unstable_by_key(|r| match r {
        Replayed::Message { pos } | Replayed::Folded { pos, .. } => *pos,
    });
    out
}

/// What a [`Reader`] did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The stream's text changed.
    Applied,
    /// Already in the text held (a live append the replay included): dropped.
    Stale,
    /// Fragments between the one held and this one are missing: the stream should be read
    /// again (a resume from the last id held brings its folded text).
    Missing,
}

/// A client's streams: the text so far of each, from folded messages and appends.
#[derive(Debug, Default, Clone)]
pub struct Reader {
    streams: HashMap<String, Accumulator>,
}

impl Reader {
    /// A folded message: the stream's text so far, unless the one held is as recent.
    pub fn folded(
        &mut self,
        stream: &str,
        seq: u32,
        text: &str,
        closed: Option<CloseReason>,
    ) -> Seen {
        if self.streams.get(stream).is_some_and(|a| a.seq >= seq) {
            return Seen::Stale;
        }
        self.streams.insert(
            stream.to_owned(),
            Accumulator {
                seq,
                text: text.to_owned(),
                closed,
            },
        );
        Seen::Applied
    }

    /// A live append.
    pub fn append(
        &mut self,
        stream: &str,
        seq: u32,
        data: &str,
        closed: Option<CloseReason>,
    ) -> Seen {
        let a = self
            .streams
            .entry(stream.to_owned())
            .or_insert(Accumulator {
                seq: 0,
                text: String::new(),
                closed: None,
            });
        if seq <= a.seq {
            return Seen::Stale;
        }
        if seq != a.seq + 1 {
            return Seen::Missing;
        }
        a.seq = seq;
        a.text.push_str(data);
        a.closed = closed;
        Seen::Applied
    }

    /// A stream's text so far, its seq and whether it is closed.
    pub fn get(&self, stream: &str) -> Option<(&str, u32, Option<CloseReason>)> {
        self.streams
            .get(stream)
            .map(|a| (a.text.as_str(), a.seq, a.closed))
    }
}

#[cfg(test)]
#[path = "append_tests.rs"]
mod tests;
