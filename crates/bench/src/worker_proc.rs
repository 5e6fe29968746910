//! A bench worker process as the coordinator holds it: started as `clarion bench-worker`, given
//! its job as one JSON line on stdin, and read line by line: progress lines (`P`, JSON) update
//! the worker's slot in the shared progress table, every other line (its final report) is
//! passed on. Both coordinators (the regular run and the soak) start their workers this way; the
//! million run starts its own with [`start`] and reads them its way.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A running worker process.
pub(crate) struct Worker {
    pub(crate) child: Child,
    pub(crate) stdin: ChildStdin,
    /// Its lines that are not progress.
    pub(crate) lines: Receiver<String>,
}

impl Worker {
    /// Closes the worker's stdin, the end of its commands (a regular run's worker holds its
    /// connections until then), and waits for it to exit.
    pub(crate) fn let_go(self) {
        let Worker {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        let _ = child.wait();
    }
}

/// Starts `exe bench-worker` and gives it `job`: the process, its stdin, its stdout.
pub(crate) fn start<J: Serialize>(
    exe: &std::path::Path,
    job: &J,
) -> anyhow::Result<(Child, ChildStdin, ChildStdout)> {
    let mut child = Command::new(exe)
        .arg("bench-worker")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start a worker process")?;
    let mut stdin = child.stdin.take().context("worker stdin")?;
    writeln!(stdin, "{}", serde_json::to_string(job)?)?;
    let stdout = child.stdout.take().context("worker stdout")?;
    Ok((child, stdin, stdout))
}

/// Starts worker `w` of `exe` with `job`; its progress lines land in `progress[w]`.
pub(crate) fn spawn<J: Serialize, P: DeserializeOwned + Send + 'static>(
    exe: &std::path::Path,
    w: usize,
    job: &J,
    progress: &Arc<Mutex<Vec<P>>>,
) -> anyhow::Result<Worker> {
    let (child, stdin, stdout) = start(exe, job)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let slot = Arc::clone(progress);
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(p) = serde_json::from_str::<P>(&line) {
                if let Ok(mut all) = slot.lock() {
                    if let Some(s) = all.get_mut(w) {
                        *s = p;
                    }
                }
            } else if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok(Worker {
        child,
        stdin,
        lines: rx,
    })
}

/// The worker's side: the coordinator's commands, one JSON object per stdin line, read by a
/// thread that wakes `poll` (under `token`) after each. Keep the waker as long as the poll.
pub(crate) fn commands<C: DeserializeOwned + Send + 'static>(
    poll: &mio::Poll,
    token: mio::Token,
) -> std::io::Result<(Arc<mio::Waker>, Receiver<C>)> {
    let waker = Arc::new(mio::Waker::new(poll.registry(), token)?);
    let (tx, rx) = std::sync::mpsc::channel::<C>();
    let wake = Arc::clone(&waker);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if let Ok(c) = serde_json::from_str::<C>(&line) {
                let _ = tx.send(c);
                let _ = wake.wake();
            }
        }
    });
    Ok((waker, rx))
}
