//! Redis behind Sentinel: where the master is, and following it through a failover.
//!
//! An [`Endpoint`] is the Redis one shard of the broker talks to: a fixed address
//! (`redis://`, `rediss://`), or the master a set of sentinels names
//! (`redis+sentinel://h1:26379,h2:26379/mymaster`). Connections are opened through it, so
//! every user (the publishers' pool, the subscriber connection, the webhooks' occupancy) finds
//! the current master the same way: the sentinels are asked in order
//! (`SENTINEL get-master-addr-by-name`), and the address they give is used only once `ROLE`
//! there says `master`. The master is asked again whenever a connection to it fails or a
//! command is refused with `READONLY`/`LOADING` ([`Endpoint::lost`]), and a watcher thread per
//! endpoint hears `+switch-master` from a sentinel ([`Endpoint::watch`]). A change of master
//! bumps the endpoint's generation; connections of an older generation are dropped by their
//! users. It does not touch topics or scripts: the reader re-subscribes its topics on its new
//! connection and scripts are loaded again through the `NOSCRIPT` path.
//!
//! The parsers of the URL and of the sentinels' replies are pure (bytes in, values out) and
//! tested below.

use crate::redact::Urls;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clarion_proto::resp::Value;

use super::conn::{Conn, LinkError, RedisUrl};
use super::stream::RedisTls;
use crate::hub::lock;

/// The port of a sentinel named without one (Sentinel's default).
const SENTINEL_PORT: u16 = 26379;

/// How long the watcher waits for a message before looking at the stop flag; also its pause
/// before trying the next sentinel after one failed.
const WATCH_TICK: Duration = Duration::from_millis(250);

/// How long the watcher's sentinel may be silent before it is asked with a `PING`.
const WATCH_PING_AFTER: Duration = Duration::from_secs(1);

/// Credentials for the sentinels themselves (`redis_sentinel_username`,
/// `redis_sentinel_password`): the URL's are Redis's. `Debug` shows the password as `***`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SentinelAuth {
    /// For `AUTH` with an ACL user.
    pub username: Option<String>,
    /// For `AUTH` (`requirepass` in sentinel.conf).
    pub password: Option<String>,
}

impl std::fmt::Debug for SentinelAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let SentinelAuth { username, password } = self;
        f.debug_struct("SentinelAuth")
            .field("username", username)
            .field(
                "password",
                &password.as_ref().map(|_| crate::redact::HIDDEN),
            )
            .finish()
    }
}

impl SentinelAuth {
    /// The `redis_sentinel_*` settings.
    pub fn for_config(config: &crate::config::Config) -> SentinelAuth {
        SentinelAuth {
            username: config.redis_sentinel_username.clone(),
            password: config.redis_sentinel_password.clone(),
        }
    }
}

/// `redis+sentinel://[user:pass@]host1:26379,host2:26379/NAME[/db]`, or `rediss+sentinel://`
/// for TLS to the sentinels and to Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// The sentinels, in the order they are asked (no credentials: see [`SentinelAuth`]).
    pub sentinels: Vec<RedisUrl>,
    /// The master's name in the sentinels' configuration.
    pub master: String,
    /// Redis's TLS, credentials and database; its address is whatever the sentinels name.
    pub redis: RedisUrl,
}

impl SentinelUrl {
    /// Parses a sentinel URL; `None` if `url` has another scheme.
    pub fn parse(url: &str) -> Option<Result<SentinelUrl, String>> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("redis+sentinel://") {
            (false, r)
        } else {
            (true, url.strip_prefix("rediss+sentinel://")?)
        };
        Some(Self::parse_rest(url, tls, rest))
    }

    fn parse_rest(url: &str, tls: bool, rest: &str) -> Result<SentinelUrl, String> {
        let (auth, hostpath) = match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        let (hosts, path) = hostpath.split_once('/').unwrap_or((hostpath, ""));
        let (master, db) = path.split_once('/').unwrap_or((path, ""));
        if master.is_empty() {
            return Err(format!(
                "{:?}: name the master after the sentinels: \
                 redis+sentinel://host1:26379,host2:26379/mymaster",
                Urls(url)
            ));
        }
        let scheme = if tls { "rediss" } else { "redis" };
        let mut sentinels = Vec::new();
        for host in hosts.split(',').map(str::trim) {
            let has_port = host
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
                && !host.ends_with(']');
            let one = if has_port {
                format!("{scheme}://{host}")
            } else {
                format!("{scheme}://{host}:{SENTINEL_PORT}")
            };
            let parsed =
                RedisUrl::parse(&one).map_err(|e| format!("{:?}: sentinel {e}", Urls(url)))?;
            sentinels.push(parsed);
        }
        let with_auth = match auth {
            Some(a) => format!("{scheme}://{a}@placeholder/{db}"),
            None => format!("{scheme}://placeholder/{db}"),
        };
        let mut redis = RedisUrl::parse(&with_auth).map_err(|e| {
            // The placeholder host is ours; the error is about the database.
            format!(
                "{:?}: {}",
                Urls(url),
                e.rsplit_once(": ").map_or(e.as_str(), |(_, m)| m)
            )
        })?;
        redis.addr.clear();
        redis.host.clear();
        Ok(SentinelUrl {
            sentinels,
            master: master.to_owned(),
            redis,
        })
    }
}

/// Splits the `broker` setting into URLs: a comma starts a new URL only where one begins
/// (`scheme://`), so a sentinel URL keeps its list of sentinels.
pub fn split_urls(setting: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for piece in setting.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match out.last_mut() {
            Some(last) if !piece.contains("://") => {
                last.push(',');
                last.push_str(piece);
            }
            _ => out.push(piece.to_owned()),
        }
    }
    out
}

/// Whether `url` names a Redis broker (any of the six schemes).
pub fn is_redis_url(url: &str) -> bool {
    [
        "redis://",
        "rediss://",
        "redis+sentinel://",
        "rediss+sentinel://",
        "redis+cluster://",
        "rediss+cluster://",
    ]
    .iter()
    .any(|s| url.trim_start().starts_with(s))
}

/// The address in a reply to `SENTINEL get-master-addr-by-name`; `None` when the sentinel
/// knows no master of that name (a nil reply), an error for anything else.
pub fn master_addr(reply: &Value) -> Result<Option<String>, String> {
    match reply {
        Value::Nil => Ok(None),
        Value::Array(parts) => {
            let ip = parts.first().and_then(Value::as_str);
            let port = parts
                .get(1)
                .and_then(Value::as_str)
                .and_then(|p| p.parse::<u16>().ok());
            match (ip, port, parts.len()) {
                (Some(ip), Some(port), 2) if !ip.is_empty() => Ok(Some(join_addr(ip, port))),
                _ => Err(format!("unexpected answer {reply:?}")),
            }
        }
        Value::Error(e) => Err(e.clone()),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

/// The role in a reply to `ROLE` (`master`, `slave`, `sentinel`).
pub fn role(reply: &Value) -> Result<&str, String> {
    match reply {
        Value::Array(parts) => parts
            .first()
            .and_then(Value::as_str)
            .ok_or_else(|| format!("unexpected answer to ROLE {reply:?}")),
        Value::Error(e) => Err(e.clone()),
        other => Err(format!("unexpected answer to ROLE {other:?}")),
    }
}

/// The new address in a `+switch-master` message (`NAME OLDIP OLDPORT NEWIP NEWPORT`) if it
/// is about `master`.
pub fn switched_to(payload: &[u8], master: &str) -> Option<String> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut words = text.split(' ');
    if words.next()? != master {
        return None;
    }
    let (_, _, ip, port) = (words.next()?, words.next()?, words.next()?, words.next()?);
    Some(join_addr(ip, port.parse().ok()?))
}

/// `ip:port`, with brackets around an IPv6 address.
fn join_addr(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// The Redis one shard of the broker talks to.
pub struct Endpoint {
    kind: Kind,
    /// The replication id (`master_replid`) of the server the last connection reached: in a
    /// Redis Cluster, topics migrated from this master keep their epoch (docs/cluster.md).
    replid: Mutex<String>,
}

enum Kind {
    Fixed(RedisUrl),
    Sentinel(Box<Sentinel>),
    /// One master of a Redis Cluster, wherever the topology puts this place of the shard
    /// table (`None`: the place is free). See [`super::topology`].
    Cluster(Box<ClusterPlace>),
}

/// A place of the shard table in a Redis Cluster.
struct ClusterPlace {
    master: Mutex<Option<RedisUrl>>,
    /// Bumped when the place gets another master.
    generation: AtomicU64,
}

struct Sentinel {
    url: SentinelUrl,
    auth: SentinelAuth,
    master: Mutex<Master>,
    /// Bumped when the master's address changes; connections remember the one they were
    /// opened under.
    generation: AtomicU64,
}

/// What this node knows of the master.
#[derive(Default)]
struct Master {
    /// The master to connect to; `None` once a connection to it failed (ask again).
    url: Option<RedisUrl>,
    /// The last master's address, for the log line of a change.
    last: Option<String>,
    /// When a connection to the last master first failed: the failover's duration, as this
    /// node saw it, runs from there.
    lost_at: Option<Instant>,
}

impl Endpoint {
    /// One URL of the `broker` setting.
    pub fn parse(url: &str, auth: &SentinelAuth) -> Result<Endpoint, String> {
        let kind = match SentinelUrl::parse(url) {
            Some(s) => Kind::Sentinel(Box::new(Sentinel {
                url: s?,
                auth: auth.clone(),
                master: Mutex::new(Master::default()),
                generation: AtomicU64::new(0),
            })),
            None => Kind::Fixed(RedisUrl::parse(url)?),
        };
        Ok(Endpoint {
            kind,
            replid: Mutex::new(String::new()),
        })
    }

    /// A free place of a Redis Cluster's shard table.
    pub fn cluster_place() -> Endpoint {
        Endpoint {
            kind: Kind::Cluster(Box::new(ClusterPlace {
                master: Mutex::new(None),
                generation: AtomicU64::new(0),
            })),
            replid: Mutex::new(String::new()),
        }
    }

    /// Gives a cluster place another master (or frees it); `true` if that changed it.
    pub fn set_master(&self, url: Option<RedisUrl>) -> bool {
        let Kind::Cluster(c) = &self.kind else {
            return false;
        };
        let mut m = lock(&c.master);
        if m.as_ref().map(|u| &u.addr) == url.as_ref().map(|u| &u.addr) {
            return false;
        }
        *m = url;
        lock(&self.replid).clear();
        c.generation.fetch_add(1, Relaxed);
        true
    }

    /// The address of a cluster place's master.
    pub fn master_addr(&self) -> Option<String> {
        match &self.kind {
            Kind::Cluster(c) => lock(&c.master).as_ref().map(|u| u.addr.clone()),
            Kind::Fixed(u) => Some(u.addr.clone()),
            Kind::Sentinel(_) => None,
        }
    }

    /// Whether there is a server to connect to (a free cluster place has none).
    pub fn assigned(&self) -> bool {
        match &self.kind {
            Kind::Cluster(c) => lock(&c.master).is_some(),
            _ => true,
        }
    }

    /// The replication id the last connection found (empty if unknown).
    pub fn replid(&self) -> String {
        lock(&self.replid).clone()
    }

    /// What logs call it: `host:port`, or `sentinel master NAME`.
    pub fn label(&self) -> String {
        match &self.kind {
            Kind::Fixed(u) => u.addr.clone(),
            Kind::Sentinel(s) => format!("sentinel master {}", s.url.master),
            Kind::Cluster(c) => match lock(&c.master).as_ref() {
                Some(u) => format!("cluster master {}", u.addr),
                None => "cluster (no master here)".to_owned(),
            },
        }
    }

    /// Whether a watcher thread should follow `+switch-master`.
    pub fn is_sentinel(&self) -> bool {
        matches!(self.kind, Kind::Sentinel(_))
    }

    /// Changes with the master's address (always 0 for a fixed address).
    pub fn generation(&self) -> u64 {
        match &self.kind {
            Kind::Fixed(_) => 0,
            Kind::Sentinel(s) => s.generation.load(Relaxed),
            Kind::Cluster(c) => c.generation.load(Relaxed),
        }
    }

    /// Opens a connection to the master (set up as [`Conn::open`] does), with the generation
    /// it belongs to. Behind Sentinel: to the master known, verified with `ROLE`; failing
    /// that, to the one the sentinels name now.
    pub fn open(
        &self,
        tls: Option<&RedisTls>,
        timeout: Duration,
        name: &str,
    ) -> Result<(Conn, u64), LinkError> {
        let (conn, generation) = self.open_inner(tls, timeout, name)?;
        if !conn.replid().is_empty() {
            *lock(&self.replid) = conn.replid().to_owned();
        }
        Ok((conn, generation))
    }

    fn open_inner(
        &self,
        tls: Option<&RedisTls>,
        timeout: Duration,
        name: &str,
    ) -> Result<(Conn, u64), LinkError> {
        let s = match &self.kind {
            Kind::Fixed(url) => return Ok((Conn::open(url, tls, timeout, name)?, 0)),
            Kind::Cluster(c) => {
                let generation = c.generation.load(Relaxed);
                let url = lock(&c.master).clone().ok_or(LinkError::Down)?;
                return Ok((Conn::open(&url, tls, timeout, name)?, generation));
            }
            Kind::Sentinel(s) => s,
        };
        let generation = s.generation.load(Relaxed);
        let known = lock(&s.master).url.clone();
        if let Some(url) = known {
            match open_master(&url, tls, timeout, name) {
                Ok(c) => return Ok((c, generation)),
                Err(_) => self.lost(generation),
            }
        }
        let url = s.discover(tls, timeout, name)?;
        let conn = open_master(&url, tls, timeout, name)?;
        Ok((conn, s.adopt(url, "asked the sentinels")))
    }

    /// A connection of `generation` failed, or the server refused a write as a replica: the
    /// next connection asks the sentinels again.
    pub fn lost(&self, generation: u64) {
        if let Kind::Sentinel(s) = &self.kind {
            let mut m = lock(&s.master);
            if s.generation.load(Relaxed) == generation && m.url.is_some() {
                m.url = None;
                m.lost_at.get_or_insert_with(Instant::now);
            }
        }
    }

    /// Follows `+switch-master` on the sentinels (in turn, while one fails) until `stop`;
    /// `moved` is called after each change of master this node learns of this way.
    pub fn watch(
        &self,
        tls: Option<&RedisTls>,
        timeout: Duration,
        name: &str,
        stop: &AtomicBool,
        moved: &dyn Fn(),
    ) {
        let Kind::Sentinel(s) = &self.kind else {
            return;
        };
        let mut next = 0usize;
        while !stop.load(Relaxed) {
            let Some(at) = s.url.sentinels.get(next % s.url.sentinels.len().max(1)) else {
                return;
            };
            next += 1;
            let result = s.listen(at, tls, timeout, name, stop, moved);
            if let Err(e) = result {
                if !stop.load(Relaxed) {
                    crate::log::warn(format_args!(
                        "broker sentinel {}: {e}; watching the next sentinel",
                        at.addr
                    ));
                    std::thread::sleep(WATCH_TICK);
                }
            }
        }
    }
}

impl Sentinel {
    /// A sentinel's URL with the sentinels' credentials.
    fn with_auth(&self, at: &RedisUrl) -> RedisUrl {
        let mut url = at.clone();
        url.username.clone_from(&self.auth.username);
        url.password.clone_from(&self.auth.password);
        url
    }

    /// Redis's URL at `addr` (`ip:port`, as [`join_addr`] writes it).
    fn master_url(&self, addr: String) -> RedisUrl {
        let mut url = self.url.redis.clone();
        let host = addr.rsplit_once(':').map_or("", |(h, _)| h);
        url.host = host.trim_matches(['[', ']']).to_owned();
        url.addr = addr;
        url
    }

    /// Asks the sentinels in order where the master is; the first that knows answers.
    fn discover(
        &self,
        tls: Option<&RedisTls>,
        timeout: Duration,
        name: &str,
    ) -> Result<RedisUrl, LinkError> {
        let ask = [vec![
            b"SENTINEL".to_vec(),
            b"get-master-addr-by-name".to_vec(),
            self.url.master.as_bytes().to_vec(),
        ]];
        let mut why = Vec::new();
        for at in &self.url.sentinels {
            let reply =
                Conn::open(&self.with_auth(at), tls, timeout, name).and_then(|mut c| c.call(&ask));
            match reply.as_deref().map(|r| r.first().map(master_addr)) {
                Ok(Some(Ok(Some(addr)))) => return Ok(self.master_url(addr)),
                Ok(Some(Ok(None))) => why.push(format!(
                    "{}: no master named {:?}",
                    at.addr, self.url.master
                )),
                Ok(Some(Err(e))) => why.push(format!("{}: {e}", at.addr)),
                Ok(None) => why.push(format!("{}: no answer", at.addr)),
                Err(LinkError::Refused(e)) => why.push(format!("{}: {e}", at.addr)),
                Err(e) => why.push(format!("{}: {e}", at.addr)),
            }
        }
        Err(LinkError::NoMaster(format!(
            "no sentinel names the master {:?} ({})",
            self.url.master,
            why.join("; ")
        )))
    }

    /// Makes `url` the master; returns the generation. A new address bumps the generation
    /// and logs the change once, with how long this node was without a master.
    fn adopt(&self, url: RedisUrl, how: &str) -> u64 {
        let mut m = lock(&self.master);
        let changed = m.last.as_deref() != Some(url.addr.as_str());
        if changed {
            if let Some(old) = &m.last {
                let took = match m.lost_at {
                    Some(t) => format!(
                        "{} ms after the old one first failed here",
                        t.elapsed().as_millis()
                    ),
                    None => "no failure seen here before".to_owned(),
                };
                crate::log::warn(format_args!(
                    "broker sentinel master {}: failover {old} -> {} ({how}; {took})",
                    self.url.master, url.addr
                ));
            }
            self.generation.fetch_add(1, Relaxed);
        }
        m.last = Some(url.addr.clone());
        m.url = Some(url);
        m.lost_at = None;
        self.generation.load(Relaxed)
    }

    /// One sentinel's `+switch-master` messages, until its connection fails or `stop`.
    fn listen(
        &self,
        at: &RedisUrl,
        tls: Option<&RedisTls>,
        timeout: Duration,
        name: &str,
        stop: &AtomicBool,
        moved: &dyn Fn(),
    ) -> Result<(), LinkError> {
        let mut conn = Conn::open(&self.with_auth(at), tls, timeout, name)?;
        conn.send(&[vec![b"SUBSCRIBE".as_slice(), b"+switch-master".as_slice()]])?;
        conn.set_read_timeout(WATCH_TICK)?;
        // A sentinel that stops answering (stalled, or a dead host whose socket stays open) is
        // noticed by a PING after a quiet second, and left when no answer comes in `timeout`.
        let mut heard = Instant::now();
        let mut pinged = false;
        while !stop.load(Relaxed) {
            let msg = match conn.read() {
                Ok(v) => v,
                Err(LinkError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    let quiet = heard.elapsed();
                    if pinged && quiet >= WATCH_PING_AFTER + timeout {
                        return Err(LinkError::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no answer to PING",
                        )));
                    }
                    if !pinged && quiet >= WATCH_PING_AFTER {
                        conn.send(&[vec![b"PING".as_slice()]])?;
                        pinged = true;
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            heard = Instant::now();
            pinged = false;
            let Value::Array(parts) = msg else {
                continue;
            };
            let payload = match (parts.first().and_then(Value::as_bytes), parts.get(2)) {
                (Some(b"message"), Some(p)) => p.as_bytes().unwrap_or_default(),
                _ => continue,
            };
            if let Some(addr) = switched_to(payload, &self.url.master) {
                let url = self.master_url(addr);
                let before = self.generation.load(Relaxed);
                if self.adopt(url, "announced by a sentinel") != before {
                    moved();
                }
            }
        }
        Ok(())
    }
}

/// Connects to `url` and checks that it is a master (after a failover the old master comes
/// back as a replica, and a replica refuses the scripts' writes).
fn open_master(
    url: &RedisUrl,
    tls: Option<&RedisTls>,
    timeout: Duration,
    name: &str,
) -> Result<Conn, LinkError> {
    let mut conn = Conn::open(url, tls, timeout, name)?;
    let reply = conn.call(&[vec![b"ROLE".to_vec()]])?;
    match reply.first().map(role) {
        Some(Ok("master")) => Ok(conn),
        Some(Ok(other)) => Err(LinkError::Refused(format!(
            "{} is a {other}, not the master (asking the sentinels again)",
            url.addr
        ))),
        Some(Err(e)) => Err(LinkError::Refused(format!("{}: {e}", url.addr))),
        None => Err(LinkError::Down),
    }
}

/// Whether a reply says the server is not (or not yet) a usable master: the connection is
/// dropped and the sentinels asked again.
pub fn not_master(reply: &Value) -> bool {
    matches!(reply, Value::Error(e) if e.starts_with("READONLY") || e.starts_with("LOADING"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sentinel_urls_list_sentinels_the_master_and_redis_settings() {
        let u = SentinelUrl::parse("redis+sentinel://h1:26380,h2/mymaster")
            .unwrap()
            .unwrap();
        let addrs: Vec<&str> = u.sentinels.iter().map(|s| s.addr.as_str()).collect();
        assert_eq!(addrs, ["h1:26380", "h2:26379"]);
        assert_eq!(u.master, "mymaster");
        assert_eq!(
            (u.redis.tls, u.redis.db, u.redis.password),
            (false, 0, None)
        );
        let u = SentinelUrl::parse("rediss+sentinel://me:p@ss@10.0.0.1,[::1]:26381/m1/3")
            .unwrap()
            .unwrap();
        assert!(u.redis.tls && u.sentinels.iter().all(|s| s.tls));
        assert_eq!(u.sentinels[1].addr, "[::1]:26381");
        assert_eq!(u.sentinels[1].host, "::1");
        assert_eq!(u.redis.username.as_deref(), Some("me"));
        assert_eq!(u.redis.password.as_deref(), Some("p@ss"));
        assert!(u.sentinels.iter().all(|s| s.password.is_none()));
        assert_eq!((u.master.as_str(), u.redis.db), ("m1", 3));
        assert!(SentinelUrl::parse("redis://h").is_none());
        assert!(SentinelUrl::parse("redis+sentinel://h1,h2")
            .unwrap()
            .is_err());
        assert!(SentinelUrl::parse("redis+sentinel://h1/").unwrap().is_err());
        assert!(SentinelUrl::parse("redis+sentinel://h1/m/x")
            .unwrap()
            .is_err());
        assert!(SentinelUrl::parse("redis+sentinel://h1,/m")
            .unwrap()
            .is_err());
    }

    #[test]
    fn broker_lists_keep_a_sentinel_urls_commas() {
        assert_eq!(
            split_urls("redis+sentinel://a:1, b:2/m,redis://c:3 ,rediss://d"),
            ["redis+sentinel://a:1,b:2/m", "redis://c:3", "rediss://d"]
        );
        assert!(is_redis_url("rediss+sentinel://a/m") && !is_redis_url("nats://a"));
    }

    #[test]
    fn discovery_replies_give_the_address_or_say_why_not() {
        let bulk = |s: &str| Value::Bulk(s.as_bytes().to_vec());
        let reply = Value::Array(vec![bulk("127.0.0.1"), bulk("6380")]);
        assert_eq!(
            master_addr(&reply).unwrap().as_deref(),
            Some("127.0.0.1:6380")
        );
        let reply = Value::Array(vec![bulk("fd00::1"), bulk("6380")]);
        assert_eq!(
            master_addr(&reply).unwrap().as_deref(),
            Some("[fd00::1]:6380")
        );
        assert_eq!(master_addr(&Value::Nil).unwrap(), None);
        assert!(master_addr(&Value::Error("NOAUTH".into())).is_err());
        assert!(master_addr(&Value::Array(vec![bulk("h"), bulk("x")])).is_err());
        assert!(master_addr(&Value::Array(vec![bulk("h")])).is_err());
        assert!(master_addr(&Value::Integer(1)).is_err());
        let master = Value::Array(vec![
            bulk("master"),
            Value::Integer(7),
            Value::Array(vec![]),
        ]);
        assert_eq!(role(&master).unwrap(), "master");
        assert_eq!(role(&Value::Array(vec![bulk("slave")])).unwrap(), "slave");
        assert!(role(&Value::Nil).is_err());
        assert!(not_master(&Value::Error("READONLY You can't write".into())));
        assert!(not_master(&Value::Error("LOADING".into())));
        assert!(!not_master(&Value::Error("NOSCRIPT".into())));
    }

    #[test]
    fn switch_master_messages_name_the_new_address_of_our_master() {
        let msg = b"mymaster 127.0.0.1 7001 127.0.0.1 7002";
        assert_eq!(
            switched_to(msg, "mymaster").as_deref(),
            Some("127.0.0.1:7002")
        );
        assert_eq!(switched_to(msg, "other"), None);
        assert_eq!(switched_to(b"mymaster 127.0.0.1 7001", "mymaster"), None);
        assert_eq!(switched_to(b"mymaster a 1 b x", "mymaster"), None);
    }
}
