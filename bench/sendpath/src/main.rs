//! What one ticker delivery costs the sending process, by the way the fan-out is submitted.
//!
//! A ticker message to N subscribers is N small writes to N sockets: nothing to coalesce. Clarion
//! and µWebSockets both make one `send` system call per delivery. This tool measures whether
//! handing the kernel the whole fan-out through io_uring (one `io_uring_enter` per batch of up to
//! 4,096 sends, optionally with registered files or a kernel polling thread) is cheaper, on this
//! machine's kernel, with the receiving side real: a second process holds the other ends and
//! reads every byte through epoll, as a client fleet would (on loopback the receiver's TCP work
//! runs in the sender's system call, so it is part of what is measured, as it is in a server).
//!
//! Usage: `sendpath [--sockets N] [--rounds R] [--size BYTES] [--only a,b]`. Each round sends one
//! message to every socket with each strategy in turn (interleaved), waits until the receiver has
//! read all of it, and records the sending process's CPU time (user + system, all its threads,
//! the io_uring polling thread included) and the wall time from the first send to the last
//! completion. It prints medians over the rounds and ratios to `send`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};

const QUEUE: u32 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    /// One `send(fd, buf, MSG_DONTWAIT | MSG_NOSIGNAL)` per socket: what Clarion and
    /// µWebSockets do.
    Send,
    /// io_uring `IORING_OP_SEND` for every socket, submitted in batches of 4,096.
    Uring,
    /// The same with the sockets registered once (`IORING_REGISTER_FILES`): no per-send file
    /// lookup and reference count.
    UringFixed,
    /// The same with a kernel thread polling the submission queue (`IORING_SETUP_SQPOLL`): no
    /// `io_uring_enter` at all while it is awake; its CPU is counted.
    UringSqpoll,
}

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::Send => "send",
            Strategy::Uring => "uring",
            Strategy::UringFixed => "uring-fixed",
            Strategy::UringSqpoll => "uring-sqpoll",
        }
    }
    const ALL: [Strategy; 4] = [
        Strategy::Send,
        Strategy::Uring,
        Strategy::UringFixed,
        Strategy::UringSqpoll,
    ];
}

struct Args {
    sockets: usize,
    rounds: usize,
    size: usize,
    only: Vec<Strategy>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        sockets: 15_000,
        rounds: 30,
        size: 32,
        only: Strategy::ALL.to_vec(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--sockets" => a.sockets = value()?.parse().map_err(|e| format!("--sockets: {e}"))?,
            "--rounds" => a.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--size" => a.size = value()?.parse().map_err(|e| format!("--size: {e}"))?,
            "--only" => {
                let v = value()?;
                a.only = v
                    .split(',')
                    .map(|n| {
                        Strategy::ALL
                            .into_iter()
                            .find(|s| s.name() == n)
                            .ok_or(format!("--only: unknown strategy {n}"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            "-h" | "--help" => {
                println!("sendpath [--sockets N] [--rounds R] [--size BYTES] [--only send,uring,uring-fixed,uring-sqpoll]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    if a.sockets == 0 || a.sockets > 19_000 || a.size == 0 || a.size > 4096 {
        return Err(
            "--sockets must be 1..=19000 (open files per process) and --size 1..=4096".into(),
        );
    }
    Ok(a)
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("receive") {
        if let Err(e) = receive() {
            eprintln!("sendpath receiver: {e}");
            std::process::exit(1);
        }
        return;
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sendpath: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("sendpath: {e}");
        std::process::exit(1);
    }
}

/// This process's CPU seconds (user + system, all threads).
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        t(u.ru_utime) + t(u.ru_stime)
    }
}

fn run(a: &Args) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .arg("receive")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("receiver: {e}"))?;
    let mut to_child = child.stdin.take().ok_or("receiver stdin")?;
    let mut from_child = BufReader::new(child.stdout.take().ok_or("receiver stdout")?);
    let mut line = String::new();
    from_child.read_line(&mut line).map_err(|e| e.to_string())?;
    let port: u16 = line
        .trim()
        .parse()
        .map_err(|_| format!("receiver said {line:?}"))?;
    writeln!(to_child, "{} {}", a.sockets, a.size).map_err(|e| e.to_string())?;

    let mut socks = Vec::with_capacity(a.sockets);
    for _ in 0..a.sockets {
        let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        socks.push(s);
    }
    let fds: Vec<RawFd> = socks.iter().map(AsRawFd::as_raw_fd).collect();
    wait_line(&mut from_child, "accepted")?;
    eprintln!(
        "sendpath: {} sockets, {} B per message, {} rounds of {:?}",
        a.sockets,
        a.size,
        a.rounds,
        a.only.iter().map(|s| s.name()).collect::<Vec<_>>()
    );

    let msg = vec![b'x'; a.size];
    let mut plain = IoUring::new(QUEUE).map_err(|e| format!("io_uring: {e}"))?;
    let mut fixed = IoUring::new(QUEUE).map_err(|e| format!("io_uring: {e}"))?;
    fixed
        .submitter()
        .register_files(&fds)
        .map_err(|e| format!("register files: {e}"))?;
    let mut sqpoll = IoUring::builder()
        .setup_sqpoll(50)
        .build(QUEUE)
        .map_err(|e| format!("io_uring sqpoll: {e}"))?;
    sqpoll
        .submitter()
        .register_files(&fds)
        .map_err(|e| format!("register files: {e}"))?;

    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); a.only.len()];
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); a.only.len()];
    for round in 0..a.rounds + 1 {
        for (k, &s) in a.only.iter().enumerate() {
            // Let the receiver and the kernel settle so each strategy starts from the same state.
            std::thread::sleep(Duration::from_millis(30));
            let c0 = cpu_seconds();
            let t0 = Instant::now();
            let sent = match s {
                Strategy::Send => send_each(&fds, &msg)?,
                Strategy::Uring => uring_all(&mut plain, &fds, &msg, false)?,
                Strategy::UringFixed => uring_all(&mut fixed, &fds, &msg, true)?,
                Strategy::UringSqpoll => uring_all(&mut sqpoll, &fds, &msg, true)?,
            };
            let w = t0.elapsed().as_secs_f64();
            let c = cpu_seconds() - c0;
            if sent != a.sockets {
                return Err(format!(
                    "{}: {sent} of {} sends completed",
                    s.name(),
                    a.sockets
                ));
            }
            wait_line(&mut from_child, "round")?;
            // The first round warms caches and the rings; it is not counted.
            if round > 0 {
                cpu[k].push(c);
                wall[k].push(w);
            }
        }
    }
    drop(to_child);
    let _ = child.wait();

    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let base_cpu = med(&mut cpu[0].clone());
    let base_wall = med(&mut wall[0].clone());
    println!(
        "{:<14} {:>16} {:>10} {:>20} {:>10}",
        "strategy", "CPU µs per send", "ratio", "fan-out wall ms", "ratio"
    );
    for (k, s) in a.only.iter().enumerate() {
        let c = med(&mut cpu[k]);
        let w = med(&mut wall[k]);
        println!(
            "{:<14} {:>16.3} {:>10.3} {:>20.2} {:>10.3}",
            s.name(),
            c * 1e6 / a.sockets as f64,
            c / base_cpu.max(1e-12),
            w * 1e3,
            w / base_wall.max(1e-12)
        );
    }
    println!(
        "medians of {} rounds, interleaved; ratios against `{}`",
        a.rounds,
        a.only.first().map_or("", |s| s.name())
    );
    Ok(())
}

fn wait_line(r: &mut impl BufRead, want: &str) -> Result<(), String> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() == want {
        Ok(())
    } else {
        Err(format!("receiver said {line:?}, expected {want}"))
    }
}

fn send_each(fds: &[RawFd], msg: &[u8]) -> Result<usize, String> {
    let mut done = 0;
    for &fd in fds {
        // SAFETY: `msg` outlives the call; `fd` is an open socket owned by the caller.
        let n = unsafe {
            libc::send(
                fd,
                msg.as_ptr().cast(),
                msg.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n == msg.len() as isize {
            done += 1;
        }
    }
    Ok(done)
}

/// Every socket gets one send: as many as the submission queue takes, then one
/// `submit_and_wait` for all of them, until every send has completed.
fn uring_all(ring: &mut IoUring, fds: &[RawFd], msg: &[u8], fixed: bool) -> Result<usize, String> {
    let (mut next, mut outstanding, mut completed, mut done) = (0usize, 0usize, 0usize, 0usize);
    while completed < fds.len() {
        {
            let mut sq = ring.submission();
            while let Some(&fd) = fds.get(next) {
                let op = if fixed {
                    opcode::Send::new(types::Fixed(next as u32), msg.as_ptr(), msg.len() as u32)
                } else {
                    opcode::Send::new(types::Fd(fd), msg.as_ptr(), msg.len() as u32)
                };
                let entry = op
                    .flags(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                    .build()
                    .user_data(next as u64);
                // SAFETY: `msg` outlives every send: we return only once all have completed.
                if unsafe { sq.push(&entry) }.is_err() {
                    break; // the queue is full: submit what is there first
                }
                next += 1;
                outstanding += 1;
            }
        }
        ring.submit_and_wait(outstanding)
            .map_err(|e| format!("io_uring_enter: {e}"))?;
        for cqe in ring.completion() {
            completed += 1;
            outstanding -= 1;
            if cqe.result() == msg.len() as i32 {
                done += 1;
            }
        }
    }
    Ok(done)
}

/// The receiving process: accepts the sockets, reads every byte through epoll, and says
/// `round` each time every socket has received one more message.
fn receive() -> Result<(), String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let mut out = std::io::stdout();
    writeln!(out, "{port}").map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let mut it = line
        .split_whitespace()
        .filter_map(|v| v.parse::<usize>().ok());
    let (n, size) = (it.next().ok_or("count")?, it.next().ok_or("size")?);
    let mut conns = Vec::with_capacity(n);
    // SAFETY: plain epoll calls on descriptors this process owns.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err("epoll_create1".into());
    }
    for i in 0..n {
        let (s, _) = listener.accept().map_err(|e| e.to_string())?;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: i as u64,
        };
        // SAFETY: see above.
        if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) } < 0 {
            return Err("epoll_ctl".into());
        }
        conns.push(s);
    }
    writeln!(out, "accepted").map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    let mut total = 0usize;
    let mut rounds = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 4096];
    // The parent closing our stdin ends the run; a thread watches it.
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
    loop {
        // SAFETY: see above; `events` has room for its length.
        let k = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, 1000) };
        for ev in events.iter().take(k.max(0) as usize) {
            let i = ev.u64 as usize;
            let Some(s) = conns.get_mut(i) else { continue };
            loop {
                match s.read(&mut buf) {
                    Ok(0) => return Ok(()),
                    Ok(m) => total += m,
                    Err(_) => break,
                }
            }
        }
        while total >= (rounds + 1) * n * size {
            rounds += 1;
            writeln!(out, "round").map_err(|e| e.to_string())?;
            out.flush().map_err(|e| e.to_string())?;
        }
    }
}
