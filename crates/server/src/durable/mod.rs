//! Durable history (`history_dir`): the file I/O that keeps the in-memory broker's history on
//! disk, so that a restart (graceful or `kill -9`) resumes clients exactly. The record format
//! is sans-IO in [`clarion_proto::history_log`]; what a directory's files mean after a crash is
//! decided sans-IO in [`recover`]. This module only reads, writes, syncs and deletes files; the
//! broker (`broker::local`) calls it under its lock, so the log's order is the publish order.
//!
//! # On disk
//!
//! `history_dir` holds `NNNNNNNNNNNNNNNNNNNN.seg` segment files, written in increasing numbers,
//! and `clean` after a graceful stop. A process never appends to a segment an earlier one
//! wrote: at start it recovers what the files hold, writes it into a fresh segment (fsync'd),
//! and deletes the older files. Each publish batch is encoded into one buffer and written with
//! one `write(2)` **before** the publish is acknowledged or delivered; an `fsync` follows every
//! `history_fsync_ms` (or every write, with `0`). When a segment reaches
//! `history_segment_bytes` the next one begins; segments whose messages have all left history
//! are deleted, and when the files hold more than twice what history holds (plus two segments)
//! the held messages are rewritten into the new segment and every older one is deleted. So disk
//! use follows the same limits as memory (`history_size`, `history_ttl`, `history_memory`).

pub mod files;
pub mod load;
pub mod recover;

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clarion_proto::history_log::{self, Header};
use clarion_proto::pubsub::wire;

pub use crate::config::HistoryDisk as Settings;
use crate::hub::lock;
use crate::message::Published;
use crate::metrics::HistoryWrite;

/// The files of a history directory, as read at start.
pub struct DirContents {
    /// Every segment, in increasing number.
    pub segments: Vec<SegmentRead>,
    /// The clean-stop file's bytes, if there is one.
    pub clean: Option<Vec<u8>>,
    /// The directory's lock, held by this process until its log is closed.
    pub lock: DirLock,
}

/// One segment as read at start: its intact records, without the bytes of its damage.
pub struct SegmentRead {
    /// Its number.
    pub seq: u64,
    /// Its file name.
    pub name: String,
    /// Its size in bytes.
    pub len: u64,
    /// The bytes read (the size, unless it is larger than a segment can be).
    pub read: u64,
    /// Its intact records, one after another.
    pub kept: Vec<u8>,
    /// Each intact record's offset in the file and in `kept`.
    pub records: Vec<(usize, usize)>,
    /// Damaged regions followed by an intact record.
    pub damage: Vec<history_log::Damage>,
    /// Bytes at the end that hold no intact record (those not read included).
    pub tail: Option<history_log::Damage>,
}

/// How much of a segment is read at once: its records are copied out as they are found, so
/// reading a file holds this plus the record being read, whatever the file's size.
const READ_PIECE: usize = 64 * 1024;

const CLEAN: &str = "clean";
const SUFFIX: &str = ".seg";
const LOCK: &str = "lock";
/// How long a start waits for another process to let go of the directory: a process handing
/// over closes its log before the new one reads it, so only an overlap by mistake waits.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// One process per directory: an exclusive `flock` on `history_dir/lock`, which holds the pid
/// of the process that has it (for the error another process gets). The kernel lets go when
/// the process dies, so a `kill -9` leaves nothing stale behind.
pub struct DirLock(#[allow(dead_code)] File);

impl DirLock {
    /// Takes the lock of `dir`, waiting up to `wait` for a holder to let go. The error names
    /// the process that holds it.
    pub fn take(dir: &Path, wait: Duration) -> io::Result<DirLock> {
        use std::io::{Read as _, Seek as _};
        let path = dir.join(LOCK);
        let mut file = files::open_or_create(&path)?;
        let deadline = std::time::Instant::now() + wait;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(fs::TryLockError::Error(e)) => return Err(e),
                Err(fs::TryLockError::WouldBlock) => {}
            }
            if std::time::Instant::now() >= deadline {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => "another process".to_owned(),
                    pid => format!("process {pid}"),
                };
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "in use by {holder} ({} is locked); give each process its own directory",
                        path.display()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes())?;
        Ok(DirLock(file))
    }
}

/// Creates `dir` if needed (mode 0700) or checks that it is private ([`files::private_dir`]),
/// checks that it can be written, takes its lock, and reads its files, each segment up to
/// `max_segment` bytes. An error here stops the start with the path in the message.
pub fn read_dir(dir: &Path, max_segment: u64) -> io::Result<DirContents> {
    if let Some(old) = files::private_dir(dir)? {
        crate::log::info(format_args!(
            "history_dir {}: mode {old:04o} tightened to 0700 (history is private to this user)",
            dir.display()
        ));
    }
    let probe = dir.join(".write-test");
    files::create_fresh(&probe)?.write_all(b"ok")?;
    fs::remove_file(&probe)?;
    let lock = DirLock::take(dir, LOCK_WAIT)?;
    let mut segments = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(seq) = name
            .strip_suffix(SUFFIX)
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        segments.push(read_segment(&entry.path(), seq, name, max_segment)?);
    }
    segments.sort_unstable_by_key(|s| s.seq);
    let clean = match read_all(&dir.join(CLEAN)) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    Ok(DirContents {
        segments,
        clean,
        lock,
    })
}

/// What a failed write of the log means: the counter's reason and the sentence a refused
/// publish is answered with. A full disk and the process's file size limit (`RLIMIT_FSIZE`,
/// whose `SIGXFSZ` the server ignores so that the write fails with `EFBIG` instead of killing
/// it) are the same for a publisher: nothing more can be written until an operator acts.
pub fn write_failure(e: &io::Error) -> (HistoryWrite, String) {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => (
            HistoryWrite::DiskFull,
            format!("history could not be written (the disk is full: {e})"),
        ),
        Some(libc::EFBIG) => (
            HistoryWrite::FileTooLarge,
            format!(
                "history could not be written (the process's file size limit, RLIMIT_FSIZE, \
                 was reached: {e})"
            ),
        ),
        _ => (
            HistoryWrite::Other,
            format!("history could not be written: {e}"),
        ),
    }
}

/// Reads a segment piece by piece ([`history_log::Scanner`]), keeping only its intact records,
/// and no more than `max` bytes of it.
fn read_segment(path: &Path, seq: u64, name: String, max: u64) -> io::Result<SegmentRead> {
    use std::io::Read as _;
    let file = files::open_existing(path, false)?;
    let len = file.metadata()?.len();
    let mut from = file.take(max);
    let mut out = SegmentRead {
        seq,
        name,
        len,
        read: 0,
        kept: Vec::new(),
        records: Vec::new(),
        damage: Vec::new(),
        tail: None,
    };
    let mut scanner = history_log::Scanner::default();
    let mut buf: Vec<u8> = Vec::with_capacity(READ_PIECE);
    loop {
        let held = buf.len();
        buf.resize(held + READ_PIECE, 0);
        let n = loop {
            match from.read(buf.get_mut(held..).unwrap_or_default()) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                other => break other?,
            }
        };
        buf.truncate(held + n);
        out.read += n as u64;
        let end = n == 0;
        let SegmentRead {
            kept,
            records,
            damage,
            ..
        } = &mut out;
        let used = scanner.feed(&buf, end, |found| match found {
            history_log::Found::Record { offset, bytes, .. } => {
                records.push((offset, kept.len()));
                kept.extend_from_slice(bytes);
            }
            history_log::Found::Damage(d) => damage.push(d),
        });
        buf.drain(..used);
        if end {
            break;
        }
        // The start of a record longer than what is held: room for all of it (bounded by
        // the record format's largest body and by what the file has).
        buf.reserve(READ_PIECE);
    }
    out.tail = scanner.finish();
    if out.read < len {
        let unread = usize::try_from(out.read).unwrap_or(usize::MAX);
        let whole = usize::try_from(len).unwrap_or(usize::MAX);
        out.tail = Some(match out.tail {
            Some(t) => history_log::Damage {
                len: whole - t.offset,
                // Not a write cut short: the file goes on past what was read.
                error: match t.error {
                    history_log::RecordError::Truncated => history_log::RecordError::Oversized,
                    other => other,
                },
                offset: t.offset,
            },
            None => history_log::Damage {
                offset: unread,
                len: whole - unread,
                error: history_log::RecordError::Oversized,
            },
        });
    }
    Ok(out)
}

/// The whole of a file of the directory, opened as [`files::open_existing`] does.
fn read_all(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut out = Vec::new();
    files::open_existing(path, false)?.read_to_end(&mut out)?;
    Ok(out)
}

/// This boot's id, or `None` where the kernel does not say.
pub fn boot_id() -> Option<String> {
    let id = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_owned())
}

/// A closed segment.
struct Closed {
    path: PathBuf,
    /// The largest id in it (ids only grow within and across segments).
    last_id: u64,
    bytes: u64,
}

/// What the fsync thread shares with the writer.
struct SyncShared {
    /// A handle on the segment being written.
    file: Mutex<Option<File>>,
    /// Written since the last sync.
    dirty: AtomicBool,
    stop: AtomicBool,
}

/// The log a running process appends to.
pub struct HistoryLog {
    settings: Settings,
    epoch: Arc<str>,
    boot_id: String,
    damage_floor: u64,
    /// Unix seconds = `origin + at` for a message's hub clock `at`.
    origin: i64,
    file: File,
    seq: u64,
    active_bytes: u64,
    active_last_id: u64,
    closed: VecDeque<Closed>,
    closed_bytes: u64,
    buf: Vec<u8>,
    sync: Arc<SyncShared>,
    syncer: Option<std::thread::JoinHandle<()>>,
    /// Released when the log is dropped (after [`HistoryLog::close`], or at exit).
    _lock: DirLock,
}

/// Where a fresh log starts.
pub struct Start<'a> {
    /// The epoch of this run.
    pub epoch: Arc<str>,
    /// This boot's id (empty when unknown).
    pub boot_id: String,
    /// The damage floor to carry in headers.
    pub damage_floor: u64,
    /// Unix seconds at hub clock 0.
    pub origin: i64,
    /// Segment numbers already in the directory, to delete once the snapshot is safe.
    pub old: Vec<u64>,
    /// What history holds now, in increasing id.
    pub held: &'a [Arc<Published>],
    /// The directory's lock (from [`read_dir`]).
    pub lock: DirLock,
}

impl HistoryLog {
    /// Writes `start.held` into a new segment, syncs it, and deletes the older files: from here
    /// the directory holds exactly what history holds.
    pub fn start(settings: Settings, start: Start<'_>) -> io::Result<HistoryLog> {
        let seq = start.old.iter().max().map_or(1, |m| m + 1);
        let path = segment_path(&settings.dir, seq);
        let file = files::create_new(&path)?;
        let sync = Arc::new(SyncShared {
            file: Mutex::new(Some(file.try_clone()?)),
            dirty: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let mut log = HistoryLog {
            epoch: start.epoch,
            boot_id: start.boot_id,
            damage_floor: start.damage_floor,
            origin: start.origin,
            file,
            seq,
            active_bytes: 0,
            active_last_id: 0,
            closed: VecDeque::new(),
            closed_bytes: 0,
            buf: Vec::new(),
            sync,
            syncer: None,
            settings,
            _lock: start.lock,
        };
        log.write_header()?;
        log.append(start.held)?;
        log.file.sync_data()?;
        sync_dir(&log.settings.dir)?;
        for old in start.old {
            remove(&segment_path(&log.settings.dir, old))?;
        }
        remove(&log.settings.dir.join(CLEAN))?;
        sync_dir(&log.settings.dir)?;
        if log.settings.fsync_ms > 0 {
            let shared = Arc::clone(&log.sync);
            let every = Duration::from_millis(log.settings.fsync_ms);
            log.syncer = Some(
                std::thread::Builder::new()
                    .name("history-fsync".into())
                    .spawn(move || sync_loop(&shared, every))?,
            );
        }
        Ok(log)
    }

    fn write_header(&mut self) -> io::Result<()> {
        self.buf.clear();
        history_log::encode_header(
            &Header {
                epoch: &self.epoch,
                boot_id: &self.boot_id,
                floor: self.damage_floor,
                synced: self.settings.fsync_ms == 0,
            },
            &mut self.buf,
        );
        self.file.write_all(&self.buf)?;
        self.active_bytes += self.buf.len() as u64;
        Ok(())
    }

    /// Writes `msgs` (in increasing id) with one `write(2)`; with `history_fsync_ms = 0`, syncs
    /// them too. On an error the segment is cut back to its last whole record.
    pub fn append(&mut self, msgs: &[Arc<Published>]) -> io::Result<()> {
        if msgs.is_empty() {
            return Ok(());
        }
        self.buf.clear();
        for m in msgs {
            let unix = (self.origin + i64::from(m.at)).max(0) as u64;
            if m.stream {
                // A stream's text so far (history holds no live fragment): written whole, so
                // this segment holds all of it whatever older segments are deleted.
                if let Some(w) = whole_text(m) {
                    history_log::encode_stream(
                        &history_log::StreamRecord {
                            id: m.id,
                            unix_secs: unix,
                            epoch: &m.epoch,
                            topic: &m.topic,
                            stream: w.stream,
                            seq: w.seq,
                            whole: true,
                            closed: w.closed,
                            data: &w.data,
                        },
                        &mut self.buf,
                    );
                    continue;
                }
            }
            let a = m.attachment.as_ref().and_then(|a| a.encode());
            let tags = m.wire_tags();
            history_log::encode_message(
                &history_log::Message {
                    id: m.id,
                    unix_secs: unix,
                    epoch: &m.epoch,
                    topic: &m.topic,
                    body: wire::Body {
                        kind: m.kind,
                        event: m.event.as_deref(),
                        attachment: a.as_deref(),
                        tags: tags.as_deref(),
                        conflation_key: m.conflation_key.as_deref(),
                        payload: m.payload(),
                    },
                },
                &mut self.buf,
            );
        }
        self.write_buf(msgs.last().map_or(0, |m| m.id))
    }

    /// Writes one fragment of an appendable message like [`HistoryLog::append`] writes a
    /// publish: before it is acknowledged or delivered.
    /// `at` is its hub time (the record's Unix time is set from it).
    pub fn append_fragment(
        &mut self,
        at: u32,
        mut r: history_log::StreamRecord<'_>,
    ) -> io::Result<()> {
        r.unix_secs = (self.origin + i64::from(at)).max(0) as u64;
        self.buf.clear();
        history_log::encode_stream(&r, &mut self.buf);
        self.write_buf(r.id)
    }

    /// Writes `buf` (records up to id `last`) with one `write(2)`, syncing with
    /// `history_fsync_ms = 0`. On an error the segment is cut back to its last whole record.
    fn write_buf(&mut self, last: u64) -> io::Result<()> {
        let written = self.file.write_all(&self.buf).and_then(|()| {
            if self.settings.fsync_ms == 0 {
                self.file.sync_data()
            } else {
                self.sync.dirty.store(true, Relaxed);
                Ok(())
            }
        });
        if let Err(e) = written {
            // Whatever part of the batch reached the file is not a whole record: cut it off
            // so later records follow intact ones.
            let _ = self.file.set_len(self.active_bytes);
            return Err(e);
        }
        self.active_bytes += self.buf.len() as u64;
        self.active_last_id = self.active_last_id.max(last);
        Ok(())
    }

    /// Bytes of every segment file.
    pub fn disk_bytes(&self) -> u64 {
        self.closed_bytes + self.active_bytes
    }

    /// Whether the segment being written is full.
    pub fn wants_rotation(&self) -> bool {
        self.active_bytes >= self.settings.segment_bytes
    }

    /// Begins a new segment; deletes closed segments whose messages are all below
    /// `oldest_held`; and when the files hold more than twice `held_bytes` plus two segments,
    /// writes `held()` (what history holds, in increasing id) into the new segment and deletes
    /// every older one.
    pub fn rotate(
        &mut self,
        oldest_held: u64,
        held_bytes: u64,
        held: impl FnOnce() -> Vec<Arc<Published>>,
    ) -> io::Result<()> {
        self.file.sync_data()?;
        let seq = self.seq + 1;
        let path = segment_path(&self.settings.dir, seq);
        let file = files::create_new(&path)?;
        *lock(&self.sync.file) = Some(file.try_clone()?);
        self.closed.push_back(Closed {
            path: segment_path(&self.settings.dir, self.seq),
            last_id: self.active_last_id,
            bytes: self.active_bytes,
        });
        self.closed_bytes += self.active_bytes;
        self.file = file;
        self.seq = seq;
        self.active_bytes = 0;
        self.write_header()?;
        while let Some(c) = self.closed.front().filter(|c| c.last_id < oldest_held) {
            remove(&c.path)?;
            self.closed_bytes -= c.bytes;
            self.closed.pop_front();
        }
        if self.disk_bytes() > 2 * held_bytes + 2 * self.settings.segment_bytes {
            self.append(&held())?;
            self.file.sync_data()?;
            for c in self.closed.drain(..) {
                remove(&c.path)?;
            }
            self.closed_bytes = 0;
        }
        sync_dir(&self.settings.dir)
    }

    /// A graceful stop: syncs the log and leaves the clean-stop file saying that every id
    /// below `next_id` is on disk.
    pub fn close(&mut self, next_id: u64) -> io::Result<()> {
        self.stop_syncer();
        self.file.sync_data()?;
        self.buf.clear();
        history_log::encode_clean(
            &history_log::Clean {
                epoch: &self.epoch,
                next_id,
            },
            &mut self.buf,
        );
        let tmp = self.settings.dir.join("clean.tmp");
        let mut f = files::create_fresh(&tmp)?;
        f.write_all(&self.buf)?;
        f.sync_all()?;
        fs::rename(&tmp, self.settings.dir.join(CLEAN))?;
        sync_dir(&self.settings.dir)
    }

    fn stop_syncer(&mut self) {
        self.sync.stop.store(true, Relaxed);
        if let Some(t) = self.syncer.take() {
            // It notices within one interval; the last sync is the caller's.
            let _ = t.join();
        }
    }
}

impl Drop for HistoryLog {
    fn drop(&mut self) {
        self.stop_syncer();
    }
}

/// The fsync thread: syncs the segment being written every `every` when something was written.
fn sync_loop(shared: &SyncShared, every: Duration) {
    while !shared.stop.load(Relaxed) {
        std::thread::sleep(every);
        if shared.dirty.swap(false, Relaxed) {
            let file = lock(&shared.file).as_ref().and_then(|f| f.try_clone().ok());
            if let Some(f) = file {
                if let Err(e) = f.sync_data() {
                    crate::log::warn(format_args!("history_dir: fsync failed: {e}"));
                }
            }
        }
    }
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}{SUFFIX}"))
}

fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Makes file creations and deletions in `dir` durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    files::open_dir(dir)?.sync_all()
}

/// What a folded stream entry's JSON says (the broker wrote it: `folded_json`).
struct Whole {
    stream: u64,
    seq: u32,
    closed: Option<clarion_proto::pubsub::append::CloseReason>,
    data: String,
}

fn whole_text(m: &Published) -> Option<Whole> {
    use clarion_proto::pubsub::append::CloseReason;
    let v: serde_json::Value = serde_json::from_slice(m.payload()).ok()?;
    let stream = v
        .get("stream")?
        .as_str()?
        .rsplit('-')
        .next()?
        .parse()
        .ok()?;
    let seq = u32::try_from(v.get("seq")?.as_u64()?).ok()?;
    let data = v.get("data")?.as_str()?.to_owned();
    let closed = match (
        v.get("done").and_then(|d| d.as_bool()),
        v.get("reason").and_then(|r| r.as_str()),
    ) {
        (Some(true), None) => Some(CloseReason::Done),
        (Some(true), Some("timeout")) => Some(CloseReason::Timeout),
        (Some(true), Some(_)) => Some(CloseReason::Restart),
        (Some(false) | None, _) => None,
    };
    Some(Whole {
        stream,
        seq,
        closed,
        data,
    })
}
