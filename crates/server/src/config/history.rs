//! How much history is kept and where: the hub's limits (`history_size`, `history_ttl`,
//! `history_memory`) and the durable log's (`history_dir`, `history_fsync_ms`,
//! `history_segment_bytes`), as [`super::Config`] hands them to the hub and to `crate::durable`.

use std::path::PathBuf;

use clarion_proto::pubsub::append::StreamLimits;

/// Where and how durable history is kept (from `history_dir`, `history_fsync_ms` and
/// `history_segment_bytes`); read by `crate::durable`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryDisk {
    /// The directory (created if missing).
    pub dir: PathBuf,
    /// Milliseconds between `fsync`s; `0` syncs every write before it is acknowledged.
    pub fsync_ms: u64,
    /// Bytes after which a new segment begins.
    pub segment_bytes: u64,
    /// The largest a segment can be ([`largest_segment`]): bytes past it are not read at start.
    pub max_segment_bytes: u64,
}

/// The largest a segment can grow with these settings, with room to spare: a segment ends
/// after the write that takes it past `history_segment_bytes`, and the one a start or a
/// compaction begins with holds what history holds (`history_memory`, whose accounting counts
/// more than a message's bytes on disk) before it. So `segment_bytes` plus twice
/// `history_memory` plus two publishes, and 1 MiB for framing.
pub fn largest_segment(segment_bytes: u64, history_memory: usize, max_publish: usize) -> u64 {
    let wide = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    segment_bytes
        .saturating_add(wide(history_memory).saturating_mul(2))
        .saturating_add(wide(max_publish).saturating_mul(2))
        .saturating_add(1 << 20)
}

/// How much history the hub keeps (from `history_size`, `history_ttl` and `history_memory`).
/// Any of the three limits trims it. Declared here, not in the hub, so configuration depends on
/// nothing above it.
#[derive(Debug, Clone, Copy)]
pub struct HistoryLimits {
    /// Most messages kept per topic (0 = no history).
    pub per_topic: usize,
    /// Seconds a message is kept after it was published (0 = no history).
    pub ttl: u32,
    /// Bytes of history across all topics (see `Published::cost`); the oldest messages go
    /// first.
    pub max_bytes: usize,
}

impl HistoryLimits {
    /// Whether history is kept at all (every limit is above zero).
    pub fn enabled(&self) -> bool {
        self.per_topic > 0 && self.ttl > 0 && self.max_bytes > 0
    }
}

/// How streams are bounded (`stream_max_fragments`, `stream_max_bytes`, `stream_max_open`,
/// `stream_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSettings {
    /// Fragments, bytes and open streams per topic.
    pub limits: StreamLimits,
    /// Seconds without a fragment after which an open stream is closed (reason `timeout`).
    pub timeout: u32,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            limits: StreamLimits::default(),
            timeout: 300,
        }
    }
}
