//! The API's overflow: a connection that arrives while the pool is taken (all its threads, or
//! its share for the client's address) waits here, on one thread with one poller, until its
//! request head has arrived. A health check is then answered from its head alone, here, with
//! no thread and no body read (a `GET /healthz` that declares a body it never sends costs
//! nothing); a request with credentials gets a thread for that one request ([`API_RESERVE`] at
//! once, [`API_RESERVE_PER_ADDRESS`] for one client address); anything else is answered `503`,
//! and a head that does not arrive within [`API_RESERVE_DEADLINE`] gets `408`. Waiting here
//! costs a socket and a partial head, never a thread, so a flood of trickling connections
//! cannot keep a publisher with the key or a health checker out.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clarion_proto::http1;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::config::limits::{
    API_HEALTH_THREADS, API_RESERVE, API_RESERVE_DEADLINE, API_RESERVE_PER_ADDRESS,
    HELPER_THREAD_STACK,
};
use crate::hub::lock;
use crate::log;
use crate::reply::Answer;

/// Connections waiting here at once; past it the newest is answered `503` at once.
const MAX_WAITING: usize = 4096;
const WAKER: Token = Token(usize::MAX);

/// How long an answered connection is read (and what it sends dropped) after our answer and
/// our FIN, so that a body it still sends does not reset the connection before it has read
/// the answer (a lingering close, as nginx's `lingering_close`).
const LINGER: Duration = Duration::from_secs(1);

/// What serves a connection once its head shows it may be served: the connection, the bytes
/// read so far. Runs on its own thread.
pub(super) type Serve = Box<dyn Fn(std::net::TcpStream, Vec<u8>) + Send + Sync>;

/// What the triage does with a request whose head has arrived.
pub(super) enum Verdict {
    /// Answer this at once, from the head alone, and close (a health check, a misdirected
    /// `Host`, a malformed head).
    Answer(Answer),
    /// Answer what this computes, from the head alone, and close; computing it may wait (a
    /// group's health scrapes its processes), so it runs on a thread of its own
    /// ([`API_HEALTH_THREADS`] at once) that never reads from the client.
    Compute(Box<dyn FnOnce() -> Answer + Send>),
    /// Serve the request on a reserve thread (credentials).
    Serve,
    /// `503`: nothing past the caps for this request.
    Refuse,
}

/// The queue into the triage thread.
pub(super) struct Triage {
    incoming: Mutex<Vec<std::net::TcpStream>>,
    waker: Waker,
}

struct Waiting {
    stream: TcpStream,
    buf: Vec<u8>,
    deadline: Instant,
    /// Answered and half-closed: what arrives now is read and dropped until EOF or the
    /// deadline ([`LINGER`]).
    answered: bool,
}

/// Reserve threads busy, in all and per client address.
#[derive(Default)]
struct Busy {
    all: usize,
    per_address: HashMap<IpAddr, usize>,
}

impl Busy {
    /// Takes a place for `ip`, if the reserve and its share for `ip` have one.
    fn take(&mut self, ip: IpAddr) -> bool {
        let from_ip = self.per_address.get(&ip).copied().unwrap_or(0);
        if self.all >= API_RESERVE || from_ip >= API_RESERVE_PER_ADDRESS {
            return false;
        }
        self.all += 1;
        *self.per_address.entry(ip).or_default() += 1;
        true
    }

    fn give_back(&mut self, ip: IpAddr) {
        self.all = self.all.saturating_sub(1);
        if let Some(n) = self.per_address.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_address.remove(&ip);
            }
        }
    }
}

/// Decides from a parsed head and the listener's own address what happens to a request.
pub(super) type Judge = dyn Fn(&http1::RequestHead<'_>, Option<SocketAddr>) -> Verdict + Send;

impl Triage {
    /// Starts the triage thread. `judge` decides from a parsed head what happens to the
    /// request; `serve` serves the ones it lets through.
    pub(super) fn start(
        limits: http1::HeadLimits,
        judge: Box<Judge>,
        serve: Serve,
    ) -> io::Result<Arc<Triage>> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let triage = Arc::new(Triage {
            incoming: Mutex::new(Vec::new()),
            waker,
        });
        let t = Arc::clone(&triage);
        std::thread::Builder::new()
            .name("clarion-api-triage".into())
            .stack_size(HELPER_THREAD_STACK)
            .spawn(move || run(&t, poll, &limits, &*judge, Arc::new(serve)))?;
        Ok(triage)
    }

    /// Hands over a connection the pool has no room for.
    pub(super) fn admit(&self, stream: std::net::TcpStream) {
        lock(&self.incoming).push(stream);
        let _ = self.waker.wake();
    }
}

fn run(t: &Triage, mut poll: Poll, limits: &http1::HeadLimits, judge: &Judge, serve: Arc<Serve>) {
    let mut events = Events::with_capacity(256);
    let mut waiting: HashMap<usize, Waiting> = HashMap::new();
    let mut next = 0usize;
    let busy = Arc::new(Mutex::new(Busy::default()));
    let computing = Arc::new(AtomicUsize::new(0));
    loop {
        if let Err(e) = poll.poll(&mut events, Some(Duration::from_millis(100))) {
            if e.kind() != io::ErrorKind::Interrupted {
                log::warn(format_args!("api triage: {e}"));
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        for std_stream in std::mem::take(&mut *lock(&t.incoming)) {
            if waiting.len() >= MAX_WAITING || std_stream.set_nonblocking(true).is_err() {
                refuse(std_stream, 503, "too many API connections");
                continue;
            }
            let mut stream = TcpStream::from_std(std_stream);
            next = next.wrapping_add(1) % (usize::MAX - 1);
            if poll
                .registry()
                .register(&mut stream, Token(next), Interest::READABLE)
                .is_err()
            {
                continue;
            }
            let deadline = Instant::now() + API_RESERVE_DEADLINE;
            waiting.insert(
                next,
                Waiting {
                    stream,
                    buf: Vec::new(),
                    deadline,
                    answered: false,
                },
            );
        }
        for ev in &events {
            let Token(id) = ev.token();
            if id == WAKER.0 {
                continue;
            }
            let Some(w) = waiting.get_mut(&id) else {
                continue;
            };
            let mut chunk = [0u8; 4096];
            let mut closed = false;
            loop {
                match w.stream.read(&mut chunk) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(_) if w.answered => {}
                    Ok(n) => w.buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        closed = true;
                        break;
                    }
                }
            }
            if w.answered {
                if closed {
                    if let Some(mut w) = waiting.remove(&id) {
                        let _ = poll.registry().deregister(&mut w.stream);
                    }
                }
                continue;
            }
            let verdict = match http1::parse_head(&w.buf, limits) {
                Ok(Some(head)) => Some(Ok(judge(&head, w.stream.local_addr().ok()))),
                Ok(None) if closed => Some(Err((0, ""))),
                Ok(None) => None,
                Err(e) => Some(Err((e.status(), "malformed request head"))),
            };
            let Some(verdict) = verdict else { continue };
            let verdict = match verdict {
                Ok(Verdict::Answer(a)) => {
                    // Answered here: our answer and FIN now, then whatever the client still
                    // sends is read and dropped for a moment (unless it has closed already).
                    let _ = w.stream.write_all(&a.bytes(false));
                    let _ = w.stream.shutdown(std::net::Shutdown::Write);
                    if !closed {
                        w.buf = Vec::new();
                        w.answered = true;
                        w.deadline = Instant::now() + LINGER;
                        continue;
                    }
                    Err((0, ""))
                }
                Ok(v @ (Verdict::Compute(_) | Verdict::Serve | Verdict::Refuse)) => Ok(v),
                Err(e) => Err(e),
            };
            let Some(mut w) = waiting.remove(&id) else {
                continue;
            };
            let _ = poll.registry().deregister(&mut w.stream);
            let std_stream = into_std(w.stream);
            match verdict {
                Ok(Verdict::Serve) => {
                    let ip = std_stream
                        .peer_addr()
                        .map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
                    if !lock(&busy).take(ip) {
                        refuse(std_stream, 503, "too many API connections");
                        continue;
                    }
                    let (serve, busy2) = (Arc::clone(&serve), Arc::clone(&busy));
                    let buf = w.buf;
                    let spawned = std::thread::Builder::new()
                        .name("clarion-api".into())
                        .stack_size(HELPER_THREAD_STACK)
                        .spawn(move || {
                            if std_stream.set_nonblocking(false).is_ok() {
                                serve(std_stream, buf);
                            }
                            lock(&busy2).give_back(ip);
                        });
                    if spawned.is_err() {
                        lock(&busy).give_back(ip);
                    }
                }
                Ok(Verdict::Compute(answer)) if computing.load(Relaxed) < API_HEALTH_THREADS => {
                    computing.fetch_add(1, Relaxed);
                    let busy2 = Arc::clone(&computing);
                    let spawned = std::thread::Builder::new()
                        .name("clarion-api-health".into())
                        .stack_size(HELPER_THREAD_STACK)
                        .spawn(move || {
                            refuse_with(std_stream, &answer());
                            busy2.fetch_sub(1, Relaxed);
                        });
                    if spawned.is_err() {
                        computing.fetch_sub(1, Relaxed);
                    }
                }
                Ok(Verdict::Compute(_) | Verdict::Refuse) => {
                    refuse(std_stream, 503, "too many API connections");
                }
                // Answered above, or the client went away before its head was whole.
                Ok(Verdict::Answer(_)) | Err((0, _)) => {}
                Err((status, why)) => refuse(std_stream, status, why),
            }
        }
        let now = Instant::now();
        let late: Vec<usize> = waiting
            .iter()
            .filter(|(_, w)| w.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            if let Some(mut w) = waiting.remove(&id) {
                let _ = poll.registry().deregister(&mut w.stream);
                if !w.answered {
                    refuse(
                        into_std(w.stream),
                        408,
                        "the request did not arrive in time",
                    );
                }
            }
        }
    }
}

fn into_std(s: TcpStream) -> std::net::TcpStream {
    std::net::TcpStream::from(std::os::fd::OwnedFd::from(s))
}

/// Answers `status` and closes, without waiting on a client that does not read.
fn refuse(s: std::net::TcpStream, status: u16, why: &str) {
    refuse_with(s, &Answer::error(status, why));
}

fn refuse_with(mut s: std::net::TcpStream, a: &Answer) {
    let _ = s.set_nonblocking(true);
    let _ = s.write_all(&a.bytes(false));
    let _ = s.shutdown(std::net::Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_takes_at_most_its_share_of_the_reserve() {
        let mut busy = Busy::default();
        let (a, b) = (IpAddr::from([127, 0, 0, 7]), IpAddr::from([127, 0, 0, 1]));
        let taken = (0..API_RESERVE).filter(|_| busy.take(a)).count();
        assert_eq!(taken, API_RESERVE_PER_ADDRESS);
        assert!(busy.take(b), "another address still gets a thread");
        busy.give_back(a);
        assert!(busy.take(a));
        assert!(!busy.take(a));
    }
}
