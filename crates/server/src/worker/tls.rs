//! One connection's TLS state, driven through rustls' unbuffered API so that an idle secure
//! connection keeps no buffers: ciphertext is read into the worker's shared read buffer,
//! plaintext is handed over in a worker-owned buffer, and records to send are built in scratch
//! space. A connection keeps bytes only for a partial record it has not fully received and for
//! ciphertext the kernel has not taken yet, in one box that is freed as soon as both empty.
//!
//! Once a TLS 1.3 handshake completes, the records move to proto's record layer (handed over
//! in [`clarion_proto::tls13::handoff`]), which keeps only raw keys while the connection is idle; TLS 1.2
//! connections stay with rustls.
//!
//! The hand-off happens exactly at the record that ends the handshake (the client's Finished):
//! rustls is given whole records one at a time until then, and never one after it. Whatever
//! follows in the same read (data, a KeyUpdate sent at once) goes to the lean layer in that
//! same call. rustls must not see a KeyUpdate: it answers one only when it next sends, so the
//! answer would be lost at the hand-off while its sending key had already moved on (issue 38).
//! Its tickets, sent when the Finished arrives, go out before the hand-off, and the lean layer
//! continues their key and sequence numbers.
//!
//! No socket is touched here: the caller writes what lands in `out`.

use std::alloc::Layout;
use std::sync::{Arc, Mutex};

use rustls::server::{ServerConfig, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncryptError};

use clarion_proto::tls13::handoff::{self, encode, Schedule};
use clarion_proto::tls13::{KeyError, Parked, RecordHeader};

use super::pool::{InPool, Slots};
use crate::tls::Secret;

/// The record layer of an established TLS 1.3 server connection.
type Records = clarion_proto::tls13::Records<Schedule<rustls::server::ServerConnectionData>>;

/// Why a TLS connection cannot continue in another process (a hand-over counts each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmovable {
    /// The handshake is not finished: rustls' handshake state cannot be serialized.
    Handshake,
    /// TLS 1.2 stays with rustls, whose record state cannot be serialized.
    Tls12,
    /// The lean layer's keys are derived by rustls (its traffic secrets were not captured).
    Keys,
}

/// Plaintext bytes per TLS record (RFC 8446 §5.1).
pub const MAX_RECORD: usize = 16 * 1024;
/// Room for a record's header, nonce, tag and content type: 29 bytes at most for the suites
/// rustls offers (TLS 1.2 GCM), rounded up.
const RECORD_OVERHEAD: usize = 32;

/// What reading some ciphertext produced besides plaintext.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadOutcome {
    /// The handshake finished during this read.
    pub handshake_done: bool,
    /// The peer sent close_notify: it will send nothing more.
    pub peer_closed: bool,
}

/// rustls' connection and what only its phase needs: all of it is gone once a TLS 1.3
/// connection moves to the lean layer.
struct Handshake {
    conn: UnbufferedServerConnection,
    /// The application traffic secrets (ours, the client's) rustls reported, from the
    /// server's first flight until the hand-off to the lean layer takes them.
    secrets: Option<(Secret, Secret)>,
    /// The handshake has completed (a TLS 1.2 connection stays here).
    established: bool,
    /// Some ciphertext has arrived (to tell a plain-HTTP request from a ClientHello).
    started: bool,
}

/// Who does the records. The lean layer is the long-lived state, so it is inline (one
/// allocation per connection) while the much larger rustls state is boxed only until the
/// handshake ends.
#[allow(clippy::large_enum_variant)]
enum Engine {
    /// rustls: during the handshake, and for TLS 1.2 connections throughout.
    Rustls(Box<Handshake>),
    /// Our lean TLS 1.3 record layer, once the handshake is done.
    Lean(Records),
    /// Only while switching from one to the other (and after a hand-off that failed).
    Switching,
}

impl Engine {
    /// Whether the handshake has completed: only rustls can be in the middle of one.
    fn established(&self) -> bool {
        match self {
            Engine::Rustls(h) => h.established,
            Engine::Lean(_) | Engine::Switching => true,
        }
    }
}

/// Ciphertext a connection holds between events, boxed together because it is rare.
#[derive(Default)]
struct InFlight {
    /// Ciphertext of a record not yet complete.
    partial: Vec<u8>,
    /// Encrypted bytes the kernel refused.
    unsent: Vec<u8>,
}

/// A TLS server connection.
pub struct Session {
    engine: Engine,
    /// Ciphertext in flight; `None` (nothing allocated) almost always, and again as soon as
    /// both parts empty.
    in_flight: Option<Box<InFlight>>,
}

/// The pool every worker's sessions share (see [`super::pool`]).
static SESSIONS: Mutex<Slots> = Mutex::new(Slots::new(Layout::new::<Session>()));

impl InPool for Session {
    fn slots() -> &'static Mutex<Slots> {
        &SESSIONS
    }
}

impl Session {
    /// A connection that will handshake with `config`.
    pub fn new(config: &Arc<ServerConfig>) -> Result<Session, rustls::Error> {
        Ok(Session {
            engine: Engine::Rustls(Box::new(Handshake {
                conn: UnbufferedServerConnection::new(Arc::clone(config))?,
                secrets: None,
                established: false,
                started: false,
            })),
            in_flight: None,
        })
    }

    /// An established TLS 1.3 connection that another process parked (a hand-over), with the
    /// ciphertext it had in flight: `partial`, the start of the client's next record, and
    /// `unsent`, records the kernel had not taken, which go out before anything else.
    ///
    /// `parked` is read, not moved: dropping the box wipes the secrets it held.
    pub fn resume(
        parked: Box<Parked>,
        partial: Vec<u8>,
        unsent: Vec<u8>,
    ) -> Result<Session, KeyError> {
        let mut s = Session {
            engine: Engine::Lean(Records::resume(Parked::clone(&parked), Schedule::Secrets)?),
            in_flight: Some(Box::new(InFlight { partial, unsent })),
        };
        s.tidy();
        Ok(s)
    }

    /// Everything another process needs to continue this connection's records, or why it
    /// cannot. The ciphertext in flight is not included: see [`Session::take_in_flight`].
    pub fn park(&self) -> Result<Parked, Unmovable> {
        match &self.engine {
            Engine::Lean(r) => r.park().ok_or(Unmovable::Keys),
            Engine::Rustls(h) if h.established => Err(Unmovable::Tls12),
            Engine::Rustls(_) => Err(Unmovable::Handshake),
            Engine::Switching => Err(Unmovable::Keys),
        }
    }

    /// Takes the ciphertext in flight: (the partial record received, the records not sent).
    pub fn take_in_flight(&mut self) -> (Vec<u8>, Vec<u8>) {
        let InFlight { partial, unsent } = self.in_flight.take().map(|b| *b).unwrap_or_default();
        (partial, unsent)
    }

    /// Encrypted bytes the kernel refused, which go out before anything else.
    pub fn unsent(&self) -> &[u8] {
        self.in_flight.as_ref().map_or(&[], |f| &f.unsent[..])
    }

    /// Keeps `records` the kernel refused, after those already kept.
    pub fn keep_unsent(&mut self, records: &[u8]) {
        if !records.is_empty() {
            let f = self.in_flight.get_or_insert_with(Box::default);
            f.unsent.extend_from_slice(records);
        }
    }

    /// The kernel took the first `n` bytes of [`Session::unsent`]; frees them (and the
    /// in-flight box once nothing is left in it).
    pub fn unsent_written(&mut self, n: usize) {
        if let Some(f) = self.in_flight.as_mut() {
            f.unsent.drain(..n.min(f.unsent.len()));
            if f.unsent.is_empty() {
                f.unsent = Vec::new();
            }
        }
        self.tidy();
    }

    /// Stores the partial record kept after a read (freeing it if empty).
    fn keep_partial(&mut self, partial: Vec<u8>) {
        if partial.is_empty() {
            if let Some(f) = self.in_flight.as_mut() {
                f.partial = Vec::new();
            }
            self.tidy();
        } else {
            self.in_flight.get_or_insert_with(Box::default).partial = partial;
        }
    }

    /// Drops the in-flight box once it holds nothing.
    fn tidy(&mut self) {
        if self
            .in_flight
            .as_ref()
            .is_some_and(|f| f.partial.is_empty() && f.unsent.is_empty())
        {
            self.in_flight = None;
        }
    }

    /// Whether the handshake has completed.
    pub fn established(&self) -> bool {
        self.engine.established()
    }

    /// Whether no byte has arrived yet.
    pub fn untouched(&self) -> bool {
        match &self.engine {
            Engine::Rustls(h) => !h.started,
            Engine::Lean(_) | Engine::Switching => false,
        }
    }

    /// Whether the lean record layer has taken over from rustls.
    pub fn is_lean(&self) -> bool {
        matches!(self.engine, Engine::Lean(_))
    }

    /// The negotiated protocol version, once known ("1.3" or "1.2").
    pub fn version(&self) -> Option<&'static str> {
        match &self.engine {
            Engine::Rustls(h) => h.conn.protocol_version().map(|v| match v {
                rustls::ProtocolVersion::TLSv1_3 => "1.3",
                rustls::ProtocolVersion::TLSv1_2 => "1.2",
                _ => "other",
            }),
            Engine::Lean(_) => Some("1.3"),
            Engine::Switching => None,
        }
    }

    /// Frees the expanded keys of a direction that was quiet since the previous call (the
    /// worker's sweep calls this once a second).
    pub fn compact(&mut self) -> bool {
        match &mut self.engine {
            Engine::Lean(r) => r.compact(),
            _ => false,
        }
    }

    /// Feeds `fresh` ciphertext (joined to any partial record kept from before). Plaintext is
    /// appended to `plain`; handshake records and alerts to send are appended to `out`, which
    /// the caller must write before anything else. On error, `out` may hold an alert.
    pub fn read(
        &mut self,
        fresh: &mut [u8],
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<ReadOutcome, rustls::Error> {
        if let Engine::Rustls(h) = &mut self.engine {
            h.started = true;
        }
        let was_established = self.established();
        let mut partial = self
            .in_flight
            .as_mut()
            .map(|f| std::mem::take(&mut f.partial))
            .unwrap_or_default();
        let engine = &mut self.engine;
        let joined = !partial.is_empty();
        if joined {
            partial.extend_from_slice(fresh);
        }
        let buf: &mut [u8] = if joined { &mut partial } else { fresh };
        let (mut used, mut result) = process(engine, buf, plain, out);
        if result.is_ok() && !was_established && engine.established() {
            // The handshake ended at a record boundary inside this input: the records after
            // it belong to whoever holds the connection now.
            go_lean(engine);
            let rest = buf.get_mut(used..).unwrap_or_default();
            if !rest.is_empty() {
                let (more, after) = process(engine, rest, plain, out);
                used += more;
                result = match (result, after) {
                    (Ok(a), Ok(b)) => Ok(ReadOutcome {
                        peer_closed: a.peer_closed || b.peer_closed,
                        ..a
                    }),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                };
            }
        }
        // Keep the unprocessed tail (a partial record) and nothing else.
        let tail = buf.get(used..).unwrap_or_default();
        let kept = if result.is_err() {
            if let Engine::Rustls(h) = engine {
                drain_alert(&mut h.conn, out);
            }
            Vec::new()
        } else if joined {
            partial.drain(..used.min(partial.len()));
            partial
        } else {
            tail.to_vec()
        };
        self.keep_partial(kept);
        let mut outcome = result?;
        outcome.handshake_done = !was_established && self.established();
        Ok(outcome)
    }

    /// Encrypts `data` (any length; split into records as needed), appending the records to
    /// `out`.
    pub fn encrypt(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), rustls::Error> {
        if let Engine::Lean(r) = &mut self.engine {
            return r
                .seal(data, out)
                .map_err(|e| rustls::Error::General(e.to_string()));
        }
        let records = data.len().div_ceil(MAX_RECORD).max(1);
        let room = data.len() + records * RECORD_OVERHEAD;
        self.with_write_traffic(out, room, |w, buf| w.encrypt(data, buf))
    }

    /// Appends a close_notify alert to `out` (when the handshake has completed).
    pub fn close_notify(&mut self, out: &mut Vec<u8>) {
        if !self.established() {
            return;
        }
        if let Engine::Lean(r) = &mut self.engine {
            r.close_notify(out);
            return;
        }
        let _ =
            self.with_write_traffic(out, RECORD_OVERHEAD + 8, |w, buf| w.queue_close_notify(buf));
    }

    /// Brings the rustls connection to its write state (encoding anything it queued first,
    /// such as the answer to a key update) and runs `f` there on `room` bytes appended to
    /// `out`, keeping the ones it reports written.
    fn with_write_traffic(
        &mut self,
        out: &mut Vec<u8>,
        room: usize,
        f: impl FnOnce(
            &mut rustls::unbuffered::WriteTraffic<'_, rustls::server::ServerConnectionData>,
            &mut [u8],
        ) -> Result<usize, EncryptError>,
    ) -> Result<(), rustls::Error> {
        let Engine::Rustls(h) = &mut self.engine else {
            return Err(rustls::Error::HandshakeNotComplete);
        };
        let conn = &mut h.conn;
        // Each step either finishes or consumes one queued item; a handful is plenty.
        for _ in 0..16 {
            let status = conn.process_tls_records(&mut []);
            match status.state? {
                ConnectionState::WriteTraffic(mut w) => {
                    let start = out.len();
                    out.resize(start + room, 0);
                    let res = f(&mut w, out.get_mut(start..).unwrap_or_default());
                    out.truncate(start + *res.as_ref().unwrap_or(&0));
                    return res.map(drop).map_err(encrypt_error);
                }
                ConnectionState::EncodeTlsData(mut e) => encode(&mut e, out)?,
                ConnectionState::TransmitTlsData(t) => t.done(),
                ConnectionState::ReadTraffic(mut r) => while let Some(Ok(_)) = r.next_record() {},
                _ => break,
            }
        }
        Err(rustls::Error::General(
            "application data before the handshake completed".into(),
        ))
    }
}

/// Runs whichever engine holds the records over `buf`: returns the bytes it consumed and what
/// happened. A record-layer error appends its alert to `out`.
fn process(
    engine: &mut Engine,
    buf: &mut [u8],
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> (usize, Result<ReadOutcome, rustls::Error>) {
    match engine {
        Engine::Rustls(h) => drive(h, buf, plain, out),
        Engine::Lean(records) => match records.open(buf, plain) {
            Ok(read) => (
                read.used,
                Ok(ReadOutcome {
                    peer_closed: read.peer_closed,
                    ..ReadOutcome::default()
                }),
            ),
            Err(e) => {
                records.fatal_alert(&e, out);
                (0, Err(rustls::Error::General(e.to_string())))
            }
        },
        Engine::Switching => (0, Err(rustls::Error::HandshakeNotComplete)),
    }
}

/// Hands an established TLS 1.3 connection from rustls to the lean record layer. TLS 1.2
/// (and anything unexpected) stays with rustls, which is always correct, just larger.
///
/// rustls has read nothing past the client's Finished ([`drive`]) and has encoded everything
/// it queued (the tickets): `dangerous_into_kernel_connection` refuses a connection with
/// records still queued, and takes the sequence numbers the tickets left.
///
/// With the traffic secrets rustls reported during the handshake, the lean layer derives its
/// next keys itself and rustls is dropped entirely; the connection can then move to another
/// process ([`Session::park`]).
fn go_lean(engine: &mut Engine) {
    let tls13 = matches!(engine, Engine::Rustls(h)
        if h.conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3));
    if !tls13 {
        if let Engine::Rustls(h) = engine {
            h.secrets = None; // TLS 1.2: never used.
        }
        return;
    }
    let Engine::Rustls(h) = std::mem::replace(engine, Engine::Switching) else {
        return;
    };
    let Handshake { conn, secrets, .. } = *h;
    *engine = match conn.dangerous_into_kernel_connection() {
        Ok((extracted, kernel)) => match handoff::take_over_with_secrets(
            extracted,
            kernel,
            secrets
                .as_ref()
                .map(|(ours, theirs)| (&ours[..], &theirs[..])),
        ) {
            Some(r) => Engine::Lean(r),
            None => Engine::Switching,
        },
        Err(_) => Engine::Switching,
    };
}

/// Where the record that starts at `from` ends, if all of it is in `buf`; otherwise the end of
/// `buf` (a partial record, which rustls keeps waiting for, or bytes that are no record
/// header, which rustls refuses with the right alert).
fn record_end(buf: &[u8], from: usize) -> usize {
    let rest = buf.get(from..).unwrap_or_default();
    match RecordHeader::whole_record(rest) {
        Ok(Some(len)) => from + len,
        _ => buf.len(),
    }
}

/// Runs rustls over `buf`: returns the bytes it consumed and what happened.
///
/// During the handshake rustls sees whole records one at a time, and none after the one that
/// completes it: those are the lean layer's (see the module documentation). Once established
/// (TLS 1.2, which stays with rustls) it sees everything.
fn drive(
    h: &mut Handshake,
    buf: &mut [u8],
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> (usize, Result<ReadOutcome, rustls::Error>) {
    let Handshake {
        conn,
        secrets,
        established,
        ..
    } = h;
    let mut outcome = ReadOutcome::default();
    let mut used = 0usize;
    // How far into `buf` rustls may read.
    let mut end = if *established { buf.len() } else { 0 };
    loop {
        if end <= used && conn.is_handshaking() {
            end = record_end(buf, used);
        }
        let rest = buf.get_mut(used..end.max(used)).unwrap_or_default();
        // rustls reports the traffic secrets while it runs (`crate::tls::SecretCapture`): what
        // is captured during this call is this connection's.
        drop(crate::tls::take_captured());
        let status = conn.process_tls_records(rest);
        if let Some(captured) = crate::tls::take_captured() {
            *secrets = Some(captured);
        }
        let discard = status.discard;
        let state = match status.state {
            Ok(s) => s,
            Err(e) => return (used + discard, Err(e)),
        };
        let (mut stop, mut blocked) = (false, false);
        let step = match state {
            ConnectionState::ReadTraffic(mut r) => {
                let mut res = Ok(());
                while let Some(rec) = r.next_record() {
                    match rec {
                        Ok(rec) => plain.extend_from_slice(rec.payload),
                        Err(e) => {
                            res = Err(e);
                            break;
                        }
                    }
                }
                res
            }
            ConnectionState::ReadEarlyData(mut r) => {
                // Early data is never enabled; drain it should a future rustls offer it.
                while let Some(Ok(_)) = r.next_record() {}
                Ok(())
            }
            ConnectionState::EncodeTlsData(mut e) => encode(&mut e, out),
            ConnectionState::TransmitTlsData(t) => {
                t.done();
                Ok(())
            }
            ConnectionState::PeerClosed => {
                outcome.peer_closed = true;
                Ok(())
            }
            ConnectionState::WriteTraffic(_) => {
                *established = true;
                stop = true;
                Ok(())
            }
            ConnectionState::BlockedHandshake => {
                blocked = true;
                Ok(())
            }
            // Closed, and states of future versions.
            _ => {
                stop = true;
                Ok(())
            }
        };
        used += discard;
        if let Err(e) = step {
            return (used, Err(e));
        }
        if blocked {
            if end >= buf.len() {
                return (used, Ok(outcome)); // Waiting for the peer.
            }
            // The next record may complete a handshake message: show rustls that one too.
            end = record_end(buf, end);
        }
        if stop {
            return (used, Ok(outcome));
        }
    }
}

/// After an error, rustls may have queued an alert for the peer: append it to `out`.
fn drain_alert(conn: &mut UnbufferedServerConnection, out: &mut Vec<u8>) {
    for _ in 0..4 {
        let status = conn.process_tls_records(&mut []);
        match status.state {
            Ok(ConnectionState::EncodeTlsData(mut e)) => {
                if encode(&mut e, out).is_err() {
                    return;
                }
            }
            Ok(ConnectionState::TransmitTlsData(t)) => t.done(),
            _ => return,
        }
    }
}

fn encrypt_error(e: EncryptError) -> rustls::Error {
    rustls::Error::General(format!("encrypt: {e}"))
}

/// Why a handshake failed, as the metrics count it.
pub fn failure_reason(e: &rustls::Error) -> &'static str {
    use rustls::Error as E;
    match e {
        E::General(s) if s.contains("certificate chain") => "sni",
        E::PeerIncompatible(_) | E::NoApplicationProtocol => "incompatible",
        E::AlertReceived(_) => "alert",
        _ => "protocol",
    }
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
