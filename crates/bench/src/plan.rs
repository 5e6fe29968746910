//! What to run: the `clarion bench` options, the presets, the connection counts of each step and
//! the topic each connection follows. A plan is data; the coordinator ([`crate::run`]) carries it
//! out and [`crate::scenario`] fills in a preset's shape.

use std::net::SocketAddr;

use anyhow::Context as _;

/// `clarion bench` options.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// A preset: idle (hold connections), burst (100 messages to one topic), ticker (one
    /// message every 2 s), topics (chat rooms: many topics, few subscribers each), churn
    /// (connect and disconnect in cycles, then check the server returns to its baseline),
    /// million, soak, streams (appendable messages: AI token streams, resumed mid-stream).
    #[arg(long, value_enum)]
    pub scenario: Option<Scenario>,
    /// The server's client listener.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub target: SocketAddr,
    /// The server's API listener: host:port or http://host:port[/prefix].
    #[arg(long, default_value = "127.0.0.1:8081", value_parser = crate::publisher::parse_api)]
    pub api: crate::publisher::ApiTarget,
    /// Sample this server process's CPU, memory and open files; a comma-separated list samples
    /// several processes summed (nginx's master and workers, Pushpin's processes).
    #[arg(long, alias = "server-pids", value_delimiter = ',')]
    pub server_pid: Vec<u32>,
    /// Connections to open.
    #[arg(long, short = 'n', default_value_t = 1000)]
    pub connections: usize,
    /// ws, sse or poll.
    #[arg(long, value_enum, default_value = "ws")]
    pub transport: TransportArg,
    /// Topics the connections are spread over.
    #[arg(long, default_value_t = 1)]
    pub topics: usize,
    /// How connections pick topics: uniform (round robin) or skewed (a few popular topics).
    #[arg(long, value_enum, default_value = "uniform")]
    pub distribution: Distribution,
    /// Publishing rounds; each round sends one message to every topic.
    #[arg(long, short = 'm', default_value_t = 100)]
    pub messages: u64,
    /// Message size in bytes.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Milliseconds between rounds (0: as fast as the API accepts).
    #[arg(long, default_value_t = 0)]
    pub interval_ms: u64,
    /// Seconds to hold the connections idle before publishing.
    #[arg(long, default_value_t = 0)]
    pub hold: u64,
    /// New connections per second, all workers together (0: as fast as they complete).
    #[arg(long, default_value_t = 0)]
    pub connect_rate: u32,
    /// Open the connections in steps and measure the server's memory per connection at each,
    /// e.g. `--steps 1000,5000,15000` (the last step replaces --connections).
    #[arg(long, value_delimiter = ',')]
    pub steps: Vec<usize>,
    /// Topic names are this prefix and a number (churn gives each cycle its own, so a server
    /// that replays a topic's history to new subscribers cannot hand one cycle another's).
    #[arg(long, default_value = "bench", hide = true)]
    pub topic_prefix: String,
    /// Connect/disconnect cycles of the churn scenario.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// Worker processes (default: one per 10,000 connections, at least 2; per step with --steps).
    #[arg(long)]
    pub procs: Option<usize>,
    /// Seconds to wait for the last deliveries after publishing.
    #[arg(long, default_value_t = 30)]
    pub drain: u64,
    /// Write the full result here as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Write a self-contained HTML report with plots over time here.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
    /// Connect over TLS to --target, trusting the CA certificates in this PEM file (for
    /// `clarion cert --dev`, its `ca.pem`).
    #[arg(long)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The server name to ask for and verify over TLS.
    #[arg(long, default_value = "localhost")]
    pub tls_name: String,
    /// A text message every WebSocket client sends as soon as it is open: a peer's own
    /// protocol greeting, such as Centrifuge's connect command `{"id":1,"connect":{}}`.
    #[arg(long)]
    pub ws_hello: Option<String>,
    /// Worker processes connect from 127.0.0.B, 127.0.0.B+1, ...: another B keeps this run's
    /// source ports apart from another bench's on the same machine.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=250))]
    pub source_base: u8,
    /// The million scenario without publishing: the connections are held and ping once per
    /// --interval-ms, nothing else (the Raspberry Pi seed's "a million sockets pinged every
    /// 16 s": `--interval-ms 16000`).
    #[arg(long)]
    pub pings_only: bool,
    /// Sample this broker process (redis-server) too: its CPU and memory are reported apart
    /// (the million scenario).
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// Subscribe over HTTP/2: SSE streams (`--transport sse`) or WebSockets (`ws`, RFC 8441's
    /// extended CONNECT) on connections that ALPN made h2 (with --tls-ca) or that start with
    /// the h2c preface (prior knowledge, clear text). -n stays the number of subscribers
    /// (streams).
    #[arg(long)]
    pub http2: bool,
    /// With --http2, streams per connection: `-n 15000 --streams-per-conn 100` opens 150
    /// connections.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub streams_per_conn: u32,
    /// Soak: seconds of publishing (the processes killed and restarted meanwhile are the
    /// caller's: `bench/soak.sh`).
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Soak: mean life of a connection in seconds (each is uniform in half to one and a half
    /// times this); at its end the client closes and reconnects with its last id.
    #[arg(long, default_value_t = 60)]
    pub life: u64,
    /// Soak: messages published per second, all topics together.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Soak: the transports clients use, in turn (WebSocket with `clarion.v1` resuming with
    /// `since=`, SSE resuming with `Last-Event-ID`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ws,sse")]
    pub soak_transport: Vec<crate::soak_life::SoakTransport>,
    /// Soak: the share of clients, in percent, that connect as browsers and Clarion's own
    /// clients do (the rest use --soak-transport): permessage-deflate WebSockets subscribing
    /// in-band with a compressed message, and HTTP/2 connections carrying --soak-h2-streams SSE
    /// streams each; over TLS 1.3 too for half of them when --tls-ca and --tls-target are
    /// given.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub soak_browser_share: u8,
    /// Soak: SSE streams on each HTTP/2 client's connection.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub soak_h2_streams: u32,
    /// Soak: the server's TLS listener, for the TLS clients of --soak-browser-share (with
    /// --tls-ca).
    #[arg(long)]
    pub tls_target: Option<std::net::SocketAddr>,
    /// Give every WebSocket and SSE connection a token of its own identity (`sub`), signed
    /// HS256 with this secret (the server's `auth_secret`): each is then a presence member.
    #[arg(long)]
    pub jwt_secret: Option<String>,
    /// Streams: fragments per stream (4 to 8 bytes each); --topics is the number of streams,
    /// one topic each.
    #[arg(long, default_value_t = 400)]
    pub fragments: usize,
    /// Streams: fragments a second per stream.
    #[arg(long, default_value_t = 50.0)]
    pub fragment_rate: f64,
    /// Streams: subscribers (clarion.v1 WebSockets) per stream.
    #[arg(long, default_value_t = 5)]
    pub subscribers: usize,
    /// Streams: subscribers that close at a random fragment and resume from the last id they
    /// saw, each checked to get the text so far as one message, then the rest exactly.
    #[arg(long, default_value_t = 100)]
    pub resumers: usize,
    /// Streams: kept-alive API connections publishing, each paced over its share of the
    /// streams.
    #[arg(long, default_value_t = 8)]
    pub publishers: usize,
    /// Streams: fragments (or plain messages) a publisher sends per request: 1 publishes each
    /// with its own `POST /publish/{topic}`, more send that many streams' fragments in one
    /// `POST /publish` batch.
    #[arg(long, default_value_t = 1)]
    pub fragment_batch: usize,
    /// Streams: the subscribers offer permessage-deflate as browsers and Clarion's clients do,
    /// and inflate what the server compresses; resume bytes are then counted as received.
    #[arg(long)]
    pub deflate: bool,
    /// Streams: stream and plain phase pairs, in alternating order (the CPU ratio is their
    /// median).
    #[arg(long, default_value_t = 3)]
    pub repeats: u32,
    /// Streams: the seed of the fragments and of who resumes where.
    #[arg(long, default_value_t = 52)]
    pub seed: u64,
}

impl BenchArgs {
    /// Whether the options fit together: HTTP/2 carries SSE streams and WebSockets, and the
    /// million scenario speaks HTTP/1.1.
    pub fn check_http2(&self) -> anyhow::Result<()> {
        if self.http2 && self.transport == TransportArg::Poll {
            anyhow::bail!(
                "--http2 opens SSE streams or WebSockets (RFC 8441): use it with --transport sse or ws"
            );
        }
        if self.http2 && self.scenario == Some(Scenario::Million) {
            anyhow::bail!("the million scenario does not speak HTTP/2");
        }
        if !self.http2 && self.streams_per_conn != 1 {
            anyhow::bail!("--streams-per-conn needs --http2");
        }
        Ok(())
    }

    /// TLS for the workers' connections, from `--tls-ca` and `--tls-name`.
    pub fn tls_job(&self) -> anyhow::Result<Option<crate::tls_client::TlsJob>> {
        let Some(path) = &self.tls_ca else {
            return Ok(None);
        };
        Ok(Some(crate::tls_client::TlsJob {
            ca_pem: std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
            server_name: self.tls_name.clone(),
            h2: self.http2,
        }))
    }
}

/// Presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Hold connections idle for 10 s; one message at the end proves they are alive.
    Idle,
    /// 100 messages as fast as possible to one topic.
    Burst,
    /// One message every 2 s to every connection, for 60 s.
    Ticker,
    /// 10,000 topics (chat rooms), 20 rounds of one message per topic.
    Topics,
    /// Open N connections, deliver one message, close them all; repeat --rounds times, then
    /// check that the server's RSS and open files return to where they started.
    Churn,
    /// Hold N WebSocket connections (a million on one machine) for --hold seconds: every
    /// connection pings once a minute, one message a minute to a topic all follow, chat
    /// traffic on 10,000 rooms; every delivery and pong checked (docs/benchmarks.md, Million).
    Million,
    /// Logical clients that reconnect after a random life of about --life seconds and resume
    /// with their last id, --rate messages a second over --topics topics for --duration
    /// seconds; every message checked per client across its reconnects (bench/soak.sh adds
    /// the chaos: docs/benchmarks.md, Chaos soak).
    Soak,
    /// AI token streams (issue 52): --topics streams (1,000) of --fragments fragments (400)
    /// at --fragment-rate a second (50), --subscribers per stream (5), --resumers (100) that
    /// resume mid-stream; a plain phase of the same shape for the server's CPU ratio
    /// (docs/benchmarks.md, Appendable messages).
    Streams,
}

/// Transports, as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    /// WebSocket.
    Ws,
    /// Server-Sent Events.
    Sse,
    /// Long-polling.
    Poll,
}

/// Topic choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Distribution {
    /// Connection i follows topic i mod T.
    Uniform,
    /// Topic popularity falls off like 1/rank.
    Skewed,
}

/// The connection counts of each step: `--steps` (sorted, deduplicated, zero dropped), or one
/// step of all connections.
pub fn stages(steps: &[usize], connections: usize) -> Vec<usize> {
    let mut s: Vec<usize> = steps.iter().copied().filter(|&n| n > 0).collect();
    s.sort_unstable();
    s.dedup();
    if s.is_empty() {
        s.push(connections);
    }
    s
}

/// The topic of connection `i`.
pub fn topic_of(i: usize, topics: usize, dist: Distribution) -> usize {
    let t = topics.max(1);
    match dist {
        Distribution::Uniform => i % t,
        Distribution::Skewed => {
            // Harmonic weights: topic k gets a share proportional to 1/(k+1).
            let h: f64 = (1..=t).map(|k| 1.0 / k as f64).sum();
            let x = ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11) as f64
                / (1u64 << 53) as f64
                * h;
            let mut acc = 0.0;
            for k in 0..t {
                acc += 1.0 / (k + 1) as f64;
                if x < acc {
                    return k;
                }
            }
            t - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skewed_topics_favour_the_first() {
        let mut counts = [0usize; 10];
        for i in 0..10_000 {
            counts[topic_of(i, 10, Distribution::Skewed)] += 1;
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[9], "{counts:?}");
        assert!(counts.iter().all(|&c| c > 0));
        assert_eq!(topic_of(7, 3, Distribution::Uniform), 1);
    }

    #[test]
    fn steps_are_sorted_and_default_to_all_connections() {
        assert_eq!(
            stages(&[15000, 1000, 5000, 1000, 0], 7),
            vec![1000, 5000, 15000]
        );
        assert_eq!(stages(&[], 700), vec![700]);
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn scenarios_set_their_shape() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let parse = |args: &[&str]| {
            let mut a = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
                .map(|c| c.bench);
            if let Ok(a) = a.as_mut() {
                crate::scenario::apply_scenario(a);
            }
            a
        };
        let a = parse(&["--server-pid", "12,34", "--steps", "1000,5000"]).ok();
        assert_eq!(a.as_ref().map(|a| a.server_pid.clone()), Some(vec![12, 34]));
        assert_eq!(a.map(|a| a.connections), Some(5000));
        let a = parse(&["--server-pid", "9", "--scenario", "churn", "-n", "300"]).ok();
        assert_eq!(a.as_ref().map(|a| a.server_pid.clone()), Some(vec![9]));
        assert_eq!(a.map(|a| (a.messages, a.rounds)), Some((1, 5)));
        assert!(parse(&["--server-pid", "x"]).is_err());
        // The ticker's pace is 2 s unless --interval-ms says otherwise (it once overrode it).
        let a = parse(&["--scenario", "ticker"]).ok();
        assert_eq!(a.map(|a| (a.interval_ms, a.messages)), Some((2000, 30)));
        let a = parse(&["--scenario", "ticker", "--interval-ms", "500", "-m", "30"]).ok();
        assert_eq!(a.map(|a| (a.interval_ms, a.messages)), Some((500, 30)));
        // HTTP/2: SSE or WebSockets (RFC 8441, the default transport), not long-polls;
        // streams per connection only with it, never zero.
        let a = parse(&["--http2", "--transport", "sse", "--streams-per-conn", "100"]).unwrap();
        assert_eq!((a.http2, a.streams_per_conn), (true, 100));
        assert!(a.check_http2().is_ok());
        assert!(parse(&["--streams-per-conn", "0"]).is_err());
        let a = parse(&["--http2", "--streams-per-conn", "10"]).unwrap();
        assert!(a.check_http2().is_ok());
        let a = parse(&["--http2", "--transport", "poll"]).unwrap();
        assert!(a.check_http2().is_err());
        let a = parse(&["--transport", "sse", "--streams-per-conn", "2"]).unwrap();
        assert!(a.check_http2().is_err());
        let a = parse(&["--transport", "sse"]).unwrap();
        assert_eq!((a.http2, a.streams_per_conn), (false, 1));
    }
}
