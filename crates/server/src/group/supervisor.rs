//! The supervisor of a `--processes N` group: starts the members, restarts the ones that die,
//! stops them all on SIGTERM/SIGINT, and keeps the [`nodes`] file current.
//!
//! It serves no client itself. It probes the ports once for the whole group ([`guard`]), then
//! holds each shared port with a bound, never-listening `SO_REUSEPORT` socket for its whole
//! life: that resolves port 0 to one port every member can share, and a member that restarts
//! binds the same port again. Members are this binary (`/proc/self/exe`, so an upgrade of the
//! file on disk cannot mix versions in one group) with the supervisor's own arguments and
//! environment (so they resolve the same configuration) plus their [`Member`] identity. Each
//! runs in its own process group, so a terminal's Ctrl-C reaches the supervisor only and the
//! stop is orderly; each member's standard input is a pipe the supervisor holds, whose end
//! (closed to stop the group, or by the kernel when the supervisor dies) makes the member shut
//! down gracefully ([`Member::watch_supervisor`]).

use std::io::{BufRead as _, Write as _};
use std::net::SocketAddr;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};

use super::nodes::{self, Node, State};
use super::{base_node_name, guard, Member, RELOAD, RESTART};
use crate::config::limits::{
    GROUP_BACKOFF_RESET, GROUP_NODES_REFRESH, GROUP_RESTART_BACKOFF, GROUP_RESTART_MAX_BACKOFF,
    GROUP_STARTUP_TIMEOUT, GROUP_STOP_MARGIN, GROUP_TICK,
};
use crate::config::Config;
use crate::log;

/// The supervisor's binary as it was started (see [`start`]).
static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// What a member's output reader reports.
struct Ready {
    /// The member's index.
    index: usize,
    /// Which start of it (a restarted member's old reader must not count).
    generation: u64,
    /// Its private API address, from its ready line.
    api: Option<SocketAddr>,
    /// A rolling upgrade's successor: the connections it took over (`handover=` in its ready
    /// line); `None` when it started without them.
    taken: Option<u64>,
}

/// One member's place in the group, across its restarts.
struct Slot {
    member: Member,
    node: Node,
    child: Option<Child>,
    /// The write end of the member's standard input; dropping it stops the member.
    stdin: Option<ChildStdin>,
    generation: u64,
    started: Instant,
    backoff: Duration,
    next_start: Option<Instant>,
    /// The member a rolling upgrade's successor takes over from, until it exits.
    retiring: Option<Retiring>,
    /// What the last start's ready line said it took over (see [`Ready::taken`]).
    taken: Option<u64>,
}

/// A member being replaced by a successor that takes its connections.
struct Retiring {
    child: Child,
    /// Held so the member does not take the end of its pipe for a stop before it hands over.
    stdin: Option<ChildStdin>,
}

/// A rolling upgrade (SIGUSR1): one member at a time, its successor is started from the binary
/// on disk with the member's pid (`_CLARION_GROUP_UPGRADE_FROM`); it takes the member's
/// listeners and live connections (`crate::handover`), and the member exits. When the member
/// refuses or the hand-over fails, the member restarts with a drain instead (its clients get
/// 1012 and reconnect to the others through the shared port). Once the successor is ready and
/// the member gone, the next one's turn comes.
struct Rolling {
    /// The member being replaced.
    at: usize,
    /// Its successor has been started (or, failing that, it has been asked to stop).
    stopping: bool,
    /// Its start generation when it was asked: a later one is its successor.
    asked: u64,
    /// Successors that took their member's connections over, and how many connections.
    handed: usize,
    moved: u64,
}

/// The group's directory, removed when the supervisor ends.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a group of `config.processes` members until SIGTERM or SIGINT, then stops them all
/// and returns when they have exited.
pub fn supervise(config: Config) -> anyhow::Result<()> {
    if let Ok(exe) = std::env::current_exe() {
        let _ = EXE.set(exe);
    }
    let n = config.processes;
    let tls = config.tls_address();
    let ports = [
        (Some(config.listen), "client"),
        (tls, "TLS"),
        (Some(config.api_listen), "API"),
    ];
    for (addr, what) in ports {
        if let Some(addr) = addr {
            guard::check(addr, what)?;
        }
    }
    let named: Vec<u16> = ports
        .iter()
        .filter_map(|(a, _)| a.map(|a| a.port()))
        .filter(|p| *p != 0)
        .collect();
    let reused = named.iter().enumerate();
    if reused
        .clone()
        .any(|(i, p)| named.iter().skip(i + 1).any(|q| q == p))
    {
        bail!("the client, TLS and API addresses must use different ports");
    }
    // Held for the supervisor's life (see the module doc).
    let (_listen_hold, listen) = reserve(config.listen, "client")?;
    let tls_hold = tls.map(|a| reserve(a, "TLS")).transpose()?;
    let tls_listen = tls_hold.as_ref().map(|(_, a)| *a);
    let (_api_hold, api) = reserve(config.api_listen, "API")?;

    let dir = Dir(make_dir()?);
    // SIGHUP is passed on (certificate reloads), never the end of the group; SIGUSR2 stops
    // it as a restart (WebSockets get 1012).
    crate::service_manager::init(true);
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2])
            .context("cannot install signal handlers")?;
    let base = base_node_name(&config);
    let mut slots: Vec<Slot> = (0..n)
        .map(|index| {
            let member = Member {
                index,
                node: format!("{base}-{index}"),
                dir: dir.0.clone(),
                listen,
                tls_listen,
                api_listen: api,
            };
            Slot {
                node: Node {
                    index,
                    name: member.node.clone(),
                    state: State::Down,
                    api: None,
                    restarts: 0,
                    pid: 0,
                },
                member,
                child: None,
                stdin: None,
                generation: 0,
                started: Instant::now(),
                backoff: GROUP_RESTART_BACKOFF,
                next_start: None,
                retiring: None,
                taken: None,
            }
        })
        .collect();
    let (tx, rx) = mpsc::channel::<Ready>();
    let stop_wait =
        Duration::from_secs(config.drain_period + config.shutdown_timeout) + GROUP_STOP_MARGIN;

    // Start: every member must come up, or the whole group is refused, as one server would be.
    for slot in &mut slots {
        if let Err(e) = start(slot, &tx, None) {
            stop(&mut slots, &mut signals, stop_wait);
            return Err(e);
        }
    }
    write_nodes(&dir.0, &slots);
    let deadline = Instant::now() + GROUP_STARTUP_TIMEOUT;
    while slots.iter().any(|s| s.node.state != State::Up) {
        if signals.pending().any(|sig| sig != SIGHUP) {
            stop(&mut slots, &mut signals, stop_wait);
            return Ok(());
        }
        if let Ok(ready) = rx.recv_timeout(GROUP_TICK) {
            mark_ready(&mut slots, &ready);
        }
        let failed = slots
            .iter_mut()
            .find_map(|s| Some((s.node.name.clone(), exited(s)?)));
        if let Some((name, status)) = failed {
            stop(&mut slots, &mut signals, stop_wait);
            bail!(
                "process {name} {} while starting (its messages are above)",
                describe(status)
            );
        }
        if Instant::now() > deadline {
            stop(&mut slots, &mut signals, stop_wait);
            bail!("the group's processes were not ready within {GROUP_STARTUP_TIMEOUT:?}");
        }
    }
    write_nodes(&dir.0, &slots);
    announce(listen, tls_listen, api, n)?;
    // The supervisor is the service's main process for the whole life of the group.
    crate::service_manager::ready(&format!(
        "serving: group of {n} processes, clients on {listen}, API on {api}"
    ));

    // Run: restart what dies, until a signal.
    let mut written = Instant::now();
    let mut rolling: Option<Rolling> = None;
    loop {
        let pending: Vec<i32> = signals.pending().collect();
        if pending.contains(&SIGUSR1) {
            if rolling.is_some() {
                log::info(format_args!(
                    "SIGUSR1: a rolling upgrade is already under way"
                ));
            } else {
                log::info(format_args!(
                    "SIGUSR1: rolling upgrade of {n} processes, one at a time"
                ));
                crate::service_manager::reloading(&format!(
                    "upgrade: rolling upgrade of {n} processes, one at a time"
                ));
                rolling = Some(Rolling {
                    at: 0,
                    stopping: false,
                    asked: 0,
                    handed: 0,
                    moved: 0,
                });
            }
        }
        if let Some(r) = rolling.as_mut() {
            if roll(r, &mut slots, &tx) {
                log::info(format_args!(
                    "rolling upgrade done: {} processes handed over ({} connections moved), {} \
                     restarted with a drain",
                    r.handed,
                    r.moved,
                    n - r.handed.min(n)
                ));
                crate::service_manager::ready(&format!(
                    "serving: group of {n} processes, upgraded ({} handed over, {} connections \
                     moved)",
                    r.handed, r.moved
                ));
                rolling = None;
            }
        }
        if pending.contains(&SIGHUP) {
            log::info(format_args!("SIGHUP: passed on to {n} processes"));
            for slot in &mut slots {
                if let Some(stdin) = slot.stdin.as_mut() {
                    let _ = stdin.write_all(&[RELOAD]);
                }
            }
        }
        if pending.contains(&SIGUSR2) {
            // Each member raises SIGUSR2 on itself before the end of its pipe stops it.
            for slot in &mut slots {
                if let Some(stdin) = slot.stdin.as_mut() {
                    let _ = stdin.write_all(&[RESTART]);
                }
            }
        }
        if let Some(sig) = pending.iter().find(|s| **s != SIGHUP && **s != SIGUSR1) {
            crate::service_manager::stopping(&format!(
                "stopping: {n} processes closing their connections (up to {} s)",
                stop_wait.as_secs()
            ));
            log::info(format_args!(
                "signal {sig}: stopping {n} processes (up to {} s)",
                stop_wait.as_secs()
            ));
            break;
        }
        let mut changed = false;
        while let Ok(ready) = rx.try_recv() {
            changed |= mark_ready(&mut slots, &ready);
        }
        let now = Instant::now();
        for slot in &mut slots {
            changed |= retired(slot);
            // A restarted process that never becomes ready is killed, so it is restarted (with
            // the backoff) rather than left half-started for good.
            let stuck = slot.node.state == State::Starting
                && now.saturating_duration_since(slot.started) > GROUP_STARTUP_TIMEOUT;
            if let Some(child) = slot.child.as_mut().filter(|_| stuck) {
                log::warn(format_args!(
                    "process {} (pid {}) not ready within {GROUP_STARTUP_TIMEOUT:?}: killing it",
                    slot.node.name,
                    child.id()
                ));
                let _ = child.kill();
                let _ = child.wait();
            }
            let planned = rolling
                .as_ref()
                .is_some_and(|r| r.stopping && r.at == slot.node.index);
            if let Some(status) = exited(slot) {
                if planned {
                    log::info(format_args!(
                        "process {} {} during the rolling upgrade; starting its successor",
                        slot.node.name,
                        describe(status)
                    ));
                    // A successor that failed before it was ready: the member it was to
                    // replace restarts with a drain instead (its clients resume elsewhere).
                    if let Some(r) = slot.retiring.as_mut() {
                        log::warn(format_args!(
                            "process {} (pid {}): no hand-over; it restarts with a drain",
                            slot.node.name,
                            r.child.id()
                        ));
                        if let Some(stdin) = r.stdin.as_mut() {
                            let _ = stdin.write_all(&[RESTART]);
                        }
                        r.stdin = None;
                    }
                    slot.next_start = Some(now);
                    changed = true;
                } else {
                    let ran = now.saturating_duration_since(slot.started);
                    let (delay, next) = restart_delay(slot.backoff, ran);
                    log::warn(format_args!(
                        "process {} {} after {:.1} s; starting it again in {:.2} s",
                        slot.node.name,
                        describe(status),
                        ran.as_secs_f64(),
                        delay.as_secs_f64()
                    ));
                    slot.next_start = Some(now + delay);
                    slot.backoff = next;
                    changed = true;
                }
            }
            if slot.next_start.is_some_and(|t| t <= now) {
                slot.next_start = None;
                slot.node.restarts += 1;
                if let Err(e) = start(slot, &tx, None) {
                    let (delay, next) = restart_delay(slot.backoff, Duration::ZERO);
                    log::warn(format_args!(
                        "cannot start process {} ({e:#}); trying again in {:.2} s",
                        slot.node.name,
                        delay.as_secs_f64()
                    ));
                    slot.next_start = Some(now + delay);
                    slot.backoff = next;
                }
                changed = true;
            }
        }
        // Rewritten now and then too, so a temp-file cleaner cannot leave the group's
        // metrics without their list for good.
        if changed || now.saturating_duration_since(written) >= GROUP_NODES_REFRESH {
            write_nodes(&dir.0, &slots);
            written = now;
        }
        if let Ok(ready) = rx.recv_timeout(GROUP_TICK) {
            mark_ready(&mut slots, &ready);
            write_nodes(&dir.0, &slots);
        }
    }
    stop(&mut slots, &mut signals, stop_wait);
    log::info(format_args!("stopped: all {n} processes exited"));
    Ok(())
}

/// The wait before starting again a member that died after running `ran`, and the backoff
/// for its next death: the current `backoff`, doubled each time up to
/// [`GROUP_RESTART_MAX_BACKOFF`], back to the first after a run of [`GROUP_BACKOFF_RESET`].
fn restart_delay(backoff: Duration, ran: Duration) -> (Duration, Duration) {
    let delay = if ran >= GROUP_BACKOFF_RESET {
        GROUP_RESTART_BACKOFF
    } else {
        backoff
    };
    (delay, (delay * 2).min(GROUP_RESTART_MAX_BACKOFF))
}

/// Binds (without listening) a `SO_REUSEPORT` socket on `addr`: the port, resolved.
fn reserve(addr: SocketAddr, what: &str) -> anyhow::Result<(socket2::Socket, SocketAddr)> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())
        .with_context(|| format!("cannot listen on {addr} ({what})"))?;
    let bound = s
        .local_addr()?
        .as_socket()
        .context("bound address is not an IP address")?;
    Ok((s, bound))
}

/// A fresh directory for the nodes file, inside this user's private directory (the hand-over
/// socket's, [`socket_dir`](crate::handover::socket_dir)): a name in the shared temporary
/// directory could be taken first by another local user, and the group would not start.
fn make_dir() -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    let dir = crate::handover::socket_dir::private_dir(true)
        .context("no private directory for the group's files")?
        .join(format!("clarion-group-{}", std::process::id()));
    // A directory left by a killed supervisor with our pid: ours now.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// Starts the slot's member, with a reader thread that reports its ready line; with
/// `upgrade_from`, as the successor that takes that process's connections.
fn start(
    slot: &mut Slot,
    tx: &mpsc::Sender<Ready>,
    upgrade_from: Option<u32>,
) -> anyhow::Result<()> {
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "clarion".into());
    // The binary on disk where the supervisor was started from: after an upgrade replaced it,
    // new members (a rolling restart's, a crashed one's) run the new version.
    let exe = EXE
        .get()
        .filter(|p| p.is_file())
        .map_or(Path::new("/proc/self/exe"), PathBuf::as_path);
    let mut command = Command::new(exe);
    command.arg0(arg0).args(args).envs(slot.member.env());
    if let Some(pid) = upgrade_from {
        command.env(super::ENV_UPGRADE_FROM, pid.to_string());
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .context("cannot start a group process")?;
    slot.generation += 1;
    slot.started = Instant::now();
    slot.stdin = child.stdin.take();
    slot.node.pid = child.id();
    slot.node.state = State::Starting;
    slot.node.api = None;
    if let Some(out) = child.stdout.take() {
        let (tx, index, generation) = (tx.clone(), slot.node.index, slot.generation);
        std::thread::Builder::new()
            .name("clarion-group-out".into())
            .spawn(move || {
                // The first ready line is reported; the rest is drained so the member never
                // blocks on a full pipe.
                let mut reported = false;
                for line in std::io::BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if !reported && line.starts_with("clarion ready") {
                        reported = true;
                        let field = |name: &str| {
                            line.split_whitespace()
                                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                                .map(str::to_owned)
                        };
                        let _ = tx.send(Ready {
                            index,
                            generation,
                            api: field("node_api").and_then(|a| a.parse().ok()),
                            taken: field("handover").and_then(|n| n.parse().ok()),
                        });
                    }
                }
            })
            .context("cannot start a reader thread")?;
    }
    slot.child = Some(child);
    Ok(())
}

/// One step of a rolling upgrade; `true` once every member has been replaced. The member at
/// `r.at` steps aside (it becomes the slot's [`Retiring`]) and its successor starts with its pid
/// to take its connections over; should the successor not start, the member is asked to stop
/// as a restart (the [`RESTART`] byte, then the end of its pipe) and the supervisor's loop
/// starts a fresh one when it has exited. Once the successor is ready and the member gone, the
/// next member's turn comes.
fn roll(r: &mut Rolling, slots: &mut [Slot], tx: &mpsc::Sender<Ready>) -> bool {
    let Some(slot) = slots.get_mut(r.at) else {
        return true;
    };
    if !r.stopping {
        if slot.node.state != State::Up {
            // Not up (restarting after a crash): its turn waits until it is.
            return false;
        }
        let Some(child) = slot.child.take() else {
            return false;
        };
        let old = child.id();
        slot.retiring = Some(Retiring {
            child,
            stdin: slot.stdin.take(),
        });
        r.stopping = true;
        r.asked = slot.generation;
        slot.node.restarts += 1;
        match start(slot, tx, Some(old)) {
            Ok(()) => log::info(format_args!(
                "rolling upgrade: process {} (pid {old}) hands its connections to pid {}",
                slot.node.name, slot.node.pid
            )),
            Err(e) => {
                log::warn(format_args!(
                    "rolling upgrade: cannot start the successor of process {} ({e:#}); it \
                     restarts with a drain",
                    slot.node.name
                ));
                // Back in its slot, asked to stop: its exit starts the replacement.
                if let Some(mut back) = slot.retiring.take() {
                    if let Some(stdin) = back.stdin.as_mut() {
                        let _ = stdin.write_all(&[RESTART]);
                    }
                    slot.child = Some(back.child);
                    slot.stdin = None;
                    slot.node.pid = old;
                }
            }
        }
        return false;
    }
    // Its successor has started and is ready, and the member it replaced is gone: the next.
    if slot.generation > r.asked
        && slot.child.is_some()
        && slot.node.state == State::Up
        && slot.retiring.is_none()
    {
        if let Some(n) = slot.taken {
            r.handed += 1;
            r.moved += n;
        }
        r.at += 1;
        r.stopping = false;
        return r.at >= slots.len();
    }
    false
}

/// Reaps the slot's retiring member if it has exited; `true` if it did.
fn retired(slot: &mut Slot) -> bool {
    let Some(r) = slot.retiring.as_mut() else {
        return false;
    };
    let Ok(Some(status)) = r.child.try_wait() else {
        return false;
    };
    log::info(format_args!(
        "process {} (pid {}) {} after the hand-over",
        slot.node.name,
        r.child.id(),
        describe(status)
    ));
    slot.retiring = None;
    true
}

/// Records a member's readiness; `false` when it was an earlier start's.
fn mark_ready(slots: &mut [Slot], ready: &Ready) -> bool {
    let Some(slot) = slots.get_mut(ready.index) else {
        return false;
    };
    if slot.generation != ready.generation || slot.child.is_none() {
        return false;
    }
    slot.node.state = State::Up;
    slot.node.api = ready.api;
    slot.taken = ready.taken;
    log::info(format_args!(
        "process {} ready (pid {})",
        slot.node.name, slot.node.pid
    ));
    true
}

/// The exit status of the slot's member if it has exited (and then forgets it).
fn exited(slot: &mut Slot) -> Option<ExitStatus> {
    let status = slot.child.as_mut()?.try_wait().ok()??;
    slot.child = None;
    slot.stdin = None;
    slot.node.state = State::Down;
    slot.node.api = None;
    slot.node.pid = 0;
    Some(status)
}

/// "exited with status 1", "was killed by signal 9".
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "ended".to_owned(),
    }
}

fn write_nodes(dir: &Path, slots: &[Slot]) {
    let list: Vec<Node> = slots.iter().map(|s| s.node.clone()).collect();
    let _ = std::fs::create_dir_all(dir);
    if let Err(e) = nodes::write(dir, &list) {
        log::warn(format_args!("cannot write the group's nodes file: {e}"));
    }
}

/// The group's ready line: the shared addresses and the process count.
fn announce(
    listen: SocketAddr,
    tls: Option<SocketAddr>,
    api: SocketAddr,
    n: usize,
) -> anyhow::Result<()> {
    log::info(format_args!(
        "group of {n} processes: clients on {listen}, API on {api} (metrics for the group)"
    ));
    let tls = tls.map_or_else(String::new, |a| format!(" tls={a}"));
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "clarion ready clients={listen} api={api}{tls} processes={n}"
    )?;
    out.flush()?;
    Ok(())
}

/// Stops every member: closes their pipes (each then shuts down as on SIGTERM), waits up to
/// `wait` for them to exit, and kills what is left. A second signal kills at once.
fn stop(slots: &mut [Slot], signals: &mut signal_hook::iterator::Signals, wait: Duration) {
    for slot in slots.iter_mut() {
        slot.stdin = None;
        slot.next_start = None;
        if let Some(r) = slot.retiring.as_mut() {
            r.stdin = None;
        }
    }
    let deadline = Instant::now() + wait;
    loop {
        for slot in slots.iter_mut() {
            let _ = exited(slot);
            let _ = retired(slot);
        }
        if slots
            .iter()
            .all(|s| s.child.is_none() && s.retiring.is_none())
        {
            return;
        }
        let hurry = signals.pending().any(|sig| sig != SIGHUP);
        if hurry || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(GROUP_TICK);
    }
    for slot in slots.iter_mut() {
        let retiring = slot.retiring.take().map(|r| r.child);
        for mut child in slot.child.take().into_iter().chain(retiring) {
            log::warn(format_args!(
                "process {} (pid {}) did not stop in time: killing it",
                slot.node.name,
                child.id()
            ));
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_to_a_bound_and_start_over_after_a_long_run() {
        let mut backoff = GROUP_RESTART_BACKOFF;
        let mut delays = Vec::new();
        for _ in 0..12 {
            let (delay, next) = restart_delay(backoff, Duration::from_secs(1));
            delays.push(delay);
            backoff = next;
        }
        assert_eq!(delays[0], GROUP_RESTART_BACKOFF);
        assert_eq!(delays[1], GROUP_RESTART_BACKOFF * 2);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(delays.last(), Some(&GROUP_RESTART_MAX_BACKOFF));
        let (delay, _) = restart_delay(GROUP_RESTART_MAX_BACKOFF, GROUP_BACKOFF_RESET);
        assert_eq!(delay, GROUP_RESTART_BACKOFF);
    }

    #[test]
    fn exits_are_described_by_code_or_signal() {
        assert_eq!(describe(ExitStatus::from_raw(256)), "exited with status 1");
        assert_eq!(describe(ExitStatus::from_raw(9)), "was killed by signal 9");
    }

    #[test]
    fn a_reservation_resolves_port_zero_members_share_it_and_strangers_are_refused() {
        let (_hold, addr) = reserve("127.0.0.1:0".parse().unwrap(), "client").unwrap();
        assert_ne!(addr.port(), 0);
        // Two members bind and listen beside the (never listening) reservation.
        let member = || {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.set_reuse_address(true).unwrap();
            s.set_reuse_port(true).unwrap();
            s.bind(&addr.into()).unwrap();
            s.listen(8).unwrap();
            s
        };
        let (_a, _b) = (member(), member());
        assert!(guard::check(addr, "client").is_err());
    }
}
