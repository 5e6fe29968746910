//! The hand-over format: what a running server sends the binary that replaces it
//! (`clarion serve --upgrade-from PID`) over a Unix socket, besides the file descriptors that
//! travel beside it (`SCM_RIGHTS`).
//!
//! Pure functions over bytes: the server does the socket I/O and decides what each frame means
//! for its workers. The peer is another process, possibly another version of Clarion, so the
//! decoder checks every length against what is left and against [`MAX_BODY`], and never panics.
//!
//! Every frame is
//!
//! ```text
//! MAGIC "CLHO" (4 bytes) | TYPE (u8) | LEN (u32 LE, body bytes) | BODY
//! ```
//!
//! and the conversation is: the new process sends **hello**; the old one answers **hello** (or
//! **refuse**), then **listeners** (the sockets ride with it), then **history** (where the
//! message ids stand, and, without `history_dir`, the messages themselves); the new process
//! answers **ready** (or **refuse**); the old one sends **conns** frames (one descriptor per
//! record rides with each, at most [`MAX_FDS`]) and **end**; the new process answers **ack**
//! once every connection is registered with its workers, and the old one exits. With a
//! clustered broker, **positions** (the last id delivered per topic) take the place of
//! **history**, which lives in the broker.
//!
//! A connection record of a TLS 1.3 connection carries its record layer ([`TlsRecord`],
//! [`crate::tls13::parked`]): its traffic secrets make a **conns** frame secret, for the caller
//! to send only over a private channel and to wipe after use.
//!
//! A connection record of a WebSocket whose compression keeps context carries the windows of
//! its streams ([`DeflateWindows`], [`crate::ws::deflate`]): the new process primes fresh
//! streams with them, so the client's compressor and inflater continue as if nothing moved.
//!
//! An HTTP/2 connection's record carries its protocol state and its streams ([`H2Record`]):
//! each stream is a record of its own, without a socket, nested in its connection's.
//!
//! A connection held by a GRIP backend (a held stream or long-poll) carries the GRIP part
//! ([`GripRecord`], [`crate::handover_grip`]): the backend's keep-alive or the long-poll's hold.
//!
//! A **hello** carries [`VERSION`]: a peer with another format version refuses, and the old
//! process falls back to a restart with drain.

pub use crate::handover_cursor::Error;
use crate::handover_cursor::Reader;

pub use crate::handover_grip::GripRecord;
use crate::handover_state::{self, ModeState};
pub use crate::handover_streams::{OpenStream, StreamTable};

/// The first bytes of every frame.
pub const MAGIC: [u8; 4] = *b"CLHO";
/// The format version this code writes and reads. 1: the first; 2: the positions frame (a
/// clustered broker), and in each connection record the auth/hooks/presence section and the
/// TLS 1.3 record layer; 3: in each connection record, the permessage-deflate windows
/// ([`DeflateWindows`]); 4: the HTTP/2 part of a connection record ([`H2Record`]); 5: the
/// old process's node name in the listeners frame ([`Listeners::node`]), the GRIP part of a
/// connection record ([`GripRecord`]) and GRIP held streams' states.
pub const VERSION: u16 = 5;
/// Frame header bytes: magic, type and length.
pub const HEAD: usize = 9;
/// The largest body accepted: a history snapshot is bounded by `history_memory`, a batch of
/// connections by [`MAX_FDS`] times the slow-consumer cap; a length beyond this is a broken peer.
pub const MAX_BODY: usize = 1 << 30;
/// Most descriptors sent with one message (the kernel's `SCM_MAX_FD` is 253).
pub const MAX_FDS: usize = 250;

/// A frame's type byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameType {
    /// Both sides' identity: format version, binary version, worker count.
    Hello = 1,
    /// The sender will not hand over (or take over); the reason says why.
    Refuse = 2,
    /// How many listening sockets ride with this frame, and of which kind.
    Listeners = 3,
    /// Where message ids stand, and the history to continue from.
    History = 4,
    /// The new process holds the history: send the connections.
    Ready = 5,
    /// A batch of connection records; one descriptor per record rides with the frame.
    Conns = 6,
    /// Every connection has been sent.
    End = 7,
    /// The new process serves every connection; the old one may exit.
    Ack = 8,
    /// Instead of **history** with a clustered broker (history lives in the broker): the id
    /// of the last message the old process delivered on each topic it follows, from which the
    /// new process resumes each connection as a reconnecting client would.
    Positions = 9,
}

impl FrameType {
    fn from_u8(b: u8) -> Option<FrameType> {
        Some(match b {
            1 => FrameType::Hello,
            2 => FrameType::Refuse,
            3 => FrameType::Listeners,
            4 => FrameType::History,
            5 => FrameType::Ready,
            6 => FrameType::Conns,
            7 => FrameType::End,
            8 => FrameType::Ack,
            9 => FrameType::Positions,
            _ => return None,
        })
    }
}

/// One side's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello<'a> {
    /// The format version ([`VERSION`]).
    pub version: u16,
    /// The binary's version (`CARGO_PKG_VERSION`), for the log.
    pub binary: &'a str,
    /// Event-loop threads: the old process's listeners are one per worker.
    pub workers: u16,
    /// Whether a TLS listener is configured.
    pub tls: bool,
}

/// How many listening sockets ride with the frame: `client` client listeners, then `tls` TLS
/// listeners, then `api` API listeners, in that order; and the old process's node name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listeners<'a> {
    /// Client listeners (one per worker).
    pub client: u16,
    /// TLS listeners (one per worker, or none).
    pub tls: u16,
    /// The API listener (0 or 1).
    pub api: u8,
    /// The old process's node name (`node_name`, or the `host:pid` it was started with, or the
    /// one it took over itself): a new process without `node_name` keeps it, so connection ids
    /// in webhooks and the dashboard's node stay the same across upgrades.
    pub node: &'a str,
}

/// Where message ids stand when the old process froze: the new one continues from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History<'a> {
    /// The epoch of every id issued so far.
    pub epoch: &'a str,
    /// The `SEQ` of the next id.
    pub next_id: u64,
    /// Whether the history is in `history_dir` (closed cleanly by the old process) rather than
    /// in `records`.
    pub on_disk: bool,
    /// The floor of topics created afresh (see the hub).
    pub forgotten_floor: u64,
    /// Topics whose floor is above zero, with it.
    pub floors: Vec<(&'a str, u64)>,
    /// The held messages as durable history's message records (`history_log`), in id order.
    pub records: &'a [u8],
    /// The appendable messages it holds ([`crate::handover_streams`]): an optional part at the
    /// end of the body, absent in a frame written before streams existed or without any.
    pub streams: Option<StreamTable<'a>>,
}

/// Which transport a connection is in, with its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnState<'a> {
    /// Reading HTTP request heads (idle keep-alive, or a request partly received).
    Http,
    /// A WebSocket.
    Ws {
        /// 0 pub/sub, 1 the `clarion.v1` envelope, 2 echo, 3 Pusher, 4 Pusher with Clarion's
        /// resume extension (a Pusher role exactly when the record's mode state has a Pusher
        /// part, [`crate::handover_state::PusherState`]).
        role: u8,
        /// The packed permessage-deflate parameters, when negotiated.
        deflate: Option<u8>,
        /// A keep-alive ping is outstanding.
        pinged: bool,
    },
    /// An SSE stream: 0 payload, 1 JSON envelope.
    Sse(u8),
    /// A streamed response: 0 NDJSON, 1 raw lines, 2 to 5 a GRIP held stream
    /// ([`crate::handover_grip::stream_mode`]).
    Stream(u8),
    /// A held long-poll.
    Poll {
        /// The connection returns to HTTP after the answer.
        keep: bool,
        /// Seconds left before its deadline.
        left: u32,
        /// Where its answer resumes (an id).
        cursor: &'a str,
    },
    /// An HTTP/2 connection: its record has an [`H2Record`].
    H2,
}

/// One connection as it moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnRecord<'a> {
    /// The worker that held it (the new process spreads over its own).
    pub worker: u16,
    /// Its transport.
    pub state: ConnState<'a>,
    /// Seconds since its last activity that counts for timeouts.
    pub idle: u32,
    /// The client's address key (for the per-address limit).
    pub peer: u32,
    /// Bytes read but not yet consumed (a partial request head or frame).
    pub input: &'a [u8],
    /// Bytes owed to the client that the kernel has not taken yet.
    pub output: &'a [u8],
    /// Subscribed topics.
    pub topics: Vec<&'a str>,
    /// What authentication, hooks and presence keep for it ([`crate::handover_state`]), when
    /// any of them does.
    pub mode: Option<ModeState<'a>>,
    /// For a TLS 1.3 connection, its record layer; `input` and `output` are then plaintext.
    pub tls: Option<TlsRecord<'a>>,
    /// For a WebSocket with permessage-deflate, the windows of the streams that keep context.
    pub deflate: DeflateWindows<'a>,
    /// For an HTTP/2 connection (state [`ConnState::H2`]), its protocol state and streams.
    pub h2: Option<H2Record<'a>>,
    /// For a connection held by a GRIP backend: a held stream's keep-alive, or a GRIP
    /// long-poll's hold (state [`ConnState::Poll`] with an empty cursor).
    pub grip: Option<GripRecord<'a>>,
}

/// The compression streams of a WebSocket that keep context between messages, each as the
/// last bytes it saw (at most [`crate::ws::deflate::MAX_WINDOW`]): all that the stream's next
/// message can refer back to. Only a record in [`ConnState::Ws`] with `deflate` may carry them.
///
/// Encoded as `FLAGS (u8: 1 deflater, 2 inflater) | [WINDOW (u16 length, bytes)] per flag`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeflateWindows<'a> {
    /// The server's own compressor (`dedicated` mode), once it has compressed a message.
    pub deflater: Option<&'a [u8]>,
    /// The inflater of a client that keeps context (agreed with a server before
    /// `client_no_context_takeover` was always answered), once it has sent a compressed message.
    pub inflater: Option<&'a [u8]>,
}

impl DeflateWindows<'_> {
    /// Whether neither stream is carried.
    pub fn is_empty(&self) -> bool {
        self.deflater.is_none() && self.inflater.is_none()
    }
}

/// An HTTP/2 connection's part of its record: the protocol state and the streams that move
/// with it. The connection's `input` is the client's frames not yet read and its `output`
/// the frames the kernel has not taken; a stream's are the HTTP/1.1-shaped bytes of its own
/// request and answer, framed by the new process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Record<'a> {
    /// The connection's state as [`crate::h2::server::Connection::park`] wrote it (checked by
    /// the decoder with [`crate::h2::server::Connection::restore`]).
    pub connection: &'a [u8],
    /// Each moving stream's id and its record: a connection record of its own, without a
    /// socket, a TLS part or an HTTP/2 part (its `worker` and `peer` are its connection's).
    pub streams: Vec<(u32, ConnRecord<'a>)>,
}

/// A TLS 1.3 connection's record layer as it moves: the keys' state and the ciphertext in
/// flight, so that the new process continues the connection byte for byte. Its bytes are
/// secret (the traffic secrets): they travel only over the private hand-over socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsRecord<'a> {
    /// Suite, both directions' traffic secrets and their use, a KeyUpdate owed or half read.
    /// Boxed: the records around it move (decoded into a list, handed to a worker), and each
    /// move of an inline value would leave a copy of the secrets behind in freed memory;
    /// the box moves as a pointer and wipes its one copy when dropped.
    pub session: Box<crate::tls13::Parked>,
    /// Ciphertext of a record not yet complete (less than one record).
    pub partial: &'a [u8],
    /// Records sealed but not taken by the kernel yet; they go out before anything else.
    pub unsent: &'a [u8],
}

/// How many connections moved and how many fell back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// Connections sent in `conns` frames.
    pub moved: u32,
    /// Connections told to reconnect instead.
    pub fallback: u32,
}

/// A decoded frame, borrowing from the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    /// See [`FrameType::Hello`].
    Hello(Hello<'a>),
    /// See [`FrameType::Refuse`].
    Refuse(&'a str),
    /// See [`FrameType::Listeners`].
    Listeners(Listeners<'a>),
    /// See [`FrameType::History`].
    History(History<'a>),
    /// See [`FrameType::Ready`].
    Ready,
    /// See [`FrameType::Conns`].
    Conns(Vec<ConnRecord<'a>>),
    /// See [`FrameType::End`].
    End(End),
    /// See [`FrameType::Ack`].
    Ack,
    /// See [`FrameType::Positions`]: (topic, `EPOCH-SEQ` id) pairs.
    Positions(Vec<(&'a str, &'a str)>),
}

impl Frame<'_> {
    /// Descriptors that ride with this frame.
    pub fn fds(&self) -> usize {
        match self {
            Frame::Listeners(l) => usize::from(l.client) + usize::from(l.tls) + usize::from(l.api),
            Frame::Conns(c) => c.len(),
            _ => 0,
        }
    }
}

/// Appends `frame`'s encoding to `out`. Lengths beyond a field's width are cut to it (the
/// caller keeps names, cursors and counts within them, as the server's own limits do).
pub fn encode(frame: &Frame<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    let ty = match frame {
        Frame::Hello(_) => FrameType::Hello,
        Frame::Refuse(_) => FrameType::Refuse,
        Frame::Listeners(_) => FrameType::Listeners,
        Frame::History(_) => FrameType::History,
        Frame::Ready => FrameType::Ready,
        Frame::Conns(_) => FrameType::Conns,
        Frame::End(_) => FrameType::End,
        Frame::Ack => FrameType::Ack,
        Frame::Positions(_) => FrameType::Positions,
    };
    out.push(ty as u8);
    out.extend_from_slice(&[0; 4]);
    match frame {
        Frame::Hello(h) => {
            out.extend_from_slice(&h.version.to_le_bytes());
            put_str8(out, h.binary);
            out.extend_from_slice(&h.workers.to_le_bytes());
            out.push(u8::from(h.tls));
        }
        Frame::Refuse(why) => put_str16(out, why),
        Frame::Listeners(l) => {
            out.extend_from_slice(&l.client.to_le_bytes());
            out.extend_from_slice(&l.tls.to_le_bytes());
            out.push(l.api);
            put_str16(out, l.node);
        }
        Frame::History(h) => {
            put_str8(out, h.epoch);
            out.extend_from_slice(&h.next_id.to_le_bytes());
            out.push(u8::from(h.on_disk));
            out.extend_from_slice(&h.forgotten_floor.to_le_bytes());
            out.extend_from_slice(&(h.floors.len() as u32).to_le_bytes());
            for (name, floor) in &h.floors {
                put_str16(out, name);
                out.extend_from_slice(&floor.to_le_bytes());
            }
            put_bytes32(out, h.records);
            if let Some(t) = &h.streams {
                crate::handover_streams::encode(t, out);
            }
        }
        Frame::Ready | Frame::Ack => {}
        Frame::Conns(list) => {
            out.extend_from_slice(&(list.len() as u16).to_le_bytes());
            for c in list {
                encode_conn(c, out);
            }
        }
        Frame::End(e) => {
            out.extend_from_slice(&e.moved.to_le_bytes());
            out.extend_from_slice(&e.fallback.to_le_bytes());
        }
        Frame::Positions(list) => {
            out.extend_from_slice(&(list.len() as u32).to_le_bytes());
            for (topic, id) in list {
                put_str16(out, topic);
                put_str8(out, id);
            }
        }
    }
    let len = (out.len() - start - HEAD) as u32;
    if let Some(slot) = out.get_mut(start + 5..start + HEAD) {
        slot.copy_from_slice(&len.to_le_bytes());
    }
}

fn encode_conn(c: &ConnRecord<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(&c.worker.to_le_bytes());
    match &c.state {
        ConnState::Http => out.push(0),
        ConnState::Ws {
            role,
            deflate,
            pinged,
        } => {
            out.extend_from_slice(&[1, *role, u8::from(deflate.is_some())]);
            out.extend_from_slice(&[deflate.unwrap_or(0), u8::from(*pinged)]);
        }
        ConnState::Sse(m) => out.extend_from_slice(&[2, *m]),
        ConnState::Stream(m) => out.extend_from_slice(&[3, *m]),
        ConnState::Poll { keep, left, cursor } => {
            out.extend_from_slice(&[4, u8::from(*keep)]);
            out.extend_from_slice(&left.to_le_bytes());
            put_str16(out, cursor);
        }
        ConnState::H2 => out.push(5),
    }
    out.extend_from_slice(&c.idle.to_le_bytes());
    out.extend_from_slice(&c.peer.to_le_bytes());
    put_bytes32(out, c.input);
    put_bytes32(out, c.output);
    out.extend_from_slice(&(c.topics.len() as u16).to_le_bytes());
    for t in &c.topics {
        put_str16(out, t);
    }
    match &c.mode {
        None => out.push(0),
        Some(m) => {
            // Flag, then the section's length (filled in once written) and the section.
            out.push(1);
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            handover_state::encode(m, out);
            let len = (out.len() - at - 4) as u32;
            if let Some(slot) = out.get_mut(at..at + 4) {
                slot.copy_from_slice(&len.to_le_bytes());
            }
        }
    }
    encode_tls(c.tls.as_ref(), out);
    encode_deflate(&c.deflate, out);
    encode_h2(c.h2.as_ref(), out);
    crate::handover_grip::encode(c.grip.as_ref(), out);
}

/// The deflate part of a connection record (see [`DeflateWindows`]).
fn encode_deflate(d: &DeflateWindows<'_>, out: &mut Vec<u8>) {
    let flags = u8::from(d.deflater.is_some()) | u8::from(d.inflater.is_some()) << 1;
    out.push(flags);
    for w in [d.deflater, d.inflater].into_iter().flatten() {
        // At most MAX_WINDOW (32 KiB): the caller carries no more than a window.
        let w = w
            .get(w.len().saturating_sub(crate::ws::deflate::MAX_WINDOW)..)
            .unwrap_or_default();
        out.extend_from_slice(&(w.len() as u16).to_le_bytes());
        out.extend_from_slice(w);
    }
}

fn decode_deflate<'a>(
    r: &mut Reader<'a>,
    state: &ConnState<'_>,
) -> Result<DeflateWindows<'a>, Error> {
    let flags = r.u8()?;
    if flags > 3 {
        return Err(Error::Malformed(r.what));
    }
    let mut window = |bit: u8| -> Result<Option<&'a [u8]>, Error> {
        if flags & bit == 0 {
            return Ok(None);
        }
        let n = usize::from(r.u16()?);
        if n > crate::ws::deflate::MAX_WINDOW {
            return Err(Error::Malformed(r.what));
        }
        r.take(n).map(Some)
    };
    let d = DeflateWindows {
        deflater: window(1)?,
        inflater: window(2)?,
    };
    let compressed = matches!(
        state,
        ConnState::Ws {
            deflate: Some(_),
            ..
        }
    );
    if !d.is_empty() && !compressed {
        // One encoding per record: no windows on a connection without compression.
        return Err(Error::Malformed(r.what));
    }
    Ok(d)
}

/// The HTTP/2 part of a connection record: `0`, or `1 | CONNECTION (bytes32) | N (u16) |
/// N x (STREAM (u32) | RECORD)`, each RECORD a connection record without its own HTTP/2 part.
fn encode_h2(h2: Option<&H2Record<'_>>, out: &mut Vec<u8>) {
    let Some(h) = h2 else {
        out.push(0);
        return;
    };
    out.push(1);
    put_bytes32(out, h.connection);
    out.extend_from_slice(&(h.streams.len() as u16).to_le_bytes());
    for (id, r) in &h.streams {
        out.extend_from_slice(&id.to_le_bytes());
        encode_conn(r, out);
    }
}

fn decode_h2<'a>(r: &mut Reader<'a>) -> Result<Option<H2Record<'a>>, Error> {
    if !r.flag()? {
        return Ok(None);
    }
    let connection = r.bytes32()?;
    crate::h2::server::Connection::restore(connection).map_err(|_| Error::Malformed(r.what))?;
    let n = usize::from(r.u16()?);
    let mut streams: Vec<(u32, ConnRecord<'a>)> = Vec::with_capacity(n.min(r.buf.len() / 32));
    for _ in 0..n {
        let id = r.u32()?;
        let rec = decode_conn(r, false)?;
        let fresh = streams.iter().all(|(other, _)| *other != id);
        let streamish = rec.tls.is_none() && rec.state != ConnState::H2;
        if id % 2 == 0 || id > crate::h2::frame::MAX_WINDOW || !fresh || !streamish {
            return Err(Error::Malformed(r.what));
        }
        streams.push((id, rec));
    }
    Ok(Some(H2Record {
        connection,
        streams,
    }))
}

/// The TLS part of a connection record: `0`, or `1 | LEN (u8) | PARKED | PARTIAL (bytes32) |
/// UNSENT (bytes32)` (see [`crate::tls13::parked`]).
fn encode_tls(tls: Option<&TlsRecord<'_>>, out: &mut Vec<u8>) {
    let Some(t) = tls else {
        out.push(0);
        return;
    };
    out.push(1);
    let at = out.len();
    out.push(0);
    t.session.encode(out);
    let len = out.len() - at - 1;
    if let Some(slot) = out.get_mut(at) {
        *slot = len as u8; // At most `parked::MAX_LEN` (228) bytes.
    }
    put_bytes32(out, t.partial);
    put_bytes32(out, t.unsent);
}

fn decode_tls<'a>(r: &mut Reader<'a>) -> Result<Option<TlsRecord<'a>>, Error> {
    if !r.flag()? {
        return Ok(None);
    }
    let n = usize::from(r.u8()?);
    let session = crate::tls13::Parked::decode(r.take(n)?)
        .map(Box::new)
        .map_err(|_| Error::Malformed(r.what))?;
    let partial = r.bytes32()?;
    // A partial record is shorter than the longest record.
    if partial.len() >= crate::tls13::wire::HEADER_LEN + crate::tls13::wire::MAX_CIPHERTEXT {
        return Err(Error::Malformed(r.what));
    }
    let unsent = r.bytes32()?;
    Ok(Some(TlsRecord {
        session,
        partial,
        unsent,
    }))
}

fn put_str8(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes().get(..s.len().min(255)).unwrap_or_default();
    out.push(b.len() as u8);
    out.extend_from_slice(b);
}

fn put_str16(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes().get(..s.len().min(65535)).unwrap_or_default();
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_bytes32(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Decodes the frame at the start of `buf`: `Ok(None)` when more bytes are needed, else the
/// frame and the bytes it used. Checks the magic and the length before waiting for the body.
pub fn decode(buf: &[u8]) -> Result<Option<(Frame<'_>, usize)>, Error> {
    let Some(head) = buf.get(..HEAD) else {
        if buf.iter().zip(MAGIC.iter()).any(|(a, b)| a != b) {
            return Err(Error::Magic);
        }
        return Ok(None);
    };
    if head.get(..4) != Some(&MAGIC[..]) {
        return Err(Error::Magic);
    }
    let ty_byte = head.get(4).copied().unwrap_or(0);
    let ty = FrameType::from_u8(ty_byte).ok_or(Error::Type(ty_byte))?;
    let mut len = [0u8; 4];
    len.copy_from_slice(head.get(5..9).unwrap_or(&[0; 4]));
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_BODY {
        return Err(Error::TooLong(len));
    }
    let Some(body) = buf.get(HEAD..HEAD + len) else {
        return Ok(None);
    };
    let frame = decode_body(ty, body)?;
    Ok(Some((frame, HEAD + len)))
}

fn decode_body(ty: FrameType, body: &[u8]) -> Result<Frame<'_>, Error> {
    let name = match ty {
        FrameType::Hello => "hello",
        FrameType::Refuse => "refuse",
        FrameType::Listeners => "listeners",
        FrameType::History => "history",
        FrameType::Ready => "ready",
        FrameType::Conns => "conns",
        FrameType::End => "end",
        FrameType::Ack => "ack",
        FrameType::Positions => "positions",
    };
    let mut r = Reader {
        buf: body,
        what: name,
    };
    let frame = match ty {
        FrameType::Hello => Frame::Hello(Hello {
            version: r.u16()?,
            binary: r.str8()?,
            workers: r.u16()?,
            tls: r.flag()?,
        }),
        FrameType::Refuse => Frame::Refuse(r.str16()?),
        FrameType::Listeners => Frame::Listeners(Listeners {
            client: r.u16()?,
            tls: r.u16()?,
            api: r.u8()?,
            node: r.str16()?,
        }),
        FrameType::History => {
            let epoch = r.str8()?;
            let next_id = r.u64()?;
            let on_disk = r.flag()?;
            let forgotten_floor = r.u64()?;
            let n = r.u32()? as usize;
            // Each floor takes at least 10 bytes: a count beyond that is a lie, not a size to
            // reserve.
            let mut floors = Vec::with_capacity(n.min(r.buf.len() / 10));
            for _ in 0..n {
                floors.push((r.str16()?, r.u64()?));
            }
            let records = r.bytes32()?;
            let streams = if r.buf.is_empty() {
                None
            } else {
                Some(crate::handover_streams::decode(&mut r)?)
            };
            Frame::History(History {
                epoch,
                next_id,
                on_disk,
                forgotten_floor,
                floors,
                records,
                streams,
            })
        }
        FrameType::Ready => Frame::Ready,
        FrameType::Ack => Frame::Ack,
        FrameType::Conns => {
            let n = usize::from(r.u16()?);
            if n > MAX_FDS {
                return Err(Error::Malformed(name));
            }
            let mut list = Vec::with_capacity(n);
            for _ in 0..n {
                list.push(decode_conn(&mut r, true)?);
            }
            Frame::Conns(list)
        }
        FrameType::End => Frame::End(End {
            moved: r.u32()?,
            fallback: r.u32()?,
        }),
        FrameType::Positions => {
            let n = r.u32()? as usize;
            // Each pair takes at least 3 bytes: a count beyond that is a lie.
            let mut list = Vec::with_capacity(n.min(r.buf.len() / 3));
            for _ in 0..n {
                list.push((r.str16()?, r.str8()?));
            }
            Frame::Positions(list)
        }
    };
    if !r.buf.is_empty() {
        return Err(Error::Trailing(name));
    }
    Ok(frame)
}

/// One connection record; `outer`: a record of its own (not an HTTP/2 stream's, which
/// cannot hold an HTTP/2 part).
fn decode_conn<'a>(r: &mut Reader<'a>, outer: bool) -> Result<ConnRecord<'a>, Error> {
    let worker = r.u16()?;
    let state = match r.u8()? {
        0 => ConnState::Http,
        1 => {
            let role = r.u8()?;
            if role > 4 {
                return Err(Error::Malformed(r.what));
            }
            let has = r.flag()?;
            let bits = r.u8()?;
            if !has && bits != 0 {
                // One encoding per record: no parameters without compression.
                return Err(Error::Malformed(r.what));
            }
            ConnState::Ws {
                role,
                deflate: has.then_some(bits),
                pinged: r.flag()?,
            }
        }
        2 => ConnState::Sse(r.at_most(1)?),
        3 => ConnState::Stream(r.at_most(5)?),
        4 => ConnState::Poll {
            keep: r.flag()?,
            left: r.u32()?,
            cursor: r.str16()?,
        },
        5 => ConnState::H2,
        _ => return Err(Error::Malformed(r.what)),
    };
    let idle = r.u32()?;
    let peer = r.u32()?;
    let input = r.bytes32()?;
    let output = r.bytes32()?;
    let n = usize::from(r.u16()?);
    let mut topics = Vec::with_capacity(n.min(r.buf.len() / 2));
    for _ in 0..n {
        topics.push(r.str16()?);
    }
    let mode = if r.flag()? {
        let section = r.bytes32()?;
        Some(handover_state::decode(section).map_err(|_| Error::Malformed(r.what))?)
    } else {
        None
    };
    // A Pusher WebSocket exactly when its Pusher part is there.
    let pusher_role = matches!(state, ConnState::Ws { role: 3 | 4, .. });
    if pusher_role != mode.as_ref().is_some_and(|m| m.pusher.is_some()) {
        return Err(Error::Malformed(r.what));
    }
    let tls = decode_tls(r)?;
    let deflate = decode_deflate(r, &state)?;
    let h2 = if outer { decode_h2(r)? } else { None };
    if !outer && r.flag()? {
        return Err(Error::Malformed(r.what));
    }
    // An HTTP/2 part exactly on an HTTP/2 connection.
    if h2.is_some() != (state == ConnState::H2) {
        return Err(Error::Malformed(r.what));
    }
    let grip = crate::handover_grip::decode(r)?;
    // A keep-alive only on a GRIP held stream, a hold only on a poll without a cursor.
    let fits = match (&grip, &state) {
        (None, _) => true,
        (Some(GripRecord::KeepAlive { .. }), ConnState::Stream(m)) => {
            crate::handover_grip::grip_stream(*m).is_some()
        }
        (Some(GripRecord::Response { .. }), ConnState::Poll { cursor, .. }) => cursor.is_empty(),
        (Some(GripRecord::KeepAlive { .. } | GripRecord::Response { .. }), _) => false,
    };
    if !fits {
        return Err(Error::Malformed(r.what));
    }
    Ok(ConnRecord {
        worker,
        state,
        idle,
        peer,
        input,
        output,
        topics,
        mode,
        tls,
        deflate,
        h2,
        grip,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::handover_grip::stream_mode;

    fn tls_sample() -> TlsRecord<'static> {
        use crate::tls13::limits::Usage;
        use crate::tls13::parked::ParkedDirection;
        use crate::tls13::{CipherSuite, TrafficKey, TrafficSecret};
        let suite = CipherSuite::Aes256GcmSha384;
        TlsRecord {
            session: Box::new(crate::tls13::Parked {
                suite,
                send: ParkedDirection {
                    secret: TrafficSecret::new(suite, &[9; 48]).unwrap(),
                    key: TrafficKey::new(suite, &[7; 32], &[1; 12]).unwrap(),
                    usage: Usage { seq: 3, weight: 99 },
                },
                receive: ParkedDirection {
                    secret: TrafficSecret::new(suite, &[8; 48]).unwrap(),
                    key: TrafficKey::new(suite, &[6; 32], &[2; 12]).unwrap(),
                    usage: Usage { seq: 4, weight: 77 },
                },
                owe_update: true,
                partial_handshake: vec![24],
            }),
            partial: b"\x17\x03\x03\x00",
            unsent: b"\x17\x03\x03\x00\x11sealed records...",
        }
    }

    /// An HTTP/2 connection over TLS with an SSE stream and a held poll.
    fn h2_sample() -> ConnRecord<'static> {
        let mut parked = Vec::new();
        crate::h2::server::Connection::new(crate::h2::server::Settings::default())
            .park(&mut parked);
        let stream = |state| ConnRecord {
            worker: 0,
            state,
            idle: 2,
            peer: 9,
            input: b"",
            output: b"data: owed\n\n",
            topics: vec!["t"],
            mode: None,
            tls: None,
            deflate: DeflateWindows::default(),
            grip: None,
            h2: None,
        };
        ConnRecord {
            worker: 1,
            state: ConnState::H2,
            idle: 0,
            peer: 9,
            input: b"\0\0\x08\x06",
            output: b"\0\0\0\x04\x01\0\0\0\0",
            topics: vec![],
            mode: None,
            tls: Some(tls_sample()),
            deflate: DeflateWindows::default(),
            grip: None,
            h2: Some(H2Record {
                connection: Box::leak(parked.into_boxed_slice()),
                streams: vec![
                    (1, stream(ConnState::Sse(0))),
                    (
                        3,
                        stream(ConnState::Poll {
                            keep: false,
                            left: 20,
                            cursor: "k3x9-7",
                        }),
                    ),
                    (
                        5,
                        ConnRecord {
                            deflate: DeflateWindows {
                                deflater: Some(b"{\"seq\":40}"),
                                inflater: None,
                            },
                            ..stream(ConnState::Ws {
                                role: 0,
                                deflate: Some(0b0010_0111),
                                pinged: false,
                            })
                        },
                    ),
                ],
            }),
        }
    }

    fn samples() -> Vec<Frame<'static>> {
        vec![
            Frame::Hello(Hello {
                version: VERSION,
                binary: "0.9.0",
                workers: 2,
                tls: true,
            }),
            Frame::Refuse("format version 2, this binary reads 1"),
            Frame::Listeners(Listeners {
                client: 2,
                tls: 0,
                api: 1,
                node: "web-1:4242",
            }),
            Frame::History(History {
                epoch: "k3x9",
                next_id: 1001,
                on_disk: false,
                forgotten_floor: 7,
                floors: vec![("news", 12), ("a/b", 3)],
                records: b"\xC7records",
                streams: None,
            }),
            Frame::Ready,
            Frame::Conns(vec![
                ConnRecord {
                    worker: 1,
                    state: ConnState::Ws {
                        role: 1,
                        deflate: Some(0b0010_0111),
                        pinged: true,
                    },
                    idle: 3,
                    peer: 0x7f00_0001,
                    input: b"\x81\x85partial",
                    output: b"owed",
                    topics: vec!["news", "sport"],
                    mode: Some(crate::handover_state::tests::full()),
                    tls: Some(tls_sample()),
                    deflate: DeflateWindows {
                        deflater: Some(b"{\"seq\":41,\"price\":\"1.08412\"}"),
                        inflater: Some(b""),
                    },
                    grip: None,
                    h2: None,
                },
                ConnRecord {
                    worker: 0,
                    state: ConnState::Poll {
                        keep: true,
                        left: 25,
                        cursor: "k3x9-1000",
                    },
                    idle: 0,
                    peer: 1,
                    input: b"",
                    output: b"",
                    topics: vec!["news"],
                    mode: Some(ModeState::default()),
                    tls: None,
                    deflate: DeflateWindows::default(),
                    grip: None,
                    h2: None,
                },
                ConnRecord {
                    worker: 0,
                    state: ConnState::Sse(1),
                    idle: 0,
                    peer: 1,
                    input: b"",
                    output: b"",
                    topics: vec![],
                    mode: None,
                    tls: None,
                    deflate: DeflateWindows::default(),
                    grip: None,
                    h2: None,
                },
                ConnRecord {
                    worker: 0,
                    state: ConnState::Stream(0),
                    idle: 9,
                    peer: 2,
                    input: b"",
                    output: b"x",
                    topics: vec!["t"],
                    mode: None,
                    tls: None,
                    deflate: DeflateWindows::default(),
                    grip: None,
                    h2: None,
                },
                h2_sample(),
                ConnRecord {
                    worker: 3,
                    state: ConnState::Http,
                    idle: 1,
                    peer: 2,
                    input: b"GET / HT",
                    output: b"",
                    topics: vec![],
                    mode: None,
                    tls: None,
                    deflate: DeflateWindows::default(),
                    grip: None,
                    h2: None,
                },
            ]),
            Frame::End(End {
                moved: 6,
                fallback: 2,
            }),
            Frame::Ack,
            Frame::Positions(vec![("news", "k3x9-41"), ("a/b", "q2-0")]),
            Frame::Positions(Vec::new()),
            Frame::Conns(grip_records()),
            Frame::Conns(pusher_records()),
        ]
    }

    /// Pusher connections: one with compression (its deflater's window) in presence and
    /// public channels, one with the resume extension.
    fn pusher_records() -> Vec<ConnRecord<'static>> {
        let mode = ModeState {
            pusher: Some(crate::handover_state::tests::pusher()),
            ..crate::handover_state::tests::full()
        };
        let record = |role, deflate: Option<u8>| ConnRecord {
            worker: 1,
            state: ConnState::Ws {
                role,
                deflate,
                pinged: role == 4,
            },
            idle: 2,
            peer: 7,
            input: b"",
            output: b"",
            topics: vec!["presence-room", "ticker"],
            mode: Some(mode.clone()),
            tls: None,
            deflate: DeflateWindows {
                deflater: deflate.map(|_| &b"{\"event\":\"quote\"}"[..]),
                inflater: None,
            },
            h2: None,
            grip: None,
        };
        vec![record(3, Some(0b0010_0111)), record(4, None)]
    }

    /// Connections a GRIP backend holds: a chunked stream with its keep-alive, a
    /// close-delimited one without, a long-poll, and an HTTP/2 connection with a held stream.
    fn grip_records() -> Vec<ConnRecord<'static>> {
        let record = |state, grip| ConnRecord {
            worker: 0,
            state,
            idle: 4,
            peer: 5,
            input: b"",
            output: b"6\r\npushed\r\n",
            topics: vec!["channel"],
            mode: None,
            tls: None,
            deflate: DeflateWindows::default(),
            h2: None,
            grip,
        };
        let keep_alive = GripRecord::KeepAlive {
            data: b"1\r\n\n\r\n",
            every: 10,
            interval: false,
            since: 2,
        };
        let hold = GripRecord::Response {
            left: 12,
            timeout: b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            headers: vec![("Content-Type", "text/plain")],
        };
        let poll = ConnState::Poll {
            keep: true,
            left: 0,
            cursor: "",
        };
        let mut h2 = h2_sample();
        if let Some(h) = h2.h2.as_mut() {
            let held = record(
                ConnState::Stream(stream_mode(true, false)),
                Some(keep_alive.clone()),
            );
            h.streams.push((9, held));
        }
        vec![
            record(ConnState::Stream(stream_mode(true, true)), Some(keep_alive)),
            record(ConnState::Stream(stream_mode(false, false)), None),
            record(poll, Some(hold)),
            h2,
        ]
    }

    #[test]
    fn a_grip_part_only_goes_with_a_grip_hold() {
        let keep_alive = GripRecord::KeepAlive {
            data: b"",
            every: 1,
            interval: true,
            since: 0,
        };
        let hold = GripRecord::Response {
            left: 1,
            timeout: b"",
            headers: vec![],
        };
        let mut bad = grip_records();
        bad.truncate(1);
        let misfits = [
            (ConnState::Stream(0), keep_alive.clone()),
            (ConnState::Sse(0), keep_alive.clone()),
            (ConnState::Stream(stream_mode(true, true)), hold.clone()),
            (
                ConnState::Poll {
                    keep: false,
                    left: 3,
                    cursor: "k-1",
                },
                hold,
            ),
            (ConnState::Http, keep_alive),
        ];
        for (state, part) in misfits {
            bad[0].state = state.clone();
            bad[0].grip = Some(part.clone());
            let mut buf = Vec::new();
            encode(&Frame::Conns(bad.clone()), &mut buf);
            assert!(decode(&buf).is_err(), "{state:?} with {part:?}");
        }
        bad[0].state = ConnState::Stream(6);
        bad[0].grip = None;
        let mut buf = Vec::new();
        encode(&Frame::Conns(bad), &mut buf);
        assert!(decode(&buf).is_err(), "no stream mode 6");
    }

    #[test]
    fn a_pusher_role_goes_exactly_with_a_pusher_part() {
        let good = pusher_records();
        for (i, r) in good.iter().enumerate() {
            let mut buf = Vec::new();
            encode(&Frame::Conns(vec![r.clone()]), &mut buf);
            assert_eq!(
                decode(&buf),
                Ok(Some((Frame::Conns(vec![r.clone()]), buf.len())))
            );
            // The same record without its Pusher part, or as a pub/sub one with it: refused.
            let mut bare = r.clone();
            if let Some(m) = bare.mode.as_mut() {
                m.pusher = None;
            }
            let mut plain = r.clone();
            plain.state = ConnState::Ws {
                role: 0,
                deflate: None,
                pinged: false,
            };
            plain.deflate = DeflateWindows::default();
            for wrong in [bare, plain] {
                let mut buf = Vec::new();
                encode(&Frame::Conns(vec![wrong]), &mut buf);
                assert!(decode(&buf).is_err(), "record {i}");
            }
        }
    }

    #[test]
    fn every_frame_round_trips_and_counts_its_descriptors() {
        let mut all = Vec::new();
        for f in samples() {
            encode(&f, &mut all);
        }
        let mut at = 0;
        for f in samples() {
            let (got, used) = decode(&all[at..]).unwrap().unwrap();
            assert_eq!(got, f);
            assert_eq!(got.fds(), f.fds());
            at += used;
        }
        assert_eq!(at, all.len());
        assert_eq!(samples()[2].fds(), 3);
        assert_eq!(samples()[5].fds(), 6);
    }

    #[test]
    fn the_committed_fuzz_seeds_decode() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/handover");
        let mut parts = (false, false, false, false, false);
        let mut stream_table = false;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            if path.ends_with("parked_tls13") {
                // The fuzz target also decodes its input as a parked TLS record layer alone.
                crate::tls13::Parked::decode(&bytes).unwrap();
                continue;
            }
            if path.ends_with("h2_connection") {
                // ... and as a parked HTTP/2 connection alone.
                crate::h2::server::Connection::restore(&bytes).unwrap();
                continue;
            }
            if path.ends_with("grip_part") {
                // ... and as a connection record's GRIP part alone.
                crate::handover_grip::decode_part(&bytes).unwrap().unwrap();
                continue;
            }
            if path.ends_with("mode_state") {
                // ... and as a connection record's auth/hooks/presence section alone.
                crate::handover_state::decode(&bytes).unwrap();
                continue;
            }
            let mut at = 0;
            while at < bytes.len() {
                let (frame, used) = decode(&bytes[at..]).unwrap().unwrap();
                if let Frame::History(h) = &frame {
                    stream_table |= h.streams.as_ref().is_some_and(|t| !t.open.is_empty());
                }
                if let Frame::Conns(records) = frame {
                    for r in &records {
                        let nested = r.h2.iter().flat_map(|h| h.streams.iter().map(|(_, s)| s));
                        for c in std::iter::once(r).chain(nested) {
                            parts.0 |= c.deflate.deflater.is_some();
                            parts.1 |= c.deflate.inflater.is_some();
                        }
                        parts.2 |= r.h2.is_some();
                        parts.3 |= r.grip.is_some();
                        parts.4 |= r.mode.as_ref().is_some_and(|m| m.pusher.is_some());
                    }
                }
                at += used;
            }
        }
        // Every part of a connection record is in some seed, so the fuzz target starts from
        // each (deflater and inflater windows, an HTTP/2 connection, a GRIP hold, a Pusher
        // connection's part).
        assert_eq!(
            parts,
            (true, true, true, true, true),
            "(deflater, inflater, h2, grip, pusher)"
        );
        // ... and a history frame's table of open streams.
        assert!(
            stream_table,
            "no seed holds a history frame with open streams"
        );
    }

    #[test]
    fn a_short_buffer_asks_for_more_at_every_cut() {
        let mut buf = Vec::new();
        encode(&samples()[5], &mut buf);
        for cut in 0..buf.len() {
            assert_eq!(decode(&buf[..cut]), Ok(None), "cut at {cut}");
        }
        assert!(decode(&buf).unwrap().is_some());
    }

    #[test]
    fn bad_magic_type_length_and_trailing_bytes_are_refused() {
        assert_eq!(decode(b"HTTP/1.1"), Err(Error::Magic));
        assert_eq!(decode(b"CLX"), Err(Error::Magic));
        assert_eq!(decode(b"CLHO\x63\0\0\0\0"), Err(Error::Type(0x63)));
        let mut huge = b"CLHO\x06".to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&huge), Err(Error::TooLong(u32::MAX as usize)));
        let mut buf = Vec::new();
        encode(&Frame::Ack, &mut buf);
        buf[5] = 1;
        buf.push(0);
        assert_eq!(decode(&buf), Err(Error::Trailing("ack")));
    }

    #[test]
    fn lying_lengths_inside_a_body_are_malformed_not_panics() {
        let mut buf = Vec::new();
        encode(&samples()[5], &mut buf);
        // Every single-byte corruption of the body decodes or fails cleanly.
        for i in HEAD..buf.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut b = buf.clone();
                b[i] = v;
                let _ = decode(&b);
            }
        }
        // A conns frame announcing more records than descriptors may carry.
        let mut b = b"CLHO\x06\x02\0\0\0".to_vec();
        b.extend_from_slice(&((MAX_FDS + 1) as u16).to_le_bytes());
        assert_eq!(decode(&b), Err(Error::Malformed("conns")));
        // Deflate parameters without deflate (found by the fuzz target: it would not
        // re-encode to the same bytes).
        let mut b = b"CLHO\x06".to_vec();
        let body = [1u8, 0, 0, 0, 1, 1, 0, 0xb5, 0];
        b.extend_from_slice(&(body.len() as u32).to_le_bytes());
        b.extend_from_slice(&body);
        assert_eq!(decode(&b), Err(Error::Malformed("conns")));
        // A TLS part that lies: a parked state one byte short, a partial record as long as a
        // whole one.
        let windowed = match &samples()[5] {
            Frame::Conns(l) => l[0].clone(),
            _ => unreachable!(),
        };
        let conn = ConnRecord {
            deflate: DeflateWindows::default(),
            ..windowed.clone()
        };
        let mut good = Vec::new();
        encode(&Frame::Conns(vec![conn.clone()]), &mut good);
        let mut plain = Vec::new();
        encode(
            &Frame::Conns(vec![ConnRecord { tls: None, ..conn }]),
            &mut plain,
        );
        // The TLS part, then the deflate part's flags (none), the HTTP/2 part's and the GRIP
        // part's.
        let tls_at = plain.len() - 4;
        assert_eq!((plain[tls_at], good[tls_at]), (0, 1), "the TLS flag");
        let mut b = good.clone();
        b[tls_at + 1] -= 1;
        assert_eq!(decode(&b), Err(Error::Malformed("conns")));
        let mut b = good.clone();
        b[tls_at] = 2;
        assert_eq!(decode(&b), Err(Error::Malformed("conns")));
        let mut b = good[..tls_at].to_vec();
        let mut tail = Vec::new();
        let mut long = tls_sample();
        let whole = vec![0u8; 5 + crate::tls13::wire::MAX_CIPHERTEXT];
        long.partial = &whole;
        encode_tls(Some(&long), &mut tail);
        b.extend_from_slice(&tail);
        b.push(0);
        encode_h2(None, &mut b);
        crate::handover_grip::encode(None, &mut b);
        let body = (b.len() - HEAD) as u32;
        b[5..9].copy_from_slice(&body.to_le_bytes());
        assert_eq!(decode(&b), Err(Error::Malformed("conns")));
        // Deflate windows that lie: on a record without compression, with an unknown flag,
        // longer than any window.
        let sse = match &samples()[5] {
            Frame::Conns(l) => l[2].clone(),
            _ => unreachable!(),
        };
        let mut plain = Vec::new();
        encode(&Frame::Conns(vec![sse.clone()]), &mut plain);
        let with = ConnRecord {
            deflate: DeflateWindows {
                deflater: Some(b"ab"),
                inflater: None,
            },
            ..sse
        };
        let mut b = Vec::new();
        encode(&Frame::Conns(vec![with]), &mut b);
        assert_eq!(decode(&b), Err(Error::Malformed("conns")));
        let mut b = plain.clone();
        // The deflate flags, before the HTTP/2 part's flag and the GRIP part's.
        let at = b.len() - 3;
        b[at] = 4;
        assert_eq!(decode(&b), Err(Error::Malformed("conns")));
        let mut ws = Vec::new();
        let deflater = windowed.deflate.deflater.map_or(0, <[u8]>::len);
        encode(&Frame::Conns(vec![windowed]), &mut ws);
        // Flags, the deflater's window, the inflater's empty one, the HTTP/2 part's flag, the
        // GRIP part's.
        let flags_at = ws.len() - (1 + 2 + deflater + 2 + 1 + 1);
        assert_eq!(ws[flags_at], 3, "the deflate flags");
        let mut b = ws[..flags_at].to_vec();
        b.push(1);
        b.extend_from_slice(&((crate::ws::deflate::MAX_WINDOW + 1) as u16).to_le_bytes());
        b.extend_from_slice(&vec![0u8; crate::ws::deflate::MAX_WINDOW + 1]);
        b.extend_from_slice(&[0, 0]);
        let body = (b.len() - HEAD) as u32;
        b[5..9].copy_from_slice(&body.to_le_bytes());
        assert_eq!(decode(&b), Err(Error::Malformed("conns")));
        // HTTP/2 parts where they do not belong, or missing where they do.
        let h2 = h2_sample();
        let no_part = ConnRecord {
            grip: None,
            h2: None,
            ..h2.clone()
        };
        let misplaced = ConnRecord {
            state: ConnState::Sse(0),
            ..h2.clone()
        };
        let mut nested = h2.clone();
        if let Some(p) = nested.h2.as_mut() {
            p.streams[0].1.state = ConnState::H2;
        }
        let mut even = h2.clone();
        if let Some(p) = even.h2.as_mut() {
            p.streams[1].0 = 4;
        }
        for bad in [no_part, misplaced, nested, even] {
            let mut b = Vec::new();
            encode(&Frame::Conns(vec![bad]), &mut b);
            assert_eq!(decode(&b), Err(Error::Malformed("conns")));
        }
        // A parked connection that does not restore.
        let mut broken = h2.clone();
        if let Some(p) = broken.h2.as_mut() {
            p.connection = b"\x01";
        }
        let mut b = Vec::new();
        encode(&Frame::Conns(vec![broken]), &mut b);
        assert_eq!(decode(&b), Err(Error::Malformed("conns")));
        // A state out of range.
        let mut b = b"CLHO\x06".to_vec();
        let body = [1u8, 0, 0, 0, 9];
        b.extend_from_slice(&(body.len() as u32).to_le_bytes());
        b.extend_from_slice(&body);
        assert_eq!(decode(&b), Err(Error::Malformed("conns")));
    }
}
