//! The contract between an HTTP/2 server connection and the layer above that keeps a record
//! per stream (the engine's stream records), under any client bytes: the layer above makes a
//! record only for a stream still open once a read is taken, finds a stream's record through
//! `user_of` and `Event::Reset`, and lets records go by `end` and `cancel`, as the engine
//! does. After every step, every record belongs to a stream the connection has open and bound
//! to it, and there are never more than `max_streams` (the "MadeYouReset" class: records kept
//! for streams the server reset).
#![no_main]

use clarion_proto::h2::frame::ErrorCode;
use clarion_proto::h2::response::Ended;
use clarion_proto::h2::server::{Connection, Event, Settings};
use libfuzzer_sys::fuzz_target;

const MAX_STREAMS: u32 = 4;
const ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: x\n\n";

/// One record of the layer above: its handle and its stream.
struct Record {
    user: u32,
    stream: u32,
}

fuzz_target!(|data: &[u8]| {
    // The first byte chooses how the input is cut into reads; the first byte of each read
    // also chooses what the layer above does after it.
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut % 64).max(1);
    let mut c = Connection::new(Settings {
        max_streams: MAX_STREAMS,
        max_header_list: 4096,
        ..Settings::default()
    });
    let mut records: Vec<Record> = Vec::new();
    let mut next_user = 0u32;
    let mut buf: Vec<u8> = Vec::new();
    for piece in data.chunks(step) {
        buf.extend_from_slice(piece);
        let (mut out, mut events) = (Vec::new(), Vec::new());
        let res = c.receive(&buf, &mut out, &mut events);
        let mut opened = Vec::new();
        for e in &events {
            match e {
                Event::Request { stream, .. } => opened.push(*stream),
                Event::Data { stream, .. } => {
                    // Bytes for a stream reach its record, if it has one.
                    if let Some(u) = c.user_of(*stream) {
                        assert!(records.iter().any(|r| r.user == u && r.stream == *stream));
                    }
                }
                Event::Reset { stream, user } => {
                    if let Some(u) = user {
                        records.retain(|r| !(r.user == *u && r.stream == *stream));
                    }
                }
            }
        }
        drop(events);
        for s in opened {
            // Reset later in the same read: no record.
            if !c.is_open(s) {
                continue;
            }
            assert!(records.len() < MAX_STREAMS as usize, "a stream past the limit");
            next_user += 1;
            c.bind(s, next_user);
            records.push(Record {
                user: next_user,
                stream: s,
            });
        }
        match res {
            Ok(used) => {
                buf.drain(..used.min(buf.len()));
            }
            Err(_) => {
                // The connection ends, and its records with it.
                assert!(c.going_away());
                return;
            }
        }
        // The layer above: answers and lets go of the oldest record, gives up the newest,
        // or a second passes.
        match piece.first().map_or(0, |b| b % 5) {
            1 if !records.is_empty() => {
                let r = records.remove(0);
                let mut frames = Vec::new();
                let n = c.respond(r.stream, ANSWER, &mut frames);
                assert!(n <= ANSWER.len());
                if c.end(r.stream, &mut frames) == Ended::Later {
                    records.push(r);
                }
            }
            2 => {
                if let Some(r) = records.pop() {
                    c.cancel(r.stream, ErrorCode::Cancel, &mut Vec::new());
                }
            }
            3 => c.tick(),
            _ => {}
        }
        for r in &records {
            assert!(c.is_open(r.stream), "a record for closed stream {}", r.stream);
            assert_eq!(c.user_of(r.stream), Some(r.user));
        }
        assert!(records.len() <= MAX_STREAMS as usize);
    }
});
