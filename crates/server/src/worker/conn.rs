//! One client connection as the event loop stores it: a small fixed-size record in the worker's
//! slab, plus heap memory only while there is a partial frame or unsent bytes.
//!
//! This module owns the write path (direct writes, the backlog of shared chunks the kernel
//! refused, vectored flushes, and encryption for TLS connections). It does not know about
//! protocols: the worker decides what to send.
//!
//! On a TLS connection the backlog still holds shared plaintext frames: they are encrypted
//! only when the socket can take them, so a slow secure subscriber pins references to shared
//! frames, not private ciphertext copies. Only ciphertext already made and refused by the
//! kernel is kept per connection (`Session::unsent`). In a fan-out, a TLS connection with
//! nothing waiting has its record sealed into the worker's shared buffer and written with the
//! other subscribers' in one submission ([`Conn::seal_into`]).
#![deny(clippy::wildcard_enum_match_arm)]

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::ops::Range;
use std::sync::Arc;

use clarion_proto::ws::Receiver;
use mio::net::TcpStream;

use super::index::Subs;
use super::pool::Pooled;
use super::socket::Socket;

use super::state::State;
use super::tls::{Session, MAX_RECORD};

/// A shared, already-encoded buffer and how much of it was written.
struct Chunk {
    data: Arc<[u8]>,
    offset: usize,
}

/// Bytes the kernel did not take yet: references to shared frames, never copies of them.
#[derive(Default)]
struct Backlog {
    chunks: VecDeque<Chunk>,
    /// Unsent bytes in `chunks`, compared with the slow-consumer cap.
    bytes: usize,
}

/// Most buffers handed to one `writev`: enough to coalesce a burst, small enough for the stack.
const MAX_IOV: usize = 64;

/// A client connection. Kept small: 15,000 idle ones must cost less than µWebSockets' 460 bytes
/// each, kernel excluded.
pub struct Conn<S = TcpStream> {
    /// The socket, registered with the worker's poller under the slab key; `None` for an
    /// HTTP/2 stream, whose bytes wait in the backlog until its connection frames them (see
    /// `super::h2`).
    pub stream: Option<S>,
    /// WebSocket message assembly state (8 bytes; a box only during a fragmented message).
    pub rx: Receiver,
    /// Bytes of a partial request head or frame, kept between reads; `None` almost always.
    pub input: Option<Box<Vec<u8>>>,
    out: Option<Box<Backlog>>,
    /// Subscribed topics, as ids in the worker's topic index.
    pub subs: Subs,
    /// Worker clock (seconds) of the last activity that counts for timeouts: the last byte read
    /// for WebSockets, the start of the current request for HTTP, the start of closing.
    pub last_seen: u32,
    /// Life stage, with the options that only mean something in it. Changed only through
    /// [`super::Engine::set_state`], which keeps the gauges exact.
    pub state: State,
    /// The client's address as the per-address limit counts it (see [`address_key`]).
    pub peer: u32,
    /// TLS state, for connections accepted on the TLS listener.
    pub tls: Option<Pooled<Session>>,
}

/// A compact key for a client address: an IPv4 address itself; for IPv6, a hash of its /64
/// (one subscriber line usually owns a whole /64, so counting single IPv6 addresses would let one
/// host open millions). Distinct /64s may share a key; that only makes the limit stricter.
pub fn address_key(ip: std::net::IpAddr) -> u32 {
    match ip {
        std::net::IpAddr::V4(v4) => u32::from(v4),
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => u32::from(v4),
            None => {
                let prefix = (u128::from(v6) >> 64) as u64;
                let h = prefix.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                (h >> 32) as u32
            }
        },
    }
}

impl<S: Socket> Conn<S> {
    /// A fresh connection in `state`.
    pub fn new(stream: S, state: State, now: u32, peer: u32) -> Conn<S> {
        Conn {
            stream: Some(stream),
            ..Conn::stream_of_h2(state, now, peer)
        }
    }

    /// An HTTP/2 stream's record: no socket of its own.
    pub fn stream_of_h2(state: State, now: u32, peer: u32) -> Conn<S> {
        Conn {
            stream: None,
            rx: Receiver::default(),
            input: None,
            out: None,
            subs: Subs::None,
            last_seen: now,
            state,
            peer,
            tls: None,
        }
    }

    /// The first unsent bytes of the backlog (an HTTP/2 stream's, for framing).
    pub fn backlog_front(&self) -> Option<&[u8]> {
        let c = self.out.as_ref()?.chunks.front()?;
        c.data.get(c.offset..)
    }

    /// Marks `n` bytes at the front of the backlog as sent.
    pub fn backlog_consume(&mut self, mut n: usize) {
        let Some(b) = self.out.as_mut() else {
            return;
        };
        while n > 0 {
            let Some(front) = b.chunks.front_mut() else {
                break;
            };
            let left = front.data.len() - front.offset;
            let take = n.min(left);
            front.offset += take;
            b.bytes -= take;
            n -= take;
            if front.offset == front.data.len() {
                b.chunks.pop_front();
            }
        }
        if b.chunks.is_empty() {
            self.out = None;
        }
    }

    /// Unsent bytes waiting in the backlog.
    pub fn backlog_bytes(&self) -> usize {
        self.out.as_ref().map_or(0, |b| b.bytes) + self.tls.as_ref().map_or(0, |t| t.unsent().len())
    }

    /// Whether bytes are waiting to be written (new ones must queue behind them).
    fn waiting(&self) -> bool {
        self.out.is_some() || self.tls.as_ref().is_some_and(|t| !t.unsent().is_empty())
    }

    /// Writes `data` now if nothing is waiting before it, and keeps whatever the kernel refuses
    /// (a reference, not a copy). Returns the bytes written.
    pub fn send(&mut self, data: &Arc<[u8]>) -> io::Result<usize> {
        if self.tls.is_some() {
            return self.send_tls(&[data]);
        }
        let Some(stream) = self.stream.as_ref().filter(|_| self.out.is_none()) else {
            self.queue(data);
            return Ok(0);
        };
        let offset = write_some(stream, data)?;
        Ok(self.keep_unsent(data, offset))
    }

    /// Whether a message may be written straight to the socket (by [`Conn::send`] or with a
    /// fan-out's other writes): clear text, nothing waiting before it.
    pub fn sends_directly(&self) -> bool {
        self.tls.is_none() && self.out.is_none() && self.stream.is_some()
    }

    /// Whether a message may be encrypted now and written with a fan-out's other writes: TLS,
    /// nothing waiting before it (neither queued frames nor refused records).
    pub fn seals_directly(&self) -> bool {
        self.tls.is_some() && !self.waiting() && self.stream.is_some()
    }

    /// Encrypts `frame` at the end of `arena`, where a fan-out gathers many connections'
    /// records to write them in one submission; returns where this connection's records are.
    /// Only when [`Conn::seals_directly`]: the records must go out before anything else is
    /// sealed for this connection.
    pub fn seal_into(&mut self, frame: &[u8], arena: &mut Vec<u8>) -> io::Result<Range<usize>> {
        let start = arena.len();
        if let Some(t) = self.tls.as_mut() {
            if let Err(e) = seal(t, std::iter::once(frame), arena) {
                arena.truncate(start);
                return Err(e);
            }
        }
        Ok(start..arena.len())
    }

    /// After `offset` bytes of this connection's `records` (from [`Conn::seal_into`]) went out
    /// with a fan-out's writes, keeps the rest, private ciphertext, to go first when the socket
    /// drains. Returns `offset`.
    pub fn keep_unsent_records(&mut self, records: &[u8], offset: usize) -> usize {
        if let (Some(t), Some(rest)) = (self.tls.as_mut(), records.get(offset..)) {
            t.keep_unsent(rest);
        }
        offset
    }

    /// After `offset` bytes of `data` were written straight to the socket (nothing was
    /// waiting), keeps the rest (a reference, not a copy) for the writable event. Returns
    /// `offset`.
    pub fn keep_unsent(&mut self, data: &Arc<[u8]>, offset: usize) -> usize {
        if offset < data.len() {
            let mut b = Box::<Backlog>::default();
            b.bytes = data.len() - offset;
            b.chunks.push_back(Chunk {
                data: Arc::clone(data),
                offset,
            });
            self.out = Some(b);
        }
        offset
    }

    /// Writes several frames with as few `writev` calls as the kernel allows (a burst of
    /// messages to one subscriber costs one system call, not one each), and keeps whatever it
    /// refuses. Nothing is allocated unless the kernel refuses something, so a burst that is
    /// written at once leaves no memory behind. Returns the bytes written.
    pub fn send_all(&mut self, frames: &[&Arc<[u8]>]) -> io::Result<usize> {
        if self.tls.is_some() {
            return self.send_tls(frames);
        }
        let Some(stream) = self.stream.as_ref().filter(|_| self.out.is_none()) else {
            for f in frames {
                self.queue(f);
            }
            return Ok(0);
        };
        // (index of the first frame not fully written, bytes of it already written)
        let (mut i, mut offset, mut written) = (0usize, 0usize, 0usize);
        while i < frames.len() {
            let res = {
                let mut iov = [IoSlice::new(&[]); MAX_IOV];
                let mut n = 0;
                for (slot, (j, f)) in iov.iter_mut().zip(frames.iter().enumerate().skip(i)) {
                    let start = if j == i { offset } else { 0 };
                    *slot = IoSlice::new(f.get(start..).unwrap_or_default());
                    n += 1;
                }
                stream.write_vectored(iov.get(..n).unwrap_or_default())
            };
            match res {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(mut n) => {
                    written += n;
                    while n > 0 {
                        let Some(f) = frames.get(i) else { break };
                        let left = f.len() - offset;
                        if n >= left {
                            n -= left;
                            i += 1;
                            offset = 0;
                        } else {
                            offset += n;
                            n = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        for (j, f) in frames.iter().enumerate().skip(i) {
            let start = if j == i { offset } else { 0 };
            let b = self.out.get_or_insert_with(Box::default);
            b.bytes += f.len() - start;
            b.chunks.push_back(Chunk {
                data: Arc::clone(f),
                offset: start,
            });
        }
        Ok(written)
    }

    /// Appends `data` to the backlog without writing; it goes out when the socket is writable.
    pub fn queue(&mut self, data: &Arc<[u8]>) {
        let b = self.out.get_or_insert_with(Box::default);
        b.bytes += data.len();
        b.chunks.push_back(Chunk {
            data: Arc::clone(data),
            offset: 0,
        });
    }

    /// Writes as much of the backlog as the kernel takes, `MAX_IOV` buffers per system call, and
    /// frees the backlog once it is empty. Returns the bytes written.
    pub fn flush(&mut self) -> io::Result<usize> {
        if self.tls.is_some() {
            return self.flush_tls();
        }
        let (Some(b), Some(stream)) = (self.out.as_mut(), self.stream.as_ref()) else {
            return Ok(0);
        };
        let mut written = 0;
        while !b.chunks.is_empty() {
            let res = {
                let mut iov = [IoSlice::new(&[]); MAX_IOV];
                let mut n = 0;
                for (slot, c) in iov.iter_mut().zip(b.chunks.iter()) {
                    *slot = IoSlice::new(c.data.get(c.offset..).unwrap_or_default());
                    n += 1;
                }
                stream.write_vectored(iov.get(..n).unwrap_or_default())
            };
            match res {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(mut n) => {
                    written += n;
                    b.bytes -= n;
                    while n > 0 {
                        let Some(front) = b.chunks.front_mut() else {
                            break;
                        };
                        let left = front.data.len() - front.offset;
                        if n >= left {
                            n -= left;
                            b.chunks.pop_front();
                        } else {
                            front.offset += n;
                            n = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if b.chunks.is_empty() {
            self.out = None;
        }
        Ok(written)
    }

    /// Writes raw bytes (TLS records) now, keeping what the kernel refuses in the session.
    /// Returns the bytes written.
    pub fn write_records(&mut self, records: &[u8]) -> io::Result<usize> {
        let mut offset = 0;
        if let Some(stream) = self
            .stream
            .as_ref()
            .filter(|_| self.tls.as_ref().is_none_or(|t| t.unsent().is_empty()))
        {
            offset = write_some(stream, records)?;
        }
        if let Some(rest) = records.get(offset..).filter(|r| !r.is_empty()) {
            if let Some(t) = self.tls.as_mut() {
                t.keep_unsent(rest);
            }
        }
        Ok(offset)
    }

    /// Encrypts frames (coalesced into full records) and writes them, unless bytes are already
    /// waiting: then the frames queue as shared plaintext and are encrypted when the socket
    /// drains.
    fn send_tls(&mut self, frames: &[&Arc<[u8]>]) -> io::Result<usize> {
        if self.waiting() {
            for f in frames {
                self.queue(f);
            }
            return Ok(0);
        }
        self.seal_and_write(frames.iter().map(|f| &f[..]))
    }

    /// Encrypts `frames` into the worker's scratch buffer and writes the records.
    fn seal_and_write<'a>(&mut self, frames: impl Iterator<Item = &'a [u8]>) -> io::Result<usize> {
        let Some(t) = self.tls.as_mut() else {
            return Ok(0);
        };
        let mut scratch = SCRATCH.with(std::cell::Cell::take);
        let res = seal(t, frames, &mut scratch).and_then(|()| self.write_records(&scratch));
        scratch.clear();
        SCRATCH.with(|cell| cell.replace(scratch));
        res
    }

    /// Writes refused ciphertext, then encrypts and writes queued frames, a bounded batch at a
    /// time, until the kernel refuses or nothing is left. Returns the bytes written.
    fn flush_tls(&mut self) -> io::Result<usize> {
        /// Plaintext encrypted per round: enough to fill a socket buffer quickly, small enough
        /// that a refusal leaves little private ciphertext behind.
        const BATCH: usize = 4 * MAX_RECORD;
        let mut written = 0;
        loop {
            if let Some(t) = self.tls.as_mut().filter(|t| !t.unsent().is_empty()) {
                let Some(stream) = self.stream.as_ref() else {
                    return Ok(written);
                };
                let n = write_some(stream, t.unsent())?;
                written += n;
                t.unsent_written(n);
                if !t.unsent().is_empty() {
                    return Ok(written);
                }
            }
            let Some(b) = self.out.as_mut() else {
                return Ok(written);
            };
            let (mut take, mut bytes) = (0, 0);
            for c in &b.chunks {
                if take > 0 && bytes + c.data.len() > BATCH {
                    break;
                }
                take += 1;
                bytes += c.data.len() - c.offset;
            }
            let batch: Vec<Chunk> = b.chunks.drain(..take).collect();
            b.bytes -= bytes;
            if b.chunks.is_empty() {
                self.out = None;
            }
            if batch.is_empty() {
                return Ok(written);
            }
            written += self.seal_and_write(
                batch
                    .iter()
                    .map(|c| c.data.get(c.offset..).unwrap_or_default()),
            )?;
            if self.tls.as_ref().is_some_and(|t| !t.unsent().is_empty()) {
                return Ok(written); // The kernel refused part of it: wait for writability.
            }
        }
    }

    /// Ends the write side: a TLS connection first sends close_notify (best effort).
    pub fn shutdown_write(&mut self) {
        if let Some(t) = self.tls.as_mut() {
            let mut alert = Vec::new();
            t.close_notify(&mut alert);
            if let Some(stream) = self.stream.as_ref() {
                let _ = write_some(stream, &alert);
            }
        }
        if let Some(stream) = self.stream.as_ref() {
            let _ = stream.shutdown_write();
        }
    }

    /// Takes every byte owed to the client that the kernel has not taken (a hand-over carries
    /// them to the next process), leaving the backlog empty. Clear text only.
    pub fn take_unsent(&mut self) -> Vec<u8> {
        let Some(b) = self.out.take() else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(b.bytes);
        for c in &b.chunks {
            out.extend_from_slice(c.data.get(c.offset..).unwrap_or_default());
        }
        out
    }

    /// Drops queued chunks that have not started to be written (a slow consumer that is being
    /// closed gets its Close frame next, not the rest of its feed). A chunk already partly
    /// written stays, so the frame stream remains well-formed.
    pub fn discard_unstarted(&mut self) {
        if let Some(b) = self.out.as_mut() {
            let keep = usize::from(b.chunks.front().is_some_and(|c| c.offset > 0));
            b.chunks.truncate(keep);
            b.bytes = b.chunks.iter().map(|c| c.data.len() - c.offset).sum();
            if b.chunks.is_empty() {
                self.out = None;
            }
        }
    }
}

thread_local! {
    /// Where a worker builds TLS records before writing them; one per worker thread, so
    /// encrypting for thousands of subscribers allocates nothing per connection.
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    /// Where consecutive small frames are packed into one record's plaintext.
    static PACK: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Encrypts `frames` into `out`, packing consecutive small frames into one record (a burst of
/// small messages to one subscriber costs one record, not one each).
fn seal<'a>(
    t: &mut Session,
    frames: impl Iterator<Item = &'a [u8]>,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let tls_err = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);
    let mut pack = PACK.with(|cell| cell.take());
    let mut frames = frames.peekable();
    let res = (|| {
        while let Some(f) = frames.next() {
            // A frame that makes a record by itself (the usual single delivery) is encrypted
            // where it is, without a copy into `pack`.
            let alone = frames
                .peek()
                .is_none_or(|next| f.len() + next.len() > MAX_RECORD);
            if pack.is_empty() && alone {
                t.encrypt(f, out).map_err(tls_err)?;
                continue;
            }
            if f.len() >= MAX_RECORD {
                if !pack.is_empty() {
                    t.encrypt(&pack, out).map_err(tls_err)?;
                    pack.clear();
                }
                t.encrypt(f, out).map_err(tls_err)?;
                continue;
            }
            if pack.len() + f.len() > MAX_RECORD {
                t.encrypt(&pack, out).map_err(tls_err)?;
                pack.clear();
            }
            pack.extend_from_slice(f);
        }
        if !pack.is_empty() {
            t.encrypt(&pack, out).map_err(tls_err)?;
        }
        Ok(())
    })();
    pack.clear();
    PACK.with(|cell| cell.replace(pack));
    res
}

/// Writes as much of `data` as the kernel takes now.
fn write_some(stream: &impl Socket, data: &[u8]) -> io::Result<usize> {
    let mut offset = 0;
    while offset < data.len() {
        match stream.write(data.get(offset..).unwrap_or_default()) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => offset += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(offset)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Read as _;

    /// A connected loopback pair: our non-blocking side as a `Conn`, and the peer.
    fn pair() -> (Conn, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (ours, _) = l.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        (
            Conn::new(
                TcpStream::from_std(ours),
                State::Ws(crate::worker::state::WsMode::new(
                    crate::worker::state::WsRole::PubSub,
                )),
                0,
                0,
            ),
            peer,
        )
    }

    #[test]
    fn send_all_coalesces_a_burst_and_keeps_only_what_the_kernel_refused() {
        let (mut conn, mut peer) = pair();
        // Small frames that fit: written at once, nothing kept.
        let small: Vec<Arc<[u8]>> = (0..100u8).map(|i| Arc::from(vec![i; 10])).collect();
        let refs: Vec<&Arc<[u8]>> = small.iter().collect();
        assert_eq!(conn.send_all(&refs).unwrap(), 1000);
        assert!(conn.out.is_none());
        // A burst larger than the socket buffers: the rest is kept, in order, and flushed.
        let big: Vec<Arc<[u8]>> = (0..40u8).map(|i| Arc::from(vec![i; 100_000])).collect();
        let refs: Vec<&Arc<[u8]>> = big.iter().collect();
        let written = conn.send_all(&refs).unwrap();
        assert_eq!(written + conn.backlog_bytes(), 4_000_000);
        assert!(conn.backlog_bytes() > 0);
        // With a backlog, a further burst is queued behind it.
        assert_eq!(conn.send_all(&refs[..1]).unwrap(), 0);
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            peer.read_to_end(&mut got).unwrap();
            got
        });
        while conn.backlog_bytes() > 0 {
            conn.flush().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(conn);
        let got = reader.join().unwrap();
        assert_eq!(got.len(), 1000 + 4_000_000 + 100_000);
        let (head, rest) = got.split_at(1000);
        for (i, block) in head.chunks(10).enumerate() {
            assert!(block.iter().all(|&b| b == i as u8));
        }
        for (i, block) in rest.chunks(100_000).enumerate() {
            assert!(
                block.iter().all(|&b| b == (i % 40) as u8),
                "block {i} out of order"
            );
        }
    }

    #[test]
    fn backlog_keeps_refused_bytes_and_flushes_them_in_order() {
        let (mut conn, mut peer) = pair();
        let chunks: Vec<Arc<[u8]>> = (0..64u8).map(|i| Arc::from(vec![i; 64 * 1024])).collect();
        let mut written = 0;
        for c in &chunks {
            written += conn.send(c).unwrap();
        }
        let total = 64 * 64 * 1024;
        assert!(
            conn.backlog_bytes() > 0,
            "4 MiB cannot fit in loopback socket buffers"
        );
        assert_eq!(written + conn.backlog_bytes(), total);
        let reader = std::thread::spawn(move || {
            let mut got = Vec::with_capacity(total);
            peer.read_to_end(&mut got).unwrap();
            got
        });
        while conn.backlog_bytes() > 0 {
            conn.flush().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(conn.out.is_none(), "an empty backlog is freed");
        drop(conn);
        let got = reader.join().unwrap();
        assert_eq!(got.len(), total);
        for (i, block) in got.chunks(64 * 1024).enumerate() {
            assert!(
                block.iter().all(|&b| b == i as u8),
                "block {i} out of order"
            );
        }
    }

    #[test]
    fn discarding_keeps_a_partly_written_frame() {
        let (mut conn, _peer) = pair();
        let big: Arc<[u8]> = Arc::from(vec![1u8; 8 << 20]);
        conn.send(&big).unwrap();
        let left = conn.backlog_bytes();
        assert!(left > 0 && left < 8 << 20);
        conn.queue(&Arc::from(vec![2u8; 100]));
        conn.discard_unstarted();
        assert_eq!(conn.backlog_bytes(), left);
    }

    #[test]
    fn record_stays_small() {
        // The per-connection budget. The socket handle is a 4-byte descriptor in release builds
        // (mio adds a registry id to it in debug builds), so measure the rest: 64 bytes, and a
        // release-build record is 64 bytes in all (56 before the TLS pointer).
        let socket = std::mem::size_of::<TcpStream>();
        let rest = std::mem::size_of::<Conn>() - socket;
        assert!(rest <= 64, "{rest}");
        // The state carries its options (WebSocket role and deflate parameters, stream and
        // poll modes) in the 4 bytes that the state, a flag word and the deflate byte took.
        assert!(std::mem::size_of::<State>() <= 4);
        assert_eq!(std::mem::size_of::<Subs>(), 16);
    }
}
