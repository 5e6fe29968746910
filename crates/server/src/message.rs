//! A published message and its wire encodings. The hub builds the plain WebSocket frame when the
//! message is published; every other encoding (envelope, SSE event, stream line) is built the
//! first time a subscriber needs it and then shared by all of them, so a broadcast to 100,000
//! SSE subscribers formats the event once.
//!
//! A message may also carry an [`Attachment`]: content in another protocol's terms that a
//! publish in that protocol's format supplied for its own connections (GRIP's Pushpin items do).
//! This module and the hub hold it without knowing what it is.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use base64::Engine as _;
use clarion_proto::http1::write_chunk;
pub use clarion_proto::pubsub::GapReason;
use clarion_proto::pubsub::{Envelope, GapNotice};
use clarion_proto::sse;
use clarion_proto::ws::deflate;
use clarion_proto::ws::frame::{encode_compressed_frame, encode_frame};
use clarion_proto::ws::{DataKind, OpCode};

use crate::delta::{Chain, Delta, Position, Step};

/// The shared encodings of a message, besides its plain WebSocket frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// A WebSocket text frame holding the `clarion.v1` JSON envelope.
    WsEnvelope,
    /// An SSE event whose data is the payload (base64 for binary messages).
    Sse,
    /// An SSE event whose data is the JSON envelope (`format=json`).
    SseJson,
    /// A chunk holding the JSON envelope and a newline (`/stream`, the default format).
    NdjsonChunk,
    /// A chunk holding the payload and a newline (`/stream?format=raw`).
    RawChunk,
    /// A WebSocket text frame holding the Pusher channel event
    /// `{"event":E,"channel":TOPIC,"data":"PAYLOAD"}` (`docs/pusher.md`).
    Pusher,
}

const ENCODINGS: usize = 6;

/// A message's shared encodings, by [`Encoding`].
type Encodings = [OnceLock<Arc<[u8]>>; ENCODINGS];

/// The Pusher event name of a message published without one (Clarion's own publishes): the
/// name an SSE client sees for an unnamed event too.
pub const PUSHER_DEFAULT_EVENT: &str = "message";

/// One published message, encoded once and shared by every worker, subscriber and history.
pub struct Published {
    /// The topic it was published to.
    pub topic: Arc<str>,
    /// Its position in the server's publish order (the `SEQ` of its id).
    pub id: u64,
    /// The server run that published it (the `EPOCH` of its id).
    pub epoch: Arc<str>,
    /// Text or binary, as published.
    pub kind: DataKind,
    /// An SSE event name given by the publisher.
    pub event: Option<Box<str>>,
    /// When it was published, in seconds of the hub's clock (for history expiry).
    pub at: u32,
    /// The payload as a complete WebSocket frame, sent to plain WebSocket subscribers.
    pub frame: Arc<[u8]>,
    /// Its other encodings ([`Published::encoded`]), each built on first use. Boxed, so a
    /// message no subscriber has read yet (most of what history holds) pays 16 bytes for them
    /// rather than 144.
    encoded: OnceLock<Box<Encodings>>,
    /// Frames compressed for permessage-deflate subscribers: (plain, envelope) × (15-bit,
    /// 9-bit window). Boxed, so a message nobody compresses pays 8 bytes for them.
    deflated: OnceLock<Box<Deflated>>,
    /// Its other Pusher frames ([`Published::pusher`]).
    pusher: OnceLock<Box<PusherFrames>>,
    /// What a publish in another protocol's format carries for that protocol's connections;
    /// `None` for Clarion's own publishes. Read it back with [`Published::attachment`].
    pub attachment: Option<Arc<dyn Attachment>>,
    /// Its filter tags (`docs/filters.md`), valid by `validate_tags`; empty when untagged.
    pub tags: Box<[(String, String)]>,
    /// The publisher's conflation key (`conflation_key`, `docs/conflation.md`), if it gave one.
    pub conflation_key: Option<Box<str>>,
    /// Whether this is a gap notice ([`Published::notice`]) rather than a message.
    pub notice: bool,
    /// Whether this is a presence event ([`Published::presence`]): delivered only to the
    /// subscribers that asked for them, never kept in history.
    pub presence: bool,
    /// Its delta against its topic's previous publication on this node (`delta_topics`), set
    /// once by the broker before any worker sees it ([`Published::chain`]).
    delta: OnceLock<Box<Delta>>,
    /// Whether this is an appendable message's event ([`Published::stream_event`]): its
    /// payload is its own typed JSON, sent as it is where others get an envelope.
    pub stream: bool,
    /// Set when debouncing (`max_rate`) held it and it replaced others: how many
    /// ([`Published::debounce_skipped`]); its subscribers get a `conflated` notice first.
    debounced: OnceLock<u64>,
}

/// Content a publish supplies for the connections of one mode, besides the payload every
/// subscriber gets (GRIP's held streams, responses and WebSockets). Opaque to the hub and its
/// history, which only need to know its size and the id its publisher gave it; the mode that
/// attached it reads it back by type with [`Published::attachment`].
pub trait Attachment: Any + Send + Sync {
    /// Bytes it holds, counted against the history's memory cap with the message.
    fn cost(&self) -> usize;
    /// The id the publisher gave this message in its own format, if any: a subscriber may ask
    /// for everything after it (`Since::PublisherId`).
    fn publisher_id(&self) -> Option<&str>;
    /// Bytes that carry it to another node through a cluster broker, which gives them back to
    /// the decoder the server registered for them. `None`: it stays on this node.
    fn encode(&self) -> Option<Vec<u8>> {
        None
    }
    /// The event name its publisher gave it when that is not a Clarion event name (a Pusher
    /// trigger's `App\Events\Shipped`): the name Pusher subscribers see.
    fn event_name(&self) -> Option<&str> {
        None
    }
    /// The member who sent it when it is a presence channel's client event (Pusher sends it
    /// to the channel's other members as `user_id`).
    fn user_id(&self) -> Option<&str> {
        None
    }
}

/// The compressed frames of one message, each built on first use.
#[derive(Default)]
struct Deflated {
    plain15: OnceLock<Arc<[u8]>>,
    plain9: OnceLock<Arc<[u8]>>,
    envelope15: OnceLock<Arc<[u8]>>,
    envelope9: OnceLock<Arc<[u8]>>,
}

/// A message's Pusher frames besides the plain one ([`Encoding::Pusher`]), each built on first
/// use and shared by every Pusher connection that takes that form: with its id (the resume
/// extension), and each compressed with a 15- or 9-bit window. Boxed, so a message no Pusher
/// connection takes so pays 8 bytes for them.
#[derive(Default)]
struct PusherFrames {
    ids: OnceLock<Arc<[u8]>>,
    plain15: OnceLock<Arc<[u8]>>,
    plain9: OnceLock<Arc<[u8]>>,
    ids15: OnceLock<Arc<[u8]>>,
    ids9: OnceLock<Arc<[u8]>>,
}

/// How a Pusher connection takes channel events ([`Published::pusher`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PusherForm {
    /// With `"clarion_id"`: it asked for the resume extension (`docs/pusher.md`).
    pub ids: bool,
    /// It agreed permessage-deflate: `Some(small_window)` (the client limited the server's
    /// window, so 9 bits, else 15).
    pub deflate: Option<bool>,
}

/// The Pusher event name of Clarion's gap notice (the resume extension, `docs/pusher.md`).
pub const PUSHER_GAP_EVENT: &str = "clarion:gap";

/// How shared compressed frames are made (from the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeflateSettings {
    /// Payloads shorter than this are not compressed.
    pub threshold: usize,
    /// zlib level.
    pub level: u32,
}

impl Published {
    /// Encodes the plain frame now; the rest waits until a subscriber needs it.
    pub fn new(
        topic: Arc<str>,
        id: u64,
        epoch: Arc<str>,
        kind: DataKind,
        event: Option<Box<str>>,
        at: u32,
        payload: &[u8],
    ) -> Published {
        let opcode = match kind {
            DataKind::Text => OpCode::Text,
            DataKind::Binary => OpCode::Binary,
        };
        Published {
            topic,
            id,
            epoch,
            kind,
            event,
            at,
            frame: encode_frame(opcode, payload).into(),
            encoded: OnceLock::new(),
            deflated: OnceLock::new(),
            pusher: OnceLock::new(),
            attachment: None,
            tags: Box::default(),
            conflation_key: None,
            notice: false,
            presence: false,
            delta: OnceLock::new(),
            stream: false,
            debounced: OnceLock::new(),
        }
    }

    /// A gap notice sent live, in order with a topic's messages: a clustered broker found that
    /// messages between its last delivery and the next one cannot be delivered (they were
    /// trimmed from the broker's history, or the broker lost its data and began a new epoch).
    /// It is positioned at `epoch-id`, so a long-poll cursor or a resume after it starts right
    /// after the missing messages. Every encoding is the notice itself: a text frame holding
    /// its JSON, an SSE `gap` event without an id, a stream line. GRIP connections do not get
    /// it (it carries no GRIP content, as Pushpin sends none).
    pub fn notice(topic: Arc<str>, id: u64, epoch: Arc<str>, at: u32, gap: &Gap) -> Published {
        let mut m = Published::typed(topic, id, epoch, "gap", &gap.json());
        m.at = at;
        m.notice = true;
        m
    }

    /// A presence event (`join`, `leave`) for the subscribers of `topic` that asked for them.
    /// `json` is its whole text (`{"type":"join","topic":..,"member":{..}}`), encoded as a gap
    /// notice is. `version` is the room's version after the change: a subscriber whose member
    /// list was read at a later version skips it.
    pub fn presence(topic: Arc<str>, version: u64, kind: &str, json: &str) -> Published {
        let mut m = Published::typed(topic, version, Arc::from(""), kind, json);
        m.presence = true;
        m
    }

    /// A message of the server's own, typed by its JSON: every encoding is that text (a text
    /// frame, an SSE event named `kind` without an id, so `Last-Event-ID` stays on the last
    /// message, a stream line).
    fn typed(topic: Arc<str>, id: u64, epoch: Arc<str>, kind: &str, json: &str) -> Published {
        let frame: Arc<[u8]> = encode_frame(OpCode::Text, json.as_bytes()).into();
        let mut event = Vec::new();
        sse::write_event(&mut event, None, Some(kind), json.as_bytes());
        let event: Arc<[u8]> = event.into();
        let mut chunk = Vec::new();
        write_chunk(&mut chunk, format!("{json}\n").as_bytes());
        let chunk: Arc<[u8]> = chunk.into();
        let encoded: OnceLock<Box<Encodings>> = OnceLock::from(Box::new([
            OnceLock::from(Arc::clone(&frame)),
            OnceLock::from(Arc::clone(&event)),
            OnceLock::from(event),
            OnceLock::from(Arc::clone(&chunk)),
            OnceLock::from(chunk),
            OnceLock::new(),
        ]));
        Published {
            topic,
            id,
            epoch,
            kind: DataKind::Text,
            event: Some(kind.into()),
            at: 0,
            frame,
            encoded,
            deflated: OnceLock::new(),
            pusher: OnceLock::new(),
            attachment: None,
            tags: Box::default(),
            conflation_key: None,
            notice: false,
            presence: false,
            delta: OnceLock::new(),
            stream: false,
            debounced: OnceLock::new(),
        }
    }

    /// An appendable message's event (built by the in-memory broker): a live fragment
    /// (`{"type":"append",..}`, SSE event `append`) or a stream's text so far as history keeps
    /// and replays it (`{"type":"message",..,"stream","seq"}`, SSE event `stream`). Its JSON is
    /// its payload and every encoding (the plain and `clarion.v1` WebSocket frame, a stream
    /// line); SSE events carry its id, so `Last-Event-ID` resumes after it. Encodings other
    /// than the frame are built on first use: history holds one copy of a stream's text.
    pub fn stream_event(
        topic: Arc<str>,
        id: u64,
        epoch: Arc<str>,
        at: u32,
        folded: bool,
        json: &str,
    ) -> Published {
        let kind = if folded { "stream" } else { "append" };
        let mut m = Published::new(
            topic,
            id,
            epoch,
            DataKind::Text,
            Some(kind.into()),
            at,
            json.as_bytes(),
        );
        m.stream = true;
        m
    }

    /// The payload, without its frame header.
    pub fn payload(&self) -> &[u8] {
        frame_payload(&self.frame)
    }

    /// The id as clients see it: `EPOCH-SEQ`.
    pub fn id_string(&self) -> String {
        format!("{}-{}", self.epoch, self.id)
    }

    /// The envelope as JSON text (no trailing newline):
    /// `{"type":"message","topic":..,"id":..,["event":..,]["encoding":"base64",]"data":..}`.
    pub fn json(&self) -> &[u8] {
        frame_payload(self.encoded(Encoding::WsEnvelope))
    }

    /// Memory this message holds, as the history's memory cap counts it: payload, frame header,
    /// its delta (set before it is kept) and the fixed records around it. Encodings built
    /// later are not included.
    pub fn cost(&self) -> usize {
        self.frame.len()
            + self.topic.len()
            + std::mem::size_of::<Published>()
            + 64
            + self.attachment.as_ref().map_or(0, |a| a.cost())
            + self
                .tags
                .iter()
                .map(|(k, v)| k.len() + v.len() + 48)
                .sum::<usize>()
            + self
                .delta()
                .map_or(0, |d| d.bytes.len() + d.base_id.len() + 128)
    }

    /// Its tags as a cluster or log body carries them (`None` when untagged).
    pub fn wire_tags(&self) -> Option<Vec<u8>> {
        encode_tags(&self.tags)
    }

    /// The attachment, if there is one and it is a `T`.
    pub fn attachment<T: Attachment>(&self) -> Option<&T> {
        let any: &dyn Any = self.attachment.as_deref()?;
        any.downcast_ref()
    }

    /// One of the shared encodings, built on first use.
    pub fn encoded(&self, which: Encoding) -> &Arc<[u8]> {
        let [ws, sse, sse_json, ndjson, raw, pusher] =
            &**self.encoded.get_or_init(Default::default);
        let slot = match which {
            Encoding::WsEnvelope => ws,
            Encoding::Sse => sse,
            Encoding::SseJson => sse_json,
            Encoding::NdjsonChunk => ndjson,
            Encoding::RawChunk => raw,
            Encoding::Pusher => pusher,
        };
        slot.get_or_init(|| self.build(which))
    }

    /// The frame a permessage-deflate subscriber gets: the plain payload (or the envelope when
    /// `envelope`) compressed once, without context, with a 15-bit window (or a 9-bit one when
    /// `small_window`, valid for any negotiated limit from 9 bits up), RSV1 set. Built on first
    /// use and shared by every such subscriber. A payload under the threshold, or one that does
    /// not shrink, is sent as the uncompressed frame instead (RFC 7692 lets each message choose).
    pub fn deflated(&self, envelope: bool, small_window: bool, s: &DeflateSettings) -> &Arc<[u8]> {
        let slots = self.deflated.get_or_init(Default::default);
        let slot = match (envelope, small_window) {
            (false, false) => &slots.plain15,
            (false, true) => &slots.plain9,
            (true, false) => &slots.envelope15,
            (true, true) => &slots.envelope9,
        };
        slot.get_or_init(|| {
            let (base, opcode) = if envelope {
                (self.encoded(Encoding::WsEnvelope), OpCode::Text)
            } else {
                (&self.frame, opcode_of(self.kind))
            };
            compress_frame(base, opcode, if small_window { 9 } else { 15 }, s)
        })
    }

    /// The channel event a Pusher connection of `form` gets: the shared Pusher frame, with
    /// `"clarion_id"` when it asked for ids, compressed once per window size when it agreed
    /// permessage-deflate (under the threshold or not shrinking: uncompressed, as
    /// [`Published::deflated`]). Gap notices and presence events carry no id.
    pub fn pusher(&self, form: PusherForm, s: &DeflateSettings) -> &Arc<[u8]> {
        if !form.ids && form.deflate.is_none() {
            return self.encoded(Encoding::Pusher);
        }
        let slots = self.pusher.get_or_init(Default::default);
        let plain = if form.ids && !self.notice && !self.presence {
            slots.ids.get_or_init(|| {
                let json = String::from_utf8_lossy(frame_payload(self.encoded(Encoding::Pusher)));
                let json = clarion_proto::pusher::server::with_member(
                    &json,
                    "clarion_id",
                    &self.id_string(),
                );
                encode_frame(OpCode::Text, json.as_bytes()).into()
            })
        } else {
            self.encoded(Encoding::Pusher)
        };
        let Some(small_window) = form.deflate else {
            return plain;
        };
        let slot = match (form.ids, small_window) {
            (false, false) => &slots.plain15,
            (false, true) => &slots.plain9,
            (true, false) => &slots.ids15,
            (true, true) => &slots.ids9,
        };
        let bits = if small_window { 9 } else { 15 };
        slot.get_or_init(|| compress_frame(plain, OpCode::Text, bits, s))
    }

    /// Steps its topic's `chain` to this message (the broker does, in the topic's delivery
    /// order on this node) and keeps the delta against the previous one, if any; `compute`:
    /// someone here may want it. Notices and presence events are not publications.
    pub fn chain(&self, chain: &mut Chain, compute: bool) {
        if self.notice || self.presence {
            return;
        }
        let step = Step {
            at: Position {
                epoch: Arc::clone(&self.epoch),
                seq: self.id,
            },
            kind: self.kind,
            frame: &self.frame,
            start: self.frame.len() - self.payload().len(),
        };
        if let Some(d) = chain.step(step, compute) {
            // Only the broker that made the message sets it, once.
            let _ = self.delta.set(Box::new(d));
        }
    }

    /// Messages of its key it replaced while debouncing held it (0: none). Set once, by the
    /// node's debouncer, before any worker sees it live.
    pub fn debounce_skipped(&self) -> u64 {
        self.debounced.get().copied().unwrap_or(0)
    }

    /// Records that it replaced `skipped` messages while held (once; later calls are ignored).
    pub fn mark_debounced(&self, skipped: u64) {
        let _ = self.debounced.set(skipped);
    }

    /// Its delta against the topic's previous publication, when it has one.
    pub fn delta(&self) -> Option<&Delta> {
        self.delta.get().map(|d| &**d)
    }

    /// The delta message in one of the shared encodings that have a delta shape (the
    /// `clarion.v1` envelope's: WebSocket envelope, SSE `format=json`, NDJSON lines); `None`
    /// when it has no delta or the encoding carries no envelope (raw payloads).
    pub fn delta_encoded(&self, which: Encoding) -> Option<&Arc<[u8]>> {
        let d = self.delta()?;
        let slot = match which {
            Encoding::WsEnvelope => &d.encoded.ws,
            Encoding::SseJson => &d.encoded.sse_json,
            Encoding::NdjsonChunk => &d.encoded.ndjson,
            Encoding::Sse | Encoding::RawChunk | Encoding::Pusher => return None,
        };
        Some(slot.get_or_init(|| {
            let id = self.id_string();
            let json = d.envelope_json(
                &self.topic,
                &id,
                self.event.as_deref(),
                self.kind,
                &self.tags,
            );
            let mut out = Vec::new();
            match which {
                Encoding::WsEnvelope => return encode_frame(OpCode::Text, json.as_bytes()).into(),
                Encoding::SseJson => {
                    sse::write_event(&mut out, Some(&id), self.event.as_deref(), json.as_bytes())
                }
                Encoding::NdjsonChunk | Encoding::Sse | Encoding::RawChunk | Encoding::Pusher => {
                    let mut line = json.into_bytes();
                    line.push(b'\n');
                    write_chunk(&mut out, &line);
                }
            }
            out.into()
        }))
    }

    /// The delta message's envelope frame compressed for permessage-deflate subscribers, as
    /// [`Published::deflated`] compresses the full one; `None` when it has no delta.
    pub fn delta_deflated(&self, small_window: bool, s: &DeflateSettings) -> Option<&Arc<[u8]>> {
        let d = self.delta()?;
        let plain = self.delta_encoded(Encoding::WsEnvelope)?;
        let slot = if small_window {
            &d.encoded.deflated9
        } else {
            &d.encoded.deflated15
        };
        Some(slot.get_or_init(|| {
            compress_frame(plain, OpCode::Text, if small_window { 9 } else { 15 }, s)
        }))
    }

    fn build(&self, which: Encoding) -> Arc<[u8]> {
        let id = self.id_string();
        let mut out = Vec::new();
        match which {
            Encoding::WsEnvelope if self.stream => return Arc::clone(&self.frame),
            Encoding::WsEnvelope => {
                let json = self.envelope_json(&id);
                return encode_frame(OpCode::Text, json.as_bytes()).into();
            }
            Encoding::Sse => {
                let data = match self.kind {
                    DataKind::Text => std::borrow::Cow::Borrowed(self.payload()),
                    DataKind::Binary => std::borrow::Cow::Owned(
                        base64::engine::general_purpose::STANDARD
                            .encode(self.payload())
                            .into_bytes(),
                    ),
                };
                sse::write_event(&mut out, Some(&id), self.event.as_deref(), &data);
            }
            Encoding::SseJson => {
                sse::write_event(&mut out, Some(&id), self.event.as_deref(), self.json());
            }
            Encoding::NdjsonChunk | Encoding::RawChunk if self.stream => {
                let mut line = self.payload().to_vec();
                line.push(b'\n');
                write_chunk(&mut out, &line);
            }
            Encoding::NdjsonChunk => {
                let mut line = self.json().to_vec();
                line.push(b'\n');
                write_chunk(&mut out, &line);
            }
            Encoding::RawChunk => {
                let mut line = self.payload().to_vec();
                line.push(b'\n');
                write_chunk(&mut out, &line);
            }
            Encoding::Pusher if self.presence => {
                let json = pusher_presence_event(&self.topic, self.payload());
                return encode_frame(OpCode::Text, json.as_bytes()).into();
            }
            Encoding::Pusher => {
                // Pusher's data is a string: a text payload as it is, a binary one in base64.
                let data = match self.kind {
                    DataKind::Text => String::from_utf8_lossy(self.payload()),
                    DataKind::Binary => std::borrow::Cow::Owned(
                        base64::engine::general_purpose::STANDARD.encode(self.payload()),
                    ),
                };
                let attachment = self.attachment.as_deref();
                let name = attachment
                    .and_then(|a| a.event_name())
                    .or(self.event.as_deref())
                    .unwrap_or(PUSHER_DEFAULT_EVENT);
                let name = if self.notice { PUSHER_GAP_EVENT } else { name };
                let json = clarion_proto::pusher::server::channel_event(
                    &self.topic,
                    name,
                    &clarion_proto::pusher::server::Data::Text(&data),
                    attachment.and_then(|a| a.user_id()),
                );
                return encode_frame(OpCode::Text, json.as_bytes()).into();
            }
        }
        out.into()
    }

    fn envelope_json(&self, id: &str) -> String {
        Envelope {
            topic: &self.topic,
            id,
            delta: None,
            event: self.event.as_deref(),
            kind: self.kind,
            payload: self.payload(),
            tags: &self.tags,
        }
        .to_json()
    }
}

/// A presence event (`{"type":"join"|"leave","member":{"sub":..,"info":..}}`) in Pusher's
/// form: `pusher_internal:member_added` with `user_id` and `user_info`, or `member_removed`.
fn pusher_presence_event(topic: &str, json: &[u8]) -> String {
    use clarion_proto::pusher::server::{member_added, member_removed};
    let v: serde_json::Value = serde_json::from_slice(json).unwrap_or_default();
    let member = v.get("member");
    let id = member
        .and_then(|m| m.get("sub"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    match v.get("type").and_then(serde_json::Value::as_str) {
        Some("join") => {
            let info = member
                .and_then(|m| m.get("info"))
                .map(serde_json::Value::to_string);
            member_added(topic, id, info.as_deref())
        }
        Some(_) | None => member_removed(topic, id),
    }
}

thread_local! {
    /// One compressor per worker thread and window size (9 and 15 bits), reset for each
    /// message, so compressing a broadcast allocates nothing but its output.
    static SHARED_COMPRESSORS: std::cell::RefCell<(Option<deflate::Compressor>, Option<deflate::Compressor>)> =
        const { std::cell::RefCell::new((None, None)) };
}

fn opcode_of(kind: DataKind) -> OpCode {
    match kind {
        DataKind::Text => OpCode::Text,
        DataKind::Binary => OpCode::Binary,
    }
}

/// `frame` (a complete uncompressed frame of `opcode`) compressed on its own, or `frame` itself
/// when its payload is under the threshold or would not shrink (with a threshold of 0 every
/// message is compressed).
pub fn compress_frame(
    frame: &Arc<[u8]>,
    opcode: OpCode,
    window_bits: u8,
    s: &DeflateSettings,
) -> Arc<[u8]> {
    let payload = frame_payload(frame);
    if payload.len() < s.threshold {
        return Arc::clone(frame);
    }
    let z = SHARED_COMPRESSORS.with(|cell| {
        let mut slots = cell.borrow_mut();
        let slot = if window_bits < 15 {
            &mut slots.0
        } else {
            &mut slots.1
        };
        let c = slot.get_or_insert_with(|| {
            deflate::Compressor::new(s.level, if window_bits < 15 { 9 } else { 15 }, 8)
        });
        // Shared frames carry no context: every message starts afresh.
        c.reset();
        c.compress(payload)
    });
    // A threshold of 0 means "compress everything", even what does not shrink.
    if s.threshold > 0 && z.len() >= payload.len() {
        return Arc::clone(frame);
    }
    encode_compressed_frame(opcode, &z).into()
}

/// `tags` as a cluster or log body carries them (`None` when there are none, so an untagged
/// body is what nodes wrote before tags existed).
pub fn encode_tags(tags: &[(String, String)]) -> Option<Vec<u8>> {
    if tags.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    clarion_proto::pubsub::wire::encode_tags(tags, &mut out);
    Some(out)
}

/// The tags of a body read from a broker or a log ([`clarion_proto::pubsub::wire::decode`]
/// checked them already).
pub fn decode_tags(bytes: Option<&[u8]>) -> Box<[(String, String)]> {
    bytes
        .and_then(|b| clarion_proto::pubsub::wire::decode_tags(b).ok())
        .unwrap_or_default()
        .into_boxed_slice()
}

/// The payload of an encoded server frame (unmasked, so only the length field varies).
pub fn frame_payload(frame: &[u8]) -> &[u8] {
    let header = match frame.get(1).map(|b| b & 0x7f) {
        Some(126) => 4,
        Some(127) => 10,
        _ => 2,
    };
    frame.get(header..).unwrap_or_default()
}

/// A notice that a resume is incomplete, sent before the messages that could be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The topic concerned.
    pub topic: Arc<str>,
    /// The id the client resumed from, as it sent it.
    pub since: String,
    /// Why.
    pub reason: GapReason,
}

impl Gap {
    /// `{"type":"gap","topic":..,"since":..,"reason":"trimmed"|"epoch"}`.
    pub fn json(&self) -> String {
        GapNotice {
            topic: &self.topic,
            since: &self.since,
            reason: self.reason,
        }
        .to_json()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    struct Note(&'static str);

    impl Attachment for Note {
        fn cost(&self) -> usize {
            1000
        }
        fn publisher_id(&self) -> Option<&str> {
            Some(self.0)
        }
    }

    struct Other;

    impl Attachment for Other {
        fn cost(&self) -> usize {
            0
        }
        fn publisher_id(&self) -> Option<&str> {
            None
        }
    }

    #[test]
    fn attachments_are_read_back_by_type_and_counted() {
        let mut p = msg(DataKind::Text, None, b"x");
        let bare = p.cost();
        assert!(p.attachment::<Note>().is_none());
        p.attachment = Some(Arc::new(Note("n-1")));
        assert_eq!(p.cost(), bare + 1000);
        assert_eq!(p.attachment::<Note>().map(|n| n.0), Some("n-1"));
        assert!(p.attachment::<Other>().is_none(), "another mode's type");
    }

    #[test]
    fn a_message_nobody_read_holds_no_encoding_slots() {
        let p = msg(DataKind::Text, None, b"x");
        assert!(p.encoded.get().is_none());
        let json = p.json().to_vec();
        assert!(p.encoded.get().is_some());
        assert_eq!(p.json(), &json[..], "built once");
        // The boxed slots are 16 bytes of the message, not six empty ones (144).
        assert_eq!(std::mem::size_of_val(&p.encoded), 16);
    }

    fn msg(kind: DataKind, event: Option<&str>, payload: &[u8]) -> Published {
        Published::new(
            "t".into(),
            7,
            "ep".into(),
            kind,
            event.map(Into::into),
            0,
            payload,
        )
    }

    #[test]
    fn pusher_frames_carry_ids_on_request_and_are_compressed_once_per_form() {
        let s = DeflateSettings {
            threshold: 0,
            level: 6,
        };
        let p = msg(DataKind::Text, Some("e"), "x".repeat(300).as_bytes());
        let plain = PusherForm {
            ids: false,
            deflate: None,
        };
        assert!(Arc::ptr_eq(
            p.pusher(plain, &s),
            p.encoded(Encoding::Pusher)
        ));
        let ids = PusherForm {
            ids: true,
            deflate: None,
        };
        let with: serde_json::Value =
            serde_json::from_slice(frame_payload(p.pusher(ids, &s))).unwrap();
        assert_eq!(with["clarion_id"], "ep-7");
        assert_eq!(with["event"], "e");
        for ids in [false, true] {
            for small in [false, true] {
                let form = PusherForm {
                    ids,
                    deflate: Some(small),
                };
                let z = p.pusher(form, &s);
                assert_eq!(z[0] & 0x40, 0x40, "RSV1: compressed");
                assert!(Arc::ptr_eq(z, p.pusher(form, &s)), "built once, shared");
            }
        }
        let gap = Gap {
            topic: "t".into(),
            since: "old-1".into(),
            reason: GapReason::Trimmed,
        };
        let notice = Published::notice("t".into(), 8, "ep".into(), 0, &gap);
        let n: serde_json::Value =
            serde_json::from_slice(frame_payload(notice.pusher(ids, &s))).unwrap();
        assert_eq!(n["event"], PUSHER_GAP_EVENT);
        assert!(
            n.get("clarion_id").is_none(),
            "a notice is no event to resume from"
        );
    }

    #[test]
    fn envelope_escapes_and_encodes() {
        let p = msg(DataKind::Text, None, "a\"b\n".as_bytes());
        assert_eq!(p.payload(), b"a\"b\n");
        let json: serde_json::Value = serde_json::from_slice(p.json()).unwrap();
        assert_eq!(json["data"], "a\"b\n");
        assert_eq!(json["id"], "ep-7");
        assert_eq!(json["topic"], "t");
        assert!(p
            .json()
            .starts_with(br#"{"type":"message","topic":"t","id":"ep-7","data":"#));
        let b = msg(DataKind::Binary, Some("blob"), &[0, 1, 255]);
        let json: serde_json::Value = serde_json::from_slice(b.json()).unwrap();
        assert_eq!(json["encoding"], "base64");
        assert_eq!(json["data"], "AAH/");
        assert_eq!(json["event"], "blob");
        let big = msg(DataKind::Binary, None, &[7u8; 300]);
        assert_eq!(big.payload(), &[7u8; 300][..]);
    }

    #[test]
    fn sse_and_stream_encodings() {
        let p = msg(DataKind::Text, Some("price"), b"1\n2");
        assert_eq!(
            &**p.encoded(Encoding::Sse),
            b"id: ep-7\nevent: price\ndata: 1\ndata: 2\n\n"
        );
        let raw = p.encoded(Encoding::RawChunk);
        assert_eq!(&**raw, b"4\r\n1\n2\n\r\n");
        let nd = p.encoded(Encoding::NdjsonChunk);
        assert!(nd.ends_with(b"}\n\r\n"));
        let sj = p.encoded(Encoding::SseJson);
        assert!(sj.starts_with(b"id: ep-7\nevent: price\ndata: {"));
        // Built once: the same allocation every time.
        assert!(Arc::ptr_eq(
            p.encoded(Encoding::Sse),
            p.encoded(Encoding::Sse)
        ));
        let b = msg(DataKind::Binary, None, &[0, 1, 255]);
        assert_eq!(&**b.encoded(Encoding::Sse), b"id: ep-7\ndata: AAH/\n\n");
    }

    #[test]
    fn a_kept_delta_counts_against_the_history_memory_cap() {
        let mut chain = crate::delta::Chain::default();
        let a = msg(
            DataKind::Text,
            None,
            "0123456789abcdefghij0123456789".as_bytes(),
        );
        let b = msg(
            DataKind::Text,
            None,
            "0123456789abcdefghij012345678X".as_bytes(),
        );
        a.chain(&mut chain, true);
        let bare = b.cost();
        b.chain(&mut chain, true);
        let d = b.delta().unwrap();
        assert_eq!(b.cost(), bare + d.bytes.len() + d.base_id.len() + 128);
        // The delta frames are the envelope's, naming the base.
        let env = b.delta_encoded(Encoding::WsEnvelope).unwrap();
        assert!(frame_payload(env)
            .starts_with(br#"{"type":"message","topic":"t","id":"ep-7","delta":"ep-7","data":"#));
        assert!(b.delta_encoded(Encoding::RawChunk).is_none());
    }

    #[test]
    fn gap_json() {
        let g = Gap {
            topic: "a".into(),
            since: "x-1".into(),
            reason: GapReason::Trimmed,
        };
        assert_eq!(
            g.json(),
            r#"{"type":"gap","topic":"a","since":"x-1","reason":"trimmed"}"#
        );
    }
}
