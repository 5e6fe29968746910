//! The group's `/metrics` and `/healthz`: asked on the shared API port, answered by scraping
//! every member's private loopback address (listed in the [`super::nodes`] file) in parallel,
//! each bounded by [`GROUP_SCRAPE_TIMEOUT`], and merging what came back.

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};

use clarion_proto::http1::{parse_response_head, ResponseBody};

use super::merge::{escape_label, merge};
use super::nodes::{self, Node, State};
use super::Member;
use crate::config::limits::{GROUP_SCRAPE_MAX_BYTES, GROUP_SCRAPE_TIMEOUT};

/// Why one member could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The member has no private address (not ready, or down).
    #[error("not running")]
    NotRunning,
    /// Connecting, writing or reading failed (refused, timed out).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The answer was not an HTTP response we can read.
    #[error("unreadable answer")]
    Malformed,
    /// The answer was larger than [`GROUP_SCRAPE_MAX_BYTES`].
    #[error("answer too large")]
    TooLarge,
}

/// `GET path` on a member's private address: the status and body.
pub fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), ScrapeError> {
    let mut s = TcpStream::connect_timeout(&addr, GROUP_SCRAPE_TIMEOUT)?;
    s.set_read_timeout(Some(GROUP_SCRAPE_TIMEOUT))?;
    s.set_write_timeout(Some(GROUP_SCRAPE_TIMEOUT))?;
    // One write: `write!` would send each piece on its own.
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes())?;
    let mut buf = Vec::new();
    let limit = u64::try_from(GROUP_SCRAPE_MAX_BYTES).unwrap_or(u64::MAX) + 1;
    s.take(limit).read_to_end(&mut buf)?;
    if buf.len() > GROUP_SCRAPE_MAX_BYTES {
        return Err(ScrapeError::TooLarge);
    }
    let head = parse_response_head(&buf, 64, 16 * 1024)
        .map_err(|_| ScrapeError::Malformed)?
        .ok_or(ScrapeError::Malformed)?;
    let rest = buf.get(head.head_len..).unwrap_or_default();
    let body = match head.body("GET").map_err(|_| ScrapeError::Malformed)? {
        ResponseBody::None => &[][..],
        ResponseBody::Length(n) => rest
            .get(..usize::try_from(n).unwrap_or(usize::MAX))
            .ok_or(ScrapeError::Malformed)?,
        ResponseBody::UntilClose => rest,
        // The API answers with a length; a chunked answer is not one of ours.
        ResponseBody::Chunked => return Err(ScrapeError::Malformed),
    };
    Ok((head.status, String::from_utf8_lossy(body).into_owned()))
}

/// Asks every listed member for `path` at once; answers in the list's order.
fn ask_all(nodes: &[Node], path: &str) -> Vec<Result<(u16, String), ScrapeError>> {
    std::thread::scope(|scope| {
        let asks: Vec<_> = nodes
            .iter()
            .map(|n| {
                scope.spawn(move || match (n.state, n.api) {
                    (State::Up, Some(addr)) => get(addr, path),
                    _ => Err(ScrapeError::NotRunning),
                })
            })
            .collect();
        asks.into_iter()
            .map(|a| a.join().unwrap_or(Err(ScrapeError::Malformed)))
            .collect()
    })
}

/// The group's metrics: every member's merged (see [`super::merge`]), then the group's own
/// families: processes configured, each member up or not, and its restarts.
pub fn metrics(member: &Member, processes: usize) -> String {
    let nodes = nodes::read(&member.dir).unwrap_or_default();
    let answers = ask_all(&nodes, "/metrics");
    let texts: Vec<(&str, &str)> = nodes
        .iter()
        .zip(&answers)
        .filter_map(|(n, a)| match a {
            Ok((200, text)) => Some((n.name.as_str(), text.as_str())),
            _ => None,
        })
        .collect();
    let mut out = merge(&texts);
    let _ = writeln!(
        out,
        "# HELP clarion_group_processes Processes configured in this group (--processes).\n\
         # TYPE clarion_group_processes gauge\nclarion_group_processes {processes}"
    );
    let _ = writeln!(
        out,
        "# HELP clarion_group_node_up Whether a group process answered this scrape.\n\
         # TYPE clarion_group_node_up gauge"
    );
    for (n, a) in nodes.iter().zip(&answers) {
        let up = u8::from(matches!(a, Ok((200, _))));
        let _ = writeln!(
            out,
            "clarion_group_node_up{{node=\"{}\"}} {up}",
            escape_label(&n.name)
        );
    }
    let _ = writeln!(
        out,
        "# HELP clarion_group_restarts_total Times a group process was started again after it died.\n\
         # TYPE clarion_group_restarts_total counter"
    );
    for n in &nodes {
        let _ = writeln!(
            out,
            "clarion_group_restarts_total{{node=\"{}\"}} {}",
            escape_label(&n.name),
            n.restarts
        );
    }
    out
}

/// The group's health: `200` with `ok` while every member answers its own `/healthz` with
/// `200`, `200` with `degraded` while some do (the group still serves: the kernel gives new
/// connections only to live listeners), `503` when none does; then one line per member.
pub fn health(member: &Member) -> (u16, String) {
    let nodes = nodes::read(&member.dir).unwrap_or_default();
    let answers = ask_all(&nodes, "/healthz");
    let mut lines = String::new();
    let mut ok = 0;
    for (n, a) in nodes.iter().zip(&answers) {
        let state = match a {
            Ok((200, _)) => {
                ok += 1;
                "ok".to_owned()
            }
            Ok((status, body)) => format!("{status} {}", body.trim()),
            Err(e) => format!("down ({e})"),
        };
        let pid = match n.pid {
            0 => String::new(),
            pid => format!(" pid {pid}"),
        };
        let _ = writeln!(lines, "{} {state}{pid} restarts {}", n.name, n.restarts);
    }
    let (status, word) = match ok {
        0 => (503, "down"),
        n if n == nodes.len() => (200, "ok"),
        _ => (200, "degraded"),
    };
    (
        status,
        format!("{word} ({ok} of {} processes)\n{lines}", nodes.len()),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-shot HTTP server answering `answer` to the first request.
    fn serve_once(answer: &'static str) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                // The whole request, so closing with unread bytes cannot reset the answer.
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.ends_with(b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(n @ 1..) => head.extend_from_slice(&buf[..n]),
                        _ => break,
                    }
                }
                let _ = s.write_all(answer.as_bytes());
            }
        });
        addr
    }

    fn member(dir: &std::path::Path) -> Member {
        Member {
            index: 0,
            node: "g-0".into(),
            dir: dir.to_owned(),
            listen: "127.0.0.1:1".parse().unwrap(),
            tls_listen: None,
            api_listen: "127.0.0.1:2".parse().unwrap(),
        }
    }

    #[test]
    fn a_length_framed_answer_is_read() {
        let addr = serve_once("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello trailing");
        assert_eq!(get(addr, "/metrics").unwrap(), (200, "hello".into()));
        let addr = serve_once("nonsense\r\n\r\n");
        assert!(matches!(get(addr, "/"), Err(ScrapeError::Malformed)));
    }

    #[test]
    fn the_group_view_merges_live_members_and_reports_the_rest() {
        let dir = std::env::temp_dir().join(format!("clarion-scrape-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let body =
            "# TYPE clarion_messages_published_total counter\nclarion_messages_published_total 4\n";
        let answer: &'static str = Box::leak(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_boxed_str(),
        );
        let a = serve_once(answer);
        let b = serve_once(answer);
        // A port nobody listens on: bound, then closed.
        let dead = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let node = |index, name: &str, state, api| Node {
            index,
            name: name.into(),
            state,
            api,
            restarts: index as u64,
            pid: 10 + index as u32,
        };
        let list = vec![
            node(0, "g-0", State::Up, Some(a)),
            node(1, "g-1", State::Up, Some(b)),
            node(2, "g-2", State::Up, Some(dead)),
            node(3, "g-3", State::Down, None),
        ];
        nodes::write(&dir, &list).unwrap();
        let out = metrics(&member(&dir), 4);
        assert!(
            out.contains("\nclarion_messages_published_total 8\n"),
            "{out}"
        );
        assert!(out.contains("clarion_messages_published_total{node=\"g-1\"} 4"));
        assert!(out.contains("clarion_group_node_up{node=\"g-0\"} 1"));
        assert!(out.contains("clarion_group_node_up{node=\"g-2\"} 0"));
        assert!(out.contains("clarion_group_restarts_total{node=\"g-3\"} 3"));
        assert!(out.contains("clarion_group_processes 4"));

        let ok = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";
        let list = vec![
            node(0, "g-0", State::Up, Some(serve_once(ok))),
            node(1, "g-1", State::Down, None),
        ];
        nodes::write(&dir, &list).unwrap();
        let (status, text) = health(&member(&dir));
        assert_eq!(status, 200);
        assert!(text.starts_with("degraded (1 of 2 processes)\n"), "{text}");
        assert!(text.contains("g-0 ok pid 10 restarts 0\n"), "{text}");
        assert!(text.contains("g-1 down (not running)"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
