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

/// Reads `CLARION_LOG` (`warn`, `info`, `debug`); call once at startup.
pub fn init() {
    START.get_or_init(Instant::now);
    let level = match std::env::var("CLARION_LOG").as_deref() {
        Ok("debug") | Ok("trace") => DEBUG,
        Ok("warn") | Ok("error") => WARN,
        _ => INFO,
    };
    LEVEL.store(level, Relaxed);
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
        match NODE.get() {
            Some(node) => eprintln!("{t:10.3} {tag} [{node}] {args}"),
            None => eprintln!("{t:10.3} {tag} {args}"),
        }
    }
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
