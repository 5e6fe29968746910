//! A fan-out's writes submitted together (`io_uring = true`, the default): one
//! `io_uring_enter` per 256 sends instead of one `send` system call per subscriber (issue 22).
//!
//! A ticker message to N subscribers is N small writes to N sockets: nothing to coalesce, so
//! the cost is N system calls. At the steady ticker of issue 22 (15,000 subscribers, two
//! messages a second, docs/benchmarks.md) submitting them in batches cut the server's CPU per
//! delivery by about a third against one `send` each, and its latency by a fifth. The batch is
//! small on purpose: measured at 64, 256, 1,024 and 4,096 sends per call, 256 was the cheapest,
//! and 4,096 cost more than plain sends. A long batch keeps the core from the readers the sends
//! wake (this kernel does not preempt a system call), so the socket buffers of thousands of
//! unread messages pile up before anything is freed; a short one lets them drain in between.
//! The ring is small too: 256 submission and 512 completion entries, 24 KiB per worker.
//!
//! Every send carries `MSG_DONTWAIT`, so the kernel completes it while submitting (a full
//! socket answers `EAGAIN`, as a plain non-blocking `send` would, and the engine keeps the rest
//! for the socket's writable event); [`SendRing::send_all`] waits for all completions before it
//! returns, so the buffers and descriptors it was given need to live only for the call. This is
//! the only `unsafe` in the server: pushing a submission whose buffer the kernel reads later.
//!
//! Where io_uring is turned off (`io_uring = false`) or unavailable (old kernels,
//! `kernel.io_uring_disabled`, container seccomp profiles), the worker has no ring and writes one
//! socket at a time. A ring that fails mid-flight is dropped (sends it never submitted are
//! discarded with it) and its unanswered items are written the plain way.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;

use io_uring::{opcode, types, IoUring, Probe};

use crate::log;

/// Submission queue entries: a batch of up to this many sends per `io_uring_enter` (see the
/// module's note for why not more).
const ENTRIES: u32 = 256;
/// How often a refused submission (`EAGAIN`/`EBUSY`/`EINTR`) is retried before the ring is
/// given up.
const RETRIES: u32 = 8;

/// One worker's ring for fan-out writes.
pub struct SendRing {
    ring: IoUring,
    /// Results of the current batch by item: bytes written or `-errno`; `None` until answered.
    done: Vec<Option<i32>>,
}

impl SendRing {
    /// A ring, if this kernel has io_uring with `IORING_OP_SEND` (Linux 5.6).
    pub fn new() -> io::Result<SendRing> {
        let ring = IoUring::new(ENTRIES)?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::Send::CODE) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no IORING_OP_SEND",
            ));
        }
        Ok(SendRing {
            ring,
            done: Vec::new(),
        })
    }

    /// Sends `bytes` on `fd` for every item and waits until each has completed; afterwards
    /// `self.done[i]` holds item `i`'s result. On error, items the kernel never took stay
    /// `None` and the ring must be dropped.
    fn send_all<S: AsRawFd>(&mut self, items: &[(&S, &[u8])]) -> io::Result<()> {
        self.done.clear();
        self.done.resize(items.len(), None);
        let (mut next, mut outstanding, mut refused) = (0usize, 0usize, 0u32);
        while next < items.len() || outstanding > 0 {
            {
                let mut sq = self.ring.submission();
                while let Some(&(socket, bytes)) = items.get(next) {
                    if outstanding >= ENTRIES as usize {
                        break;
                    }
                    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
                    let fd = types::Fd(socket.as_raw_fd());
                    let entry = opcode::Send::new(fd, bytes.as_ptr(), len)
                        .flags(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                        .build()
                        .user_data(next as u64);
                    // SAFETY: the kernel reads `len` bytes at `bytes.as_ptr()` and uses `fd`
                    // until the send completes; both are borrowed for this whole call, and the
                    // call returns only once every submitted send has completed (or, on error,
                    // with the unsubmitted ones left for the caller to discard with the ring).
                    if unsafe { sq.push(&entry) }.is_err() {
                        break;
                    }
                    next += 1;
                    outstanding += 1;
                }
            }
            if outstanding == 0 {
                // Nothing could be queued and nothing is in flight: the ring is unusable.
                return Err(io::Error::other("submission queue full"));
            }
            if let Err(e) = self.ring.submit_and_wait(outstanding) {
                let transient = matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                );
                refused += 1;
                if !transient || refused > RETRIES {
                    self.reap(&mut outstanding);
                    return Err(e);
                }
            }
            self.reap(&mut outstanding);
        }
        Ok(())
    }

    /// Takes every completion that has arrived.
    fn reap(&mut self, outstanding: &mut usize) {
        for cqe in self.ring.completion() {
            if let Some(slot) = usize::try_from(cqe.user_data())
                .ok()
                .and_then(|i| self.done.get_mut(i))
            {
                *slot = Some(cqe.result());
                *outstanding = outstanding.saturating_sub(1);
            }
        }
    }
}

/// The real socket's `write_many` (`worker::socket`): one buffer to each of several sockets,
/// through the worker's ring when it has one, else (and for what the ring did not take) one
/// `write` each.
pub fn write_many<S: AsRawFd>(
    ring: &mut Option<SendRing>,
    items: &[(&S, &[u8])],
    out: &mut Vec<io::Result<usize>>,
) where
    for<'a> &'a S: io::Write,
{
    let write = |s: &S, b: &[u8]| io::Write::write(&mut &*s, b);
    let Some(r) = ring.as_mut().filter(|_| items.len() > 1) else {
        out.extend(items.iter().map(|(s, b)| write(s, b)));
        return;
    };
    let failed = r.send_all(items).err();
    for (i, (s, b)) in items.iter().enumerate() {
        out.push(match r.done.get(i).copied().flatten() {
            Some(n) if n >= 0 => Ok(n as usize),
            Some(errno) => Err(io::Error::from_raw_os_error(-errno)),
            // Never taken by the kernel: the plain way.
            None => write(s, b),
        });
    }
    if let Some(e) = failed {
        log::warn(format_args!(
            "io_uring submission failed ({e}); this worker writes one socket at a time from now on"
        ));
        *ring = None;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_batch_larger_than_the_ring_reaches_every_socket_and_full_ones_say_so() {
        let Ok(ring) = SendRing::new() else {
            eprintln!("io_uring unavailable here: nothing to test");
            return;
        };
        let mut ring = Some(ring);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let n = ENTRIES as usize + 100;
        let mut pairs = Vec::new();
        for _ in 0..n {
            let c = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (s, _) = listener.accept().unwrap();
            s.set_nonblocking(true).unwrap();
            pairs.push((mio::net::TcpStream::from_std(s), c));
        }
        let messages: Vec<Vec<u8>> = (0..n)
            .map(|i| format!("message {i}").into_bytes())
            .collect();
        let items: Vec<(&mio::net::TcpStream, &[u8])> = pairs
            .iter()
            .zip(&messages)
            .map(|((s, _), m)| (s, &m[..]))
            .collect();
        let mut out = Vec::new();
        write_many(&mut ring, &items, &mut out);
        assert!(ring.is_some());
        for (i, ((_, c), r)) in pairs.iter_mut().zip(&out).enumerate() {
            let want = messages[i].len();
            assert_eq!(*r.as_ref().unwrap(), want);
            let mut got = vec![0u8; want];
            c.read_exact(&mut got).unwrap();
            assert_eq!(got, messages[i]);
        }
        // A socket whose peer does not read fills up: the batch reports a short write, then
        // WouldBlock, as a non-blocking send would.
        let (s, _c) = &pairs[0];
        let big = vec![7u8; 1 << 20];
        let mut results = Vec::new();
        for _ in 0..64 {
            out.clear();
            write_many(&mut ring, &[(s, &big[..]), (&pairs[1].0, b"x")], &mut out);
            let r = out.remove(0);
            let blocked = matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock);
            results.push(r.map_err(|e| e.kind()));
            if blocked {
                break;
            }
        }
        assert!(
            results
                .last()
                .is_some_and(|r| *r == Err(io::ErrorKind::WouldBlock)),
            "{results:?}"
        );
    }

    #[test]
    fn without_a_ring_writes_are_plain() {
        let mut ring = None;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (s, _) = listener.accept().unwrap();
        let s = mio::net::TcpStream::from_std(s);
        let mut out = Vec::new();
        write_many(&mut ring, &[(&s, b"hi"), (&s, b"!")], &mut out);
        assert_eq!(out.len(), 2);
        let mut got = [0u8; 3];
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi!");
    }
}
