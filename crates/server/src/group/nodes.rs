//! The nodes file: the supervisor's list of its members, read by whichever member answers the
//! group's `/metrics` or `/healthz`.
//!
//! One line per member, tab-separated: index, state, private API address (`-` until known),
//! restarts, pid (`0` when not running) and node name last (the only free text; tabs and line
//! breaks in it are replaced). The supervisor is the only writer and replaces the file whole
//! (write, then rename), so a reader sees the old list or the new one, never half of one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The file's name in the group's directory.
const FILE: &str = "nodes";

/// The nodes file in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Where a member is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Started, not ready yet.
    Starting,
    /// Printed its ready line: serving.
    Up,
    /// Exited; waiting to be started again.
    Down,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Up => "up",
            State::Down => "down",
        }
    }

    fn parse(s: &str) -> Option<State> {
        Some(match s {
            "starting" => State::Starting,
            "up" => State::Up,
            "down" => State::Down,
            _ => return None,
        })
    }
}

/// One member as the supervisor last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its index in the group.
    pub index: usize,
    /// Its node name.
    pub name: String,
    /// Its state.
    pub state: State,
    /// Its private API address, once it reported one.
    pub api: Option<SocketAddr>,
    /// How often it was started again after dying.
    pub restarts: u64,
    /// Its process id, 0 when none runs.
    pub pid: u32,
}

/// The file's text for `nodes`.
pub fn format(nodes: &[Node]) -> String {
    let mut out = String::new();
    for n in nodes {
        let api = n.api.map_or_else(|| "-".to_owned(), |a| a.to_string());
        let name: String = n
            .name
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        out.push_str(&format!(
            "{}\t{}\t{api}\t{}\t{}\t{name}\n",
            n.index,
            n.state.name(),
            n.restarts,
            n.pid
        ));
    }
    out
}

/// The members listed in `text`; lines that do not parse are skipped (the file is ours, but a
/// reader must not fail the whole scrape on one).
pub fn parse(text: &str) -> Vec<Node> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.splitn(6, '\t');
            let index = f.next()?.parse().ok()?;
            let state = State::parse(f.next()?)?;
            let api = match f.next()? {
                "-" => None,
                a => Some(a.parse().ok()?),
            };
            let restarts = f.next()?.parse().ok()?;
            let pid = f.next()?.parse().ok()?;
            let name = f.next()?.to_owned();
            Some(Node {
                index,
                name,
                state,
                api,
                restarts,
                pid,
            })
        })
        .collect()
}

/// Replaces the file in `dir` with `nodes`.
pub fn write(dir: &Path, nodes: &[Node]) -> std::io::Result<()> {
    let tmp = dir.join(format!("{FILE}.tmp"));
    std::fs::write(&tmp, format(nodes))?;
    std::fs::rename(&tmp, path(dir))
}

/// The members listed in `dir`'s file.
pub fn read(dir: &Path) -> std::io::Result<Vec<Node>> {
    Ok(parse(&std::fs::read_to_string(path(dir))?))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_file_round_trips_and_skips_broken_lines() {
        let nodes = vec![
            Node {
                index: 0,
                name: "host:12-0".into(),
                state: State::Up,
                api: Some("127.0.0.1:4000".parse().unwrap()),
                restarts: 0,
                pid: 99,
            },
            Node {
                index: 1,
                name: "a name with spaces-1".into(),
                state: State::Down,
                api: None,
                restarts: 3,
                pid: 0,
            },
        ];
        let text = format(&nodes);
        assert_eq!(parse(&text), nodes);
        let broken = format!("{text}x\tup\n2\tweird\t-\t0\t0\tn\n");
        assert_eq!(parse(&broken), nodes);
    }

    #[test]
    fn a_name_cannot_break_the_lines() {
        let n = Node {
            index: 0,
            name: "evil\tname\nnext".into(),
            state: State::Starting,
            api: None,
            restarts: 0,
            pid: 1,
        };
        let parsed = parse(&format(&[n]));
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].name, "evil name next");
    }

    #[test]
    fn the_file_is_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("clarion-nodes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let n = Node {
            index: 0,
            name: "n-0".into(),
            state: State::Up,
            api: None,
            restarts: 0,
            pid: 1,
        };
        write(&dir, std::slice::from_ref(&n)).unwrap();
        assert_eq!(read(&dir).unwrap(), vec![n]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
