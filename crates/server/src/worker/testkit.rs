//! An in-memory harness for the engine, the way quinn-proto tests its connections: a real
//! [`Engine`] with a real hub and configuration, connections over in-memory sockets, and a
//! clock that moves only when a test says so. Nothing here sleeps or spawns a thread, so every
//! test is deterministic.
//!
//! A [`Pipe`] stands for a socket and the kernel buffers behind it: the test writes the client's
//! bytes in, reads the server's bytes out, and may limit how many bytes "the kernel" accepts to
//! make a slow consumer. GRIP tests get a backend pool without threads: the jobs the engine
//! submits are handed to the test, which answers them by calling the engine's answer handler.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use clarion_proto::ws::frame::{encode_client_frame, parse_header_with};
use clarion_proto::ws::OpCode;

use super::socket::Socket;
use super::{Engine, Modes, Shared};
use crate::broker::{Broker, Outgoing};
use crate::config::Config;
use crate::grip::backend::{Answer, Backend, Job, Mailbox, Queued, Response};
use crate::hub::Inbox;
use crate::metrics::Metrics;

/// The Unix time at the simulated clock's second 0.
pub const UNIX_BASE: u64 = 1_800_000_000;
/// The broker hub clock's reading at the simulated clock's second 0: far from what the real
/// hub clock reads in a test (its base plus a second or two), so a reading of it shows.
pub const HUB_BASE: u32 = crate::broker::local::CLOCK_BASE + 100_000;

/// One socket's two directions, as the kernel would buffer them.
#[derive(Default)]
pub struct Pipe {
    /// Client bytes not read by the server yet.
    inbound: VecDeque<u8>,
    /// Server bytes not read by the client yet.
    outbound: Vec<u8>,
    /// How many more bytes the kernel accepts from the server (`None`: any number).
    window: Option<usize>,
    /// The client closed its side: reads return EOF once `inbound` is empty.
    client_eof: bool,
    /// The server shut its write side.
    write_shut: bool,
}

/// The server's end of a [`Pipe`].
#[derive(Clone, Default)]
pub struct MemSocket(Rc<RefCell<Pipe>>);

impl Socket for MemSocket {
    type Batch = ();

    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut p = self.0.borrow_mut();
        if p.inbound.is_empty() {
            return if p.client_eof {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = buf.len().min(p.inbound.len());
        for (slot, b) in buf.iter_mut().zip(p.inbound.drain(..n)) {
            *slot = b;
        }
        Ok(n)
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        let mut p = self.0.borrow_mut();
        if p.write_shut {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let n = p.window.map_or(buf.len(), |w| w.min(buf.len()));
        if n == 0 && !buf.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        if let Some(w) = p.window.as_mut() {
            *w -= n;
        }
        p.outbound.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut total = 0;
        for b in bufs {
            match self.write(b) {
                Ok(n) => {
                    total += n;
                    if n < b.len() {
                        break;
                    }
                }
                Err(e) if total == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(total)
    }

    fn shutdown_write(&self) -> io::Result<()> {
        self.0.borrow_mut().write_shut = true;
        Ok(())
    }

    fn peer_ip(&self) -> Option<IpAddr> {
        Some(IpAddr::from([127, 0, 0, 1]))
    }
}

/// The test's end of one connection.
pub struct Client {
    /// The connection's slab key.
    pub key: u32,
    pipe: Rc<RefCell<Pipe>>,
}

impl Client {
    /// Takes what the server wrote so far.
    pub fn take(&self) -> Vec<u8> {
        std::mem::take(&mut self.pipe.borrow_mut().outbound)
    }

    /// Takes what the server wrote so far, as text.
    pub fn take_text(&self) -> String {
        String::from_utf8_lossy(&self.take()).into_owned()
    }

    /// Whether the server shut its write side.
    pub fn write_shut(&self) -> bool {
        self.pipe.borrow().write_shut
    }

    /// The peer reset the connection: every later write fails.
    pub fn reset(&self) {
        self.pipe.borrow_mut().write_shut = true;
    }

    /// Limits how many more bytes the kernel accepts from the server (`None`: no limit).
    pub fn set_window(&self, window: Option<usize>) {
        self.pipe.borrow_mut().window = window;
    }
}

/// An engine under test, its hub and its clock.
pub struct Harness {
    /// The engine under test.
    pub engine: Engine<MemSocket>,
    /// What the engine shares with the (absent) other workers and the API.
    pub shared: Arc<Shared>,
    /// The simulated clock, in whole seconds.
    pub now: u32,
    /// Jobs submitted to the GRIP backend pool (GRIP harnesses only).
    jobs: Option<Receiver<Queued>>,
    /// Calls made to backend hooks (harnesses whose config names a hook).
    hook_jobs: Option<Receiver<Queued>>,
    /// Owns the waker's registration; never polled.
    _poll: mio::Poll,
}

impl Harness {
    /// A one-worker engine with `config`.
    pub fn new(config: Config) -> Harness {
        Self::build(config, None)
    }

    /// A one-worker engine in GRIP proxy mode with `routes` (the routes file's text); backend
    /// requests are kept for [`Self::next_job`].
    pub fn with_grip(config: Config, routes: &str) -> Harness {
        Self::build(config, Some(routes))
    }

    fn build(config: Config, routes: Option<&str>) -> Harness {
        let poll = mio::Poll::new().unwrap();
        let waker = mio::Waker::new(poll.registry(), super::WAKER).unwrap();
        let inbox = Arc::new(Inbox::new(waker));
        let metrics = Arc::new(Metrics::default());
        let broker = Broker::local(
            vec![Arc::clone(&inbox)],
            Arc::clone(&metrics),
            config.history_limits(),
        );
        let (grip, jobs) = match routes {
            Some(text) => {
                let routes = clarion_proto::grip::parse_routes(text).unwrap();
                let (backend, jobs) = Backend::detached();
                let mailbox = Arc::new(Mailbox::new(Arc::clone(&inbox)));
                let proxy =
                    crate::grip::Proxy::new(routes, backend, vec![mailbox], None, "pushpin".into());
                (Some(proxy), Some(jobs))
            }
            None => (None, None),
        };
        let config_copy = config.clone();
        // Hooks are on when production turns them on (a webhook alone included).
        let (hooks, hook_jobs) = if crate::hooks::Hooks::configured(&config) {
            let (h, j) = crate::hooks::Hooks::detached(&config, &inbox, &metrics);
            (Some(h), Some(j))
        } else {
            (None, None)
        };
        let modes = Modes {
            tls: None,
            grip,
            auth: crate::auth::Auth::from_config(&config_copy).unwrap(),
            hooks,
            presence: crate::presence::Presence::from_config(
                &config_copy,
                Arc::new(crate::metrics::Metrics::default()),
                false,
            )
            .unwrap()
            .map(Arc::new),
        };
        let shared = Arc::new(Shared::new(config, broker, metrics, 1000, modes));
        let mut engine = Engine::new(0, inbox, Arc::clone(&shared));
        engine.set_unix_base(UNIX_BASE);
        engine.set_hub_base(HUB_BASE);
        Harness {
            engine,
            shared,
            now: 0,
            jobs,
            hook_jobs,
            _poll: poll,
        }
    }

    /// Opens a connection, as if the shell had accepted it.
    pub fn connect(&mut self) -> Client {
        let socket = MemSocket::default();
        let pipe = Rc::clone(&socket.0);
        let mut key = None;
        self.engine
            .handle_accept(socket, 1, false, self.now, |_, k| {
                key = Some(k as u32);
                Ok(())
            });
        Client {
            key: key.unwrap(),
            pipe,
        }
    }

    /// Delivers `bytes` from the client and lets the engine read them.
    pub fn send(&mut self, c: &Client, bytes: &[u8]) {
        c.pipe.borrow_mut().inbound.extend(bytes);
        self.engine.handle_readable(c.key, self.now);
        self.engine.handle_inbox(self.now);
    }

    /// Sends a masked client frame.
    pub fn send_frame(&mut self, c: &Client, op: OpCode, payload: &[u8]) {
        self.send(c, &client_frame(op, payload));
    }

    /// The client closes its side (EOF).
    pub fn hang_up(&mut self, c: &Client) {
        c.pipe.borrow_mut().client_eof = true;
        self.engine.handle_readable(c.key, self.now);
    }

    /// The socket became writable again.
    pub fn writable(&mut self, c: &Client) {
        self.engine.handle_writable(c.key, self.now);
    }

    /// Moves the clock on by `secs`, one second at a time, running the sweep each second.
    pub fn advance(&mut self, secs: u32) {
        for _ in 0..secs {
            self.now += 1;
            self.engine.handle_inbox(self.now);
            self.engine.handle_tick(self.now);
        }
    }

    /// Publishes `payload` (text) to `topic` and lets the engine deliver it.
    pub fn publish(&mut self, topic: &str, payload: &str) {
        self.publish_with(topic, payload, None);
    }

    /// Publishes with GRIP content and lets the engine deliver it.
    pub fn publish_with(
        &mut self,
        topic: &str,
        payload: &str,
        grip: Option<Arc<crate::grip::GripContent>>,
    ) {
        let _ = self.shared.broker.publish(&[Outgoing {
            tags: &[],
            conflation_key: None,
            topic,
            kind: clarion_proto::ws::DataKind::Text,
            payload: payload.as_bytes(),
            event: None,
            attachment: grip.map(|g| g as Arc<dyn crate::message::Attachment>),
            key: None,
        }]);
        self.engine.handle_inbox(self.now);
    }

    /// Starts a graceful shutdown, as the shell does on a signal.
    pub fn shutdown(&mut self) {
        self.shared.stopping.store(true, Relaxed);
        self.engine.handle_shutdown(self.now, 1.0);
    }

    /// One step of a drain (a restart when `restart`): tells `share` of the connections open
    /// at the first step to go, as the shell does over `drain_period`.
    pub fn drain(&mut self, share: f64, restart: bool) {
        self.shared.restarting.store(restart, Relaxed);
        self.shared.stopping.store(true, Relaxed);
        self.engine.handle_shutdown(self.now, share);
    }

    /// Whether the connection still has a record (closing included).
    pub fn is_open(&self, c: &Client) -> bool {
        self.engine.conns.contains(c.key as usize)
    }

    /// The next request the engine sent to the GRIP backend, if any.
    pub fn next_job(&mut self) -> Option<Job> {
        self.jobs.as_ref()?.try_recv().ok().map(|q| q.job)
    }

    /// The next call made to a backend hook, if any.
    pub fn next_hook_call(&mut self) -> Option<Job> {
        self.hook_jobs.as_ref()?.try_recv().ok().map(|q| q.job)
    }

    /// Answers hook call `job` with `status` and `body`, through the engine's answer handler.
    pub fn answer_hook(&mut self, job: &Job, status: u16, body: &[u8]) {
        if let Some(h) = self.shared.hooks.as_ref() {
            h.done(job.ticket);
        }
        let answer = Answer {
            key: job.key,
            ticket: job.ticket,
            result: Ok(Response {
                status,
                reason: "OK".into(),
                headers: Vec::new(),
                body: body.to_vec(),
            }),
            elapsed_us: 0,
        };
        self.engine.now = self.now;
        self.engine.on_hook_answer(answer);
    }

    /// Answers `job` as the backend would, through the engine's answer handler.
    pub fn answer(&mut self, job: &Job, status: u16, headers: &[(&str, &str)], body: &[u8]) {
        // A pool without threads never answers by itself; nothing else is in the mailbox.
        let answer = Answer {
            key: job.key,
            ticket: job.ticket,
            result: Ok(Response {
                status,
                reason: "OK".into(),
                headers: headers
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
                    .collect(),
                body: body.to_vec(),
            }),
            elapsed_us: 0,
        };
        self.engine.now = self.now;
        self.engine.on_answer(answer);
    }

    /// Fails `job` as the backend pool would, through the engine's answer handler.
    pub fn fail(&mut self, job: &Job, failure: crate::grip::backend::Failure) {
        let answer = Answer {
            key: job.key,
            ticket: job.ticket,
            result: Err(failure),
            elapsed_us: 0,
        };
        self.engine.now = self.now;
        self.engine.on_answer(answer);
    }

    /// The connection gauges and counts that must return to zero once every connection has
    /// closed: http, ws, sse, stream, polls, grip holds, open connections, per-address entries.
    pub fn counts(&self) -> [u64; 8] {
        let m = &self.shared.metrics;
        [
            m.http_connections.load(Relaxed),
            m.ws_connections.load(Relaxed),
            m.sse_connections.load(Relaxed),
            m.stream_connections.load(Relaxed),
            m.polls_held.load(Relaxed),
            m.grip_holds.load(Relaxed),
            self.shared.open.load(Relaxed) as u64,
            crate::hub::lock(&self.shared.per_address).len() as u64,
        ]
    }
}

/// An HS256 JWT of `claims`, signed with `secret`.
pub fn hs256(secret: &str, claims: &serde_json::Value) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, signed.as_bytes());
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// A WebSocket upgrade request for `target`.
pub fn upgrade(target: &str) -> Vec<u8> {
    format!(
        "GET {target} HTTP/1.1\r\nHost: example.com\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n"
    )
    .into_bytes()
}

/// A masked frame as a client sends it.
pub fn client_frame(op: OpCode, payload: &[u8]) -> Vec<u8> {
    encode_client_frame(op, payload, [1, 2, 3, 4])
}

/// The server frames in `bytes` (unmasked, unfragmented; RSV1 allowed for compressed
/// messages): opcode and payload, parsed with proto's frame parser. Stops at an incomplete
/// frame.
pub fn server_frames(mut bytes: &[u8]) -> Vec<(OpCode, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(h) = parse_header_with(bytes, false, true, u64::MAX).expect("a server frame") {
        let end = h.header_len + h.payload_len as usize;
        if bytes.len() < end {
            break;
        }
        out.push((h.opcode, bytes[h.header_len..end].to_vec()));
        bytes = &bytes[end..];
    }
    out
}

/// The bytes after the first blank line (an HTTP head's end).
pub fn after_head(bytes: &[u8]) -> &[u8] {
    let at = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete head");
    &bytes[at + 4..]
}
