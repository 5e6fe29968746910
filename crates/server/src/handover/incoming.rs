//! The new process's side of a hand-over (`--upgrade-from PID`): connect to the old process,
//! take its listeners, rebuild the broker where its ids stand, take the connections, and
//! acknowledge once every one is registered with a worker. See [`super`] for the sequence.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use clarion_proto::handover::{self as wire, ConnState, Frame};
use clarion_proto::history_log::{self, Record};

use super::fds::Reader;
use super::{hello, send, socket_path, PEER_TIMEOUT};
use crate::broker::local::streams::{Carried, CarriedStream};
use crate::broker::local::CLOCK_BASE;
use crate::broker::Broker;
use crate::config::Config;
use crate::durable::load::{hub_time, keep_logged};
use crate::hub::{Hub, Inbox};
use crate::log;
use crate::message::Published;
use crate::metrics::Metrics;
use crate::worker::grip::carried::CarriedGrip;
use crate::worker::handover::{
    state_from_wire, Arriving, DeflateWindows, H2Part, H2Stream, MovingTls,
};
use crate::worker::handover_state::CarriedMode;
use crate::worker::state::{PollMode, State};

/// A hand-over under way, once the old process has sent its listeners and its history.
pub struct Incoming {
    rd: Reader,
    /// Client listeners, one per worker.
    pub client: Vec<std::net::TcpListener>,
    /// TLS listeners, one per worker, or none.
    pub tls: Vec<std::net::TcpListener>,
    /// The API listener.
    pub api: Option<std::net::TcpListener>,
    /// The old process's node name, which this one keeps when no `node_name` is configured.
    pub node: String,
    history: Standing,
}

/// What the old process said about its broker.
enum Standing {
    /// The in-memory broker: where ids stand, and the history.
    History(HistoryIn),
    /// A clustered broker: the id each topic stands at (see [`wire::FrameType::Positions`]).
    Positions(HashMap<String, String>),
}

/// Where ids stand in the old process, and its history when it is not on disk.
struct HistoryIn {
    epoch: String,
    next_id: u64,
    on_disk: bool,
    forgotten_floor: u64,
    floors: Vec<(String, u64)>,
    records: Vec<u8>,
    /// The ids of the held entries that are streams' folded texts.
    folded: HashSet<u64>,
    /// The open streams (and those closed lately).
    streams: Carried,
}

/// Connects to the process `pid` and takes its listeners and history. `Ok(None)` when it
/// refused (it restarts with a drain; this process binds its own listeners).
pub fn connect(pid: u32, config: &Config) -> anyhow::Result<Option<Incoming>> {
    let path = socket_path(pid)
        .map_err(|e| anyhow::anyhow!("cannot find process {pid}'s hand-over socket: {e}"))?;
    let sock =
        match super::socket_dir::addressable(&path).and_then(|n| UnixStream::connect(n.path())) {
            Ok(s) => s,
            Err(e) => anyhow::bail!(
            "cannot reach process {pid} at {}: {e} (is it a Clarion server, started by the same \
             user with the same RUNTIME_DIRECTORY, XDG_RUNTIME_DIR and TMPDIR?)",
            path.display()
        ),
        };
    // Only the process named, run by this user, may hand us sockets.
    let (peer_pid, peer_uid) = super::fds::peer(&sock)?;
    if peer_pid != pid || peer_uid != super::fds::own_uid() {
        anyhow::bail!(
            "{} is held by process {peer_pid} (user {peer_uid}), not by process {pid} of this user",
            path.display()
        );
    }
    sock.set_read_timeout(Some(PEER_TIMEOUT))?;
    sock.set_write_timeout(Some(PEER_TIMEOUT))?;
    let workers = config.worker_count();
    send(&sock, &hello(workers, config.tls_address().is_some()), &[])?;
    let mut rd = Reader::new(sock);
    let answer = rd.next(|f, _| match f {
        Frame::Hello(h) => Ok(Ok((h.version, h.binary.to_owned()))),
        Frame::Refuse(why) => Ok(Err(why.to_owned())),
        other => Err(format!("expected hello, got {other:?}")),
    })?;
    let (version, binary) = match answer.map_err(anyhow::Error::msg)? {
        Ok(h) => h,
        Err(why) => {
            log::warn(format_args!(
                "hand-over refused by process {pid}: {why}; it restarts with a drain"
            ));
            return Ok(None);
        }
    };
    if version != wire::VERSION {
        anyhow::bail!("process {pid} answered with hand-over format {version}");
    }
    let (counts, fds) = rd
        .next(|f, fds| match f {
            Frame::Listeners(l) => Ok(((l.client, l.tls, l.api, l.node.to_owned()), fds)),
            other => Err(format!("expected listeners, got {other:?}")),
        })?
        .map_err(anyhow::Error::msg)?;
    let mut fds = fds.into_iter();
    let mut take = |n: usize| -> Vec<std::net::TcpListener> {
        fds.by_ref()
            .take(n)
            .map(std::net::TcpListener::from)
            .collect()
    };
    let (n_client, n_tls, n_api, node) = counts;
    let client = take(usize::from(n_client));
    let tls = take(usize::from(n_tls));
    let api = take(usize::from(n_api)).pop();
    let history = rd
        .next(|f, _| match f {
            Frame::Positions(list) => Ok(Standing::Positions(
                list.into_iter()
                    .map(|(t, id)| (t.to_owned(), id.to_owned()))
                    .collect(),
            )),
            Frame::History(h) => Ok(Standing::History(HistoryIn {
                epoch: h.epoch.to_owned(),
                next_id: h.next_id,
                on_disk: h.on_disk,
                forgotten_floor: h.forgotten_floor,
                floors: h
                    .floors
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), *v))
                    .collect(),
                records: h.records.to_vec(),
                folded: h
                    .streams
                    .iter()
                    .flat_map(|t| t.folded.iter().copied())
                    .collect(),
                streams: h.streams.as_ref().map(carried).unwrap_or_default(),
            })),
            other => Err(format!("expected history, got {other:?}")),
        })?
        .map_err(anyhow::Error::msg)?;
    let listeners = client.len() + tls.len() + usize::from(api.is_some());
    match &history {
        Standing::History(h) => log::info(format_args!(
            "hand-over from process {pid} (binary {binary}): {listeners} listeners; ids continue \
             at {}-{}",
            h.epoch, h.next_id
        )),
        Standing::Positions(p) => log::info(format_args!(
            "hand-over from process {pid} (binary {binary}): {listeners} listeners; {} topics \
             resume from the broker",
            p.len()
        )),
    }
    Ok(Some(Incoming {
        rd,
        client,
        tls,
        api,
        node,
        history,
    }))
}

impl Incoming {
    /// The in-memory broker continuing the old one's history and open streams: the history
    /// it sent (without `history_dir`) or the one its closed log holds (with it, read as at
    /// any start). `None` for a clustered broker, made as at any start.
    pub fn broker(
        &self,
        inboxes: &[Arc<Inbox>],
        metrics: &Arc<Metrics>,
        config: &Config,
    ) -> anyhow::Result<Option<Broker>> {
        let Standing::History(h) = &self.history else {
            return Ok(None);
        };
        if h.on_disk {
            let Some(settings) = config.durable_history() else {
                // This process keeps history in memory: it starts without the old one's.
                return Ok(None);
            };
            return Broker::thawed_logged(
                inboxes,
                metrics,
                config,
                settings,
                Some(crate::pusher::decode_attachment),
                &h.epoch,
                h.streams.clone(),
            )
            .map(Some);
        }
        let limits = config.history_limits();
        let mut hub = Hub::new(inboxes.len());
        let now_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let epoch: Arc<str> = h.epoch.as_str().into();
        let mut epochs: HashMap<String, Arc<str>> = HashMap::new();
        epochs.insert(h.epoch.clone(), Arc::clone(&epoch));
        let scan = history_log::scan(&h.records);
        if !scan.damage.is_empty() || scan.tail.is_some() {
            log::warn(format_args!(
                "hand-over: damaged history records were left out"
            ));
        }
        for (_, r) in &scan.records {
            let Record::Message(m) = r else { continue };
            let at = hub_time(CLOCK_BASE, now_unix, m.unix_secs);
            let e = Arc::clone(
                epochs
                    .entry(m.epoch.to_owned())
                    .or_insert_with(|| m.epoch.into()),
            );
            let folded = h.folded.contains(&m.id).then_some(m.body.payload);
            if let Some(Ok(json)) = folded.map(std::str::from_utf8) {
                // A stream's text so far: kept as the stream event it was, not as a message
                // whose payload happens to be that event's JSON.
                let (name, _) = hub.topic_mut(m.topic, metrics);
                let p = Published::stream_event(Arc::clone(&name), m.id, e, at, true, json);
                hub.keep(&name, Arc::new(p), &limits, metrics);
                continue;
            }
            keep_logged(
                &mut hub,
                m,
                e,
                at,
                Some(crate::pusher::decode_attachment),
                &limits,
                metrics,
            );
        }
        hub.restore_forgotten_floor(h.forgotten_floor);
        for (t, f) in &h.floors {
            hub.restore_topic_floor(t, *f, metrics);
        }
        Ok(Some(Broker::thawed(
            inboxes.to_vec(),
            Arc::clone(metrics),
            config,
            epoch,
            h.next_id,
            hub,
            h.streams.clone(),
        )))
    }

    /// Checks that `broker` continues the old process's ids exactly, then asks for the
    /// connections and returns them, spread over `workers` workers. On a mismatch the old
    /// process is told, keeps its connections and restarts with a drain.
    pub fn take_connections(
        &mut self,
        broker: &Broker,
        workers: usize,
    ) -> anyhow::Result<Vec<Vec<Arriving>>> {
        let positions = match &self.history {
            // Every connection is subscribed again at once: not without the broker (the old
            // process then restarts with a drain; its clients resume when it is back).
            Standing::Positions(_) if !broker.healthy() => {
                let why = "this process cannot reach the broker".to_owned();
                let _ = send(self.rd.socket(), &Frame::Refuse(&why), &[]);
                anyhow::bail!("hand-over: {why}");
            }
            Standing::Positions(p) if broker.resumes_from_positions() => Some(p),
            Standing::Positions(_) => {
                let why = "the old process has a Redis broker, this one another".to_owned();
                let _ = send(self.rd.socket(), &Frame::Refuse(&why), &[]);
                anyhow::bail!("hand-over: {why}");
            }
            Standing::History(_) => None,
        };
        let continues = match (broker, &self.history) {
            (_, Standing::Positions(_)) => true,
            (_, Standing::History(h)) => {
                broker.epoch() == h.epoch && broker.next_id() == Some(h.next_id)
            }
        };
        if let (false, Standing::History(h)) = (continues, &self.history) {
            let why = format!(
                "this process would continue at {}-{}, not at {}-{}",
                broker.epoch(),
                broker.next_id().unwrap_or(0),
                h.epoch,
                h.next_id
            );
            let _ = send(self.rd.socket(), &Frame::Refuse(&why), &[]);
            anyhow::bail!("hand-over: {why}");
        }
        send(self.rd.socket(), &Frame::Ready, &[])?;
        let mut out: Vec<Vec<Arriving>> = (0..workers.max(1)).map(|_| Vec::new()).collect();
        loop {
            let batch = self.rd.next(|f, fds| match f {
                Frame::Conns(list) => Ok(Some(arriving(list, fds, positions))),
                Frame::End(e) => {
                    log::info(format_args!(
                        "hand-over: {} connections coming, {} stay behind and reconnect",
                        e.moved, e.fallback
                    ));
                    Ok(None)
                }
                other => Err(format!("expected connections, got {other:?}")),
            })?;
            match batch.map_err(anyhow::Error::msg)? {
                Some(list) => {
                    for (w, a) in list {
                        if let Some(slot) = out.get_mut(w % workers.max(1)) {
                            slot.push(a);
                        }
                    }
                }
                None => return Ok(out),
            }
        }
    }

    /// Tells the old process that every connection is served here: it may go.
    pub fn ack(&self) -> std::io::Result<()> {
        send(self.rd.socket(), &Frame::Ack, &[])
    }

    /// Waits (up to `timeout`) until the old process closes the hand-over socket, which it
    /// does after reading the acknowledgement and naming this process to the service manager.
    pub fn wait_released(&self, timeout: std::time::Duration) {
        use std::io::Read as _;
        let mut sock = self.rd.socket();
        let _ = sock.set_read_timeout(Some(timeout));
        let mut buf = [0u8; 64];
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            match sock.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }
}

/// The state a record's transport (and GRIP part) stands for, with a held poll's deadline and
/// cursor (a GRIP long-poll's hold is in its part instead).
fn arriving_state(
    state: &ConnState<'_>,
    grip: Option<&CarriedGrip>,
) -> Option<(State, Option<(u32, String)>)> {
    let (kind, option, deflate, pinged, poll) = match *state {
        ConnState::Http => (0, 0, None, false, None),
        ConnState::Ws {
            role,
            deflate,
            pinged,
        } => (1, role, deflate, pinged, None),
        ConnState::Sse(m) => (2, m, None, false, None),
        ConnState::Stream(m) => (3, m, None, false, None),
        ConnState::Poll { keep, left, cursor } => (
            4,
            u8::from(keep),
            None,
            false,
            Some((left, cursor.to_owned())),
        ),
        ConnState::H2 => (5, 0, None, false, None),
    };
    let state = CarriedGrip::arriving_state(state_from_wire(kind, option, deflate, pinged)?, grip);
    let poll = poll.filter(|_| !matches!(state, State::Poll(PollMode { grip: true, .. })));
    Some((state, poll))
}

/// An HTTP/2 connection's part as the workers take it. A stream in a state this version
/// cannot rebuild is left out (the restored connection resets it).
fn arriving_h2(h: &wire::H2Record<'_>, positions: Option<&HashMap<String, String>>) -> H2Part {
    let streams = h
        .streams
        .iter()
        .filter_map(|(id, r)| {
            let grip = r.grip.as_ref().map(CarriedGrip::from_wire);
            let Some((state, poll)) = arriving_state(&r.state, grip.as_ref()) else {
                log::warn(format_args!(
                    "hand-over: an HTTP/2 stream in an unknown state was reset"
                ));
                return None;
            };
            Some(H2Stream {
                id: *id,
                state,
                poll,
                idle: r.idle,
                input: r.input.to_vec(),
                output: r.output.to_vec(),
                topics: r.topics.iter().map(|t| Arc::from(*t)).collect(),
                resume: positions.map(|p| resume_from(p, &r.topics)),
                mode: r.mode.as_ref().map(CarriedMode::from_wire),
                deflate: DeflateWindows {
                    deflater: r.deflate.deflater.map(<[u8]>::to_vec),
                    inflater: r.deflate.inflater.map(<[u8]>::to_vec),
                },
                grip,
            })
        })
        .collect();
    H2Part {
        connection: h.connection.to_vec(),
        streams,
    }
}

/// The records of one batch with their sockets. A record this version cannot rebuild closes
/// its socket (the client reconnects and resumes).
fn arriving(
    list: Vec<wire::ConnRecord<'_>>,
    fds: Vec<OwnedFd>,
    positions: Option<&HashMap<String, String>>,
) -> Vec<(usize, Arriving)> {
    let mut out = Vec::with_capacity(list.len());
    for (r, fd) in list.into_iter().zip(fds) {
        let grip = r.grip.as_ref().map(CarriedGrip::from_wire);
        let Some((state, poll)) = arriving_state(&r.state, grip.as_ref()) else {
            log::warn(format_args!(
                "hand-over: a connection in an unknown state was closed"
            ));
            continue;
        };
        out.push((
            usize::from(r.worker),
            Arriving {
                state,
                poll,
                idle: r.idle,
                peer: r.peer,
                input: r.input.to_vec(),
                output: r.output.to_vec(),
                topics: r.topics.iter().map(|t| (*t).to_owned()).collect(),
                resume: positions.map(|p| resume_from(p, &r.topics)),
                mode: r.mode.as_ref().map(CarriedMode::from_wire),
                h2: r.h2.as_ref().map(|h| arriving_h2(h, positions)),
                tls: r.tls.map(|t| MovingTls {
                    session: t.session,
                    partial: t.partial.to_vec(),
                    unsent: t.unsent.to_vec(),
                }),
                deflate: DeflateWindows {
                    deflater: r.deflate.deflater.map(<[u8]>::to_vec),
                    inflater: r.deflate.inflater.map(<[u8]>::to_vec),
                },
                grip,
                fd,
            },
        ));
    }
    out
}

/// The ids a connection of `topics` resumes from, one `topic:EPOCH-SEQ` per topic (the form a
/// client resuming several topics sends); a topic the old process did not report (it could
/// not have delivered anything on it) resumes from the start of its epoch.
fn resume_from(positions: &HashMap<String, String>, topics: &[&str]) -> String {
    let ids: Vec<String> = topics
        .iter()
        .map(|t| format!("{t}:{}", positions.get(*t).map_or("0-0", String::as_str)))
        .collect();
    ids.join(",")
}

/// The streams a history frame's table carries, as the broker takes them over.
fn carried(t: &wire::StreamTable<'_>) -> Carried {
    Carried {
        open: t
            .open
            .iter()
            .map(|s| CarriedStream {
                id: s.id,
                topic: s.topic.into(),
                held: s.held,
                seq: s.seq,
                text: s.text.to_owned(),
                left: s.left,
            })
            .collect(),
        closed: t.closed.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_topic_resumes_from_its_own_id() {
        let p: HashMap<String, String> = [("a", "k3-7"), ("b:c", "q9-0")]
            .into_iter()
            .map(|(t, id)| (t.to_owned(), id.to_owned()))
            .collect();
        assert_eq!(resume_from(&p, &["a"]), "a:k3-7");
        assert_eq!(
            resume_from(&p, &["b:c", "a", "new"]),
            "b:c:q9-0,a:k3-7,new:0-0"
        );
        assert_eq!(resume_from(&p, &[]), "");
    }
}
