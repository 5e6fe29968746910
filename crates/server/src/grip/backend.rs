//! Requests to GRIP backends: a small pool of threads doing blocking HTTP/1.1 exchanges.
//!
//! Backend requests are few and short next to the connections they set up (one request opens a
//! stream that is then held for hours), so they do not go through the client event loops: a
//! worker hands a [`Job`] to the pool and gets an [`Answer`] back in its [`Mailbox`], with a
//! wake-up of its loop. Each thread keeps idle keep-alive connections to the backends it has
//! talked to, so a burst of subscriptions does not pay a TCP handshake each.
//!
//! Every exchange is bounded: waiting for a thread, connect, write and read share one deadline
//! (`grip_backend_timeout`, `hook_timeout_ms`) counted from when the job is queued, so a job
//! stuck behind slow ones is answered `Timeout` at its deadline instead of starting late; and
//! answers larger than the pool's body limit (`grip_max_body`, `hook_max_answer`) are refused.

use std::collections::HashMap;
use std::io::{self, Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clarion_proto::http1::{parse_response_head, ChunkedDecoder, HopByHop, ResponseBody};

use crate::config::limits::{GRIP_BACKEND_MAX_HEAD, GRIP_BACKEND_MAX_HEADERS};
use crate::hub::{lock, Inbox};
use crate::log;

/// A request for the pool.
pub struct Job {
    /// The worker that wants the answer (`None`: nobody, e.g. a DISCONNECT notice).
    pub reply: Option<Arc<Mailbox>>,
    /// The connection it is for, and the ticket that proves it is still the same connection.
    pub key: u32,
    /// See [`Answer::ticket`].
    pub ticket: u64,
    /// Backends to try in order (`host:port`).
    pub targets: Arc<[String]>,
    /// The request, head and body, ready to write.
    pub request: Vec<u8>,
    /// A `HEAD` request (its answer has no body whatever the headers say).
    pub head_only: bool,
}

/// A job as the pool holds it: with the time [`Backend::submit`] took it, from which its
/// deadline counts, so the time it waits for a free thread is part of the timeout (a queue of
/// slow calls must not stretch it). The pool reads the clock; the engine that submits does not.
pub(crate) struct Queued {
    pub(crate) job: Job,
    pub(crate) at: Instant,
}

/// A backend's complete answer.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Reason phrase.
    pub reason: String,
    /// Header fields, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The whole body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name`, as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }
}

/// Why there is no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No backend could be reached (502).
    Unreachable(String),
    /// The backend did not answer in time (504).
    Timeout,
    /// The answer was not valid HTTP, or too large (502).
    Invalid(String),
}

/// The outcome of a [`Job`].
pub struct Answer {
    /// The connection it is for.
    pub key: u32,
    /// Copied from the job: a worker ignores answers whose ticket no longer matches its
    /// connection (it closed, and the slab key was reused).
    pub ticket: u64,
    /// The answer, or why there is none.
    pub result: Result<Response, Failure>,
    /// Microseconds the exchange took (0 when it never started).
    pub elapsed_us: u64,
}

/// Where a worker receives its answers.
pub struct Mailbox {
    answers: Mutex<Vec<Answer>>,
    inbox: Arc<Inbox>,
}

impl Mailbox {
    /// A mailbox that wakes the loop of `inbox`.
    pub fn new(inbox: Arc<Inbox>) -> Mailbox {
        Mailbox {
            answers: Mutex::new(Vec::new()),
            inbox,
        }
    }

    fn post(&self, a: Answer) {
        let mut q = lock(&self.answers);
        let was_empty = q.is_empty();
        q.push(a);
        drop(q);
        if was_empty {
            self.inbox.wake();
        }
    }

    /// Takes every answer received so far.
    pub fn take(&self) -> Vec<Answer> {
        std::mem::take(&mut *lock(&self.answers))
    }
}

/// The pool.
pub struct Backend {
    jobs: Mutex<Sender<Queued>>,
}

/// Limits of one exchange.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Deadline for the whole exchange.
    pub timeout: Duration,
    /// Largest body.
    pub max_body: usize,
    /// The setting `max_body` comes from, named when an answer is too large.
    pub max_body_setting: &'static str,
}

impl Backend {
    /// Starts `threads` threads.
    pub fn start(threads: usize, limits: Limits) -> io::Result<Backend> {
        Backend::start_named(threads, limits, "grip")
    }

    /// Starts `threads` threads named `clarion-<name>-<i>` (the hook pool shares this code).
    pub fn start_named(threads: usize, limits: Limits, name: &str) -> io::Result<Backend> {
        let (tx, rx) = mpsc::channel::<Queued>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = Arc::clone(&rx);
            std::thread::Builder::new()
                .name(format!("clarion-{name}-{i}"))
                .stack_size(crate::config::limits::HELPER_THREAD_STACK)
                .spawn(move || run(&rx, limits))?;
        }
        Ok(Backend {
            jobs: Mutex::new(tx),
        })
    }

    /// A pool without threads whose jobs are handed to the caller instead (engine tests inject
    /// the backend's answers themselves).
    #[cfg(test)]
    pub(crate) fn detached() -> (Backend, mpsc::Receiver<Queued>) {
        let (tx, rx) = mpsc::channel::<Queued>();
        let backend = Backend {
            jobs: Mutex::new(tx),
        };
        (backend, rx)
    }

    /// Queues a job. If the pool is gone (it never is while the server runs), the job's worker
    /// gets an `Unreachable` answer.
    pub fn submit(&self, job: Job) {
        let queued = Queued {
            job,
            at: Instant::now(),
        };
        if let Err(mpsc::SendError(Queued { job, .. })) = lock(&self.jobs).send(queued) {
            if let Some(r) = &job.reply {
                r.post(Answer {
                    key: job.key,
                    ticket: job.ticket,
                    result: Err(Failure::Unreachable("backend pool stopped".into())),
                    elapsed_us: 0,
                });
            }
        }
    }
}

fn run(rx: &Mutex<Receiver<Queued>>, limits: Limits) {
    let mut idle: HashMap<String, TcpStream> = HashMap::new();
    loop {
        let Queued { job, at } = match lock(rx).recv() {
            Ok(q) => q,
            Err(_) => return,
        };
        let result = exchange(&job, at, &mut idle, limits);
        let elapsed_us = u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX);
        if let Err(f) = &result {
            log::debug(format_args!("backend {:?}: {f:?}", job.targets));
        }
        if let Some(reply) = &job.reply {
            reply.post(Answer {
                key: job.key,
                ticket: job.ticket,
                result,
                elapsed_us,
            });
        }
    }
}

/// One exchange on the calling thread, for a thread of its own that waits anyway (the webhook
/// sender): the same connection reuse, limits and answer parsing as the pool's threads.
pub fn exchange_blocking(
    job: &Job,
    idle: &mut HashMap<String, TcpStream>,
    limits: Limits,
) -> Result<Response, Failure> {
    exchange(job, Instant::now(), idle, limits)
}

/// Tries each target in turn; a reused keep-alive connection that fails before answering is
/// retried once on a fresh one (the backend may have closed it while idle).
fn exchange(
    job: &Job,
    queued: Instant,
    idle: &mut HashMap<String, TcpStream>,
    limits: Limits,
) -> Result<Response, Failure> {
    let deadline = queued + limits.timeout;
    if Instant::now() >= deadline {
        // It waited its whole time for a thread: starting now would only make it later.
        return Err(Failure::Timeout);
    }
    let mut last = Failure::Unreachable("no backend".into());
    for addr in job.targets.iter() {
        if let Some(stream) = idle.remove(addr) {
            match once(stream, job, deadline, limits) {
                Ok((r, keep)) => {
                    if let Some(s) = keep {
                        idle.insert(addr.clone(), s);
                    }
                    return Ok(r);
                }
                Err((f, answered)) if answered || f == Failure::Timeout => return Err(f),
                Err(_) => {}
            }
        }
        let stream = match connect(addr, deadline) {
            Ok(s) => s,
            Err(e) => {
                last = Failure::Unreachable(format!("{addr}: {e}"));
                continue;
            }
        };
        return match once(stream, job, deadline, limits) {
            Ok((r, keep)) => {
                if let Some(s) = keep {
                    idle.insert(addr.clone(), s);
                }
                Ok(r)
            }
            Err((f, _)) => Err(f),
        };
    }
    Err(last)
}

fn connect(addr: &str, deadline: Instant) -> io::Result<TcpStream> {
    let mut err = io::Error::new(io::ErrorKind::NotFound, "no address");
    for a in addr.to_socket_addrs()? {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        match TcpStream::connect_timeout(&a, left) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => err = e,
        }
    }
    Err(err)
}

/// One request on one connection. On success, also the connection when it may be reused. On
/// failure, whether any byte of an answer had arrived.
#[allow(clippy::type_complexity)]
fn once(
    mut s: TcpStream,
    job: &Job,
    deadline: Instant,
    limits: Limits,
) -> Result<(Response, Option<TcpStream>), (Failure, bool)> {
    let max_body = limits.max_body;
    let io_fail = |e: io::Error, answered: bool| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => (Failure::Timeout, answered),
        _ => (Failure::Unreachable(e.to_string()), answered),
    };
    let left = |deadline: Instant| {
        let d = deadline.saturating_duration_since(Instant::now());
        if d.is_zero() {
            Err((Failure::Timeout, false))
        } else {
            Ok(Some(d))
        }
    };
    s.set_write_timeout(left(deadline)?)
        .map_err(|e| io_fail(e, false))?;
    s.write_all(&job.request).map_err(|e| io_fail(e, false))?;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = vec![0u8; 16 * 1024];
    // The head.
    let (status, reason, headers, framing, head_len, close) = loop {
        if let Some(h) = parse_response_head(&buf, GRIP_BACKEND_MAX_HEADERS, GRIP_BACKEND_MAX_HEAD)
            .map_err(|e| (Failure::Invalid(e.to_string()), true))?
        {
            // 1xx answers (100 Continue) precede the real one.
            if (100..200).contains(&h.status) {
                let n = h.head_len;
                buf.drain(..n);
                continue;
            }
            let method = if job.head_only { "HEAD" } else { "GET" };
            let framing = h
                .body(method)
                .map_err(|e| (Failure::Invalid(e.to_string()), true))?;
            let close = h.minor_version == 0 || HopByHop::new(&h.headers).connection_has("close");
            break (
                h.status,
                h.reason.to_string(),
                h.headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_vec()))
                    .collect::<Vec<_>>(),
                framing,
                h.head_len,
                close,
            );
        }
        s.set_read_timeout(left(deadline)?)
            .map_err(|e| io_fail(e, !buf.is_empty()))?;
        let n = s
            .read(&mut chunk)
            .map_err(|e| io_fail(e, !buf.is_empty()))?;
        if n == 0 {
            return Err((
                Failure::Unreachable("connection closed before an answer".into()),
                !buf.is_empty(),
            ));
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    };
    buf.drain(..head_len);
    let too_large = || {
        (
            Failure::Invalid(format!("answer larger than {}", limits.max_body_setting)),
            true,
        )
    };
    let mut read = |s: &mut TcpStream, buf: &mut Vec<u8>| -> Result<usize, (Failure, bool)> {
        s.set_read_timeout(left(deadline)?)
            .map_err(|e| io_fail(e, true))?;
        let n = s.read(&mut chunk).map_err(|e| io_fail(e, true))?;
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        Ok(n)
    };
    let body = match framing {
        ResponseBody::None => Vec::new(),
        ResponseBody::Length(n) => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n > max_body {
                return Err(too_large());
            }
            while buf.len() < n {
                if read(&mut s, &mut buf)? == 0 {
                    return Err((Failure::Invalid("answer body cut short".into()), true));
                }
            }
            buf.truncate(n);
            buf
        }
        ResponseBody::Chunked => {
            let mut dec = ChunkedDecoder::new(max_body);
            let mut body = Vec::new();
            loop {
                let (used, done) = dec.decode(&buf, &mut body).map_err(|e| match e {
                    clarion_proto::http1::BodyError::TooLarge => too_large(),
                    clarion_proto::http1::BodyError::Malformed => {
                        (Failure::Invalid("malformed chunked answer".into()), true)
                    }
                })?;
                buf.drain(..used.min(buf.len()));
                if done {
                    break body;
                }
                if read(&mut s, &mut buf)? == 0 {
                    return Err((Failure::Invalid("answer body cut short".into()), true));
                }
            }
        }
        ResponseBody::UntilClose => {
            while read(&mut s, &mut buf)? > 0 {
                if buf.len() > max_body {
                    return Err(too_large());
                }
            }
            buf
        }
    };
    let reusable = !close && framing != ResponseBody::UntilClose;
    Ok((
        Response {
            status,
            reason,
            headers,
            body,
        },
        reusable.then_some(s),
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_job_that_waited_its_whole_timeout_in_the_queue_is_not_started() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let limits = Limits {
            timeout: Duration::from_secs(1),
            max_body: 1024,
            max_body_setting: "hook_max_answer",
        };
        let job = Job {
            reply: None,
            key: 0,
            ticket: 0,
            targets: vec![listener.local_addr().unwrap().to_string()].into(),
            request: b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            head_only: false,
        };
        let mut idle = HashMap::new();
        let late = Instant::now() - Duration::from_millis(1500);
        assert_eq!(
            exchange(&job, late, &mut idle, limits).err(),
            Some(Failure::Timeout)
        );
        // It never reached the backend.
        assert!(listener.accept().is_err());
        // A job queued just now does (and times out waiting for the answer that never comes,
        // one second after it was queued).
        let t0 = Instant::now();
        assert_eq!(
            exchange(&job, t0, &mut idle, limits).err(),
            Some(Failure::Timeout)
        );
        assert!(listener.accept().is_ok());
        assert!(t0.elapsed() < Duration::from_millis(1500));
    }

    #[test]
    fn a_too_large_answer_names_the_setting_of_its_pool() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
                .unwrap();
        });
        let limits = Limits {
            timeout: Duration::from_secs(5),
            max_body: 10,
            max_body_setting: "hook_max_answer",
        };
        let job = Job {
            reply: None,
            key: 0,
            ticket: 0,
            targets: vec![addr].into(),
            request: b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".to_vec(),
            head_only: false,
        };
        let got = exchange(&job, Instant::now(), &mut HashMap::new(), limits).err();
        assert_eq!(
            got,
            Some(Failure::Invalid(
                "answer larger than hook_max_answer".into()
            ))
        );
        server.join().unwrap();
    }
}
