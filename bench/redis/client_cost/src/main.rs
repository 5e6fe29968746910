//! What the Redis client costs the broker: Clarion's hand-written RESP client (the `Conn` the
//! server's broker uses) against the `redis` crate's synchronous connection, on the broker's
//! own work, against a private `redis-server` this program starts:
//!
//! - **publish**: one call of the broker's publish script per message (`EVALSHA` with the
//!   broker's keys and arguments), one at a time: round-trip latency and the client thread's
//!   CPU per call;
//! - **pipelined publish**: the same, 100 calls per round trip (a batch publish);
//! - **follow**: `SSUBSCRIBE` to 10,000 channels, one command each, pipelined, and every
//!   confirmation read (a node following its topics after a reconnect): client CPU per topic;
//! - **memory**: user-space bytes per open connection (RSS over 1,000 connections).
//!
//! Each measure alternates the two clients over `--repeats` rounds and reports medians.
//!
//!     cargo run --release -- [--messages 20000] [--channels 10000] [--repeats 5]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clarion::broker::redis::conn::{Conn, RedisUrl, REPLID_ARG};
use clarion::broker::redis::{keys, SCRIPT};
use clarion_proto::resp::Value as Resp;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Args {
    messages: usize,
    channels: usize,
    repeats: usize,
}

fn args() -> Res<Args> {
    let mut a = Args {
        messages: 20_000,
        channels: 10_000,
        repeats: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value: usize = it.next().ok_or("a value is missing")?.parse()?;
        match flag.as_str() {
            "--messages" => a.messages = value,
            "--channels" => a.channels = value,
            "--repeats" => a.repeats = value,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(a)
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or_default()
}

struct Redis {
    child: Child,
    port: u16,
    _dir: String,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis() -> Res<Redis> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let dir = format!("/tmp/client-cost-{}", std::process::id());
    std::fs::create_dir_all(&dir)?;
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir", &dir])
        .args(["--maxclients", "4000"])
        .stdout(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("redis-server did not start".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Redis {
        child,
        port,
        _dir: dir,
    })
}

/// The broker's publish call for a message to `topic`, as the server builds it.
fn publish_args(sha: &str, topic: &str, body: &[u8]) -> Vec<Vec<u8>> {
    let [meta, stream, channel] = keys(topic);
    vec![
        b"EVALSHA".to_vec(),
        sha.as_bytes().to_vec(),
        b"2".to_vec(),
        meta.into_bytes(),
        stream.into_bytes(),
        channel.into_bytes(),
        body.to_vec(),
        b"1000".to_vec(),
        b"3600".to_vec(),
        b"epoch".to_vec(),
        b"86400".to_vec(),
        REPLID_ARG.to_vec(),
    ]
}

/// The client under measure.
trait Client {
    fn name(&self) -> &'static str;
    /// Runs `cmds` as one pipeline; `Err` on any error reply.
    fn pipeline(&mut self, cmds: &[Vec<Vec<u8>>]) -> Res<usize>;
}

struct Hand(Conn);

impl Client for Hand {
    fn name(&self) -> &'static str {
        "clarion (hand-written)"
    }
    fn pipeline(&mut self, cmds: &[Vec<Vec<u8>>]) -> Res<usize> {
        let replies = self.0.call(cmds).map_err(|e| e.to_string())?;
        if let Some(Resp::Error(e)) = replies.iter().find(|r| matches!(r, Resp::Error(_))) {
            return Err(e.clone().into());
        }
        Ok(replies.len())
    }
}

struct Rs {
    conn: redis::Connection,
    /// The server's replication id, which Clarion's client puts in place of `REPLID_ARG`.
    replid: Vec<u8>,
}

impl Client for Rs {
    fn name(&self) -> &'static str {
        "redis crate (sync)"
    }
    fn pipeline(&mut self, cmds: &[Vec<Vec<u8>>]) -> Res<usize> {
        let mut pipe = redis::pipe();
        for c in cmds {
            let mut cmd = redis::Cmd::new();
            for a in c {
                if a.as_slice() == REPLID_ARG {
                    cmd.arg(&self.replid);
                } else {
                    cmd.arg(a.as_slice());
                }
            }
            pipe.add_command(cmd);
        }
        let replies: Vec<redis::Value> = pipe.query(&mut self.conn)?;
        Ok(replies.len())
    }
}

fn open_hand(port: u16) -> Res<Hand> {
    let url = RedisUrl::parse(&format!("redis://127.0.0.1:{port}"))?;
    Ok(Hand(
        Conn::open(&url, None, Duration::from_secs(5), "client-cost").map_err(|e| e.to_string())?,
    ))
}

fn open_rs(port: u16) -> Res<Rs> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_connection()?;
    let info: String = redis::cmd("INFO").arg("replication").query(&mut conn)?;
    let replid = info
        .lines()
        .find_map(|l| l.strip_prefix("master_replid:"))
        .unwrap_or_default()
        .trim()
        .as_bytes()
        .to_vec();
    Ok(Rs { conn, replid })
}

/// Per-call latencies and the client's CPU per call, `batch` calls per round trip.
fn publish(c: &mut dyn Client, sha: &str, n: usize, batch: usize) -> Res<(Vec<Duration>, f64)> {
    let body = vec![b'x'; 64];
    let topics: Vec<String> = (0..64).map(|i| format!("cost.{i}")).collect();
    let mut lat = Vec::with_capacity(n / batch + 1);
    let cpu0 = thread_cpu();
    let mut sent = 0;
    while sent < n {
        let cmds: Vec<Vec<Vec<u8>>> = (sent..sent + batch)
            .map(|i| publish_args(sha, &topics[i % topics.len()], &body))
            .collect();
        let t = Instant::now();
        c.pipeline(&cmds)?;
        lat.push(t.elapsed());
        sent += batch;
    }
    let cpu = (thread_cpu() - cpu0).as_secs_f64() * 1e6 / sent as f64;
    Ok((lat, cpu))
}

/// Client CPU per channel to follow `n` channels (and let go of them again).
fn follow(c: &mut dyn Client, n: usize) -> Res<f64> {
    let sub: Vec<Vec<Vec<u8>>> = (0..n)
        .map(|i| {
            vec![
                b"SSUBSCRIBE".to_vec(),
                keys(&format!("room.{i}"))[2].clone().into_bytes(),
            ]
        })
        .collect();
    let unsub: Vec<Vec<Vec<u8>>> = sub
        .iter()
        .map(|c| vec![b"SUNSUBSCRIBE".to_vec(), c[1].clone()])
        .collect();
    let cpu0 = thread_cpu();
    let got = c.pipeline(&sub)?;
    let cpu = (thread_cpu() - cpu0).as_secs_f64() * 1e6 / n as f64;
    c.pipeline(&unsub)?;
    if got != n {
        return Err(format!("{got} confirmations for {n} channels").into());
    }
    Ok(cpu)
}

/// User-space bytes per connection of a client: RSS over `n` open connections.
fn memory(port: u16, n: usize, hand: bool) -> Res<f64> {
    let before = rss_bytes();
    let mut held: Vec<Box<dyn Client>> = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c: Box<dyn Client> = if hand {
            Box::new(open_hand(port)?)
        } else {
            Box::new(open_rs(port)?)
        };
        // Every connection has carried one publish-sized exchange, as a pooled one has.
        c.pipeline(&[vec![b"PING".to_vec()]])?;
        held.push(c);
    }
    let after = rss_bytes();
    drop(held);
    Ok(after.saturating_sub(before) as f64 / n as f64)
}

fn main() -> Res<()> {
    let a = args()?;
    let redis = start_redis()?;
    let port = redis.port;
    let mut loader = open_hand(port)?;
    let sha = match loader
        .0
        .call(&[vec![
            b"SCRIPT".to_vec(),
            b"LOAD".to_vec(),
            SCRIPT.as_bytes().to_vec(),
        ]])
        .map_err(|e| e.to_string())?
        .pop()
    {
        Some(Resp::Bulk(b)) => String::from_utf8(b)?,
        other => return Err(format!("SCRIPT LOAD answered {other:?}").into()),
    };
    // name -> (p50 µs, p99 µs, cpu µs/call, pipelined cpu µs/call, follow cpu µs/channel, bytes/conn)
    let names = ["clarion (hand-written)", "redis crate (sync)"];
    let mut rows: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); 6]; 2];
    for r in 0..a.repeats {
        for k in 0..2 {
            let which = (k + r) % 2; // alternate which client goes first
            let mut c: Box<dyn Client> = if which == 0 {
                Box::new(open_hand(port)?)
            } else {
                Box::new(open_rs(port)?)
            };
            debug_assert_eq!(c.name(), names[which]);
            let (mut lat, cpu) = publish(c.as_mut(), &sha, a.messages, 1)?;
            let (_, cpu_pipe) = publish(c.as_mut(), &sha, a.messages, 100)?;
            let cpu_follow = follow(c.as_mut(), a.channels)?;
            let mem = memory(port, 1000, which == 0)?;
            let row = &mut rows[which];
            row[0].push(percentile(&mut lat, 0.5).as_secs_f64() * 1e6);
            row[1].push(percentile(&mut lat, 0.99).as_secs_f64() * 1e6);
            row[2].push(cpu);
            row[3].push(cpu_pipe);
            row[4].push(cpu_follow);
            row[5].push(mem);
        }
    }
    println!(
        "Redis client cost, medians of {} rounds ({} publishes, {} channels, 1,000 connections)\n",
        a.repeats, a.messages, a.channels
    );
    println!("| client | publish p50 | publish p99 | client CPU per publish | per pipelined publish (100 per trip) | client CPU per followed channel | bytes per connection |");
    println!("|---|---|---|---|---|---|---|");
    let mut json = Vec::new();
    for (name, row) in names.iter().zip(rows) {
        let m: Vec<f64> = row.into_iter().map(median).collect();
        println!(
            "| {name} | {:.1} µs | {:.1} µs | {:.2} µs | {:.2} µs | {:.3} µs | {:.0} B |",
            m[0], m[1], m[2], m[3], m[4], m[5]
        );
        json.push(format!(
            "{{\"client\":\"{name}\",\"publish_p50_us\":{:.1},\"publish_p99_us\":{:.1},\"cpu_per_publish_us\":{:.3},\"cpu_per_pipelined_publish_us\":{:.3},\"cpu_per_followed_channel_us\":{:.4},\"bytes_per_connection\":{:.0}}}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        ));
    }
    println!("\n[{}]", json.join(","));
    Ok(())
}
