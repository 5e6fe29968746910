//! The operations a NATS client sends, appended to the caller's buffer.
//!
//! Every subject is checked before anything is written, so a refused operation leaves the
//! buffer as it was. Payloads are opaque bytes: the protocol frames them by length.

use std::io::Write as _;

use serde::Serialize;

use super::subject::{validate_subject, SubjectError};

/// The `CONNECT` options Clarion sends. Fields left `None` are omitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Connect {
    /// `+OK` after every operation: off, errors still arrive as `-ERR`.
    pub verbose: bool,
    /// Stricter server-side checks of subjects: off, the client checks its own.
    pub pedantic: bool,
    /// No TLS: the link is plain TCP.
    pub tls_required: bool,
    /// Whether the server sends this connection the messages it publishes itself. A Clarion
    /// node delivers its own publishes locally, so it sends `false`.
    pub echo: bool,
    /// The client's name, shown by the server's monitoring (`connz`).
    pub name: String,
    /// The client's implementation language, for the server's monitoring.
    pub lang: &'static str,
    /// The client's version, for the server's monitoring.
    pub version: &'static str,
    /// Protocol 1: the server may send `INFO` again when the cluster changes.
    pub protocol: u8,
    /// `HMSG` (messages with headers): not asked for.
    pub headers: bool,
    /// User name, from the server URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Password, from the server URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass: Option<String>,
    /// Token, from a URL with a user part and no password (`nats://TOKEN@host`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_token: Option<String>,
}

impl Connect {
    /// Options for a client named `name`, with `echo` as given and no credentials.
    pub fn new(name: &str, echo: bool) -> Connect {
        Connect {
            verbose: false,
            pedantic: false,
            tls_required: false,
            echo,
            name: name.to_owned(),
            lang: "rust",
            version: env!("CARGO_PKG_VERSION"),
            protocol: 1,
            headers: false,
            user: None,
            pass: None,
            auth_token: None,
        }
    }

    /// Appends `CONNECT {json}\r\n`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"CONNECT ");
        // Serializing plain strings, booleans and integers into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, self);
        out.extend_from_slice(b"\r\n");
    }
}

/// Appends `PUB subject [reply] n\r\npayload\r\n`. Neither subject may hold wildcards.
pub fn publish(
    out: &mut Vec<u8>,
    subject: &str,
    reply: Option<&str>,
    payload: &[u8],
) -> Result<(), SubjectError> {
    validate_subject(subject, false)?;
    if let Some(reply) = reply {
        validate_subject(reply, false)?;
    }
    out.extend_from_slice(b"PUB ");
    out.extend_from_slice(subject.as_bytes());
    if let Some(reply) = reply {
        out.push(b' ');
        out.extend_from_slice(reply.as_bytes());
    }
    // Writing a number into a Vec cannot fail.
    let _ = write!(out, " {}\r\n", payload.len());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// The bytes [`publish`] appends for a payload of `payload_len` bytes, for queue accounting.
pub fn publish_len(subject: &str, reply: Option<&str>, payload_len: usize) -> usize {
    let digits = payload_len.checked_ilog10().unwrap_or(0) as usize + 1;
    let reply = reply.map_or(0, |r| r.len() + 1);
    "PUB ".len() + subject.len() + reply + 1 + digits + 2 + payload_len + 2
}

/// Appends `SUB subject [queue] sid\r\n`. The subject may hold wildcards; a queue group is
/// one token without wildcards.
pub fn subscribe(
    out: &mut Vec<u8>,
    subject: &str,
    queue: Option<&str>,
    sid: u64,
) -> Result<(), SubjectError> {
    validate_subject(subject, true)?;
    if let Some(queue) = queue {
        validate_subject(queue, false)?;
    }
    out.extend_from_slice(b"SUB ");
    out.extend_from_slice(subject.as_bytes());
    if let Some(queue) = queue {
        out.push(b' ');
        out.extend_from_slice(queue.as_bytes());
    }
    let _ = write!(out, " {sid}\r\n");
    Ok(())
}

/// Appends `UNSUB sid [max]\r\n`: with `max`, the server ends the subscription after that
/// many messages in all.
pub fn unsubscribe(out: &mut Vec<u8>, sid: u64, max: Option<u64>) {
    let _ = match max {
        Some(max) => write!(out, "UNSUB {sid} {max}\r\n"),
        None => write!(out, "UNSUB {sid}\r\n"),
    };
}

/// Appends `PING\r\n`.
pub fn ping(out: &mut Vec<u8>) {
    out.extend_from_slice(b"PING\r\n");
}

/// Appends `PONG\r\n`.
pub fn pong(out: &mut Vec<u8>) {
    out.extend_from_slice(b"PONG\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_json() {
        let mut out = Vec::new();
        let mut c = Connect::new("node-1", false);
        c.user = Some("u".into());
        c.pass = Some("p\"w".into());
        c.encode(&mut out);
        let text = std::str::from_utf8(&out).expect("utf-8");
        let json = text
            .strip_prefix("CONNECT ")
            .and_then(|t| t.strip_suffix("\r\n"))
            .expect("framing");
        let v: serde_json::Value = serde_json::from_str(json).expect("json");
        assert_eq!(v["verbose"], false);
        assert_eq!(v["pedantic"], false);
        assert_eq!(v["echo"], false);
        assert_eq!(v["name"], "node-1");
        assert_eq!(v["user"], "u");
        assert_eq!(v["pass"], "p\"w");
        assert!(v.get("auth_token").is_none());
        assert!(!json.contains('\n'));
    }

    #[test]
    fn publish_frames() {
        let mut out = Vec::new();
        publish(&mut out, "a.b", None, b"hi\r\n\0").expect("valid");
        assert_eq!(out, b"PUB a.b 5\r\nhi\r\n\0\r\n");
        assert_eq!(publish_len("a.b", None, 5), out.len());
        out.clear();
        publish(&mut out, "a", Some("r.1"), b"").expect("valid");
        assert_eq!(out, b"PUB a r.1 0\r\n\r\n");
        assert_eq!(publish_len("a", Some("r.1"), 0), out.len());
        assert_eq!(
            publish_len("a", None, 1234567),
            4 + 1 + 1 + 7 + 2 + 1234567 + 2
        );
        out.clear();
        assert_eq!(
            publish(&mut out, "a.*", None, b"x"),
            Err(SubjectError::Wildcard)
        );
        assert_eq!(
            publish(&mut out, "a b", None, b"x"),
            Err(SubjectError::BadByte)
        );
        assert!(out.is_empty(), "a refusal writes nothing");
    }

    #[test]
    fn subscriptions_and_pings() {
        let mut out = Vec::new();
        subscribe(&mut out, "a.>", None, 7).expect("valid");
        subscribe(&mut out, "a.*", Some("workers"), 8).expect("valid");
        unsubscribe(&mut out, 7, None);
        unsubscribe(&mut out, 8, Some(3));
        ping(&mut out);
        pong(&mut out);
        assert_eq!(
            out,
            b"SUB a.> 7\r\nSUB a.* workers 8\r\nUNSUB 7\r\nUNSUB 8 3\r\nPING\r\nPONG\r\n"
        );
        assert_eq!(
            subscribe(&mut out, "a..b", None, 1),
            Err(SubjectError::EmptyToken)
        );
        assert_eq!(
            subscribe(&mut out, "a", Some("q.*"), 1),
            Err(SubjectError::Wildcard)
        );
    }
}
