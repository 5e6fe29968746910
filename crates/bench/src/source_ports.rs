//! The bench workers' outgoing connections, from source ports the worker chooses, not the
//! kernel.

use std::io;
use std::net::{IpAddr, SocketAddr};

use mio::net::TcpStream;
use mio::{Interest, Poll, Token};

/// Source ports: a bench worker owns its source address, so it walks a port range itself.
///
/// `bind(addr, 0)` would make the kernel search for a free port, and it first searches only half
/// the ephemeral range (the other half is kept for `connect`): past ~14,000 sockets on one
/// address every bind scans thousands of ports, the workers spin in the kernel and the server's
/// handshake timeout closes connections that waited (measured: 200,000 connections stalled at
/// 150,000). Binding an explicit port is one hash lookup.
///
/// The ports are taken *below* the kernel's ephemeral range (10000 up to it): a bound port
/// holds a bind bucket that `connect` on any address skips, so ~19,000 ports per worker inside
/// the range would leave the rest of the machine (the bench's own API connection, other
/// programs) no ephemeral port at all.
pub(crate) struct SourcePorts {
    lo: u16,
    len: u32,
    next: u32,
}

/// Lowest source port used: above the well-known and most fixed service ports.
const FIRST_PORT: u16 = 10_000;

impl SourcePorts {
    pub(crate) fn new() -> SourcePorts {
        let range =
            std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
        let mut it = range
            .split_whitespace()
            .filter_map(|v| v.parse::<u16>().ok());
        let (lo, hi) = match it.next() {
            // Room below the ephemeral range for a full worker (19,000) and some slack.
            Some(eph) if eph > FIRST_PORT + 20_000 => (FIRST_PORT, eph - 1),
            // Otherwise share the ephemeral range, the best there is.
            Some(eph) => (eph, it.next().unwrap_or(u16::MAX).max(eph)),
            None => (32768, 60999),
        };
        let len = u32::from(hi - lo) + 1;
        SourcePorts {
            lo,
            len,
            next: {
                let r = crate::wire::rand16();
                u32::from_le_bytes([r[0], r[1], r[2], r[3]]) % len
            },
        }
    }

    /// Starts a non-blocking connection from `source` to `target`, registered with `poll` under
    /// `index` for reading and writing (the write readiness says the connect finished). A port
    /// whose old connection to the same server is still in TIME_WAIT may be bound again
    /// (loopback reuses it safely) but is refused by connect (EADDRNOTAVAIL): the next port is
    /// tried, up to 64 times.
    pub(crate) fn connect(
        &mut self,
        source: IpAddr,
        target: SocketAddr,
        poll: &Poll,
        index: usize,
    ) -> io::Result<TcpStream> {
        let mut tries = 0;
        loop {
            match self.connect_once(source, target, poll, index) {
                Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable && tries < 64 => tries += 1,
                other => return other,
            }
        }
    }

    fn connect_once(
        &mut self,
        source: IpAddr,
        target: SocketAddr,
        poll: &Poll,
        index: usize,
    ) -> io::Result<TcpStream> {
        let domain = socket2::Domain::for_address(target);
        let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
        s.set_nonblocking(true)?;
        s.set_reuse_address(true)?;
        self.bind(&s, source)?;
        match s.connect(&target.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(115) => {} // EINPROGRESS
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        let _ = s.set_nodelay(true);
        let mut stream = TcpStream::from_std(s.into());
        poll.registry().register(
            &mut stream,
            Token(index),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        Ok(stream)
    }

    /// Binds `sock` to `source` and the next port that is free; at most 4,096 tries.
    fn bind(&mut self, sock: &socket2::Socket, source: IpAddr) -> io::Result<()> {
        let mut last = io::Error::from(io::ErrorKind::AddrInUse);
        for _ in 0..4096 {
            let port = self.lo.wrapping_add((self.next % self.len) as u16);
            self.next = self.next.wrapping_add(1);
            match sock.bind(&SocketAddr::new(source, port).into()) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }
}

/// Whether a connection from [`SourcePorts::connect`] has connected: `Ok(false)` while it is
/// still connecting, the kind of failure (`connect: ...`) when it could not.
pub(crate) fn connected(stream: &TcpStream) -> Result<bool, String> {
    match stream.take_error() {
        Ok(Some(e)) | Err(e) => return Err(format!("connect: {}", e.kind())),
        Ok(None) => {}
    }
    Ok(stream.peer_addr().is_ok())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn source_ports_skip_those_in_use() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let mut ports = SourcePorts {
            lo: port,
            len: 2,
            next: 0,
        };
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        ports.bind(&sock, "127.0.0.1".parse().unwrap()).unwrap();
        let bound = sock.local_addr().unwrap().as_socket().unwrap().port();
        assert_eq!(bound, port.wrapping_add(1));
        assert_eq!(ports.next, 2);
    }
}
