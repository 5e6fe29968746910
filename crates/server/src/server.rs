//! Starting and stopping a server: binds the listeners, starts one event loop per worker and the
//! API thread, announces readiness, and shuts down gracefully on SIGINT/SIGTERM.
//!
//! Shutdown: the signal sets `Shared::stopping` and wakes every worker; each stops accepting,
//! sends Close 1001 to its WebSockets and waits (up to `shutdown_timeout`) for them to drain and
//! close. When every worker has finished, `run` returns and the process exits 0.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use anyhow::Context as _;
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::config::Config;
use crate::hub::{Hub, Inbox};
use crate::log;
use crate::metrics::{CloseReason, Metrics};
use crate::worker::{bind_listeners, Shared, Worker, WAKER};

/// Runs the server until a termination signal has been handled.
pub fn run(config: Config) -> anyhow::Result<()> {
    let workers = config.worker_count();
    let listeners = bind_listeners(config.listen, workers)
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let api = std::net::TcpListener::bind(config.api_listen)
        .with_context(|| format!("cannot listen on {} (API)", config.api_listen))?;
    let client_addr = listeners.first().map(|l| l.local_addr()).transpose()?;
    let api_addr = api.local_addr()?;

    let mut polls = Vec::with_capacity(workers);
    let mut inboxes = Vec::with_capacity(workers);
    for _ in 0..workers {
        let poll = mio::Poll::new().context("cannot create poller")?;
        let waker = mio::Waker::new(poll.registry(), WAKER).context("cannot create waker")?;
        inboxes.push(Arc::new(Inbox::new(waker)));
        polls.push(poll);
    }
    let metrics = Arc::new(Metrics::default());
    let cap = config.connection_cap();
    let shared = Arc::new(Shared {
        hub: Hub::new(
            inboxes.clone(),
            Arc::clone(&metrics),
            config.history_limits(),
        ),
        config,
        metrics,
        stopping: AtomicBool::new(false),
        open: AtomicUsize::new(0),
        cap,
        per_address: Default::default(),
    });

    // Register signals before announcing readiness, so an early SIGTERM is never lost.
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("cannot install signal handlers")?;

    let mut threads = Vec::with_capacity(workers);
    for (id, ((poll, listener), inbox)) in polls.into_iter().zip(listeners).zip(inboxes).enumerate()
    {
        let worker = Worker::new(id, poll, listener, inbox, Arc::clone(&shared))?;
        let t = std::thread::Builder::new()
            .name(format!("clarion-worker-{id}"))
            .spawn(move || worker.run())
            .context("cannot start worker thread")?;
        threads.push(t);
    }
    let api_shared = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("clarion-api".into())
        .spawn(move || crate::api::serve(api, api_shared))
        .context("cannot start API thread")?;

    let clients = client_addr.map_or_else(|| "-".to_owned(), |a| a.to_string());
    log::info(format_args!(
        "listening: clients on {clients} ({workers} workers, up to {cap} connections), API on {api_addr}"
    ));
    let mut out = std::io::stdout().lock();
    writeln!(out, "clarion ready clients={clients} api={api_addr}")?;
    out.flush()?;
    drop(out);

    if let Some(sig) = signals.forever().next() {
        log::info(format_args!(
            "signal {sig}: closing connections (up to {} s)",
            shared.config.shutdown_timeout
        ));
    }
    shared.stopping.store(true, Relaxed);
    shared.hub.wake_all();
    for t in threads {
        if t.join().is_err() {
            log::warn(format_args!("a worker panicked during shutdown"));
        }
    }
    log::info(format_args!(
        "stopped: {} WebSocket connections closed with 1001",
        shared.metrics.closes(CloseReason::Shutdown)
    ));
    Ok(())
}
