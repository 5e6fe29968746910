//! What /proc says about a process: CPU time, resident memory, open files, and the kernel's TCP
//! memory. Multi-process servers (nginx, Pushpin) are measured as the sum over their processes.

/// User + system CPU seconds of process `pid`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at ") ".
    let rest = stat.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

/// Resident set size of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// How many times process `pid`'s main thread gave up the CPU to wait (its
/// `voluntary_ctxt_switches`): each is a sleep that something woke it from.
pub fn voluntary_switches(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.starts_with("voluntary_ctxt_switches:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The highest resident set size process `pid` ever had (`VmHWM`), in bytes.
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Kernel memory that grows with sockets, machine-wide, in bytes: the slab caches (socket
/// objects, inodes, dentries: about 4 KiB per TCP socket) plus the pages TCP buffers hold
/// (`/proc/net/sockstat`). Other activity on the machine moves it too, so compare deltas over
/// thousands of connections.
pub fn tcp_kernel_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let slab_kib: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("Slab:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let s = std::fs::read_to_string("/proc/net/sockstat").ok()?;
    let line = s.lines().find(|l| l.starts_with("TCP:"))?;
    let mut pages = 0;
    let mut it = line.split_whitespace();
    while let Some(w) = it.next() {
        if w == "mem" {
            pages = it.next()?.parse::<u64>().ok()?;
        }
    }
    Some(slab_kib * 1024 + pages * 4096)
}

/// Open file descriptors of process `pid` (entries of `/proc/PID/fd`).
pub fn open_fds(pid: u32) -> Option<u64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(dir.filter_map(Result::ok).count() as u64)
}

/// `f` summed over every process of `pids`; `None` when the list is empty or any process
/// cannot be read (a sum that silently drops a process would understate the server).
pub fn sum_over<T: std::iter::Sum<T>>(pids: &[u32], f: impl Fn(u32) -> Option<T>) -> Option<T> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().map(|&p| f(p)).sum()
}

fn clock_ticks() -> f64 {
    // USER_HZ is 100 on every Linux architecture Clarion targets.
    100.0
}

/// CPU time (user + system) of this process, from /proc.
pub fn own_cpu_seconds() -> f64 {
    cpu_seconds(std::process::id()).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_process() {
        let me = std::process::id();
        assert!(cpu_seconds(me).is_some());
        assert!(rss_bytes(me).is_some_and(|r| r > 0));
        assert!(peak_rss_bytes(me).is_some_and(|p| p >= rss_bytes(me).unwrap_or(0) / 2));
        assert!(tcp_kernel_bytes().is_some());
        assert!(open_fds(me).is_some_and(|n| n >= 3));
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn counts_the_sleeps_of_a_process() {
        // A process asleep in nanosleep gave up the CPU at least once.
        let mut child = std::process::Command::new("sleep")
            .arg("1")
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let switches = voluntary_switches(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(switches.is_some_and(|n| n >= 1), "{switches:?}");
        assert_eq!(voluntary_switches(u32::MAX), None);
    }

    #[test]
    fn sums_over_processes_or_says_nothing() {
        let one = |p: u32| if p == 0 { None } else { Some(u64::from(p)) };
        assert_eq!(sum_over(&[1, 2, 3], one), Some(6));
        assert_eq!(sum_over(&[1, 0, 3], one), None);
        assert_eq!(sum_over(&[], one), None);
    }
}
