//! One soak client's TCP connection and its I/O: the socket, TLS when the client's kind asks
//! for it ([`crate::tls_client`]), and the protocol life it carries: a [`SoakLife`] for the
//! HTTP/1.1 kinds, a [`SoakH2`] (several SSE streams) for the HTTP/2 ones. Readiness events
//! come here from the worker ([`crate::soak_worker`]), which keeps the clients, their checks
//! and the timers.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Instant;

use mio::net::TcpStream;

use crate::soak_h2::SoakH2;
use crate::soak_life::{request, Got, SoakLife, SoakTransport};
use crate::source_ports;
use crate::tls_client::{TlsClient, TlsSetup};
use crate::wire::rand16;

/// The protocol a connection speaks, created when its first bytes go out (they carry the ids
/// to resume after).
pub(crate) enum Proto {
    H1(SoakLife),
    H2(SoakH2),
}

/// The TLS configurations of a worker: one offering `http/1.1`, one offering `h2` first.
pub(crate) struct TlsSetups {
    pub(crate) h1: TlsSetup,
    pub(crate) h2: TlsSetup,
    /// The server's TLS listener.
    pub(crate) target: SocketAddr,
}

/// One TCP connection of a client.
pub(crate) struct Conn {
    pub(crate) stream: TcpStream,
    proto: Option<Proto>,
    tls: Option<TlsClient>,
    pub(crate) started: Instant,
    /// The ids its requests resumed from, one per subscription.
    pub(crate) since: Vec<Option<Box<str>>>,
    /// When it was answered.
    pub(crate) answered_at: Option<Instant>,
}

impl Conn {
    /// A connection just started (`tls` for the TLS kinds: its ClientHello goes out now).
    pub(crate) fn new(
        stream: TcpStream,
        tls: Option<&TlsSetup>,
        now: Instant,
    ) -> Result<Conn, String> {
        let tls = match tls {
            Some(setup) => {
                let mut t = TlsClient::new(setup).map_err(|e| format!("tls: {e}"))?;
                t.flush(&stream)
                    .map_err(|e| format!("send tls: {}", e.kind()))?;
                Some(t)
            }
            None => None,
        };
        Ok(Conn {
            stream,
            proto: None,
            tls,
            started: now,
            since: Vec::new(),
            answered_at: None,
        })
    }

    /// Subscribed: the answer (every stream's, over HTTP/2) has arrived.
    pub(crate) fn is_open(&self) -> bool {
        match &self.proto {
            Some(Proto::H1(l)) => l.is_open(),
            Some(Proto::H2(l)) => l.is_open(),
            None => false,
        }
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.tls {
            Some(t) => t.send(&self.stream, bytes),
            None => (&self.stream).write_all(bytes),
        }
    }

    /// On a readiness event: the request once connected, then whatever the server sent, each
    /// thing read handed to `got` with the index of the subscription it belongs to. `Err`
    /// (why, counted by kind) when the connection ended.
    pub(crate) fn drive(
        &mut self,
        kind: SoakTransport,
        target: SocketAddr,
        subs: &[(&str, Option<&str>)],
        read_buf: &mut [u8],
        got: &mut impl FnMut(usize, Got<'_>),
    ) -> Result<(), String> {
        if self.proto.is_none() {
            if !source_ports::connected(&self.stream)? {
                return Ok(());
            }
            let (proto, first) = first_bytes(kind, target, subs);
            self.send(&first)
                .map_err(|e| format!("send request: {}", e.kind()))?;
            self.proto = Some(proto);
            self.since = subs.iter().map(|(_, s)| s.map(Into::into)).collect();
        }
        let mut replies: Vec<Vec<u8>> = Vec::new();
        let mut plain = Vec::new();
        loop {
            let n = match (&self.stream).read(read_buf) {
                Ok(0) => return Err(self.ended()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("read: {}", e.kind())),
            };
            let fresh = read_buf.get(..n).unwrap_or_default();
            let closed = match &mut self.tls {
                Some(t) => {
                    plain.clear();
                    let closed = t.receive(&self.stream, fresh, &mut plain)?;
                    self.feed(&plain, &mut replies, got)?;
                    closed
                }
                None => {
                    self.feed(fresh, &mut replies, got)?;
                    false
                }
            };
            if closed {
                return Err(self.ended());
            }
        }
        for r in replies {
            // A reply that cannot be written is found out by the next read.
            let _ = self.send(&r);
        }
        Ok(())
    }

    fn feed(
        &mut self,
        input: &[u8],
        replies: &mut Vec<Vec<u8>>,
        got: &mut impl FnMut(usize, Got<'_>),
    ) -> Result<(), String> {
        let mut pass = |i: usize, g: Got<'_>| match g {
            Got::Reply(bytes) => replies.push(bytes),
            other => got(i, other),
        };
        match &mut self.proto {
            Some(Proto::H1(l)) => l.handle_input(input, &mut |g| pass(0, g)),
            Some(Proto::H2(l)) => l.handle_input(input, &mut pass),
            None => Ok(()),
        }
        .map_err(|e| e.to_string())
    }

    fn ended(&mut self) -> String {
        match &mut self.proto {
            Some(Proto::H1(l)) => l.handle_end().to_string(),
            Some(Proto::H2(l)) => l.handle_end().to_string(),
            None => "closed during handshake".into(),
        }
    }
}

/// The protocol state of a new connection of `kind` and the bytes it starts with.
fn first_bytes(
    kind: SoakTransport,
    target: SocketAddr,
    subs: &[(&str, Option<&str>)],
) -> (Proto, Vec<u8>) {
    let (topic, since) = subs.first().copied().unwrap_or(("", None));
    match kind {
        SoakTransport::Ws | SoakTransport::Sse => (
            Proto::H1(SoakLife::new(kind)),
            request(kind, target, topic, since, rand16()).into_bytes(),
        ),
        SoakTransport::WsDeflate | SoakTransport::TlsWsDeflate => (
            Proto::H1(SoakLife::in_band(kind, topic, since)),
            request(kind, target, topic, since, rand16()).into_bytes(),
        ),
        SoakTransport::H2Sse | SoakTransport::TlsH2Sse => {
            let streams = subs
                .iter()
                .map(|(t, s)| (format!("/sse?topic={t}"), s.map(str::to_string)))
                .collect();
            (
                Proto::H2(SoakH2::new(target.to_string(), kind.tls(), streams)),
                SoakH2::preface(),
            )
        }
    }
}
