//! Telling the service manager how the server stands (systemd `Type=notify`): one datagram to
//! `$NOTIFY_SOCKET` when the server serves (`READY=1`), when an upgrade begins (`RELOADING=1`),
//! when the upgrade's new process takes over (`MAINPID=`, sent by the process handing over, then
//! `READY=1` from the new one) and when it stops (`STOPPING=1`). The message format is
//! `clarion_proto::sd_notify`; this module owns the socket and the clock. Without
//! `$NOTIFY_SOCKET` (not under systemd, or `Type=simple`) every call does nothing.
//!
//! Only the process that speaks for the service notifies: a lone server, not the members of a
//! `--processes` group, and not a process any more once it has named its successor (its own
//! restart afterwards is not the service stopping).
// `clock_gettime(CLOCK_MONOTONIC)`: the clock systemd compares `MONOTONIC_USEC=` against;
// `std::time::Instant` reads the same clock but does not show its value.
#![allow(unsafe_code)]

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::OnceLock;

use clarion_proto::sd_notify::{encode, parse_address, Address, Field};

use crate::log;

/// Where notifications go, read once at start; `None` when nobody listens.
static TARGET: OnceLock<Option<Address>> = OnceLock::new();
/// Whether this process still speaks for the service (false once it named its successor).
static SPEAKS: AtomicBool = AtomicBool::new(true);
/// A failed send is logged once, not at every notification.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Reads `$NOTIFY_SOCKET`. `speaks_for_service` is false for a group's members: their
/// supervisor is the service's main process. The variable stays set, so the process an
/// upgrade starts (which inherits the environment) can notify in turn.
pub fn init(speaks_for_service: bool) {
    let target = match std::env::var("NOTIFY_SOCKET") {
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => {
            log::warn(format_args!(
                "NOTIFY_SOCKET is not UTF-8: the service manager is not notified"
            ));
            None
        }
        Ok(_) if !speaks_for_service => None,
        Ok(value) => match parse_address(&value) {
            Ok(a) => Some(a),
            Err(e) => {
                log::warn(format_args!("{e}: the service manager is not notified"));
                None
            }
        },
    };
    let _ = TARGET.set(target);
}

/// The server serves: `MAINPID=` (this process: after an upgrade the manager may not know it
/// yet), `READY=1` and a status line.
pub fn ready(status: &str) {
    send(&[
        Field::MainPid(std::process::id()),
        Field::Ready,
        Field::Status(status),
    ]);
}

/// An upgrade began (SIGUSR1): the manager shows the service as reloading until `READY=1`.
pub fn reloading(status: &str) {
    send(&[
        Field::Reloading {
            monotonic_usec: monotonic_usec(),
        },
        Field::Status(status),
    ]);
}

/// A status line alone.
pub fn status(status: &str) {
    send(&[Field::Status(status)]);
}

/// The server stops: it drains its connections, then exits.
pub fn stopping(status: &str) {
    send(&[Field::Stopping, Field::Status(status)]);
}

/// The upgrade's new process `pid` serves from now on: the manager watches it instead of this
/// process (sent by this process, the one the manager accepts messages from under
/// `NotifyAccess=main`), and this process says nothing more.
pub fn hand_to(pid: u32, status: &str) {
    send(&[Field::MainPid(pid), Field::Status(status)]);
    SPEAKS.store(false, Relaxed);
}

/// Whether a manager listens and this process speaks for the service.
pub fn active() -> bool {
    SPEAKS.load(Relaxed) && TARGET.get().is_some_and(Option::is_some)
}

fn send(fields: &[Field<'_>]) {
    if !SPEAKS.load(Relaxed) {
        return;
    }
    let Some(Some(target)) = TARGET.get() else {
        return;
    };
    let message = encode(fields);
    if let Err(e) = send_to(target, message.as_bytes()) {
        if !WARNED.swap(true, Relaxed) {
            log::warn(format_args!(
                "cannot notify the service manager ({}): {e}",
                describe(target)
            ));
        }
    }
}

fn send_to(target: &Address, message: &[u8]) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    let sent = match target {
        Address::Path(path) => sock.send_to(message, path)?,
        Address::Abstract(name) => {
            use std::os::linux::net::SocketAddrExt as _;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(message, &addr)?
        }
    };
    if sent != message.len() {
        return Err(std::io::Error::other("the datagram was cut short"));
    }
    Ok(())
}

fn describe(target: &Address) -> String {
    match target {
        Address::Path(p) => p.clone(),
        Address::Abstract(name) => format!("@{}", String::from_utf8_lossy(name)),
    }
}

/// `CLOCK_MONOTONIC` in microseconds, the clock systemd reads for `MONOTONIC_USEC=`.
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000)
        .saturating_add(ts.tv_nsec as u64 / 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_reaches_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("clarion-notify-test-{}", std::process::id());
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("name");
        let rx = UnixDatagram::bind_addr(&addr).expect("bind");
        send_to(&Address::Abstract(name.into_bytes()), b"READY=1\n").expect("send");
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1\n");
    }

    #[test]
    fn the_monotonic_clock_moves_forward() {
        let a = monotonic_usec();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(monotonic_usec() >= a + 2_000);
    }
}
