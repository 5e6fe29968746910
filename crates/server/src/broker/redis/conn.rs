//! Blocking connections to Redis: the URL, and one connection that sends pipelined commands and
//! reads their replies within a deadline (the pool publishers share is [`super::pool`]). The bytes go
//! over plain TCP or TLS ([`super::stream`]).
//!
//! Every read and write has a timeout (`broker_timeout_ms`), so a stalled Redis costs a caller
//! at most that long; a connection that failed or timed out is dropped, never reused with a
//! reply still owed on it. A new connection is attempted at most once per backoff interval, so
//! a Redis that is down answers callers at once instead of making each wait for a connect.

use crate::redact::Urls;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use clarion_proto::resp::{self, Limits, RespError, Value};

use super::stream::{self, RedisTls, Stream, Writer};

/// Where Redis is: `redis://[user:password@]host:port[/db]`, or `rediss://...` for TLS.
/// `Debug` shows the password as `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// `host:port` (the port defaults to 6379).
    pub addr: String,
    /// The host alone (an IPv6 address without its brackets): the name TLS verifies.
    pub host: String,
    /// `rediss://`: TLS, verified.
    pub tls: bool,
    /// For `AUTH`, when the URL names one.
    pub username: Option<String>,
    /// For `AUTH`.
    pub password: Option<String>,
    /// For `SELECT`.
    pub db: u32,
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let RedisUrl {
            addr,
            host,
            tls,
            username,
            password,
            db,
        } = self;
        f.debug_struct("RedisUrl")
            .field("addr", addr)
            .field("host", host)
            .field("tls", tls)
            .field("username", username)
            .field(
                "password",
                &password.as_ref().map(|_| crate::redact::HIDDEN),
            )
            .field("db", db)
            .finish()
    }
}

impl RedisUrl {
    /// Parses the `broker` setting.
    pub fn parse(url: &str) -> Result<RedisUrl, String> {
        let (tls, rest) = match url.strip_prefix("rediss://") {
            Some(rest) => (true, rest),
            None => (
                false,
                url.strip_prefix("redis://").ok_or_else(|| {
                    format!(
                        "{:?}: a Redis broker URL starts with redis:// or rediss://",
                        Urls(url)
                    )
                })?,
            ),
        };
        let (auth, hostpath) = match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        let (host, db) = match hostpath.split_once('/') {
            Some((h, "")) => (h, 0),
            Some((h, d)) => (
                h,
                d.parse().map_err(|_| {
                    format!("{:?}: the database after / must be a number", Urls(url))
                })?,
            ),
            None => (hostpath, 0),
        };
        if host.is_empty() {
            return Err(format!("{:?}: no host", Urls(url)));
        }
        let has_port = host
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            && !host.ends_with(']');
        let (addr, bare) = if has_port {
            let bare = host.rsplit_once(':').map_or(host, |(h, _)| h);
            (host.to_owned(), bare)
        } else {
            (format!("{host}:6379"), host)
        };
        let bare = bare.trim_start_matches('[').trim_end_matches(']');
        if bare.is_empty() {
            return Err(format!("{:?}: no host", Urls(url)));
        }
        let (username, password) = match auth {
            None => (None, None),
            Some(a) => match a.split_once(':') {
                Some(("", p)) => (None, Some(p.to_owned())),
                Some((u, p)) => (Some(u.to_owned()), Some(p.to_owned())),
                None => (None, Some(a.to_owned())),
            },
        };
        Ok(RedisUrl {
            addr,
            host: bare.to_owned(),
            tls,
            username,
            password,
            db,
        })
    }
}

/// An argument [`Conn::send`] replaces with the replication id of the server it talks to
/// (`master_replid`, empty if unknown): the publish script keeps it with each topic, and a
/// topic last written under another id (a promoted replica, a restarted server) starts a new
/// epoch, since the offsets handed out last there may have been lost.
pub const REPLID_ARG: &[u8] = b"\0clarion:replid";

/// Why a command got no answer. Every variant means the connection is gone.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Redis could not be reached or the connection broke.
    #[error("Redis unreachable: {0}")]
    Io(#[from] io::Error),
    /// Redis sent something that is not RESP.
    #[error("Redis sent a malformed reply: {0}")]
    Protocol(#[from] RespError),
    /// A connection failed recently; the next attempt waits for the backoff.
    #[error("Redis unreachable (retrying)")]
    Down,
    /// Redis refused the connection setup (AUTH, SELECT).
    #[error("Redis refused the connection: {0}")]
    Refused(String),
    /// The TLS handshake or a TLS record failed: the reason says what (the certificate, the
    /// port, the client certificate).
    #[error("{0}")]
    Tls(String),
    /// No sentinel named a usable master: the reason from each.
    #[error("{0}")]
    NoMaster(String),
    /// Sentinel named another master: connections to the old one are dropped.
    #[error("{0}: Sentinel named a new master")]
    Moved(String),
    /// A routed command got no answer (the connection failed, or in a Redis Cluster the
    /// slot kept moving or the cluster is down): the reason.
    #[error("{0}")]
    Routed(String),
}

/// One connection, used by one caller at a time.
pub struct Conn {
    stream: Stream,
    /// With TLS, the verified host: failures of the TLS layer are reported as such.
    tls_host: Option<String>,
    buf: Vec<u8>,
    /// Bytes of `buf` already parsed.
    start: usize,
    limits: Limits,
    /// The server's `master_replid` when the connection was made (see [`REPLID_ARG`]).
    replid: String,
}

impl Conn {
    /// Connects (with TLS for `rediss://`, verified with `tls`), authenticates and selects the
    /// database, within `timeout` per step.
    pub fn open(
        url: &RedisUrl,
        tls: Option<&RedisTls>,
        timeout: Duration,
        name: &str,
    ) -> Result<Conn, LinkError> {
        let addrs: Vec<_> = url.addr.to_socket_addrs()?.collect();
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let stream = stream.ok_or(last)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let stream = match (url.tls, tls) {
            (false, _) => Stream::plain(stream),
            (true, Some(settings)) => {
                Stream::tls(stream, settings, &url.host).map_err(LinkError::Tls)?
            }
            (true, None) => {
                return Err(LinkError::Tls(format!(
                    "{}: rediss:// without TLS settings",
                    url.addr
                )))
            }
        };
        let mut conn = Conn {
            stream,
            tls_host: url.tls.then(|| url.host.clone()),
            buf: Vec::with_capacity(4096),
            start: 0,
            limits: Limits::default(),
            replid: String::new(),
        };
        let mut setup: Vec<Vec<Vec<u8>>> = Vec::new();
        if let Some(p) = &url.password {
            let mut auth = vec![b"AUTH".to_vec()];
            auth.extend(url.username.iter().map(|u| u.as_bytes().to_vec()));
            auth.push(p.as_bytes().to_vec());
            setup.push(auth);
        }
        if url.db != 0 {
            setup.push(vec![b"SELECT".to_vec(), url.db.to_string().into_bytes()]);
        }
        setup.push(vec![
            b"CLIENT".to_vec(),
            b"SETNAME".to_vec(),
            client_name(name).into_bytes(),
        ]);
        setup.push(vec![b"INFO".to_vec(), b"replication".to_vec()]);
        // With TLS 1.3 a server that refuses our client certificate says so after the
        // handshake: the first reply is where that shows.
        let mut replies = conn.call(&setup)?;
        // INFO may be refused (an ACL): the epochs then do not follow failovers.
        if let Some(info) = replies.pop() {
            conn.replid = info
                .as_str()
                .and_then(replid_of)
                .unwrap_or_default()
                .to_owned();
        }
        for reply in replies {
            if let Value::Error(e) = reply {
                return Err(LinkError::Refused(e));
            }
        }
        Ok(conn)
    }

    /// Sends `commands` in one write and reads one reply per command, in order.
    pub fn call<A: AsRef<[u8]>>(&mut self, commands: &[Vec<A>]) -> Result<Vec<Value>, LinkError> {
        self.send(commands)?;
        (0..commands.len()).map(|_| self.read()).collect()
    }

    /// Sends commands without reading their replies (pub/sub mode, where replies come as pushes).
    pub fn send<A: AsRef<[u8]>>(&mut self, commands: &[Vec<A>]) -> Result<(), LinkError> {
        let mut out = Vec::new();
        for c in commands {
            if c.iter().any(|a| a.as_ref() == REPLID_ARG) {
                let args: Vec<&[u8]> = c
                    .iter()
                    .map(|a| match a.as_ref() {
                        REPLID_ARG => self.replid.as_bytes(),
                        other => other,
                    })
                    .collect();
                resp::encode_command(&mut out, &args);
            } else {
                resp::encode_command(&mut out, c);
            }
        }
        self.stream.write_all(&out).map_err(|e| self.io_error(e))
    }

    /// Reads the next value; a read timeout is an error (`WouldBlock`/`TimedOut`).
    pub fn read(&mut self) -> Result<Value, LinkError> {
        loop {
            if let Some(v) = self.parsed()? {
                return Ok(v);
            }
            self.fill()?;
        }
    }

    /// The next value if the buffer already holds it, without reading.
    pub fn parsed(&mut self) -> Result<Option<Value>, LinkError> {
        let pending = self.buf.get(self.start..).unwrap_or_default();
        match resp::parse(pending, &self.limits)? {
            Some((v, used)) => {
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                Ok(Some(v))
            }
            None => Ok(None),
        }
    }

    /// Reads whatever the socket has (waiting up to the read timeout).
    pub fn fill(&mut self) -> Result<(), LinkError> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).map_err(|e| self.io_error(e))?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "Redis closed the connection",
            )
            .into());
        }
        self.buf
            .extend_from_slice(chunk.get(..n).unwrap_or_default());
        Ok(())
    }

    /// The server's `master_replid` when the connection was made (empty if unknown).
    pub fn replid(&self) -> &str {
        &self.replid
    }

    /// Changes the read timeout (the subscriber waits longer than a command does).
    pub fn set_read_timeout(&self, t: Duration) -> io::Result<()> {
        self.stream.set_read_timeout(t)
    }

    /// A handle to write on while another thread reads.
    pub fn writer(&self) -> io::Result<Writer> {
        self.stream.writer()
    }

    /// Closes both directions, waking a thread blocked reading it.
    pub fn shutdown(&self) {
        self.stream.shutdown();
    }

    /// An I/O error, or with TLS the TLS failure it carries (an alert, a bad record).
    fn io_error(&self, e: io::Error) -> LinkError {
        let from_tls = e
            .get_ref()
            .is_some_and(|i| i.downcast_ref::<rustls::Error>().is_some());
        match &self.tls_host {
            Some(host) if from_tls => LinkError::Tls(stream::explain(host, &e)),
            _ => LinkError::Io(e),
        }
    }
}

/// The `master_replid` line of an `INFO replication` answer.
fn replid_of(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|l| l.strip_prefix("master_replid:"))
        .map(str::trim)
}

/// `CLIENT SETNAME` allows no spaces or newlines.
fn client_name(node: &str) -> String {
    let clean: String = node
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect();
    format!("clarion:{clean}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls_name_host_port_auth_and_db() {
        let u = RedisUrl::parse("redis://127.0.0.1:6380").unwrap();
        assert_eq!(u.addr, "127.0.0.1:6380");
        assert_eq!((u.username, u.password, u.db), (None, None, 0));
        let u = RedisUrl::parse("redis://me:s3cr:et@cache/2").unwrap();
        assert_eq!(u.addr, "cache:6379");
        assert_eq!(u.username.as_deref(), Some("me"));
        assert_eq!(u.password.as_deref(), Some("s3cr:et"));
        assert_eq!(u.db, 2);
        let u = RedisUrl::parse("redis://:pw@[::1]:7000/").unwrap();
        assert_eq!(
            (u.addr.as_str(), u.password.as_deref()),
            ("[::1]:7000", Some("pw"))
        );
        assert!(!u.tls);
        assert_eq!(u.host, "::1");
        assert!(RedisUrl::parse("http://x").is_err());
        assert!(RedisUrl::parse("redis://[]:7000").is_err());
        assert!(RedisUrl::parse("redis://").is_err());
        assert!(RedisUrl::parse("redis://h/x").is_err());
    }

    #[test]
    fn rediss_urls_ask_for_tls_and_name_the_host_to_verify() {
        let u = RedisUrl::parse("rediss://default:pw@cache.example.com:6380/1").unwrap();
        assert!(u.tls);
        assert_eq!(
            (u.addr.as_str(), u.host.as_str()),
            ("cache.example.com:6380", "cache.example.com")
        );
        assert_eq!(
            (u.username.as_deref(), u.password.as_deref(), u.db),
            (Some("default"), Some("pw"), 1)
        );
        let u = RedisUrl::parse("rediss://10.0.0.7").unwrap();
        assert_eq!(
            (u.addr.as_str(), u.host.as_str(), u.tls),
            ("10.0.0.7:6379", "10.0.0.7", true)
        );
        let u = RedisUrl::parse("rediss://[fd00::7]:6380").unwrap();
        assert_eq!(
            (u.addr.as_str(), u.host.as_str()),
            ("[fd00::7]:6380", "fd00::7")
        );
        let u = RedisUrl::parse("rediss://[fd00::7]").unwrap();
        assert_eq!(
            (u.addr.as_str(), u.host.as_str()),
            ("[fd00::7]:6379", "fd00::7")
        );
        assert!(RedisUrl::parse("redis://h").is_ok_and(|u| !u.tls));
        assert!(RedisUrl::parse("rediss://").is_err());
        assert!(RedisUrl::parse("redisss://h").is_err());
        assert!(RedisUrl::parse("rediss://h:6380/x").is_err());
    }

    #[test]
    fn the_replication_id_comes_from_info() {
        let info = "# Replication\r\nrole:master\r\nmaster_replid:ab12\r\nmaster_replid2:00\r\n";
        assert_eq!(replid_of(info), Some("ab12"));
        assert_eq!(replid_of("# Sentinel\r\n"), None);
    }

    #[test]
    fn client_names_have_no_spaces() {
        assert_eq!(client_name("a b\n"), "clarion:a_b_");
    }
}
