//! The service manager's notification protocol (systemd's `sd_notify`): what a service tells
//! the manager over the datagram socket named by `$NOTIFY_SOCKET`. A message is one datagram of
//! newline-separated `KEY=VALUE` assignments; the manager reads each key it knows and ignores
//! the rest. Pure: the server's `service_manager` module owns the socket and the clock.
//!
//! Which process may speak for the service matters to an upgrade: with `NotifyAccess=main` the
//! manager reads only the main process's messages, so the process handing its connections over
//! names its successor (`MAINPID=`) itself before the successor says `READY=1`.

use std::fmt::Write as _;

/// One assignment of a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field<'a> {
    /// `READY=1`: startup (or a reload) is complete; the service serves.
    Ready,
    /// `RELOADING=1`: a reload began. The manager wants the `CLOCK_MONOTONIC` time (in
    /// microseconds) it began at, to tell it from an earlier reload's late message.
    Reloading {
        /// `MONOTONIC_USEC=`: when the reload began, `CLOCK_MONOTONIC`, microseconds.
        monotonic_usec: u64,
    },
    /// `STOPPING=1`: the service is shutting down (draining its connections).
    Stopping,
    /// `STATUS=`: one line shown by `systemctl status`.
    Status(&'a str),
    /// `MAINPID=`: the process the manager must watch from now on.
    MainPid(u32),
}

/// Longest `STATUS=` text sent: `systemctl status` shows one line, and a datagram stays small.
pub const MAX_STATUS: usize = 512;

/// The datagram for `fields`, in their order. A status is cut to one line (a newline in it
/// would start a new assignment) of at most [`MAX_STATUS`] bytes, on a character boundary.
pub fn encode(fields: &[Field<'_>]) -> String {
    let mut out = String::new();
    for field in fields {
        // Writing to a String cannot fail.
        let _ = match field {
            Field::Ready => writeln!(out, "READY=1"),
            Field::Reloading { monotonic_usec } => {
                writeln!(out, "RELOADING=1\nMONOTONIC_USEC={monotonic_usec}")
            }
            Field::Stopping => writeln!(out, "STOPPING=1"),
            Field::Status(text) => writeln!(out, "STATUS={}", one_line(text)),
            Field::MainPid(pid) => writeln!(out, "MAINPID={pid}"),
        };
    }
    out
}

fn one_line(text: &str) -> String {
    let mut line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.len() > MAX_STATUS {
        let mut end = MAX_STATUS;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
    }
    line
}

/// Where `$NOTIFY_SOCKET` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A socket file (`/run/systemd/notify`).
    Path(String),
    /// A Linux abstract socket name, written `@name` (the bytes after the `@`).
    Abstract(Vec<u8>),
}

/// Why `$NOTIFY_SOCKET` was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Set but empty.
    #[error("NOTIFY_SOCKET is empty")]
    Empty,
    /// Neither an absolute path nor `@name` (systemd also knows `vsock:`, which no local
    /// service manager hands a service on one machine).
    #[error("NOTIFY_SOCKET is neither an absolute path nor an @abstract name")]
    Unsupported,
    /// Longer than a Unix socket address holds (107 bytes and a terminator).
    #[error("NOTIFY_SOCKET is longer than a Unix socket address")]
    TooLong,
}

/// Longest path or abstract name a `sockaddr_un` holds.
const SUN_PATH_MAX: usize = 107;

/// Reads a `$NOTIFY_SOCKET` value.
pub fn parse_address(value: &str) -> Result<Address, AddressError> {
    if value.is_empty() {
        return Err(AddressError::Empty);
    }
    if value.len() > SUN_PATH_MAX {
        return Err(AddressError::TooLong);
    }
    if let Some(name) = value.strip_prefix('@') {
        return Ok(Address::Abstract(name.as_bytes().to_vec()));
    }
    if value.starts_with('/') {
        return Ok(Address::Path(value.to_owned()));
    }
    Err(AddressError::Unsupported)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_with_status_and_main_pid_is_one_assignment_a_line() {
        let m = encode(&[
            Field::MainPid(4242),
            Field::Ready,
            Field::Status("serving 3 connections"),
        ]);
        assert_eq!(m, "MAINPID=4242\nREADY=1\nSTATUS=serving 3 connections\n");
    }

    #[test]
    fn reloading_carries_the_monotonic_time_it_began() {
        let m = encode(&[Field::Reloading {
            monotonic_usec: 123_456_789,
        }]);
        assert_eq!(m, "RELOADING=1\nMONOTONIC_USEC=123456789\n");
    }

    #[test]
    fn stopping_is_its_own_key() {
        assert_eq!(
            encode(&[Field::Stopping, Field::Status("draining")]),
            "STOPPING=1\nSTATUS=draining\n"
        );
    }

    #[test]
    fn a_newline_in_a_status_cannot_inject_an_assignment() {
        let m = encode(&[Field::Status("ok\nREADY=1\r\tx")]);
        assert_eq!(m, "STATUS=ok READY=1  x\n");
        assert_eq!(m.lines().count(), 1);
    }

    #[test]
    fn a_long_status_is_cut_on_a_character_boundary() {
        let text = "é".repeat(MAX_STATUS); // two bytes each
        let m = encode(&[Field::Status(&text)]);
        let value = m.trim_end().trim_start_matches("STATUS=");
        assert_eq!(value.len(), MAX_STATUS);
        assert!(value.chars().all(|c| c == 'é'));
    }

    #[test]
    fn addresses_are_paths_or_abstract_names() {
        assert_eq!(
            parse_address("/run/systemd/notify"),
            Ok(Address::Path("/run/systemd/notify".into()))
        );
        assert_eq!(
            parse_address("@clarion-test/1"),
            Ok(Address::Abstract(b"clarion-test/1".to_vec()))
        );
        assert_eq!(parse_address(""), Err(AddressError::Empty));
        assert_eq!(
            parse_address("vsock:2:1234"),
            Err(AddressError::Unsupported)
        );
        assert_eq!(
            parse_address(&format!("/{}", "a".repeat(SUN_PATH_MAX))),
            Err(AddressError::TooLong)
        );
    }
}
