//! File descriptors over a Unix socket (`SCM_RIGHTS`): the only I/O of a hand-over that the
//! standard library cannot do. A frame's bytes go with one `sendmsg`, its descriptors attached
//! to the first byte; the reader keeps received descriptors in arrival order, and a frame takes
//! as many as it says it carries ([`clarion_proto::handover::Frame::fds`]).
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::io::{self, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use clarion_proto::handover::{decode, Frame, MAX_FDS};

/// Sends `bytes` with `fds` attached (at most [`MAX_FDS`]); blocks until all is written.
pub fn send(sock: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.is_empty() {
        return (&*sock).write_all(bytes);
    }
    if fds.len() > MAX_FDS || bytes.is_empty() {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call, and the
    // control buffer is CMSG_SPACE bytes for exactly `fds.len()` descriptors.
    let sent = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(io::Error::other("no room for the control message"));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(cmsg), fd_bytes);
        loop {
            let n = libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    };
    // The descriptors went with the first byte; the rest is plain bytes.
    (&*sock).write_all(bytes.get(sent..).unwrap_or_default())
}

/// The process id and user id of the process at the other end of `sock` (`SO_PEERCRED`, as
/// the kernel recorded them at connect or listen time).
pub fn peer(sock: &UnixStream) -> io::Result<(u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid as u32, cred.uid))
}

/// This process's effective user id.
pub fn own_uid() -> u32 {
    crate::user::effective_uid()
}

/// Reads frames and the descriptors that ride with them.
pub struct Reader {
    sock: UnixStream,
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
}

impl Reader {
    /// Reads from `sock` (blocking, with whatever timeout it has).
    pub fn new(sock: UnixStream) -> Reader {
        Reader {
            sock,
            buf: Vec::new(),
            fds: VecDeque::new(),
        }
    }

    /// The socket, to write answers on.
    pub fn socket(&self) -> &UnixStream {
        &self.sock
    }

    /// Reads until a whole frame and its descriptors are here, and gives both to `take`.
    pub fn next<R>(&mut self, take: impl FnOnce(Frame<'_>, Vec<OwnedFd>) -> R) -> io::Result<R> {
        loop {
            match decode(&self.buf) {
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
                Ok(Some((frame, used))) if self.fds.len() >= frame.fds() => {
                    let fds: Vec<OwnedFd> = self.fds.drain(..frame.fds()).collect();
                    let r = take(frame, fds);
                    self.consume(used);
                    return Ok(r);
                }
                Ok(_) => self.fill()?,
            }
        }
    }

    /// Drops the first `used` bytes (a frame read). A `conns` frame carries TLS traffic
    /// secrets: nothing read stays behind, neither the frame nor, past the new end, the old
    /// copy of the bytes that moved down in its place (`Vec::drain` would leave it).
    fn consume(&mut self, used: usize) {
        let used = used.min(self.buf.len());
        let left = self.buf.len() - used;
        self.buf.copy_within(used.., 0);
        zeroize::Zeroize::zeroize(self.buf.get_mut(left..).unwrap_or_default());
        self.buf.truncate(left);
    }

    fn fill(&mut self) -> io::Result<()> {
        let mut chunk = vec![0u8; 256 * 1024];
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE((MAX_FDS * 4 + 16) as u32) } as usize;
        let mut control = vec![0u8; space];
        let mut iov = libc::iovec {
            iov_base: chunk.as_mut_ptr().cast(),
            iov_len: chunk.len(),
        };
        // SAFETY: the buffers outlive the call; the kernel writes at most their lengths, and
        // the control messages are walked with the CMSG macros within `msg_controllen`.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let n = loop {
                let n = libc::recvmsg(self.sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
                if n >= 0 {
                    break n as usize;
                }
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            };
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(cmsg);
                    let len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    for i in 0..len / 4 {
                        let fd: RawFd = std::ptr::read_unaligned(data.add(i * 4).cast());
                        self.fds.push_back(OwnedFd::from_raw_fd(fd));
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
            if msg.msg_flags & libc::MSG_CTRUNC != 0 {
                return Err(io::Error::other("descriptors were cut off"));
            }
            n
        };
        if n == 0 {
            // Nothing more will come; a frame still incomplete is the peer's failure.
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let fresh = chunk.get(..n).unwrap_or_default();
        if self.buf.capacity() - self.buf.len() < fresh.len() {
            // Grown by hand so that the old allocation is wiped before it is freed.
            let want = (self.buf.len() + fresh.len()).max(2 * self.buf.capacity());
            let mut bigger = Vec::with_capacity(want);
            bigger.extend_from_slice(&self.buf);
            zeroize::Zeroize::zeroize(&mut self.buf);
            self.buf = bigger;
        }
        self.buf.extend_from_slice(fresh);
        zeroize::Zeroize::zeroize(&mut chunk);
        Ok(())
    }
}

/// The buffer may hold stale copies of secrets in its spare capacity (bytes moved down after
/// a frame was consumed): wiped, whole capacity included, when the hand-over ends.
impl Drop for Reader {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.buf);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clarion_proto::handover::{encode, Frame};

    /// A `conns` frame whose one connection carries `secret` as both traffic secrets.
    fn conns_with(secret: u8) -> Vec<u8> {
        use clarion_proto::handover::{ConnRecord, ConnState, TlsRecord};
        use clarion_proto::tls13::limits::Usage;
        use clarion_proto::tls13::parked::{Parked, ParkedDirection};
        use clarion_proto::tls13::{CipherSuite, TrafficKey, TrafficSecret};
        let suite = CipherSuite::Aes256GcmSha384;
        let direction = || ParkedDirection {
            secret: TrafficSecret::new(suite, &[secret; 48]).unwrap(),
            key: TrafficKey::new(suite, &[secret; 32], &[secret; 12]).unwrap(),
            usage: Usage { seq: 1, weight: 1 },
        };
        let record = ConnRecord {
            worker: 0,
            state: ConnState::Http,
            idle: 0,
            peer: 0,
            input: b"",
            output: b"",
            topics: Vec::new(),
            mode: None,
            tls: Some(TlsRecord {
                session: Box::new(Parked {
                    suite,
                    send: direction(),
                    receive: direction(),
                    owe_update: false,
                    partial_handshake: Vec::new(),
                }),
                partial: b"",
                unsent: b"",
            }),
            deflate: clarion_proto::handover::DeflateWindows::default(),
            h2: None,
            grip: None,
        };
        let mut out = Vec::new();
        encode(&Frame::Conns(vec![record]), &mut out);
        out
    }

    /// Where `secret` repeated 48 times (a traffic secret) starts in `bytes`.
    fn copies(bytes: &[u8], secret: u8) -> usize {
        bytes
            .windows(48)
            .filter(|w| w.iter().all(|&b| b == secret))
            .count()
    }

    #[test]
    fn a_frame_read_leaves_no_copy_of_its_secrets_in_the_buffer() {
        let (a, b) = UnixStream::pair().unwrap();
        let (first, second) = (conns_with(0xA1), conns_with(0xB2));
        // The first frame whole and the second but its last byte, in one read.
        let mut sent = first.clone();
        sent.extend_from_slice(&second[..second.len() - 1]);
        // Each frame carries one socket: any descriptor will do.
        let null = std::fs::File::open("/dev/null").unwrap();
        send(&a, &sent, &[null.as_raw_fd()]).unwrap();
        b.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut rd = Reader::new(b);
        rd.fill().unwrap();
        let high = rd.buf.len();
        assert_eq!(high, sent.len());
        rd.next(|f, _| assert!(matches!(f, Frame::Conns(_))))
            .unwrap();
        // Everything the buffer held, up to the most it held (all of it written by `fill`).
        assert!(rd.buf.capacity() >= high);
        // SAFETY: the first `high` bytes of the allocation were initialized by `fill`, and
        // nothing has shrunk or freed the allocation since.
        #[allow(unsafe_code)]
        let held = unsafe { std::slice::from_raw_parts(rd.buf.as_ptr(), high) };
        assert_eq!(copies(held, 0xA1), 0, "the frame read is wiped");
        // The second frame's secrets are there once (in the frame still to read), not twice.
        let once = copies(&second[..second.len() - 1], 0xB2);
        assert!(once > 0);
        assert_eq!(copies(held, 0xB2), once, "a moved-down copy stays behind");
        send(&a, &second[second.len() - 1..], &[null.as_raw_fd()]).unwrap();
        rd.next(|f, _| assert!(matches!(f, Frame::Conns(_))))
            .unwrap();
        // SAFETY: as above.
        #[allow(unsafe_code)]
        let held = unsafe { std::slice::from_raw_parts(rd.buf.as_ptr(), high) };
        assert_eq!(copies(held, 0xB2), 0, "both frames read: nothing left");
    }
}
