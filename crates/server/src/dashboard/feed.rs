//! One dashboard feed: Server-Sent Events on a blocking API thread.
//!
//! First a `window` event (the plot window, so plots start full), then a `stats` event each
//! time the sampler has a new sample (once a second). Between samples the thread waits by
//! reading its socket with a short timeout: a browser never sends anything on an EventSource
//! connection, so a read that returns 0 bytes (or fails) means the tab went away, and the thread
//! is freed within [`WAIT`] instead of at its next failed write. A browser reconnects by itself
//! (the `retry` field says after how long) and gets a fresh window.

use std::io::{self, ErrorKind};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use clarion_proto::http1;

use super::sample::{Sampler, PERIOD};
use super::FeedStream;
use crate::worker::Shared;

/// Longest wait on the socket between checks for a new sample, a closed tab or shutdown.
const WAIT: Duration = Duration::from_millis(250);

/// Milliseconds a browser waits before reconnecting a dropped feed (the SSE `retry` field).
const RETRY_MS: u32 = 2000;

/// Bytes a client may send on a feed before it is taken for something other than a browser's
/// EventSource and closed.
const MAX_CLIENT_BYTES: usize = 4096;

/// Serves one feed until the client goes away or the server stops.
pub fn run<S: FeedStream>(stream: &mut S, sampler: &Sampler, shared: &Shared) -> io::Result<()> {
    let mut head = Vec::with_capacity(256);
    http1::write_response_head(
        &mut head,
        200,
        &[
            ("Content-Type", "text/event-stream"),
            ("Cache-Control", "no-store"),
            ("X-Accel-Buffering", "no"),
        ],
        None,
    );
    // A watcher before the first sample is asked for, so that sample lists the busiest topics.
    sampler.watchers.fetch_add(1, Relaxed);
    let res = start_and_follow(stream, &head, sampler, shared);
    sampler.watchers.fetch_sub(1, Relaxed);
    res
}

fn start_and_follow<S: FeedStream>(
    stream: &mut S,
    head: &[u8],
    sampler: &Sampler,
    shared: &Shared,
) -> io::Result<()> {
    stream.write_all(head)?;
    let window = sampler.window_json();
    stream.write_all(format!("retry: {RETRY_MS}\nevent: window\ndata: {window}\n\n").as_bytes())?;
    let mut seen = 0u64;
    if let Some((seq, json)) = sampler.first(PERIOD, true) {
        seen = seq;
        stream.write_all(format!("event: stats\ndata: {json}\n\n").as_bytes())?;
    }
    stream.flush()?;
    events(stream, sampler, shared, seen)
}

fn events<S: FeedStream>(
    stream: &mut S,
    sampler: &Sampler,
    shared: &Shared,
    mut seen: u64,
) -> io::Result<()> {
    stream.socket().set_read_timeout(Some(WAIT))?;
    let mut received = 0usize;
    let mut scratch = [0u8; 512];
    loop {
        if shared.stopping.load(Relaxed) {
            return Ok(());
        }
        if let Some((seq, json)) = sampler.next(seen, Duration::ZERO) {
            seen = seq;
            stream.write_all(format!("event: stats\ndata: {json}\n\n").as_bytes())?;
            stream.flush()?;
        }
        match stream.read(&mut scratch) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                received += n;
                if received > MAX_CLIENT_BYTES {
                    return Ok(());
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
