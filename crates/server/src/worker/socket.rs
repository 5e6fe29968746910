//! What the engine needs of a client socket: non-blocking reads and writes (vectored too, and to
//! many sockets at once), and shutting the write side. `mio`'s `TcpStream` is the real one;
//! tests use an in-memory pipe (see `testkit`). The engine is generic over it and monomorphized,
//! so the real build calls the socket directly, as before.
//!
//! Nothing here knows about connections or protocols.

use std::io::{self, IoSlice, Read, Write};
use std::net::IpAddr;

/// A non-blocking stream socket: every call may fail with `WouldBlock`.
pub trait Socket {
    /// Reads into `buf`; `Ok(0)` is the peer's EOF.
    fn read(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes some of `buf`.
    fn write(&self, buf: &[u8]) -> io::Result<usize>;
    /// Writes some of `bufs`, in order, with one system call.
    fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Shuts the write side: the peer reads EOF after what was written.
    fn shutdown_write(&self) -> io::Result<()>;
    /// The peer's address, for forwarding headers.
    fn peer_ip(&self) -> Option<IpAddr>;
    /// Bounds the kernel's send buffer to about `bytes` (which also stops its autotuning):
    /// a subscriber of a conflating topic, whose bytes in the kernel are not conflated. Best
    /// effort: a socket that refuses keeps its buffer.
    fn limit_send_buffer(&self, _bytes: usize) {}

    /// What a worker keeps to write to many sockets in one submission (the real socket's
    /// io_uring, [`super::uring::SendRing`]); `()` where there is no such thing.
    type Batch;

    /// Writes one buffer to each of several sockets (a fan-out), appending one result per item
    /// to `out`, in order. The default is one `write` each, whatever `batch` holds.
    fn write_many(
        batch: &mut Option<Self::Batch>,
        items: &[(&Self, &[u8])],
        out: &mut Vec<io::Result<usize>>,
    ) where
        Self: Sized,
    {
        let _ = batch;
        out.extend(items.iter().map(|(s, b)| s.write(b)));
    }
}

impl Socket for mio::net::TcpStream {
    type Batch = super::uring::SendRing;

    #[inline]
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // `&TcpStream` implements `Read` and `Write`: no `&mut` needed.
        Read::read(&mut &*self, buf)
    }

    #[inline]
    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        Write::write(&mut &*self, buf)
    }

    #[inline]
    fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        Write::write_vectored(&mut &*self, bufs)
    }

    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)
    }

    fn peer_ip(&self) -> Option<IpAddr> {
        self.peer_addr().ok().map(|a| a.ip())
    }

    fn limit_send_buffer(&self, bytes: usize) {
        let _ = socket2::SockRef::from(self).set_send_buffer_size(bytes);
        // SO_SNDBUF bounds the bytes in flight and unsent together, and Linux doubles it: a
        // reader behind found ~20 KB of old messages waiting unsent in the kernel at a
        // 16 KB threshold (`ss -tm`: notsent). TCP_NOTSENT_LOWAT bounds the unsent part
        // itself: a write is refused (EAGAIN) once that many bytes wait unsent, so they wait
        // in the worker's backlog, where conflation replaces them.
        set_notsent_lowat(self, NOTSENT_LOWAT);
    }

    fn write_many(
        batch: &mut Option<Self::Batch>,
        items: &[(&Self, &[u8])],
        out: &mut Vec<io::Result<usize>>,
    ) {
        super::uring::write_many(batch, items, out);
    }
}

/// The unsent bytes the kernel may hold for a conflating subscriber (`TCP_NOTSENT_LOWAT`):
/// about one small message; the rest waits where it can still be conflated. Throughput is
/// unaffected (bytes in flight are not counted); the cost is one more wake-up per that many
/// bytes for a subscriber that keeps up.
const NOTSENT_LOWAT: u32 = 2048;

/// Sets `TCP_NOTSENT_LOWAT` on a TCP socket. Best effort, as the send buffer's bound: a kernel
/// without it (before Linux 3.12) keeps only the `SO_SNDBUF` bound.
fn set_notsent_lowat(s: &mio::net::TcpStream, bytes: u32) {
    use std::os::fd::AsRawFd;
    let value = bytes as libc::c_int;
    // SAFETY: `value` lives across the call and its size is passed; the fd is open (borrowed
    // from `s`); setsockopt only reads the option value.
    #[allow(unsafe_code)]
    let _ = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}
