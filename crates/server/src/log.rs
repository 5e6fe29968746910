//! Minimal logging to stderr: one line per event, with a level and the time since start.
//!
//! `CLARION_LOG=debug` shows per-connection reasons (every refused request and failed
//! connection); the default `info` shows lifecycle events and warnings only, so a client that
//! misbehaves cannot flood the log.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

const WARN: u8 = 1;
const INFO: u8 = 2;
const DEBUG: u8 = 3;

static LEVEL: AtomicU8 = AtomicU8::new(INFO);
static START: OnceLock<Instant> = OnceLock::new();
/// The node name a member of a `--processes` group puts on its lines: the group's processes
/// share one stderr, and a line must say which one wrote it.
static NODE: OnceLock<String> = OnceLock::new();

/// The values `CLARION_LOG` takes (`trace` means `debug`, `error` means `warn`).
const LEVEL_NAMES: &[&str] = &["warn", "info", "debug", "error", "trace"];

/// The level a `CLARION_LOG` value names (case-insensitive), `None` for anything else.
fn level_of(value: &str) -> Option<u8> {
    match value.to_ascii_lowercase().as_str() {
        "debug" | "trace" => Some(DEBUG),
        "" | "info" => Some(INFO),
        "warn" | "error" => Some(WARN),
        _ => None,
    }
}

/// Reads `CLARION_LOG` (`warn`, `info`, `debug`); call once at startup. Another value is warned
/// about (naming the nearest level) and means `info`.
pub fn init() {
    START.get_or_init(Instant::now);
    let value = std::env::var("CLARION_LOG").unwrap_or_default();
    LEVEL.store(level_of(&value).unwrap_or(INFO), Relaxed);
    if level_of(&value).is_none() {
        warn(format_args!("{}", bad_level(&value)));
    }
}

/// The warning for a `CLARION_LOG` value that is not a level.
fn bad_level(value: &str) -> String {
    let near = crate::spelling::closest(value, LEVEL_NAMES.iter().copied())
        .map_or_else(String::new, |l| format!(" (did you mean {l}?)"));
    format!("CLARION_LOG={value:?} is not a level: use warn, info or debug{near}; logging at info")
}

/// Tags every later line with `[node]`; the first call wins.
pub fn set_node(node: &str) {
    let _ = NODE.set(node.to_owned());
}

/// Whether debug lines are shown (to skip formatting work when they are not).
pub fn debug_enabled() -> bool {
    LEVEL.load(Relaxed) >= DEBUG
}

fn emit(level: u8, tag: &str, args: std::fmt::Arguments<'_>) {
    if LEVEL.load(Relaxed) >= level {
        let t = START.get_or_init(Instant::now).elapsed().as_secs_f64();
        let line = match NODE.get() {
            Some(node) => format!("{t:10.3} {tag} [{node}] {args}\n"),
            None => format!("{t:10.3} {tag} {args}\n"),
        };
        // A URL that reached the line with its password (in a library's error, say) loses it.
        write_line(&mut std::io::stderr().lock(), &crate::redact::urls(&line));
    }
}

/// Writes one log line in one `write` (the processes of a group share a stderr, and a line
/// must not interleave with another's). A stderr nobody reads any more (a closed pipe, a log
/// shipper that went away) loses the line and nothing else: `eprintln!` would panic here and
/// take down whichever thread logged, a worker with its connections or the thread that stops
/// a group member when its supervisor dies.
fn write_line(out: &mut impl std::io::Write, line: &str) {
    let _ = out.write_all(line.as_bytes());
}

/// Something an operator should look at.
pub fn warn(args: std::fmt::Arguments<'_>) {
    emit(WARN, "WARN ", args);
}

/// A lifecycle event (listening, shutting down).
pub fn info(args: std::fmt::Arguments<'_>) {
    emit(INFO, "INFO ", args);
}

/// A per-connection event (refused request, protocol violation).
pub fn debug(args: std::fmt::Arguments<'_>) {
    emit(DEBUG, "DEBUG", args);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose reader is gone, like a stderr pipe after its reader exited.
    struct Closed;

    impl std::io::Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_to_a_closed_stderr_is_lost_without_a_panic() {
        write_line(&mut Closed, "0.000 INFO  stopping\n");
    }

    #[test]
    fn levels_are_read_and_mistakes_named() {
        assert_eq!(level_of("DEBUG"), Some(DEBUG));
        assert_eq!(level_of(""), Some(INFO));
        assert_eq!(level_of("error"), Some(WARN));
        assert_eq!(level_of("dbug"), None);
        assert_eq!(
            bad_level("dbug"),
            "CLARION_LOG=\"dbug\" is not a level: use warn, info or debug (did you mean \
             debug?); logging at info"
        );
        assert!(bad_level("verbose").ends_with("use warn, info or debug; logging at info"));
    }
}
