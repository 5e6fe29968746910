//! The API's overflow: a connection that arrives while the pool is taken (all its threads, or
//! its share for the client's address) waits here, on one thread with one poller, until its
//! request head has arrived. A health check or a request with credentials then gets a thread
//! for that one request; anything else is answered `503`, and a head that does not arrive
//! within [`API_RESERVE_DEADLINE`] gets `408`. Waiting here costs a socket and a partial head,
//! never a thread, so a flood of trickling connections cannot keep a publisher with the key or
//! a health checker out.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clarion_proto::http1;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::config::limits::{API_RESERVE, API_RESERVE_DEADLINE, HELPER_THREAD_STACK};
use crate::hub::lock;
use crate::log;
use crate::reply::Answer;

/// Connections waiting here at once; past it the newest is answered `503` at once.
const MAX_WAITING: usize = 4096;
const WAKER: Token = Token(usize::MAX);

/// What serves a connection once its head shows it may be served: the connection, the bytes
/// read so far. Runs on its own thread.
pub(super) type Serve = Box<dyn Fn(std::net::TcpStream, Vec<u8>) + Send + Sync>;

/// The queue into the triage thread.
pub(super) struct Triage {
    incoming: Mutex<Vec<std::net::TcpStream>>,
    waker: Waker,
}

struct Waiting {
    stream: TcpStream,
    buf: Vec<u8>,
    deadline: Instant,
}

impl Triage {
    /// Starts the triage thread. `admits` decides from a parsed head whether the request may be
    /// served; `serve` serves it.
    pub(super) fn start(
        limits: http1::HeadLimits,
        admits: impl Fn(&http1::RequestHead<'_>) -> bool + Send + 'static,
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
            .spawn(move || run(&t, poll, &limits, &admits, Arc::new(serve)))?;
        Ok(triage)
    }

    /// Hands over a connection the pool has no room for.
    pub(super) fn admit(&self, stream: std::net::TcpStream) {
        lock(&self.incoming).push(stream);
        let _ = self.waker.wake();
    }
}

fn run(
    t: &Triage,
    mut poll: Poll,
    limits: &http1::HeadLimits,
    admits: &impl Fn(&http1::RequestHead<'_>) -> bool,
    serve: Arc<Serve>,
) {
    let mut events = Events::with_capacity(256);
    let mut waiting: HashMap<usize, Waiting> = HashMap::new();
    let mut next = 0usize;
    let serving = Arc::new(AtomicUsize::new(0));
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
                    Ok(n) => w.buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        closed = true;
                        break;
                    }
                }
            }
            let verdict = match http1::parse_head(&w.buf, limits) {
                Ok(Some(head)) => Some(Ok(admits(&head))),
                Ok(None) if closed => Some(Err((0, ""))),
                Ok(None) => None,
                Err(e) => Some(Err((e.status(), "malformed request head"))),
            };
            let Some(verdict) = verdict else { continue };
            let Some(mut w) = waiting.remove(&id) else {
                continue;
            };
            let _ = poll.registry().deregister(&mut w.stream);
            let std_stream = into_std(w.stream);
            match verdict {
                Ok(true) if serving.load(Relaxed) < API_RESERVE => {
                    serving.fetch_add(1, Relaxed);
                    let (serve, busy) = (Arc::clone(&serve), Arc::clone(&serving));
                    let buf = w.buf;
                    let spawned = std::thread::Builder::new()
                        .name("clarion-api".into())
                        .stack_size(HELPER_THREAD_STACK)
                        .spawn(move || {
                            if std_stream.set_nonblocking(false).is_ok() {
                                serve(std_stream, buf);
                            }
                            busy.fetch_sub(1, Relaxed);
                        });
                    if spawned.is_err() {
                        serving.fetch_sub(1, Relaxed);
                    }
                }
                Ok(_) => refuse(std_stream, 503, "too many API connections"),
                Err((0, _)) => {}
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
                refuse(
                    into_std(w.stream),
                    408,
                    "the request did not arrive in time",
                );
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
