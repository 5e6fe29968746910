//! Internal limits: numbers the server needs that are not settings, each with the reason for its
//! value and for not being configurable. The tunable limits are declared in the parent module;
//! no other module writes a limit of its own.
//!
//! A number belongs here rather than among the settings when no deployment has a reason to
//! change it: it bounds work a trusted peer (a backend, a publisher) asks for, or it is a
//! fairness or cleanup detail of the event loop whose effect users never see.

use std::time::Duration;

/// File descriptors kept back from the open-files limit when `max_connections = 0`: the
/// listeners (one per worker, twice with TLS), the API and its connections' first accepts, the
/// pollers and their wakers need descriptors too, and they must keep working at the limit.
pub const RESERVED_FILES: u64 = 64;

/// The open-files limit assumed when `/proc/self/limits` cannot be read: the usual default
/// soft limit on Linux, so the derived connection cap errs low rather than high.
pub const ASSUMED_OPEN_FILES: u64 = 1024;

/// Port of the TLS client listener when a certificate is configured without `tls_listen`:
/// 8443 is the customary unprivileged HTTPS port, next to `listen`'s 8080.
pub const DEFAULT_TLS_PORT: u16 = 8443;

/// Concurrent API connections (one thread each). Publishers are a handful of backends on
/// long-lived keep-alive connections; the cap keeps a runaway client from exhausting threads.
/// Not a setting: a deployment that needs more publishers than this should batch.
pub const API_MAX_CONNECTIONS: usize = 256;

/// An API connection idle this long (between or within requests) is closed: publishers keep
/// their connection busy or reconnect cheaply, and a stalled one must not hold a thread.
pub const API_IDLE: Duration = Duration::from_secs(30);

/// A request on the API must arrive whole (head and body) within this of its first byte, so a
/// client that trickles bytes cannot hold a thread for long (slowloris); a publisher on a
/// healthy network sends a request in milliseconds.
pub const API_REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// API connections from one client address at once: a few backends publish over a few
/// connections each; one address cannot take the whole pool.
pub const API_MAX_PER_ADDRESS: usize = 64;

/// Connections admitted past the caps above, each for one request that must arrive within
/// [`API_RESERVE_DEADLINE`] and carry the API key or a valid token: an authenticated publisher
/// still gets through while the pool is taken. (`/healthz` past the caps is answered from its
/// head by the triage, with no thread and no body read.)
pub const API_RESERVE: usize = 32;

/// Reserve threads one client address may hold at once: a publisher whose key leaked, or a
/// misbehaving one that trickles its bodies, cannot take the whole reserve from the others.
pub const API_RESERVE_PER_ADDRESS: usize = 8;

/// Threads answering a group's `/healthz` past the caps at once (the answer scrapes every
/// process, within `GROUP_SCRAPE_TIMEOUT`); such a thread never reads from its client.
pub const API_HEALTH_THREADS: usize = 4;

/// How long a reserve connection's request may take to arrive.
pub const API_RESERVE_DEADLINE: Duration = Duration::from_secs(1);

/// Most items in one Pushpin-format (GRIP) publish. Publishers batch at most a few hundred;
/// the cap bounds the work one request can ask for, with ample room (the body is bounded by
/// `max_publish_size` as well). `clarion_proto::grip::decode_publish` takes it from here.
pub const GRIP_PUBLISH_MAX_ITEMS: usize = 10_000;

/// Most events in one backend answer to a bridged WebSocket (`application/websocket-events`).
/// The body is bounded by `grip_max_body`; this bounds the per-event work of one answer, as
/// [`GRIP_PUBLISH_MAX_ITEMS`] does for a publish.
pub const GRIP_WS_MAX_EVENTS: usize = 10_000;

/// Most header fields in a backend's answer head. Above the 64 that `max_headers` allows a
/// client by default, since backends add framework headers; still far beyond any real answer.
pub const GRIP_BACKEND_MAX_HEADERS: usize = 100;

/// Largest backend answer head, in bytes: room for long `Grip-*` instructions (channel lists,
/// signed links) while a broken backend cannot grow a head without end.
pub const GRIP_BACKEND_MAX_HEAD: usize = 64 * 1024;

/// Lifetime of a `Grip-Sig` token, in seconds (its `exp` claim): the token proves a request
/// came through the proxy now, and an hour tolerates clock skew between proxy and backend.
pub const GRIP_SIG_LIFETIME_SECS: u64 = 3600;

/// Listen backlog asked of the kernel for each client listener (it caps the value at
/// `net.core.somaxconn`): plenty, so a connect storm queues in the kernel instead of being
/// refused while the workers catch up.
pub const LISTEN_BACKLOG: i32 = 4096;

/// Readiness events a worker takes from the poller per wake-up: enough to batch a busy loop's
/// work, small enough that timers and the inbox are looked at often.
pub const POLL_EVENTS: usize = 1024;

/// Stack of the API and GRIP backend threads (one per API connection or backend worker): they
/// parse heads and JSON with bounded depth, far below the 8 MiB default, which would multiply
/// by `API_MAX_CONNECTIONS` and `grip_backend_threads`.
pub const HELPER_THREAD_STACK: usize = 256 * 1024;

/// Pause after a failed accept on the API listener (out of descriptors, say) before trying
/// again, so the failure does not spin a core.
pub const API_ACCEPT_RETRY: Duration = Duration::from_millis(10);

/// Reads from one connection per readiness event before others get a turn; the rest is read on
/// the next loop iteration, so one fast sender cannot starve the loop.
pub const READ_BUDGET: usize = 16;

/// Seconds a closing connection may take to read our last bytes and close its side. Long
/// enough for a slow link to drain a Close frame, short enough that dead peers do not pile up.
pub const CLOSE_LINGER_SECS: u32 = 5;

/// Most processes in one `--processes` group: far past what one machine's cores make useful
/// (the million-connection plan needs about 52), low enough that a typo cannot fork-bomb it.
pub const GROUP_MAX_PROCESSES: usize = 256;

/// How long a group's processes have to print their ready line at startup before the
/// supervisor gives up and stops them all: binding and loading certificates take
/// milliseconds, a broker connection a little more.
pub const GROUP_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// First wait before a group process that died is started again, doubled after each quick
/// death up to [`GROUP_RESTART_MAX_BACKOFF`]: a crash loop costs a few starts a minute, not a
/// busy CPU, and a one-off crash is repaired at once.
pub const GROUP_RESTART_BACKOFF: Duration = Duration::from_millis(250);

/// Longest wait between restarts of a group process that keeps dying.
pub const GROUP_RESTART_MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A group process that ran this long before dying is restarted after the first backoff
/// again: its death was not part of a crash loop.
pub const GROUP_BACKOFF_RESET: Duration = Duration::from_secs(60);

/// How often a group's supervisor looks at its processes and signals when nothing else wakes
/// it: a dead process is noticed and a stop begins well within a second, at ten wake-ups a
/// second of an otherwise idle process.
pub const GROUP_TICK: Duration = Duration::from_millis(100);

/// How often the supervisor rewrites its nodes file even when nothing changed, so a temp-file
/// cleaner cannot take the group's metrics list away for good.
pub const GROUP_NODES_REFRESH: Duration = Duration::from_secs(60);

/// Time the supervisor waits for its processes beyond their own `shutdown_timeout` before it
/// kills what is left: exiting takes a moment after the last connection closed.
pub const GROUP_STOP_MARGIN: Duration = Duration::from_secs(5);

/// How long the group's `/metrics` and `/healthz` wait for one process's answer on its private
/// loopback address; a process that does not answer in time is reported down, so one stuck
/// process cannot stall a scrape past Prometheus' own 10 s default.
pub const GROUP_SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest metrics text read from one group process: a few hundred families of a few lines;
/// the bound keeps a confused peer from filling memory.
pub const GROUP_SCRAPE_MAX_BYTES: usize = 4 * 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_quote_the_internal_limits_as_defined() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/configuration.md"
        ))
        .expect("docs/configuration.md");
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        for quoted in [
            format!("gets {CLOSE_LINGER_SECS} seconds to read our last bytes"),
            format!("at most {API_MAX_CONNECTIONS} connections at once"),
            format!("at most {API_MAX_PER_ADDRESS} from one address"),
            format!("within {} seconds of its first byte", API_REQUEST_DEADLINE.as_secs()),
            format!("{API_RESERVE} more connections may each make one request"),
            format!("at most {API_RESERVE_PER_ADDRESS} of them from one address"),
            format!("arrives within {} second", API_RESERVE_DEADLINE.as_secs()),
            format!("idle for {} seconds", API_IDLE.as_secs()),
            format!("at most {GRIP_PUBLISH_MAX_ITEMS} items"),
            format!("at most {GRIP_WS_MAX_EVENTS} events"),
            format!("at most {GRIP_BACKEND_MAX_HEADERS} header fields and {GRIP_BACKEND_MAX_HEAD} bytes"),
            format!("expire {GRIP_SIG_LIFETIME_SECS} seconds after signing"),
        ] {
            assert!(text.contains(&quoted), "docs/configuration.md should say {quoted:?}");
        }
    }
}
