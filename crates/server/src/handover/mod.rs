//! Upgrades that keep connections: `clarion serve <same flags> --upgrade-from PID` starts a new
//! binary that takes the running one's listening sockets and every established connection it
//! can carry, with their state, so that clients see nothing (no close, no reconnect, no lost or
//! repeated message). The format is [`clarion_proto::handover`]; the descriptors travel with
//! `SCM_RIGHTS` ([`fds`]); the workers' part is `crate::worker::handover`.
//!
//! The old process ([`listen`]) waits on a Unix socket at [`socket_path`] (mode 0600, in a
//! directory only its user can write to, [`socket_dir`]). When a
//! new process connects and both speak the same format version:
//!
//! 1. the old one sends its listening sockets (client, TLS, API): from then on connections
//!    queue in the same kernel accept queues until the new process accepts them;
//! 2. it freezes the broker (every later publish is answered `503`, so no message is ever
//!    given an id the new process would not know) and asks each worker to let go: a worker
//!    delivers what its inbox holds and lifts each connection that can move out of its slab;
//! 3. it sends where ids stand (epoch, next id, topic floors) and, without `history_dir`, the
//!    history itself (with `history_dir` it closes the log cleanly and the new process reads
//!    it); the new process rebuilds the broker, checks that it continues the same ids, and says
//!    ready;
//! 4. it sends the connections in batches (descriptors with each), and the new process
//!    registers them with its workers, subscribed again to their topics from the frozen point,
//!    with their partial input and owed output, and a TLS 1.3 connection with its record layer
//!    (traffic secrets, sequence numbers, ciphertext in flight). The buffers that held those
//!    secrets are wiped after the send and after the read;
//! 5. on the new process's ack, the old one restarts as on SIGUSR2: the connections that could
//!    not move are told to reconnect (close 1012, SSE `retry:`) and it exits.
//!
//! With the Redis broker, step 2 also stops live deliveries (the workers' inboxes then hold
//! all the process delivers), and step 3 sends, instead of history, the id each topic stands
//! at ([`Frame::Positions`]): the new process subscribes each connection from there, as if
//! its client had resumed with those ids, so what was published meanwhile (on other processes
//! of a group) is read back from Redis, once and in order.
//!
//! A peer with another format version, a NATS broker, a different worker count, or a
//! failure before the connections were sent makes the old process fall back to that restart
//! with every connection; the new process then binds its own listeners beside the old ones.

pub mod fds;
pub mod incoming;
pub mod socket_dir;

use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clarion_proto::handover::{self as wire, ConnRecord, ConnState, Frame};
use clarion_proto::history_log;
use clarion_proto::pubsub::wire as body_wire;

use crate::broker::Frozen;
use crate::log;
use crate::worker::grip::carried::CarriedGrip;
use crate::worker::handover::{state_to_wire, Fallback, H2Part, Moving};
use crate::worker::handover_state::CarriedMode;
use crate::worker::state::State;
use crate::worker::Shared;

/// How long either side waits for the other's next frame before giving up.
const PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the workers may take to let go (each does so at its next loop iteration).
const LET_GO_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the process with `pid` listens for a hand-over: named after the pid, in a directory
/// only this user can write to ([`socket_dir`]). Creates nothing: the path to connect to, or
/// to remove at exit.
pub fn socket_path(pid: u32) -> std::io::Result<PathBuf> {
    socket_dir::socket_in(pid, false)
}

/// The binary this process was started from, read at start: after an upgrade replaced the
/// file, SIGUSR1 starts the new version from the same path.
static BINARY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Remembers the binary's path (at start, before it can be replaced).
pub fn remember_binary() {
    if let Ok(exe) = std::env::current_exe() {
        let _ = BINARY.set(exe);
    }
}

/// SIGUSR1 to a lone process: starts the binary on disk with this process's arguments and
/// `--upgrade-from` this pid, which takes the connections over. Its output goes where this
/// process's goes. A successor that fails to start leaves this process serving (false).
pub fn start_successor() -> bool {
    let exe = BINARY
        .get()
        .filter(|p| p.is_file())
        .map_or(std::path::Path::new("/proc/self/exe"), PathBuf::as_path);
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "clarion".into());
    let mut kept = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            continue;
        }
        let text = a.to_string_lossy();
        if text == "--upgrade-from" {
            skip = true;
            continue;
        }
        if text.starts_with("--upgrade-from=") {
            continue;
        }
        kept.push(a);
    }
    use std::os::unix::process::CommandExt as _;
    let spawned = std::process::Command::new(exe)
        .arg0(arg0)
        .args(kept)
        .arg("--upgrade-from")
        .arg(std::process::id().to_string())
        .stdin(std::process::Stdio::null())
        .spawn();
    match spawned {
        Ok(mut child) => {
            log::info(format_args!(
                "SIGUSR1: started {} (pid {}) to take the connections over",
                exe.display(),
                child.id()
            ));
            // Reaped if it exits while this process still runs (a failed start).
            let _ = std::thread::Builder::new()
                .name("clarion-successor".into())
                .spawn(move || {
                    if let Ok(status) = child.wait() {
                        if !status.success() {
                            log::warn(format_args!(
                                "the upgrade's new process exited ({status}); still serving"
                            ));
                            crate::service_manager::ready(
                                "serving: the upgrade's new process failed; still serving",
                            );
                        }
                    }
                });
            true
        }
        Err(e) => {
            log::warn(format_args!(
                "SIGUSR1: cannot start {}: {e}; still serving",
                exe.display()
            ));
            false
        }
    }
}

/// Writes this process's pid to `path` (through a temporary file and a rename, so a reader
/// never sees it half written).
pub fn write_pid_file(path: &std::path::Path) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{}\n", std::process::id()))?;
    std::fs::rename(&tmp, path)
}

/// Removes the pid file at exit, unless it names another process (the one that took over).
pub fn remove_pid_file(path: &std::path::Path) {
    let ours =
        std::fs::read_to_string(path).is_ok_and(|t| t.trim() == std::process::id().to_string());
    if ours {
        let _ = std::fs::remove_file(path);
    }
}

/// The sockets the old process passes on, duplicated before its workers took theirs.
pub struct Listening {
    /// One client listener per worker.
    pub client: Vec<OwnedFd>,
    /// One TLS listener per worker, or none.
    pub tls: Vec<OwnedFd>,
    /// The API listener.
    pub api: Option<OwnedFd>,
}

/// The copies of the listening sockets, kept for a hand-over; [`close_listeners`] drops them.
/// A hand-over holds the lock while it sends them, so a stop waits for it.
static LISTENING: std::sync::Mutex<Option<Listening>> = std::sync::Mutex::new(None);

/// Closes the copies of the listening sockets: a stop must not leave them accepting
/// connections that nobody serves.
pub fn close_listeners() {
    crate::hub::lock(&LISTENING).take();
}

/// The identity this binary sends in its hello.
pub fn hello(workers: usize, tls: bool) -> Frame<'static> {
    Frame::Hello(wire::Hello {
        version: wire::VERSION,
        binary: env!("CARGO_PKG_VERSION"),
        workers: workers.min(u16::MAX as usize) as u16,
        tls,
    })
}

/// Encodes and sends one frame (with `fds`).
pub(crate) fn send(sock: &UnixStream, frame: &Frame<'_>, fds: &[RawFd]) -> std::io::Result<()> {
    send_sized(sock, frame, fds, 0)
}

/// [`send`] into a buffer of `capacity` bytes, wiped after the send: a `conns` frame carries
/// TLS traffic secrets, and a buffer sized for the whole frame is never reallocated (which
/// would leave a copy in freed memory).
fn send_sized(
    sock: &UnixStream,
    frame: &Frame<'_>,
    fds: &[RawFd],
    capacity: usize,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(capacity);
    wire::encode(frame, &mut buf);
    let res = fds::send(sock, &buf, fds);
    zeroize::Zeroize::zeroize(&mut buf);
    res
}

/// Binds the hand-over socket (0600) and serves hand-over requests on a thread. Errors are
/// logged: a server without the socket still restarts with a drain.
pub fn listen(shared: Arc<Shared>, listening: Listening) {
    *crate::hub::lock(&LISTENING) = Some(listening);
    let bound = socket_dir::socket_in(std::process::id(), true).and_then(|path| {
        // Left by a killed process that had this pid: the directory is this user's alone.
        let _ = std::fs::remove_file(&path);
        bind_private(&path)
            .map(|l| (l, path.clone()))
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    });
    let (listener, path) = match bound {
        Ok(l) => l,
        Err(e) => {
            log::warn(format_args!(
                "hand-over socket: {e}; upgrades restart with a drain"
            ));
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("clarion-handover".into())
        .spawn(move || {
            for sock in listener.incoming() {
                let Ok(sock) = sock else { continue };
                // The socket is 0600; this also keeps out root processes of other users' tools.
                let peer_pid = match fds::peer(&sock) {
                    Ok((pid, uid)) if uid == fds::own_uid() => pid,
                    Ok((pid, uid)) => {
                        log::warn(format_args!(
                            "hand-over socket: process {pid} of user {uid} refused (not this user)"
                        ));
                        continue;
                    }
                    Err(e) => {
                        log::warn(format_args!("hand-over socket: {e}"));
                        continue;
                    }
                };
                let _ = sock.set_read_timeout(Some(PEER_TIMEOUT));
                let _ = sock.set_write_timeout(Some(PEER_TIMEOUT));
                let outcome = match crate::hub::lock(&LISTENING).as_ref() {
                    Some(listening) => hand_over(&shared, listening, sock, peer_pid),
                    // Stopping already: the listeners are closed.
                    None => return,
                };
                match outcome {
                    Outcome::NotAPeer(e) => {
                        log::warn(format_args!("hand-over socket: not a Clarion peer: {e}"));
                        continue;
                    }
                    Outcome::Done => {}
                    Outcome::Fallback(why) => {
                        log::warn(format_args!(
                            "hand-over refused ({why}): restarting with a drain instead"
                        ));
                        // The new process binds its own listeners and serves: it is the
                        // service's process from now on, if it still runs.
                        if std::path::Path::new(&format!("/proc/{peer_pid}")).exists() {
                            crate::service_manager::hand_to(
                                peer_pid,
                                "upgrade: the hand-over was refused; the new process serves, \
                                 this one restarts its connections",
                            );
                        }
                    }
                }
                let _ = std::fs::remove_file(&path);
                // The restart (SIGUSR2) tells the connections left to reconnect, and exits.
                restart_self();
                return;
            }
        });
    if let Err(e) = spawned {
        log::warn(format_args!("hand-over thread: {e}"));
    }
}

fn bind_private(path: &std::path::Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt as _;
    // Bound, then made private, then listening: nobody can connect before it is 0600.
    let sock = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    let name = socket_dir::addressable(path)?;
    sock.bind(&socket2::SockAddr::unix(name.path())?)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    sock.listen(1)?;
    Ok(UnixListener::from(OwnedFd::from(sock)))
}

fn restart_self() {
    let _ = signal_hook::low_level::raise(signal_hook::consts::SIGUSR2);
}

enum Outcome {
    /// Every connection that could move has moved.
    Done,
    /// The hand-over did not happen; restart with a drain.
    Fallback(String),
    /// Whatever connected does not speak the format: ignore it.
    NotAPeer(String),
}

fn hand_over(
    shared: &Arc<Shared>,
    listening: &Listening,
    sock: UnixStream,
    peer_pid: u32,
) -> Outcome {
    let began = Instant::now();
    let mut rd = fds::Reader::new(sock);
    let theirs = rd.next(|f, _| match f {
        Frame::Hello(h) => Ok((h.version, h.binary.to_owned(), h.workers)),
        other => Err(format!("expected hello, got {other:?}")),
    });
    let (version, binary, workers) = match theirs {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => return Outcome::NotAPeer(e),
        Err(e) => return Outcome::NotAPeer(e.to_string()),
    };
    let ours = shared.config.worker_count();
    let refusal = if version != wire::VERSION {
        Some(format!(
            "hand-over format {version} (binary {binary}); this process speaks {} (binary {})",
            wire::VERSION,
            env!("CARGO_PKG_VERSION")
        ))
    } else if usize::from(workers) != ours {
        Some(format!(
            "the new process has {workers} workers, this one {ours}: the listeners are one per worker"
        ))
    } else if let Some(why) = shared.broker.handover_refusal() {
        Some(why.to_owned())
    } else if !shared.broker.healthy() {
        Some("the broker is unreachable: the connections could not be resumed".to_owned())
    } else {
        None
    };
    let sock = rd.socket();
    if let Some(why) = refusal {
        let _ = send(sock, &Frame::Refuse(&why), &[]);
        return Outcome::Fallback(why);
    }
    log::info(format_args!(
        "hand-over: a new process (binary {binary}) takes over; passing the listeners"
    ));
    if let Err(e) = send(sock, &hello(ours, shared.tls.is_some()), &[]) {
        return Outcome::Fallback(format!("hello: {e}"));
    }
    let raw: Vec<RawFd> = listening
        .client
        .iter()
        .chain(&listening.tls)
        .chain(&listening.api)
        .map(|f| f.as_raw_fd())
        .collect();
    let node = shared.config.node();
    let lf = Frame::Listeners(wire::Listeners {
        client: listening.client.len() as u16,
        tls: listening.tls.len() as u16,
        api: u8::from(listening.api.is_some()),
        node: &node,
    });
    if let Err(e) = send(sock, &lf, &raw) {
        return Outcome::Fallback(format!("listeners: {e}"));
    }
    // The freeze: no publish gets an id from here on (and, with Redis, no live message reaches
    // a worker); then every worker lets go.
    let Some(history) = shared.broker.freeze() else {
        return Outcome::Fallback("broker changed".into());
    };
    let froze_at = Instant::now();
    shared.handover.request();
    shared.broker.wake_all();
    let Some(moving) = shared.handover.collect(ours, LET_GO_TIMEOUT) else {
        return Outcome::Fallback("the workers did not let go in time".into());
    };
    let history = match &history {
        Frozen::History(frozen) => history_frame_bytes(frozen),
        Frozen::Positions(positions) => {
            let list = positions
                .iter()
                .map(|(t, id)| (&**t, id.as_str()))
                .collect();
            let mut buf = Vec::new();
            wire::encode(&Frame::Positions(list), &mut buf);
            buf
        }
    };
    if let Err(e) = fds::send(sock, &history, &[]) {
        return Outcome::Fallback(format!("history: {e}"));
    }
    match rd.next(|f, _| match f {
        Frame::Ready => Ok(()),
        Frame::Refuse(why) => Err(why.to_owned()),
        other => Err(format!("expected ready, got {other:?}")),
    }) {
        Ok(Ok(())) => {}
        Ok(Err(why)) => return Outcome::Fallback(format!("the new process refused: {why}")),
        Err(e) => return Outcome::Fallback(format!("waiting for ready: {e}")),
    }
    let moved = moving.len();
    let sock = rd.socket();
    for batch in moving.chunks(wire::MAX_FDS) {
        if let Err(e) = send_batch(sock, batch) {
            // The connections already sent are the new process's; the rest close here and
            // reconnect (they resume from history).
            return Outcome::Fallback(format!("connections: {e}"));
        }
    }
    let fallback: u64 = shared
        .handover
        .fallbacks
        .counts()
        .iter()
        .map(|(_, n)| n)
        .sum();
    let end = Frame::End(wire::End {
        moved: moved as u32,
        fallback: fallback as u32,
    });
    if let Err(e) = send(sock, &end, &[]) {
        return Outcome::Fallback(format!("end: {e}"));
    }
    let acked = rd.next(|f, _| matches!(f, Frame::Ack));
    // Our copies of the sockets close with `moving` here; the new process holds them.
    drop(moving);
    // A refused HTTP/2 request is a stream whose connection moved: its client retries it
    // there. Every other reason is a connection that stays and is told to reconnect.
    let counts = shared.handover.fallbacks.counts();
    let refused: u64 = counts
        .iter()
        .filter(|(f, _)| *f == Fallback::RequestInFlight)
        .map(|(_, n)| n)
        .sum();
    let why: Vec<String> = counts
        .iter()
        .filter(|(f, n)| *n > 0 && *f != Fallback::RequestInFlight)
        .map(|(f, n)| format!("{n} {}", f.label()))
        .collect();
    let outcome = match acked {
        Ok(true) => "the new process serves them",
        _ => "the new process did not acknowledge them",
    };
    // Before this socket closes: the new process says READY=1 once it has, and a service
    // manager that hears only the main process (`NotifyAccess=main`) must know it by then.
    crate::service_manager::hand_to(
        peer_pid,
        &format!("upgrade: {moved} connections handed to process {peer_pid}"),
    );
    log::info(format_args!(
        "hand-over: {moved} connections moved in {} ms (frozen for {} ms), {outcome}; {} \
         stay and are told to reconnect{}{}",
        began.elapsed().as_millis(),
        froze_at.elapsed().as_millis(),
        fallback - refused,
        if why.is_empty() {
            String::new()
        } else {
            format!(" ({})", why.join(", "))
        },
        if refused == 0 {
            String::new()
        } else {
            format!(
                "; {refused} HTTP/2 requests in flight refused (REFUSED_STREAM) for their clients \
                 to send again on the moved connection"
            )
        }
    ));
    Outcome::Done
}

/// The history frame for what the broker froze: without `history_dir`, every held message as
/// a durable-history record (the same encoding, so one decoder reads both), and the
/// appendable messages: the open ones, which held entries are streams' folded texts, and the
/// streams closed lately.
fn history_frame_bytes(f: &crate::broker::local::Frozen) -> Vec<u8> {
    let now_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut records = Vec::new();
    for m in &f.held {
        let a = m.attachment.as_ref().and_then(|a| a.encode());
        let tags = m.wire_tags();
        let age = u64::from(f.clock_now.saturating_sub(m.at));
        history_log::encode_message(
            &history_log::Message {
                id: m.id,
                unix_secs: now_unix.saturating_sub(age),
                epoch: &m.epoch,
                topic: &m.topic,
                body: body_wire::Body {
                    kind: m.kind,
                    event: m.event.as_deref(),
                    attachment: a.as_deref(),
                    tags: tags.as_deref(),
                    conflation_key: m.conflation_key.as_deref(),
                    payload: m.payload(),
                },
            },
            &mut records,
        );
    }
    let streams = wire::StreamTable {
        open: f
            .streams
            .open
            .iter()
            .map(|s| wire::OpenStream {
                id: s.id,
                topic: &s.topic,
                held: s.held,
                seq: s.seq,
                left: s.left,
                text: &s.text,
            })
            .collect(),
        folded: f.held.iter().filter(|m| m.stream).map(|m| m.id).collect(),
        closed: f.streams.closed.clone(),
    };
    let frame = Frame::History(wire::History {
        epoch: &f.epoch,
        next_id: f.next_id,
        on_disk: f.on_disk,
        forgotten_floor: f.forgotten_floor,
        floors: f.floors.iter().map(|(n, v)| (&**n, *v)).collect(),
        records: &records,
        // None when there is nothing to carry, so an older binary still reads the frame.
        streams: (!streams.is_empty()).then_some(streams),
    });
    let mut buf = Vec::new();
    wire::encode(&frame, &mut buf);
    buf
}

/// The record's transport for `state` (`None`: not carried); a held poll's deadline and
/// cursor from `poll`.
fn wire_state(state: State, poll: Option<&(u32, String)>) -> Option<ConnState<'_>> {
    let (kind, option, deflate, pinged) = state_to_wire(state)?;
    Some(match kind {
        0 => ConnState::Http,
        1 => ConnState::Ws {
            role: option,
            deflate,
            pinged,
        },
        2 => ConnState::Sse(option),
        3 => ConnState::Stream(option),
        5 => ConnState::H2,
        _ => {
            let (left, cursor) = poll.map_or((0, ""), |(l, c)| (*l, c.as_str()));
            ConnState::Poll {
                keep: option == 1,
                left,
                cursor,
            }
        }
    })
}

/// An HTTP/2 connection's part of its record.
fn h2_record(part: &H2Part, worker: u16, peer: u32) -> wire::H2Record<'_> {
    let streams = part
        .streams
        .iter()
        .filter_map(|s| {
            let record = ConnRecord {
                worker,
                state: wire_state(s.state, s.poll.as_ref())?,
                idle: s.idle,
                peer,
                input: &s.input,
                output: &s.output,
                topics: s.topics.iter().map(|t| &**t).collect(),
                mode: s.mode.as_ref().map(CarriedMode::wire),
                tls: None,
                deflate: wire::DeflateWindows {
                    deflater: s.deflate.deflater.as_deref(),
                    inflater: s.deflate.inflater.as_deref(),
                },
                h2: None,
                grip: s.grip.as_ref().map(CarriedGrip::wire),
            };
            Some((s.id, record))
        })
        .collect();
    wire::H2Record {
        connection: &part.connection,
        streams,
    }
}

/// Bytes of the variable fields of a record (the fixed ones are within `fixed`).
fn record_size(
    fixed: usize,
    input: &[u8],
    output: &[u8],
    poll: Option<&(u32, String)>,
    topics: &[Arc<str>],
) -> usize {
    fixed
        + input.len()
        + output.len()
        + poll.map_or(0, |(_, c)| c.len())
        + topics.iter().map(|t| 2 + t.len()).sum::<usize>()
}

/// Bytes of a record's mode-state section, with its flag and length.
fn mode_len(m: &CarriedMode) -> usize {
    let mut v = Vec::new();
    clarion_proto::handover_state::encode(&m.wire(), &mut v);
    5 + v.len()
}

fn send_batch(sock: &UnixStream, batch: &[Moving]) -> std::io::Result<()> {
    let mut records = Vec::with_capacity(batch.len());
    // An upper bound on the frame's size (fixed fields, each length prefix, the parked TLS
    // state), so that the buffer holding secrets is allocated once. A mode-state section is
    // bounded by its own estimate.
    let mut size = wire::HEAD + 2;
    for m in batch {
        size += record_size(64, &m.input, &m.output, m.poll.as_ref(), &m.topics);
        size += m.tls.as_ref().map_or(0, |t| {
            16 + clarion_proto::tls13::parked::MAX_LEN + t.partial.len() + t.unsent.len()
        });
        size += [&m.deflate.deflater, &m.deflate.inflater]
            .into_iter()
            .flatten()
            .map(|w| 2 + w.len())
            .sum::<usize>();
        size += m.mode.as_ref().map_or(0, mode_len);
        size += m.grip.as_ref().map_or(1, CarriedGrip::size);
        if let Some(h) = &m.h2 {
            size += 8 + h.connection.len();
            for s in &h.streams {
                size += record_size(72, &s.input, &s.output, s.poll.as_ref(), &s.topics);
                size += s.mode.as_ref().map_or(0, mode_len);
                size += s.grip.as_ref().map_or(1, CarriedGrip::size);
                size += [&s.deflate.deflater, &s.deflate.inflater]
                    .into_iter()
                    .flatten()
                    .map(|w| 2 + w.len())
                    .sum::<usize>();
            }
        }
    }
    let mut raw = Vec::with_capacity(batch.len());
    for m in batch {
        let Some(state) = wire_state(m.state, m.poll.as_ref()) else {
            continue;
        };
        records.push(ConnRecord {
            worker: m.worker as u16,
            state,
            idle: m.idle,
            peer: m.peer,
            input: &m.input,
            output: &m.output,
            topics: m.topics.iter().map(|t| &**t).collect(),
            mode: m.mode.as_ref().map(CarriedMode::wire),
            tls: m.tls.as_ref().map(|t| wire::TlsRecord {
                session: t.session.clone(),
                partial: &t.partial,
                unsent: &t.unsent,
            }),
            deflate: wire::DeflateWindows {
                deflater: m.deflate.deflater.as_deref(),
                inflater: m.deflate.inflater.as_deref(),
            },
            h2: m.h2.as_ref().map(|h| h2_record(h, m.worker as u16, m.peer)),
            grip: m.grip.as_ref().map(CarriedGrip::wire),
        });
        raw.push(m.fd.as_raw_fd());
    }
    send_sized(sock, &Frame::Conns(records), &raw, size)
}
