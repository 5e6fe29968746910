//! The reader thread: owns the subscriber connection, turns live messages into deliveries in
//! order, fills holes from the streams, and reconnects with backoff.
//!
//! Each read is handled in three steps: parse every push it holds; apply them under the state
//! lock at once (deliveries go to the inboxes under it, see [`super`]); then, without the lock,
//! ask Redis for what the step found missing (positions of newly confirmed topics, holes) and
//! apply the answers under the lock again. The ordering, hole, epoch and gap rules are each
//! topic's follower's ([`super::follow`], sans-IO); this thread only carries its actions out.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clarion_proto::pubsub::wire;
use clarion_proto::resp::Value;

use super::cluster::{partition_slot, redirect, Redirect};
use super::conn::LinkError;
use super::follow::{Action, Read};
use super::layout::partition;
use super::{keys, topic_of, Core, Follow, State, Topic};
use crate::hub::lock;
use crate::message::Published;

/// How long the subscriber connection may be silent before we ask with a `PING`.
const PING_EVERY: Duration = Duration::from_secs(1);

/// How often the reader lets go of topics left empty (see [`super::leave`]).
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// Backoff between reconnection attempts: doubled per failure, with jitter, up to the cap.
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(5);

/// Something to ask Redis after a read, outside the lock.
enum Todo {
    /// Learn where a newly (re)subscribed topic stands.
    Position(Arc<str>),
    /// Ask the cluster where the slots are now (a slot moved away from this master); first
    /// the node a `MOVED` named, if one did.
    Refresh(Option<String>),
    /// Read offsets `from..=to` of the topic's current epoch.
    Fill {
        topic: Arc<str>,
        epoch: Arc<str>,
        from: u64,
        to: u64,
    },
}

/// The thread's body for one shard: sessions until asked to stop.
pub(super) fn run(core: &Core, shard: usize) {
    let Some(this) = core.shards.get(shard) else {
        return;
    };
    let mut backoff = BACKOFF_START;
    let mut sessions = 0u64;
    while !core.stop.load(Relaxed) {
        if !this.endpoint.assigned() {
            // A free place of a Redis Cluster's shard table: nothing to follow until the
            // topology gives it a master (a refresh signals `changed`). Waiting on it rather
            // than polling: most places stay free, and a poll each would cost CPU per second.
            let st = lock(&core.state);
            if !this.endpoint.assigned() && !core.stop.load(Relaxed) {
                let _ = core.changed.wait_timeout(st, BACKOFF_CAP);
            }
            continue;
        }
        let began = Instant::now();
        let result = session(core, shard, sessions);
        sessions += 1;
        disconnected(core, shard);
        if core.stop.load(Relaxed) {
            return;
        }
        if let Err(e) = result {
            crate::log::warn(format_args!(
                "broker {}: {e}; reconnecting",
                this.endpoint.label()
            ));
            // In a Redis Cluster the master may be gone for good (a failover).
            core.want_refresh();
        }
        if began.elapsed() > BACKOFF_CAP {
            backoff = BACKOFF_START;
        }
        let jitter = Duration::from_millis(u64::from(core.nonce.load(Relaxed) as u32 % 100));
        let until = Instant::now() + backoff + jitter;
        // Sentinel naming a new master ends the wait: it is where the topics are now.
        let master = this.endpoint.generation();
        while Instant::now() < until
            && !core.stop.load(Relaxed)
            && this.endpoint.generation() == master
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        backoff = (backoff * 2).min(BACKOFF_CAP);
    }
}

/// Marks the connection down: callers waiting to follow a topic are answered, and every topic
/// must be confirmed and positioned again.
fn disconnected(core: &Core, shard: usize) {
    let mut st = lock(&core.state);
    if let Some(c) = st.connected.get_mut(shard) {
        *c = false;
    }
    if let Some(s) = core.shards.get(shard) {
        *lock(&s.writer) = None;
    }
    for (name, t) in st.topics.iter_mut() {
        if core.shard_of(name) == shard {
            t.follow = Follow::Idle;
            t.unconfirmed = 0;
            // Fills asked for went with the session.
            t.seq.reset();
        }
    }
    st.topics
        .retain(|name, t| core.shard_of(name) != shard || !t.unused());
    core.metrics.broker_connected.store(0, Relaxed);
    core.changed.notify_all();
}

/// One connection's life: subscribe to every wanted topic, then read until it fails.
fn session(core: &Core, shard: usize, sessions: u64) -> Result<(), LinkError> {
    let Some(this) = core.shards.get(shard) else {
        return Ok(());
    };
    let (mut conn, master) = this
        .endpoint
        .open(core.tls.as_deref(), core.timeout, &core.name)?;
    this.session.store(master, Relaxed);
    conn.set_read_timeout(PING_EVERY)?;
    {
        let mut st = lock(&core.state);
        *lock(&this.writer) = Some(conn.writer()?);
        let mut cmds = Vec::new();
        for (name, t) in &mut st.topics {
            if core.shard_of(name) != shard {
                continue;
            }
            t.follow = Follow::Subscribing;
            t.unconfirmed = 1;
            cmds.push(vec![
                b"SSUBSCRIBE".to_vec(),
                keys(name)[2].clone().into_bytes(),
            ]);
        }
        if !cmds.is_empty() {
            core.send_sub(shard, &cmds)?;
        }
        if let Some(c) = st.connected.get_mut(shard) {
            *c = true;
        }
        core.metrics
            .broker_connected
            .store(u64::from(core.all_up(&st)), Relaxed);
        if sessions > 0 {
            this.pool.renew();
            core.metrics.broker_reconnects.fetch_add(1, Relaxed);
            crate::log::info(format_args!(
                "broker {}: reconnected, following its topics again",
                this.endpoint.label()
            ));
        }
        core.changed.notify_all();
    }
    let mut ping_sent: Option<Instant> = None;
    let mut todo = Vec::new();
    let mut scratch = Scratch::default();
    let mut swept = Instant::now();
    loop {
        if core.stop.load(Relaxed) {
            return Ok(());
        }
        // Topics left empty long enough are let go of here, between reads, gathered over
        // [`SWEEP_EVERY`] so that a mass disconnect makes few commands ([`super::leave`]).
        if swept.elapsed() >= SWEEP_EVERY {
            swept = Instant::now();
            core.sweep_leaving(&mut lock(&core.state), swept);
        }
        match conn.fill() {
            Ok(()) => ping_sent = None,
            Err(_) if this.endpoint.generation() != master => {
                // Closed by the Sentinel watcher: the master moved.
                return Err(LinkError::Moved(this.endpoint.label()));
            }
            Err(LinkError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if this.endpoint.generation() != master {
                    return Err(LinkError::Moved(this.endpoint.label()));
                }
                match ping_sent {
                    Some(at) if at.elapsed() >= core.timeout => {
                        core.metrics.broker_errors.fetch_add(1, Relaxed);
                        return Err(LinkError::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no answer to PING: the broker is stalled",
                        )));
                    }
                    Some(_) => {}
                    None => {
                        core.send_sub(shard, &[vec![b"PING".to_vec()]])?;
                        ping_sent = Some(Instant::now());
                    }
                }
                continue;
            }
            Err(e) => return Err(e),
        }
        let mut pushes = Vec::new();
        while let Some(v) = conn.parsed()? {
            pushes.push(v);
        }
        apply(core, shard, pushes, &mut todo, &mut scratch);
        while !todo.is_empty() {
            let batch = std::mem::take(&mut todo);
            for t in batch {
                resolve(core, t, &mut todo, &mut scratch)?;
            }
        }
    }
}

/// Applies one read's pushes under the lock. Pushes about a topic this shard no longer
/// serves (a Redis Cluster moved its slot) are ignored: its new master's are the ones that
/// count.
fn apply(
    core: &Core,
    shard: usize,
    pushes: Vec<Value>,
    todo: &mut Vec<Todo>,
    scratch: &mut Scratch,
) {
    let mut st = lock(&core.state);
    for v in pushes {
        let Value::Array(parts) = v else {
            if let Some(Redirect::Moved { slot, addr }) = redirect(&v) {
                // An SSUBSCRIBE sent to a master that no longer serves its slot: the error
                // answers it; the topic is subscribed again once the route is known.
                for (name, t) in st.topics.iter_mut() {
                    if partition_slot(partition(name)) == slot
                        && core.shard_of(name) == shard
                        && t.follow == Follow::Subscribing
                        && t.unconfirmed > 0
                    {
                        t.unconfirmed -= 1;
                    }
                }
                todo.push(Todo::Refresh(Some(addr)));
            } else if let Value::Error(e) = v {
                crate::log::warn(format_args!("broker: {e}"));
            }
            continue;
        };
        let kind = parts.first().and_then(Value::as_bytes).unwrap_or_default();
        let channel = parts.get(1).and_then(Value::as_bytes).unwrap_or_default();
        let Some(topic) = topic_of(channel) else {
            continue;
        };
        if core.shard_of(topic) != shard {
            continue;
        }
        match kind {
            b"smessage" => {
                let Some(data) = parts.get(2).and_then(Value::as_bytes) else {
                    continue;
                };
                if data.first() == Some(&b'!') {
                    // A presence event: in channel order, outside the message sequence.
                    if let Some((name, t)) = st.topics.get_key_value(topic) {
                        if t.follow == Follow::Live {
                            core.presence_event(name, t, data);
                        }
                    }
                    continue;
                }
                on_message(core, &mut st, topic, data, todo, scratch);
            }
            b"ssubscribe" => {
                let Some(name) = st.topics.get_key_value(topic).map(|(n, _)| Arc::clone(n)) else {
                    continue;
                };
                if let Some(t) = st.topics.get_mut(topic) {
                    t.unconfirmed = t.unconfirmed.saturating_sub(1);
                    if t.unconfirmed == 0 && t.follow == Follow::Subscribing {
                        t.follow = Follow::Live;
                        todo.push(Todo::Position(name));
                    }
                }
            }
            b"sunsubscribe" => {
                if let Some(t) = st.topics.get_mut(topic) {
                    if t.unconfirmed == 0 && t.follow != Follow::Idle {
                        // Not asked for: Redis dropped the subscription because the slot
                        // moved to another master (a resharding). Subscribe where it is now
                        // and fill the hole from the stream.
                        t.follow = Follow::Subscribing;
                        t.seq.reset();
                        if !todo.iter().any(|t| matches!(t, Todo::Refresh(None))) {
                            todo.push(Todo::Refresh(None));
                        }
                        continue;
                    }
                    t.unconfirmed = t.unconfirmed.saturating_sub(1);
                    if t.unconfirmed == 0 && t.follow == Follow::Idle && t.unused() {
                        st.topics.remove(topic);
                    }
                }
            }
            _ => {}
        }
    }
}

/// One live message of `topic`.
fn on_message(
    core: &Core,
    st: &mut State,
    topic: &str,
    data: &[u8],
    todo: &mut Vec<Todo>,
    scratch: &mut Scratch,
) {
    let Some((name, t)) = st.topics.get_key_value(topic) else {
        return;
    };
    if t.follow != Follow::Live {
        return;
    }
    let name = Arc::clone(name);
    let (epoch, offset, body) = match wire::split_live(data) {
        Ok(parts) => parts,
        Err(e) => {
            crate::log::warn(format_args!("broker: a message on {topic}: {e}"));
            return;
        }
    };
    let epoch: Arc<str> = match t.seq.position().0 {
        Some(e) if **e == *epoch => Arc::clone(e),
        _ => Arc::from(epoch),
    };
    let Some(m) = core.message(&name, &epoch, offset, body) else {
        return;
    };
    let Some(t) = st.topics.get_mut(topic) else {
        return;
    };
    t.traffic.published += 1;
    t.seq.live(Arc::new(m), &mut scratch.actions);
    carry_out(core, &name, t, scratch, todo);
}

/// Carries out what a topic's follower ([`super::follow`]) asked for, in order: deliveries go
/// to the workers in batches (under the state lock the caller holds), gap notices between
/// them, fills become [`Todo`]s for after the lock.
fn carry_out(
    core: &Core,
    name: &Arc<str>,
    t: &mut Topic,
    scratch: &mut Scratch,
    todo: &mut Vec<Todo>,
) {
    let Scratch { actions, batch } = scratch;
    for action in actions.drain(..) {
        match action {
            Action::Deliver(m) => batch.push(m),
            Action::Gap {
                since_epoch,
                since_last,
                reason,
                epoch,
                at,
            } => {
                flush(core, t, batch);
                let since = format!("{since_epoch}-{since_last}");
                core.notice(name, t, since, reason, epoch, at);
            }
            Action::Fill { epoch, from, to } => todo.push(Todo::Fill {
                topic: Arc::clone(name),
                epoch,
                from,
                to,
            }),
            Action::HoleFilled => {
                core.metrics.broker_holes_filled.fetch_add(1, Relaxed);
            }
            Action::Wake => {
                // A resume may be waiting for this node to reach its id (`Core::catch_up`).
                flush(core, t, batch);
                core.changed.notify_all();
            }
        }
    }
    flush(core, t, batch);
}

/// The follower's actions and a topic's deliveries, kept by the reader thread from one message
/// to the next so that a live message allocates neither.
#[derive(Default)]
struct Scratch {
    actions: Vec<Action<Arc<Published>>>,
    batch: Vec<Arc<Published>>,
}

fn flush(core: &Core, t: &mut Topic, out: &mut Vec<Arc<Published>>) {
    if !out.is_empty() {
        // Deltas against the previous message this node delivered on the topic, in the
        // order it delivers them (`crate::delta`).
        if let Some(topics) = core.delta.get() {
            // An appendable message's events are their own JSON, never deltas (as locally).
            for m in out.iter().filter(|m| !m.stream && topics.matches(&m.topic)) {
                m.chain(t.delta.get_or_insert_with(Default::default), t.total > 0);
                if m.delta().is_some() {
                    core.metrics.deltas_computed.fetch_add(1, Relaxed);
                }
            }
        }
        // History (Redis) keeps every message; live delivery of a debounced topic may wait.
        if let Some(d) = core.debounce.get() {
            out.retain(|m| m.stream || !d.hold(m));
        }
        core.fan_out(t, out);
        out.clear();
    }
}

/// Asks Redis what a [`Todo`] needs, then hands the answer to the topic's follower under the
/// lock.
fn resolve(
    core: &Core,
    job: Todo,
    todo: &mut Vec<Todo>,
    scratch: &mut Scratch,
) -> Result<(), LinkError> {
    match job {
        Todo::Refresh(first) => {
            if core.cluster.is_none() {
                let mut st = lock(&core.state);
                let same: Vec<usize> = (0..super::PARTITIONS)
                    .map(|p| core.shard_of_partition(p))
                    .collect();
                core.rehome(&mut st, &same);
            } else if let Err(e) = core.refresh_topology(first.as_deref()) {
                crate::log::warn(format_args!("broker cluster: {e}"));
                core.want_refresh();
            }
        }
        Todo::Position(topic) => {
            let remote = core.remote_position(&topic);
            let mut st = lock(&core.state);
            let Some(t) = st.topics.get_mut(&*topic) else {
                return Ok(());
            };
            if t.follow != Follow::Live || t.seq.ready() {
                return Ok(());
            }
            // Without its position a topic cannot be served: the session ends, and the next
            // one subscribes and positions every topic again.
            let (epoch, last) = remote?;
            t.seq.positioned(epoch, last, &mut scratch.actions);
            carry_out(core, &topic, t, scratch, todo);
        }
        Todo::Fill {
            topic,
            epoch,
            from,
            to,
        } => {
            let read = match core.read_range(&topic, &epoch, from, to) {
                // A range across an appendable message's moved entries (holes) reads short and
                // is announced as a gap, as a trimmed one: the live path itself never has them.
                Ok(super::resume::RangeRead { now, msgs, .. }) => Read::Range {
                    epoch: now.map(Arc::from),
                    msgs,
                },
                Err(e) => {
                    crate::log::warn(format_args!("broker: filling {topic}: {e}"));
                    Read::Failed
                }
            };
            let mut st = lock(&core.state);
            let Some(t) = st.topics.get_mut(&*topic) else {
                return Ok(());
            };
            t.seq.filled(&epoch, from, to, read, &mut scratch.actions);
            carry_out(core, &topic, t, scratch, todo);
        }
    }
    Ok(())
}
