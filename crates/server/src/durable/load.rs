//! Startup with `history_dir`: read the directory, recover ([`super::recover`]), rebuild the
//! hub's history from it, and start a fresh log holding exactly that history.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use clarion_proto::history_log::{self, Message, Scan};
use clarion_proto::pubsub::append::{folded_json, StreamEvent};

use super::recover::{self, FoldedStream, Input, SegmentFile};
use super::{HistoryLog, Settings, Start};
use crate::config::HistoryLimits;
use crate::hub::Hub;
use crate::message::{Attachment, Published};
use crate::metrics::Metrics;

/// Turns an attachment's bytes back into one (GRIP's decoder).
pub type Decoder = fn(&[u8]) -> Option<Arc<dyn Attachment>>;

/// The hub and ids a process with durable history starts with.
pub struct Loaded {
    /// History as recovered, within the limits.
    pub hub: Hub,
    /// The epoch to issue ids in (the previous run's when it can continue).
    pub epoch: Arc<str>,
    /// The `SEQ` of the next id.
    pub next_id: u64,
    /// The log, holding exactly `hub`'s history.
    pub log: HistoryLog,
    /// The streams held open ([`Context::carried_open`] that history keeps), as the log folds
    /// them.
    pub open_streams: Vec<OpenFold>,
}

/// A stream a hand-over carries open, as the log folds it (held in history).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenFold {
    /// Its id's `SEQ`.
    pub stream: u64,
    /// The `SEQ` of its folded entry in history.
    pub held: u64,
    /// Fragments its text includes.
    pub seq: u32,
    /// Its text so far.
    pub text: String,
}

/// What the hub's clock and the host look like at start.
pub struct Context<'a> {
    /// Event-loop threads.
    pub workers: usize,
    /// The history limits.
    pub limits: &'a HistoryLimits,
    /// The broker's metrics.
    pub metrics: &'a Metrics,
    /// Decodes GRIP content back into an attachment.
    pub decode_attachment: Option<Decoder>,
    /// The hub clock's reading now (seconds).
    pub clock_now: u32,
    /// A fresh epoch, used when the previous one cannot continue.
    pub new_epoch: String,
    /// The streams a hand-over carries open ([`recover::Input::carried_open`]).
    pub carried_open: &'a [u64],
}

/// The hub-clock time of a message logged at `unix_secs`, the hub clock reading `clock_now` at
/// `now_unix`.
pub fn hub_time(clock_now: u32, now_unix: u64, unix_secs: u64) -> u32 {
    let age = now_unix.saturating_sub(unix_secs);
    clock_now.saturating_sub(u32::try_from(age).unwrap_or(u32::MAX))
}

/// Keeps logged message `m`, of `epoch`, published at hub time `at`, in `hub`'s history, its
/// attachment (if any) turned back into one by `decode`.
pub fn keep_logged(
    hub: &mut Hub,
    m: &Message<'_>,
    epoch: Arc<str>,
    at: u32,
    decode: Option<Decoder>,
    limits: &HistoryLimits,
    metrics: &Metrics,
) {
    let (name, _) = hub.topic_mut(m.topic, metrics);
    let mut p = Published::new(
        Arc::clone(&name),
        m.id,
        epoch,
        m.body.kind,
        m.body.event.map(Into::into),
        at,
        m.body.payload,
    );
    p.tags = crate::message::decode_tags(m.body.tags);
    p.conflation_key = m.body.conflation_key.map(Into::into);
    p.attachment = match (m.body.attachment, decode) {
        (Some(bytes), Some(decode)) => decode(bytes),
        _ => None,
    };
    hub.keep(&name, Arc::new(p), limits, metrics);
}

/// What keeping a recovered entry needs of the [`Context`].
struct Kept<'a> {
    clock_now: u32,
    limits: &'a HistoryLimits,
    metrics: &'a Metrics,
}

/// Keeps a recovered appendable message as the stream event history replays for it: its text
/// so far, closed (by the restart when it was open).
fn keep_folded(hub: &mut Hub, f: &FoldedStream<'_>, epoch: Arc<str>, cx: &Kept<'_>, now: u64) {
    let (name, _) = hub.topic_mut(f.topic, cx.metrics);
    let (id, stream) = (format!("{epoch}-{}", f.id), format!("{epoch}-{}", f.stream));
    let json = folded_json(&StreamEvent {
        topic: f.topic,
        id: &id,
        stream: &stream,
        seq: f.seq,
        data: &f.text,
        closed: f.closed,
    });
    let at = hub_time(cx.clock_now, now, f.unix_secs);
    let p = Published::stream_event(Arc::clone(&name), f.id, epoch, at, true, &json);
    hub.keep(&name, Arc::new(p), cx.limits, cx.metrics);
}

/// Opens `settings.dir` and rebuilds history from it. The error names the directory and what
/// failed (it stops the start).
pub fn open(settings: Settings, cx: Context<'_>) -> Result<Loaded, String> {
    let dir = settings.dir.display().to_string();
    let contents = super::read_dir(&settings.dir, settings.max_segment_bytes)
        .map_err(|e| format!("history_dir {dir}: {e}"))?;
    for s in contents.segments.iter().filter(|s| s.read < s.len) {
        crate::log::warn(format_args!(
            "history_dir {dir}: {} is {} bytes, more than a segment can be with these settings \
             ({} bytes: history_segment_bytes + 2 x history_memory + 2 x max_publish_size + \
             1 MiB); only its first {} bytes were read, the rest is not (move the file away, \
             or start with the settings it was written with to keep it all)",
            s.name, s.len, settings.max_segment_bytes, s.read
        ));
    }
    let boot = super::boot_id();
    let now_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let input = Input {
        segments: contents
            .segments
            .iter()
            .map(|s| SegmentFile {
                seq: s.seq,
                name: s.name.clone(),
                scan: Scan {
                    records: s
                        .records
                        .iter()
                        .filter_map(|(offset, at)| {
                            let (r, _) = history_log::decode(s.kept.get(*at..)?).ok()?;
                            Some((*offset, r))
                        })
                        .collect(),
                    damage: s.damage.clone(),
                    tail: s.tail,
                },
                empty: s.len == 0,
            })
            .collect(),
        clean: contents.clean.as_deref(),
        boot_id: boot.as_deref(),
        now_unix,
        limits: *cx.limits,
        carried_open: cx.carried_open,
    };
    let rec = recover::recover(&input);
    for r in &rec.reports {
        crate::log::warn(format_args!("history_dir {dir}: {r}"));
    }
    let continued = rec.epoch.is_some();
    let epoch: Arc<str> = rec.epoch.clone().unwrap_or(cx.new_epoch).into();
    let mut hub = Hub::new(cx.workers);
    let mut epochs: HashMap<&str, Arc<str>> = HashMap::new();
    epochs.insert(&epoch, Arc::clone(&epoch));
    let kept = Kept {
        clock_now: cx.clock_now,
        limits: cx.limits,
        metrics: cx.metrics,
    };
    let mut streams = rec.streams.iter().peekable();
    for m in &rec.messages {
        while let Some(f) = streams.next_if(|f| f.id < m.id) {
            let e = Arc::clone(epochs.entry(f.epoch).or_insert_with(|| f.epoch.into()));
            keep_folded(&mut hub, f, e, &kept, now_unix);
        }
        let at = hub_time(cx.clock_now, now_unix, m.unix_secs);
        let e = Arc::clone(epochs.entry(m.epoch).or_insert_with(|| m.epoch.into()));
        keep_logged(
            &mut hub,
            m,
            e,
            at,
            cx.decode_attachment,
            cx.limits,
            cx.metrics,
        );
    }
    for f in streams {
        let e = Arc::clone(epochs.entry(f.epoch).or_insert_with(|| f.epoch.into()));
        keep_folded(&mut hub, f, e, &kept, now_unix);
    }
    hub.raise_floors(rec.floor);
    for (t, f) in &rec.topic_floors {
        hub.raise_topic_floor(t, *f);
    }
    hub.enforce_limits(cx.limits, cx.clock_now, cx.metrics);
    let held = hub.held_in_order();
    let held_streams: HashSet<u64> = held.iter().filter(|m| m.stream).map(|m| m.id).collect();
    let open_streams = rec
        .streams
        .iter()
        .filter(|f| f.closed.is_none() && held_streams.contains(&f.id))
        .map(|f| OpenFold {
            stream: f.stream,
            held: f.id,
            seq: f.seq,
            text: f.text.clone(),
        })
        .collect();
    let log = HistoryLog::start(
        settings,
        Start {
            epoch: Arc::clone(&epoch),
            boot_id: boot.clone().unwrap_or_default(),
            damage_floor: rec.damage_floor,
            origin: now_unix as i64 - i64::from(cx.clock_now),
            old: contents.segments.iter().map(|s| s.seq).collect(),
            held: &held,
            lock: contents.lock,
        },
    )
    .map_err(|e| format!("history_dir {dir}: {e}"))?;
    crate::log::info(format_args!(
        "history_dir {dir}: {} messages recovered; {} epoch {epoch}, next id {}",
        held.len(),
        if continued { "continuing" } else { "new" },
        rec.next_id
    ));
    Ok(Loaded {
        hub,
        epoch,
        next_id: rec.next_id,
        log,
        open_streams,
    })
}
