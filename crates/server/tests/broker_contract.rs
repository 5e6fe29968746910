//! One broker contract, run against every broker: the in-memory one, Redis and NATS (the
//! promises are in `crate::broker`'s module doc). Each broker is opened through the seam the
//! server uses (`Broker::open` from a configuration), and the same cases run against each:
//! publish order across workers, a resume from an id, a gap notice when history was trimmed,
//! an `epoch` gap for an id of another history, and the rooms the seam offers.
//!
//! Redis and NATS are private `redis-server` / `nats-server` processes (Debian's packages) on
//! free loopback ports, killed at the end. Without one of them the broker's test prints a note
//! and passes, except under CI (`CI=true`), where a missing service fails: .ci/run installs
//! both. Every wait is bounded; the whole file takes about a second.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clarion::broker::rooms::RoomChange;
use clarion::broker::{Broker, Outgoing, Since};
use clarion::config::Config;
use clarion::hub::Inbox;
use clarion::message::{GapReason, Published};
use clarion::metrics::Metrics;
use clarion_proto::ws::DataKind;

/// Messages of history per topic in every broker of this suite: small, so trimming shows.
const HISTORY: usize = 4;
const WORKERS: usize = 2;
/// The longest any delivery may take (a clustered broker's goes through its server).
const WAIT: Duration = Duration::from_secs(5);

fn binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The service's binary; `None` (with a note) when it is missing outside CI.
fn require(name: &str) -> Option<PathBuf> {
    match binary(name) {
        Some(bin) => Some(bin),
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{name} is not installed (.ci/run installs it), and CI=true")
        }
        None => {
            eprintln!("note: {name} is not installed; skipping its broker contract");
            None
        }
    }
}

/// A private server process on a free loopback port, killed when dropped.
struct Server(Child);

impl Server {
    fn start(bin: &PathBuf, args: &[String], port: u16) -> Server {
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the server starts");
        let server = Server(child);
        let deadline = Instant::now() + WAIT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "{bin:?} did not listen in time");
            std::thread::sleep(Duration::from_millis(10));
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A broker opened as the server opens it, with its workers' inboxes.
struct Fixture {
    name: &'static str,
    broker: Broker,
    inboxes: Vec<Arc<Inbox>>,
    /// Whether the broker keeps the cluster's rooms (Redis).
    shared_rooms: bool,
    _polls: Vec<mio::Poll>,
    _server: Option<Server>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.broker.shutdown();
    }
}

fn open(name: &'static str, url: Option<String>, server: Option<Server>) -> Fixture {
    let config = Config {
        broker: url,
        history_size: HISTORY,
        node_name: Some(format!("contract-{name}")),
        ..Config::default()
    };
    let mut polls = Vec::new();
    let mut inboxes = Vec::new();
    for _ in 0..WORKERS {
        let poll = mio::Poll::new().expect("a poller");
        let waker = mio::Waker::new(poll.registry(), mio::Token(0)).expect("a waker");
        inboxes.push(Arc::new(Inbox::new(waker)));
        polls.push(poll);
    }
    let broker = Broker::open(&config, &inboxes, &Arc::new(Metrics::default()), None)
        .unwrap_or_else(|e| panic!("{name}: the broker opens: {e:#}"));
    let deadline = Instant::now() + WAIT;
    while !broker.healthy() {
        assert!(Instant::now() < deadline, "{name}: the broker is not up");
        std::thread::sleep(Duration::from_millis(10));
    }
    Fixture {
        name,
        broker,
        inboxes,
        shared_rooms: name == "redis",
        _polls: polls,
        _server: server,
    }
}

fn text(topic: &str, payload: &str) -> Outgoing<'static> {
    Outgoing {
        topic: Box::leak(topic.to_owned().into_boxed_str()),
        kind: DataKind::Text,
        payload: Box::leak(payload.as_bytes().to_vec().into_boxed_slice()),
        event: None,
        attachment: None,
        key: None,
        tags: &[],
        conflation_key: None,
    }
}

/// An id's `SEQ` (ids are `EPOCH-SEQ`).
fn seq(id: &str) -> u64 {
    id.rsplit_once('-')
        .and_then(|(_, s)| s.parse().ok())
        .unwrap_or_else(|| panic!("not an id: {id}"))
}

fn payloads(msgs: &[Arc<Published>]) -> Vec<String> {
    msgs.iter()
        .map(|m| String::from_utf8_lossy(m.payload()).into_owned())
        .collect()
}

/// Publishes `n` messages `p1..pn` to `topic`, one call each; their ids.
fn publish(f: &Fixture, topic: &str, n: usize) -> Vec<String> {
    (1..=n)
        .map(|i| {
            let receipts = f
                .broker
                .publish(&[text(topic, &format!("p{i}"))])
                .unwrap_or_else(|e| panic!("{}: publish: {e}", f.name));
            receipts[0].id.clone()
        })
        .collect()
}

/// What reaches worker `w`'s inbox, until `n` messages arrived (bounded by [`WAIT`]).
fn receive(f: &Fixture, w: usize, mut got: Vec<Arc<Published>>, n: usize) -> Vec<Arc<Published>> {
    let deadline = Instant::now() + WAIT;
    let mut spare = Vec::new();
    while got.len() < n && Instant::now() < deadline {
        f.inboxes[w].take(&mut spare);
        got.append(&mut spare);
        std::thread::sleep(Duration::from_millis(2));
    }
    got
}

/// Publish order: both workers' subscribers get every message once, in publish order, the
/// messages of one call consecutive, with the ids the receipts gave.
fn publish_order_is_the_same_on_every_worker(f: &Fixture) {
    let topic = "contract.order";
    let mut pending = [Vec::new(), Vec::new()];
    for (w, p) in pending.iter_mut().enumerate() {
        let sub = f
            .broker
            .subscribe(w, &[topic], Since::Now, p)
            .expect("subscribed");
        assert!(sub.replay.is_empty() && sub.gaps.is_empty(), "{}", f.name);
    }
    let mut receipts = f
        .broker
        .publish(&[text(topic, "a"), text(topic, "b")])
        .expect("published");
    receipts.extend(f.broker.publish(&[text(topic, "c")]).expect("published"));
    let ids: Vec<u64> = receipts.iter().map(|r| seq(&r.id)).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "{}: ids {ids:?}",
        f.name
    );
    for (w, p) in pending.into_iter().enumerate() {
        let got = receive(f, w, p, 3);
        assert_eq!(payloads(&got), ["a", "b", "c"], "{}: worker {w}", f.name);
        let got_ids: Vec<u64> = got.iter().map(|m| m.id).collect();
        assert_eq!(got_ids, ids, "{}: worker {w}", f.name);
        f.broker.unsubscribe(w, topic);
    }
}

/// A resume from an id replays exactly what came after it, with no gap notice.
fn a_resume_from_an_id_replays_what_came_after_it(f: &Fixture) {
    let topic = "contract.resume";
    let ids = publish(f, topic, 3);
    let mut pending = Vec::new();
    let sub = f
        .broker
        .subscribe(0, &[topic], Since::Id(&ids[0]), &mut pending)
        .expect("subscribed");
    assert_eq!(payloads(&sub.replay), ["p2", "p3"], "{}", f.name);
    assert!(sub.gaps.is_empty(), "{}: {:?}", f.name, sub.gaps);
    f.broker.unsubscribe(0, topic);
}

/// A resume from an id older than the history holds gets what is held and a `trimmed` gap.
fn a_resume_past_the_history_gets_a_trimmed_gap(f: &Fixture) {
    let topic = "contract.trimmed";
    let ids = publish(f, topic, HISTORY + 3);
    let read = f.broker.read_since(&[topic], Since::Id(&ids[0]));
    assert_eq!(
        payloads(&read.replay),
        ["p4", "p5", "p6", "p7"],
        "{}",
        f.name
    );
    let reasons: Vec<GapReason> = read.gaps.iter().map(|g| g.reason).collect();
    assert_eq!(reasons, [GapReason::Trimmed], "{}", f.name);
    // From the last id held: nothing missed.
    let read = f.broker.read_since(&[topic], Since::Id(&ids[HISTORY + 2]));
    assert!(read.replay.is_empty() && read.gaps.is_empty(), "{}", f.name);
}

/// An id of another history (another epoch) gets everything held and an `epoch` gap.
fn an_id_of_another_epoch_gets_an_epoch_gap(f: &Fixture) {
    let topic = "contract.epoch";
    publish(f, topic, 2);
    let read = f.broker.read_since(&[topic], Since::Id("nosuchepoch-1"));
    assert_eq!(payloads(&read.replay), ["p1", "p2"], "{}", f.name);
    let reasons: Vec<GapReason> = read.gaps.iter().map(|g| g.reason).collect();
    assert_eq!(reasons, [GapReason::Epoch], "{}", f.name);
}

/// The cluster's rooms where the broker keeps them: a member added is counted.
fn shared_rooms_count_what_was_applied(f: &Fixture) {
    let Some(rooms) = f.broker.shared_rooms() else {
        assert!(!f.shared_rooms, "{}: rooms expected", f.name);
        return;
    };
    assert!(f.shared_rooms, "{}: rooms not expected", f.name);
    let topic: Arc<str> = "contract.room".into();
    rooms
        .apply(&[
            RoomChange::Connections {
                topic: Arc::clone(&topic),
                delta: 1,
                listening: false,
            },
            RoomChange::Add {
                topic: Arc::clone(&topic),
                sub: "alice".into(),
                n: 1,
                info: None,
            },
        ])
        .expect("applied");
    assert_eq!(rooms.count(&topic).expect("counted"), (1, 1), "{}", f.name);
    rooms.reap(rooms.node_name()).expect("left");
    assert_eq!(rooms.count(&topic).expect("counted"), (0, 0), "{}", f.name);
}

fn run_contract(f: &Fixture) {
    publish_order_is_the_same_on_every_worker(f);
    a_resume_from_an_id_replays_what_came_after_it(f);
    a_resume_past_the_history_gets_a_trimmed_gap(f);
    an_id_of_another_epoch_gets_an_epoch_gap(f);
    shared_rooms_count_what_was_applied(f);
}

#[test]
fn the_in_memory_broker_keeps_the_contract() {
    run_contract(&open("local", None, None));
}

#[test]
fn the_redis_broker_keeps_the_contract() {
    let Some(bin) = require("redis-server") else {
        return;
    };
    let port = free_port();
    let args: Vec<String> = [
        "--bind",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let server = Server::start(&bin, &args, port);
    let url = format!("redis://127.0.0.1:{port}");
    run_contract(&open("redis", Some(url), Some(server)));
}

#[test]
fn the_nats_broker_keeps_the_contract() {
    let Some(bin) = require("nats-server") else {
        return;
    };
    let port = free_port();
    let args = vec![
        "-a".to_owned(),
        "127.0.0.1".to_owned(),
        "-p".to_owned(),
        port.to_string(),
    ];
    let server = Server::start(&bin, &args, port);
    let url = format!("nats://127.0.0.1:{port}");
    run_contract(&open("nats", Some(url), Some(server)));
}
