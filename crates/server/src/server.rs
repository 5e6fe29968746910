//! Starting and stopping a server: binds the listeners, starts one event loop per worker and the
//! API thread, announces readiness, and shuts down gracefully on SIGINT/SIGTERM.
//!
//! Shutdown: the signal sets `Shared::stopping` and wakes every worker; each stops accepting,
//! sends Close 1001 to its WebSockets and waits (up to `shutdown_timeout`) for them to drain and
//! close. When every worker has finished, `run` returns and the process exits 0.
//!
//! TLS: when certificates are configured, each worker also gets a TLS listener (same
//! `SO_REUSEPORT` scheme), and a reloader thread re-reads the certificate files on SIGHUP or
//! when they change, without touching established connections.
//!
//! Ports: a lone server first makes sure no other process listens on its ports
//! ([`crate::group::guard`]); a member of a `--processes` group ([`run_member`]) skips that
//! check, shares the API port with its siblings too, and opens a private loopback API address
//! for the group's `/metrics` and `/healthz` ([`crate::group`]).

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use anyhow::Context as _;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};

use crate::api::Scope;
use crate::broker::Broker;
use crate::config::Config;
use crate::group::Member;
use crate::hub::Inbox;
use crate::log;
use crate::metrics::{CloseReason, Metrics};
use crate::worker::{bind_listeners, Modes, Shared, Worker, WAKER};

/// Runs the server until a termination signal has been handled.
pub fn run(config: Config) -> anyhow::Result<()> {
    run_as(config, None, &Lone::default())
}

/// What only a lone process (not a `--processes` member) may be asked on its command line.
#[derive(Debug, Default, Clone)]
pub struct Lone {
    /// `--upgrade-from PID`: take over that running server's listeners and connections.
    pub upgrade_from: Option<u32>,
    /// `--pid-file PATH`: where to write this process's pid once it serves.
    pub pid_file: Option<std::path::PathBuf>,
}

/// Runs a lone server with its command-line extras ([`Lone`]).
pub fn run_lone(config: Config, lone: &Lone) -> anyhow::Result<()> {
    run_as(config, None, lone)
}

/// Runs one member of a `--processes` group (see [`crate::group`]): its configuration is the
/// group's with the member's applied.
pub fn run_member(config: Config, member: Member) -> anyhow::Result<()> {
    log::set_node(&member.node);
    // A rolling upgrade's successor takes over the member its supervisor names.
    let lone = Lone {
        upgrade_from: crate::group::upgrade_from(),
        pid_file: None,
    };
    run_as(member.apply(config), Some(Arc::new(member)), &lone)
}

fn run_as(mut config: Config, member: Option<Arc<Member>>, lone: &Lone) -> anyhow::Result<()> {
    let (upgrade_from, pid_file) = (lone.upgrade_from, lone.pid_file.as_deref());
    // A write past the file size limit (RLIMIT_FSIZE) raises SIGXFSZ, whose default action
    // kills the process: caught (a flag nobody reads), the write fails with EFBIG instead and
    // the history log refuses that publish with 503, as on a full disk.
    signal_hook::flag::register(
        signal_hook::consts::SIGXFSZ,
        Arc::new(AtomicBool::new(false)),
    )
    .context("cannot handle SIGXFSZ")?;
    crate::service_manager::init(member.is_none());
    let mut incoming = match upgrade_from {
        Some(pid) => crate::handover::incoming::connect(pid, &config)?,
        None => None,
    };
    // Without `node_name` a lone process is `host:pid`, a new name at each upgrade: the
    // successor keeps its predecessor's, so webhook connection ids and dashboards stay put.
    if let (None, Some(i)) = (&config.node_name, &incoming) {
        config.node_name = Some(i.node.clone());
    }
    // The process being replaced holds the ports until it is gone.
    if member.is_none() && upgrade_from.is_none() {
        // A member's siblings hold the ports by design; anyone else is refused.
        let ports = [
            (Some(config.listen), "client"),
            (config.tls_address(), "TLS"),
            (Some(config.api_listen), "API"),
        ];
        for (addr, what) in ports {
            if let Some(addr) = addr {
                crate::group::guard::check(addr, what)?;
            }
        }
    }
    let workers = config.worker_count();
    let taken = incoming
        .as_mut()
        .map(|i| std::mem::take(&mut i.client))
        .filter(|l| l.len() == workers);
    let listeners = match taken {
        Some(l) => l,
        None => bind_listeners(config.listen, workers)
            .with_context(|| format!("cannot listen on {}", config.listen))?,
    };
    let api = match incoming.as_mut().and_then(|i| i.api.take()) {
        Some(l) => l,
        None if upgrade_from.is_some() && member.is_none() => {
            bind_api_after(config.api_listen, upgrade_from)
                .with_context(|| format!("cannot listen on {} (API)", config.api_listen))?
        }
        None => bind_api(config.api_listen, member.is_some())
            .with_context(|| format!("cannot listen on {} (API)", config.api_listen))?,
    };
    // A member's own view, for the group's scrapes: loopback, plain HTTP, a fresh port.
    let node_api = match member {
        Some(_) => Some(
            std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
                .context("cannot listen on a private API address")?,
        ),
        None => None,
    };
    let client_addr = listeners.first().map(|l| l.local_addr()).transpose()?;
    let api_addr = api.local_addr()?;
    let tls = match config.tls_settings() {
        Some(settings) => Some(Arc::new(
            crate::tls::Tls::load(settings).context("cannot set up TLS")?,
        )),
        None => None,
    };
    let taken_tls = incoming
        .as_mut()
        .map(|i| std::mem::take(&mut i.tls))
        .filter(|l| l.len() == workers);
    let mut tls_listeners: Vec<Option<std::net::TcpListener>> = match config.tls_address() {
        Some(_) if taken_tls.is_some() => taken_tls.into_iter().flatten().map(Some).collect(),
        Some(addr) => bind_listeners(addr, workers)
            .with_context(|| format!("cannot listen on {addr} (TLS)"))?
            .into_iter()
            .map(Some)
            .collect(),
        None => (0..workers).map(|_| None).collect(),
    };
    let tls_addr = tls_listeners
        .first()
        .and_then(|l| l.as_ref())
        .map(|l| l.local_addr())
        .transpose()?;

    let mut polls = Vec::with_capacity(workers);
    let mut inboxes = Vec::with_capacity(workers);
    for _ in 0..workers {
        let poll = mio::Poll::new().context("cannot create poller")?;
        let waker = mio::Waker::new(poll.registry(), WAKER).context("cannot create waker")?;
        inboxes.push(Arc::new(Inbox::new(waker)));
        polls.push(poll);
    }
    let grip = match &config.grip_routes {
        Some(path) => Some(crate::grip::Proxy::load(path, &config, &inboxes)?),
        None => None,
    };
    let auth = crate::auth::Auth::from_config(&config).context("cannot set up authentication")?;
    let metrics = Arc::new(Metrics::default());
    let cap = config.connection_cap();
    let thawed = match incoming.as_ref() {
        Some(i) => i.broker(&inboxes, &metrics, &config)?,
        None => None,
    };
    let broker = match thawed {
        Some(b) => b,
        None => Broker::open(
            &config,
            &inboxes,
            &metrics,
            Some(crate::pusher::decode_attachment),
        )?,
    };
    broker.set_delta_topics(crate::delta::DeltaTopics::from_config(&config));
    if let Some(d) = crate::broker::debounce::Debouncer::start(&config, &inboxes, &metrics)
        .context("cannot start the debounce timer")?
    {
        broker.set_debounce(d);
    }
    let mut arriving = match incoming.as_mut() {
        Some(i) => i.take_connections(&broker, workers)?,
        None => Vec::new(),
    };
    let hooks = crate::hooks::Hooks::from_config(&config, &inboxes, &metrics, &broker)
        .map_err(|e| anyhow::anyhow!(e))
        .context("cannot set up hooks")?;
    let clustered = broker.shared_rooms().is_some();
    let presence = crate::presence::Presence::from_config(&config, Arc::clone(&metrics), clustered)
        .map_err(|e| anyhow::anyhow!(e))?
        .map(Arc::new);
    let modes = Modes {
        tls,
        grip,
        auth,
        hooks,
        presence,
    };
    let shared = Arc::new(Shared::new(config, broker, metrics, cap, modes));

    // Register signals before announcing readiness, so an early SIGTERM is never lost.
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGUSR2])
        .context("cannot install signal handlers")?;
    if member.is_none() {
        // A lone process upgrades itself in place on SIGUSR1 (a group's supervisor owns it).
        signals.add_signal(SIGUSR1)?;
        crate::handover::remember_binary();
    }
    if let Some(tls) = shared.tls.clone() {
        start_reloader(tls, shared.config.tls_reload_interval)?;
    }
    if let Some(member) = &member {
        member
            .watch_supervisor(shared.tls.is_some())
            .context("cannot watch the group's supervisor")?;
    }

    let presence_stop = Arc::new(AtomicBool::new(false));
    let mut presence_thread = None;
    if shared.presence.as_ref().is_some_and(|p| p.clustered()) {
        let (s, stop) = (Arc::clone(&shared), Arc::clone(&presence_stop));
        let t = std::thread::Builder::new()
            .name("clarion-presence".into())
            .spawn(move || {
                if let Some(p) = s.presence.as_ref() {
                    p.run(&s.broker, &stop);
                }
            })
            .context("cannot start the presence thread")?;
        presence_thread = Some(t);
    }
    // Copies of the listening sockets for a later hand-over (to the process that replaces
    // this one: a lone process's SIGUSR1, or a group's rolling upgrade).
    let listening = Some(crate::handover::Listening {
        client: dup_all(listeners.iter())?,
        tls: dup_all(tls_listeners.iter().flatten())?,
        api: Some(api.try_clone()?.into()),
    });
    let mut threads = Vec::with_capacity(workers);
    for (id, ((poll, listener), inbox)) in polls.into_iter().zip(listeners).zip(inboxes).enumerate()
    {
        let tls_listener = tls_listeners.get_mut(id).and_then(Option::take);
        let mut worker = Worker::new(id, poll, listener, tls_listener, inbox, Arc::clone(&shared))?;
        if let Some(list) = arriving.get_mut(id) {
            worker.adopt_all(std::mem::take(list));
        }
        let t = std::thread::Builder::new()
            .name(format!("clarion-worker-{id}"))
            .spawn(move || worker.run())
            .context("cannot start worker thread")?;
        threads.push(t);
    }
    let scope = match &member {
        Some(m) => Scope::Group(Arc::clone(m)),
        None => Scope::Process,
    };
    let mut node_api_addr = None;
    let mut apis = vec![(api, scope)];
    if let Some(l) = node_api {
        node_api_addr = Some(l.local_addr()?);
        apis.push((l, Scope::Node));
    }
    for (listener, scope) in apis {
        let api_shared = Arc::clone(&shared);
        let (set_up, api_ready) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("clarion-api".into())
            .spawn(move || crate::api::serve(listener, api_shared, scope, set_up))
            .context("cannot start API thread")?;
        // Ready means ready: its threads and descriptors are made (a test counting them, or a
        // probe, sees the server as it stays).
        let _ = api_ready.recv_timeout(std::time::Duration::from_secs(10));
    }

    if let Some(path) = pid_file {
        // Before the acknowledgement: the old process exits once it has it, and a service
        // manager that follows the file must find this pid there by then.
        crate::handover::write_pid_file(path)
            .with_context(|| format!("cannot write the pid file {}", path.display()))?;
    }
    if let Some(i) = &incoming {
        // Every connection is registered with a worker: the old process may go.
        if let Err(e) = i.ack() {
            log::warn(format_args!("hand-over: the acknowledgement failed: {e}"));
        }
    }
    if let Some(l) = listening {
        crate::handover::listen(Arc::clone(&shared), l);
    }
    let clients = client_addr.map_or_else(|| "-".to_owned(), |a| a.to_string());
    let tls_note = tls_addr.map_or_else(String::new, |a| format!(", TLS clients on {a}"));
    let api_tls = if shared.config.tls_api { " (TLS)" } else { "" };
    let threads_note = if workers == 1 {
        "1 worker".to_owned()
    } else {
        format!("{workers} workers")
    };
    log::info(format_args!(
        "serving: clients on {clients}{tls_note}, API on {api_addr}{api_tls} ({threads_note}, up to \
         {cap} connections); {}",
        what_is_on(&shared, member.as_deref())
    ));
    let tls_field = tls_addr.map_or_else(String::new, |a| format!(" tls={a}"));
    let node_field = node_api_addr.map_or_else(String::new, |a| format!(" node_api={a}"));
    // A group's supervisor counts the connections its rolling upgrade moved.
    let taken = shared
        .handover
        .taken
        .load(std::sync::atomic::Ordering::Relaxed);
    let node_field = match (&member, &incoming) {
        (Some(_), Some(_)) => format!("{node_field} handover={taken}"),
        _ => node_field,
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "clarion ready clients={clients} api={api_addr}{tls_field}{node_field}"
    )?;
    out.flush()?;
    drop(out);
    if let Some(i) = &incoming {
        // The process handing over names this one to the service manager (`MAINPID=`) before
        // it lets go of the hand-over socket: `READY=1` from here must come after, or a manager
        // that hears only the main process (`NotifyAccess=main`) would drop it.
        i.wait_released(RELEASE_TIMEOUT);
    }
    crate::service_manager::ready(&format!(
        "serving: clients on {clients}, API on {api_addr}{}",
        if incoming.is_some() {
            format!(
                " ({} connections taken over)",
                shared
                    .handover
                    .taken
                    .load(std::sync::atomic::Ordering::Relaxed)
            )
        } else {
            String::new()
        }
    ));

    let mut received = None;
    for sig in signals.forever() {
        if sig == SIGUSR1 {
            crate::service_manager::reloading(
                "upgrade: starting the new binary to take the connections over",
            );
            if !crate::handover::start_successor() {
                crate::service_manager::ready(
                    "serving: the upgrade could not start; still serving",
                );
            }
            continue;
        }
        received = Some(sig);
        break;
    }
    if let Some(sig) = received {
        // A group member's watcher raises SIGUSR2 before SIGTERM for a restart of the group.
        let restart = sig == SIGUSR2 || signals.pending().any(|s| s == SIGUSR2);
        shared.restarting.store(restart, Relaxed);
        let c = &shared.config;
        crate::service_manager::stopping(&format!(
            "stopping: closing connections with {} (up to {} s)",
            if restart { "1012" } else { "1001" },
            c.drain_period + c.shutdown_timeout
        ));
        log::info(format_args!(
            "signal {sig}: {}{} (up to {} s)",
            if restart {
                "restart: closing connections with 1012"
            } else {
                "closing connections"
            },
            match c.drain_period {
                0 => String::new(),
                d => format!(" over {d} s"),
            },
            c.drain_period + c.shutdown_timeout
        ));
    }
    crate::handover::close_listeners();
    shared.stopping.store(true, Relaxed);
    shared.broker.wake_all();
    for t in threads {
        if t.join().is_err() {
            log::warn(format_args!("a worker panicked during shutdown"));
        }
    }
    presence_stop.store(true, Relaxed);
    if let Some(t) = presence_thread {
        let _ = t.join();
    }
    if let Some(p) = shared.presence.as_ref() {
        p.leave_cluster(&shared.broker);
    }
    shared.broker.shutdown();
    if let Ok(path) = crate::handover::socket_path(std::process::id()) {
        let _ = std::fs::remove_file(path);
    }
    if let Some(path) = pid_file {
        crate::handover::remove_pid_file(path);
    }
    log::info(format_args!(
        "stopped: {} connections told to go (WebSockets closed with {}, streams ended, \
         long-polls answered)",
        shared.metrics.closes(CloseReason::Shutdown),
        if shared.restarting.load(Relaxed) {
            "1012"
        } else {
            "1001"
        }
    ));
    Ok(())
}

/// The rest of the startup line: broker and node, auth, processes. Nothing secret: a broker
/// URL's credentials and path are left out, keys are only said to be set.
fn what_is_on(shared: &Shared, member: Option<&Member>) -> String {
    let c = &shared.config;
    let node = c.node();
    let broker = match c.broker.as_deref() {
        None => format!("broker: none (node {node})"),
        Some(url) => {
            let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
            let authority = rest.split(['/', '?']).next().unwrap_or_default();
            let host = authority.rsplit('@').next().unwrap_or_default();
            format!("broker: {scheme}://{host} (node {node})")
        }
    };
    // How a publisher gets in, in the words of the settings that decide it: turning tokens on
    // closes an API that has no key to everyone but token holders.
    let api = match (c.api_key.is_some(), shared.auth.is_some()) {
        (false, false) => "publish API: open (no api_key)",
        (true, false) => "publish API: api_key",
        (true, true) => "publish API: api_key, or a token that grants the topic",
        (false, true) => {
            "publish API: tokens only (no api_key; `clarion token --admin` makes one that \
             publishes anywhere)"
        }
    };
    let auth = match shared.auth.as_ref() {
        None => format!("auth: off ({api})"),
        Some(a) => {
            let public = if c.auth_public_topics.is_empty() {
                "none".to_owned()
            } else {
                c.auth_public_topics.join(", ")
            };
            let anonymous = if a.anonymous { "allowed" } else { "refused" };
            format!(
                "auth: {} tokens, public topics: {public}, anonymous connections: {anonymous} \
                 ({api})",
                a.verifier.algorithm
            )
        }
    };
    let hooks: Vec<&str> = [
        ("connect", c.hook_connect_url.is_some()),
        ("subscribe", c.hook_subscribe_url.is_some()),
        ("publish", c.hook_publish_url.is_some()),
        ("webhook", c.webhook_url.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    let hooks = if hooks.is_empty() {
        "hooks: none".to_owned()
    } else {
        format!("hooks: {}", hooks.join(", "))
    };
    let processes = match member {
        Some(m) => format!("process {} of {}", m.index + 1, c.processes),
        None => "1 process".to_owned(),
    };
    format!("{broker}; {auth}; {hooks}; {processes}")
}

/// Duplicates listening sockets (the copies keep the same accept queues).
fn dup_all<'a>(
    ls: impl Iterator<Item = &'a std::net::TcpListener>,
) -> std::io::Result<Vec<std::os::fd::OwnedFd>> {
    ls.map(|l| l.try_clone().map(Into::into)).collect()
}

/// The API listener of a process that replaces `pid` without its sockets (it refused the
/// hand-over and restarts with a drain): the port is free once that process has exited.
/// How long a successor waits for the old process to let go of the hand-over socket before it
/// says `READY=1` anyway (the old process names it right after the acknowledgement).
const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn bind_api_after(
    addr: std::net::SocketAddr,
    pid: Option<u32>,
) -> std::io::Result<std::net::TcpListener> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    loop {
        match std::net::TcpListener::bind(addr) {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                if let Some(pid) = pid {
                    log::debug(format_args!("API port busy until process {pid} exits"));
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// The API listener: a member of a group shares the group's API port with `SO_REUSEPORT`, as
/// every worker shares the client port; a lone server binds it alone.
fn bind_api(addr: std::net::SocketAddr, shared: bool) -> std::io::Result<std::net::TcpListener> {
    if !shared {
        return std::net::TcpListener::bind(addr);
    }
    let mut listeners = bind_listeners(addr, 1)?;
    let listener = listeners
        .pop()
        .ok_or_else(|| std::io::Error::other("no listener"))?;
    // The API thread accepts with blocking calls.
    listener.set_nonblocking(false)?;
    Ok(listener)
}

/// Re-reads the certificate files on SIGHUP, and every `interval` seconds if they changed
/// (0: on SIGHUP only). A failed reload is logged and the previous certificates stay in use.
fn start_reloader(tls: Arc<crate::tls::Tls>, interval: u64) -> anyhow::Result<()> {
    let mut hup = signal_hook::iterator::Signals::new([SIGHUP]).context("cannot handle SIGHUP")?;
    std::thread::Builder::new()
        .name("clarion-tls-reload".into())
        .spawn(move || {
            let mut waited = 0u64;
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
                waited += 1;
                let signalled = hup.pending().count() > 0;
                let due = interval > 0 && waited >= interval;
                if due {
                    waited = 0;
                }
                if !(signalled || due && tls.files_changed()) {
                    continue;
                }
                let why = if signalled { "SIGHUP" } else { "files changed" };
                match tls.reload() {
                    Ok(n) => log::info(format_args!("TLS certificates reloaded ({why}): {n}")),
                    Err(e) => log::warn(format_args!(
                        "TLS reload ({why}) failed, keeping the previous certificates: {e}"
                    )),
                }
            }
        })
        .context("cannot start the TLS reloader")?;
    Ok(())
}
