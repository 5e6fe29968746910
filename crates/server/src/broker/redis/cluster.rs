//! Redis Cluster, the pure part: the `redis+cluster://` URL, the hash slot of a key, the
//! topology in a `CLUSTER SLOTS` reply, redirection errors (`MOVED`, `ASK`, `TRYAGAIN`,
//! `CLUSTERDOWN`), and the assignment of the cluster's masters to the broker's shard table.
//! No sockets, no clock: [`super::topology`] does the asking and applies what these return.
//!
//! Topics live in [`PARTITIONS`] hash-tag partitions (`{pN}`), so the cluster is only ever
//! asked about those 64 slots; the shard table has one place per partition at most, and a
//! master keeps its place while it owns any of them (a failover hands the place of the lost
//! master to the replica that took over its slots).

use crate::redact::Urls;
use clarion_proto::resp::Value;

use super::conn::RedisUrl;
use super::layout::PARTITIONS;

/// Hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// `redis+cluster://[user:pass@]host1:7000,host2:7001[/]`, or `rediss+cluster://` for TLS: the
/// seed nodes the topology is first asked of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterUrl {
    /// The seeds, each with the URL's TLS and credentials.
    pub seeds: Vec<RedisUrl>,
}

impl ClusterUrl {
    /// Parses a cluster URL; `None` if `url` has another scheme.
    pub fn parse(url: &str) -> Option<Result<ClusterUrl, String>> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("redis+cluster://") {
            (false, r)
        } else {
            (true, url.strip_prefix("rediss+cluster://")?)
        };
        Some(Self::parse_rest(url, tls, rest))
    }

    fn parse_rest(url: &str, tls: bool, rest: &str) -> Result<ClusterUrl, String> {
        let (auth, hostpath) = match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        let (hosts, path) = hostpath.split_once('/').unwrap_or((hostpath, ""));
        if !path.is_empty() && path != "0" {
            return Err(format!(
                "{:?}: a Redis Cluster has only database 0 (nothing may follow the nodes)",
                Urls(url)
            ));
        }
        let scheme = if tls { "rediss" } else { "redis" };
        let mut seeds = Vec::new();
        for host in hosts.split(',').map(str::trim) {
            let one = match auth {
                Some(a) => format!("{scheme}://{a}@{host}"),
                None => format!("{scheme}://{host}"),
            };
            let parsed = RedisUrl::parse(&one).map_err(|e| {
                format!(
                    "{:?}: cluster node {}",
                    Urls(url),
                    e.rsplit_once(": ").map_or(e.as_str(), |(_, m)| m)
                )
            })?;
            seeds.push(parsed);
        }
        Ok(ClusterUrl { seeds })
    }

    /// The URL of the node at `addr` (`host:port`), with the seeds' TLS and credentials.
    pub fn node(&self, addr: &str) -> Option<RedisUrl> {
        let mut url = self.seeds.first()?.clone();
        let host = addr.rsplit_once(':').map_or("", |(h, _)| h);
        url.host = host.trim_matches(['[', ']']).to_owned();
        url.addr = addr.to_owned();
        Some(url)
    }
}

/// CRC16-XMODEM (polynomial 0x1021, initial 0), the checksum Redis Cluster hashes keys with.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash slot of `key`: of its hash tag (the bytes between the first `{` and the next `}`)
/// when that is not empty, else of the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let after = key.get(open + 1..)?;
        let len = after.iter().position(|&b| b == b'}')?;
        (len > 0).then(|| after.get(..len)).flatten()
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// The slot of partition `p`'s keys and channels (tag `{pN}`).
pub fn partition_slot(p: u32) -> u16 {
    key_slot(format!("{{p{p}}}").as_bytes())
}

/// A range of slots and the address (`host:port`) of the master serving it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRange {
    pub start: u16,
    pub end: u16,
    pub master: String,
}

/// The ranges in a `CLUSTER SLOTS` reply (`[[start, end, [ip, port, id, ...], replicas...]...]`).
/// A master announced with an empty ip is the node answering: `answered` is its address.
pub fn parse_slots(reply: &Value, answered: &str) -> Result<Vec<SlotRange>, String> {
    let Value::Array(ranges) = reply else {
        return Err(match reply {
            Value::Error(e) => e.clone(),
            other => format!("unexpected answer to CLUSTER SLOTS {other:?}"),
        });
    };
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        let bad = || format!("unexpected range in CLUSTER SLOTS {r:?}");
        let Value::Array(parts) = r else {
            return Err(bad());
        };
        let slot = |i: usize| {
            parts
                .get(i)
                .and_then(Value::as_int)
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n < SLOTS)
        };
        let (Some(start), Some(end)) = (slot(0), slot(1)) else {
            return Err(bad());
        };
        let Some(Value::Array(master)) = parts.get(2) else {
            return Err(bad());
        };
        let ip = master.first().and_then(Value::as_str).ok_or_else(bad)?;
        let port = master
            .get(1)
            .and_then(Value::as_int)
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(bad)?;
        let addr = match ip {
            "" | "?" => {
                let host = answered.rsplit_once(':').map_or(answered, |(h, _)| h);
                format!("{host}:{port}")
            }
            ip if ip.contains(':') => format!("[{ip}]:{port}"),
            ip => format!("{ip}:{port}"),
        };
        if start > end {
            return Err(bad());
        }
        out.push(SlotRange {
            start,
            end,
            master: addr,
        });
    }
    Ok(out)
}

/// Per partition, the address of the master serving its slot; an error names the first
/// partition no master serves (the cluster is incomplete: `CLUSTERDOWN` for its topics).
pub fn partition_owners(ranges: &[SlotRange]) -> Result<Vec<String>, String> {
    (0..PARTITIONS)
        .map(|p| {
            let slot = partition_slot(p);
            ranges
                .iter()
                .find(|r| r.start <= slot && slot <= r.end)
                .map(|r| r.master.clone())
                .ok_or_else(|| format!("no master serves slot {slot} (partition {p})"))
        })
        .collect()
}

/// A redirection or a cluster state in an error reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// `MOVED slot addr`: the slot is served by `addr` from now on.
    Moved { slot: u16, addr: String },
    /// `ASK slot addr`: this one command goes to `addr`, after `ASKING`.
    Ask { slot: u16, addr: String },
    /// `TRYAGAIN`: a multi-key command while its slot migrates; try again shortly.
    TryAgain,
    /// `CLUSTERDOWN`: the cluster cannot serve the slot now.
    Down(String),
}

/// The redirection an error reply carries, if it is one.
pub fn redirect(reply: &Value) -> Option<Redirect> {
    let Value::Error(e) = reply else {
        return None;
    };
    let mut words = e.split(' ');
    let kind = words.next()?;
    let target = |words: &mut std::str::Split<'_, char>| {
        let slot = words.next()?.parse::<u16>().ok().filter(|s| *s < SLOTS)?;
        let addr = words.next().filter(|a| a.contains(':'))?.to_owned();
        Some((slot, addr))
    };
    match kind {
        "MOVED" => target(&mut words).map(|(slot, addr)| Redirect::Moved { slot, addr }),
        "ASK" => target(&mut words).map(|(slot, addr)| Redirect::Ask { slot, addr }),
        "TRYAGAIN" => Some(Redirect::TryAgain),
        "CLUSTERDOWN" => Some(Redirect::Down(e.clone())),
        _ => None,
    }
}

/// Whether an `INFO` reply says cluster mode is on (`cluster_enabled:1`).
pub fn cluster_enabled(info: &str) -> bool {
    info.lines().any(|l| l.trim() == "cluster_enabled:1")
}

/// The shard table after a topology change: `places` holds each place's master address (or
/// `None`), `route` each partition's place; `owners` each partition's master now. A master
/// that still serves partitions keeps its place; a new master takes first the place of a
/// master that is gone and served its partitions (a failover), then any free place; a place
/// whose master serves nothing any more is freed. Returns the new places and route.
pub fn assign(
    places: &[Option<String>],
    route: &[usize],
    owners: &[String],
) -> (Vec<Option<String>>, Vec<usize>) {
    let mut next: Vec<Option<String>> = places
        .iter()
        .map(|a| a.clone().filter(|a| owners.contains(a)))
        .collect();
    let place_of =
        |next: &[Option<String>], addr: &str| next.iter().position(|a| a.as_deref() == Some(addr));
    for (p, owner) in owners.iter().enumerate() {
        if place_of(&next, owner).is_some() {
            continue;
        }
        // The place that served this partition, if its master is gone.
        let previous = route
            .get(p)
            .copied()
            .filter(|&i| next.get(i).is_some_and(Option::is_none))
            .filter(|&i| places.get(i).is_some_and(Option::is_some));
        let free = previous.or_else(|| next.iter().position(Option::is_none));
        match free.and_then(|i| next.get_mut(i)) {
            Some(place) => *place = Some(owner.clone()),
            None => next.push(Some(owner.clone())),
        }
    }
    let new_route = owners
        .iter()
        .map(|o| place_of(&next, o).unwrap_or(0))
        .collect();
    (next, new_route)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // Values from `CLUSTER KEYSLOT` on redis-server 7.0.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{p0}"), 15882);
        assert_eq!(partition_slot(0), 15882);
        assert_eq!(partition_slot(1), 11819);
        assert_eq!(partition_slot(63), 12555);
        assert_eq!(key_slot(b"clarion:{p1}:m:news"), 11819);
        assert_eq!(key_slot(b"clarion:{p1}:news"), key_slot(b"{p1}"));
        // An empty tag hashes the whole key; only the first `{` counts.
        assert_eq!(key_slot(b"a{}b"), crc16(b"a{}b") % SLOTS);
        assert_eq!(key_slot(b"{}{p1}"), crc16(b"{}{p1}") % SLOTS);
        assert_eq!(key_slot(b"x{p1"), crc16(b"x{p1") % SLOTS);
        let all: std::collections::HashSet<u16> = (0..PARTITIONS).map(partition_slot).collect();
        assert_eq!(all.len(), PARTITIONS as usize, "partitions share no slot");
    }

    #[test]
    fn cluster_urls_list_seed_nodes_with_the_urls_tls_and_credentials() {
        let u = ClusterUrl::parse("redis+cluster://h1:7000, h2:7001")
            .unwrap()
            .unwrap();
        let addrs: Vec<&str> = u.seeds.iter().map(|s| s.addr.as_str()).collect();
        assert_eq!(addrs, ["h1:7000", "h2:7001"]);
        assert!(u.seeds.iter().all(|s| !s.tls && s.password.is_none()));
        let u = ClusterUrl::parse("rediss+cluster://me:p@ss@10.0.0.1,[::1]:7002/")
            .unwrap()
            .unwrap();
        assert!(u.seeds.iter().all(|s| s.tls));
        assert_eq!(u.seeds[0].addr, "10.0.0.1:6379");
        assert_eq!(u.seeds[1].host, "::1");
        assert!(u
            .seeds
            .iter()
            .all(|s| s.username.as_deref() == Some("me") && s.password.as_deref() == Some("p@ss")));
        let n = u.node("10.0.0.9:7005").unwrap();
        assert_eq!(
            (n.addr.as_str(), n.host.as_str()),
            ("10.0.0.9:7005", "10.0.0.9")
        );
        assert_eq!(n.password.as_deref(), Some("p@ss"));
        assert!(ClusterUrl::parse("redis://h").is_none());
        assert!(ClusterUrl::parse("redis+cluster://h1/2").unwrap().is_err());
        assert!(ClusterUrl::parse("redis+cluster://h1,").unwrap().is_err());
        assert!(ClusterUrl::parse("redis+cluster://").unwrap().is_err());
    }

    fn bulk(s: &str) -> Value {
        Value::Bulk(s.as_bytes().to_vec())
    }

    fn range(start: i64, end: i64, ip: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Integer(start),
            Value::Integer(end),
            Value::Array(vec![bulk(ip), Value::Integer(port), bulk("id")]),
            Value::Array(vec![bulk(ip), Value::Integer(port + 3), bulk("id2")]),
        ])
    }

    #[test]
    fn cluster_slots_replies_give_ranges_and_masters() {
        let reply = Value::Array(vec![
            range(0, 5460, "127.0.0.1", 7000),
            range(5461, 10922, "", 7001),
            range(10923, 16383, "fd00::1", 7002),
        ]);
        let r = parse_slots(&reply, "10.1.1.1:7000").unwrap();
        assert_eq!(r[0].master, "127.0.0.1:7000");
        assert_eq!(r[1].master, "10.1.1.1:7001");
        assert_eq!(r[2].master, "[fd00::1]:7002");
        assert_eq!((r[2].start, r[2].end), (10923, 16383));
        let owners = partition_owners(&r).unwrap();
        assert_eq!(owners[0], "[fd00::1]:7002"); // slot 15882
        assert!(partition_owners(&r[..2]).unwrap_err().contains("slot"));
        let refused = Value::Error("ERR This instance has cluster support disabled".into());
        assert!(parse_slots(&refused, "h:1")
            .unwrap_err()
            .contains("disabled"));
        assert!(parse_slots(&Value::Array(vec![range(5, 4, "h", 1)]), "h:1").is_err());
        assert!(parse_slots(&Value::Array(vec![range(0, 16384, "h", 1)]), "h:1").is_err());
        assert!(parse_slots(&Value::Array(vec![Value::Integer(1)]), "h:1").is_err());
        assert!(parse_slots(&Value::Nil, "h:1").is_err());
    }

    #[test]
    fn redirections_are_read_from_errors() {
        let e = |s: &str| Value::Error(s.into());
        assert_eq!(
            redirect(&e("MOVED 3999 127.0.0.1:6381")),
            Some(Redirect::Moved {
                slot: 3999,
                addr: "127.0.0.1:6381".into()
            })
        );
        assert_eq!(
            redirect(&e("ASK 12 [::1]:7000")),
            Some(Redirect::Ask {
                slot: 12,
                addr: "[::1]:7000".into()
            })
        );
        assert_eq!(
            redirect(&e(
                "TRYAGAIN Multiple keys request during rehashing of slot"
            )),
            Some(Redirect::TryAgain)
        );
        assert!(matches!(
            redirect(&e("CLUSTERDOWN The cluster is down")),
            Some(Redirect::Down(_))
        ));
        assert_eq!(redirect(&e("MOVED x h:1")), None);
        assert_eq!(redirect(&e("MOVED 16384 h:1")), None);
        assert_eq!(redirect(&e("MOVED 1")), None);
        assert_eq!(redirect(&e("NOSCRIPT")), None);
        assert_eq!(redirect(&bulk("MOVED 1 h:1")), None);
        assert!(cluster_enabled("# Cluster\r\ncluster_enabled:1\r\n"));
        assert!(!cluster_enabled("# Cluster\r\ncluster_enabled:0\r\n"));
    }

    #[test]
    fn masters_keep_their_places_and_a_promoted_replica_takes_the_lost_ones() {
        let s = |a: &str| Some(a.to_owned());
        let owners = |v: &[&str]| -> Vec<String> { v.iter().map(|a| (*a).to_owned()).collect() };
        // First topology: places in order of first appearance.
        let (places, route) = assign(&vec![None; 4], &[0; 4], &owners(&["a", "b", "a", "c"]));
        assert_eq!(places, vec![s("a"), s("b"), s("c"), None]);
        assert_eq!(route, vec![0, 1, 0, 2]);
        // Failover: a is gone, d took its slots and takes its place; others stay put.
        let (places, route) = assign(&places, &route, &owners(&["d", "b", "d", "c"]));
        assert_eq!(places, vec![s("d"), s("b"), s("c"), None]);
        assert_eq!(route, vec![0, 1, 0, 2]);
        // Resharding: partition 2 moves to b; d keeps place 0.
        let (places, route) = assign(&places, &route, &owners(&["d", "b", "b", "c"]));
        assert_eq!(places, vec![s("d"), s("b"), s("c"), None]);
        assert_eq!(route, vec![0, 1, 1, 2]);
        // A new master e takes partition 3 from c, which serves nothing any more: c's place
        // is the one that served partition 3, so e takes it.
        let (places, route) = assign(&places, &route, &owners(&["d", "b", "b", "e"]));
        assert_eq!(places, vec![s("d"), s("b"), s("e"), None]);
        assert_eq!(route, vec![0, 1, 1, 2]);
        // A new master alongside the others takes a free place.
        let (places, route) = assign(&places, &route, &owners(&["d", "f", "b", "e"]));
        assert_eq!(places, vec![s("d"), s("b"), s("e"), s("f")]);
        assert_eq!(route, vec![0, 3, 1, 2]);
    }
}
