//! The port guard: a `clarion serve` refuses a port another process is listening on.
//!
//! Every listener binds with `SO_REUSEPORT` (so a process's workers, and a group's members,
//! share a port), and the kernel lets any other process of the same user join such a port too:
//! a second server started by mistake would come up without a word and take a share of the
//! first one's new connections, and each would then deliver only to its own subscribers. So
//! before binding, a process that is not a member of a deliberate group probes each port with
//! a socket *without* `SO_REUSEPORT`: the kernel refuses that bind while anyone listens on the
//! port, and the server stops with a message naming it.
//!
//! Limits of the probe, accepted because the alternative (no `SO_REUSEPORT`) costs the
//! per-worker listeners: it is a check-then-act, so two servers started in the same instant
//! can both pass it before either binds; it sees only listening sockets (a port merely bound by
//! another program passes, and the real bind then reports that); and members of a group skip
//! it, since their siblings hold the ports by design (their supervisor probed once for all).

use std::net::SocketAddr;

/// A port another process already listens on.
#[derive(Debug, thiserror::Error)]
#[error(
    "port {port} ({what} address {addr}) is held by another process: another `clarion serve` \
     (or another server) is listening there, and with SO_REUSEPORT this one would silently take \
     a share of its connections. Stop the other process or choose another port; to run several \
     processes as one server, use `clarion serve --processes N`"
)]
pub struct PortHeld {
    /// The port.
    pub port: u16,
    /// Which listener (`client`, `TLS`, `API`).
    pub what: &'static str,
    /// The address as configured.
    pub addr: SocketAddr,
}

/// Refuses `addr` when another process listens on its port. Port 0 asks for a fresh port and
/// cannot be held. Errors other than "in use" (an address not on this host, a privileged
/// port) pass: the real bind reports them with its own context.
pub fn check(addr: SocketAddr, what: &'static str) -> Result<(), PortHeld> {
    if addr.port() == 0 {
        return Ok(());
    }
    let Ok(probe) = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    ) else {
        return Ok(());
    };
    // SO_REUSEADDR (as every listener sets): connections of a server that just stopped, still
    // in TIME_WAIT, must not look like a holder. It never lets the bind past a listener.
    if probe.set_reuse_address(true).is_err() {
        return Ok(());
    }
    match probe.bind(&addr.into()) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(PortHeld {
            port: addr.port(),
            what,
            addr,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn reuseport_listener() -> std::net::TcpListener {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_reuse_address(true).unwrap();
        s.set_reuse_port(true).unwrap();
        s.bind(&addr.into()).unwrap();
        s.listen(8).unwrap();
        s.into()
    }

    #[test]
    fn a_port_someone_listens_on_is_refused_with_its_number() {
        let held = reuseport_listener();
        let addr = held.local_addr().unwrap();
        let err = check(addr, "client").unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&format!("port {}", addr.port())), "{text}");
        assert!(text.contains("another process"), "{text}");
        // The wildcard address covers the held loopback port too.
        let any = SocketAddr::from(([0, 0, 0, 0], addr.port()));
        assert!(check(any, "client").is_err());
    }

    #[test]
    fn a_free_port_and_port_zero_pass() {
        let held = reuseport_listener();
        let addr = held.local_addr().unwrap();
        drop(held);
        assert!(check(addr, "API").is_ok());
        assert!(check("127.0.0.1:0".parse().unwrap(), "API").is_ok());
    }

    #[test]
    fn the_probe_leaves_the_port_free() {
        let held = reuseport_listener();
        let addr = held.local_addr().unwrap();
        drop(held);
        check(addr, "client").unwrap();
        // A listener can still take the port after the probe (it held it only while checking).
        let again = std::net::TcpListener::bind(addr).unwrap();
        drop(again);
    }
}
