//! Giving the heap back after a storm of new connections.
//!
//! A TLS handshake, or an HTTP request being read, borrows kilobytes that are freed once the
//! connection settles, while the connection's own small records stay. When thousands of clients
//! arrive at once (a deploy, a network blip, a benchmark) the borrowed memory of the handshakes
//! in flight ends up as holes between the records that stay: glibc's allocator reuses them for
//! the next handshakes, but does not give their pages back to the kernel while it still holds
//! records above them. So once a storm is over, worker 0 calls `malloc_trim(0)`, which returns
//! every whole free page of every arena (`MADV_DONTNEED`); it costs a walk of the free lists,
//! once per storm, and a page fault per page when the next storm borrows them again.
//!
//! [`Storms`] decides when, from the count of connections admitted (pure, tested below);
//! [`give_back`] is the call. Other allocators (musl's) give pages back by themselves, and there
//! `give_back` does nothing.

/// Connections admitted since the last trim before a lull is worth a trim.
pub(crate) const STORM: u64 = 1024;
/// A second with fewer new connections than this is a lull.
pub(crate) const LULL: u64 = 64;

/// When to give the heap back: after at least [`STORM`] connections since the last time, at
/// the second second in a row with fewer than [`LULL`] new ones. Not the first: a TLS
/// connection's expanded keys, made for its first records, are dropped by the sweep after a
/// quiet second (`Session::compact`), and their memory is the last a storm frees.
#[derive(Debug, Default)]
pub(crate) struct Storms {
    /// The count of admitted connections at the previous sweep.
    seen: u64,
    /// The previous second was a lull.
    lull: bool,
    /// The count at the last trim.
    trimmed_at: u64,
}

impl Storms {
    /// At a sweep, with `admitted` connections since start: whether to trim now.
    pub(crate) fn due(&mut self, admitted: u64) -> bool {
        let lull = admitted.saturating_sub(self.seen) < LULL;
        let second_lull = lull && self.lull;
        self.seen = admitted;
        self.lull = lull;
        if !second_lull || admitted.saturating_sub(self.trimmed_at) < STORM {
            return false;
        }
        self.trimmed_at = admitted;
        true
    }
}

/// Returns the free pages of every arena to the kernel; `true` if any were.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub(crate) fn give_back() -> bool {
    // SAFETY: malloc_trim takes each arena's lock in turn; it only releases free memory.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Returns the free pages of every arena to the kernel; this allocator does so by itself.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn give_back() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_per_storm_in_its_second_quiet_second() {
        let mut s = Storms::default();
        assert!(!s.due(10), "a few connections are no storm");
        assert!(!s.due(10), "nor are they after a quiet second");
        assert!(!s.due(600), "arriving");
        assert!(!s.due(1_500), "still arriving");
        assert!(
            !s.due(1_520),
            "the first lull: the last keys are not dropped yet"
        );
        assert!(s.due(1_520), "the second");
        assert!(!s.due(1_520), "once per storm");
        assert!(!s.due(1_560), "a trickle is no storm");
        assert!(!s.due(2_400), "a second storm, arriving");
        assert!(!s.due(2_410), "a lull");
        assert!(!s.due(2_600), "arriving again (190 in a second)");
        assert!(!s.due(2_600), "its first lull");
        assert!(s.due(2_600), "its second");
    }

    #[test]
    fn a_slow_steady_stream_adds_up_to_a_storm() {
        let mut s = Storms::default();
        let mut admitted = 0;
        let mut trims = 0;
        for _ in 0..100 {
            admitted += LULL - 1;
            trims += usize::from(s.due(admitted));
        }
        // One trim each time another STORM has come, 63 a second.
        assert_eq!(trims, (100 / STORM.div_ceil(LULL - 1)) as usize);
    }

    #[test]
    fn give_back_is_safe_to_call() {
        let v: Vec<Vec<u8>> = (0..1000).map(|_| vec![1u8; 4096]).collect();
        drop(v);
        let _ = give_back();
    }
}
