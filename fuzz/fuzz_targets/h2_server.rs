//! A whole HTTP/2 server connection under a client's bytes: the preface, frames, header blocks,
//! in pieces of any size. Nothing panics; `receive` never claims more bytes than it was given
//! and keeps less than one frame; after a connection error it has sent GOAWAY; a stream's
//! answer, framed through `respond`, never exceeds what the windows allowed; a run of events
//! after it, framed through `respond_run`, never frames more than it says it used; a
//! connection that dozes between reads (`Connection::doze`) wakes as it was (its hand-over
//! bytes are the same), and one that may not doze is handed back as it was.
#![no_main]

use clarion_proto::h2::frame::{parse, Frame};
use clarion_proto::h2::server::{Connection, Event, Settings};
use libfuzzer_sys::fuzz_target;

const ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: x\n\n";

fuzz_target!(|data: &[u8]| {
    // The first byte chooses how the input is cut into reads.
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    let settings = Settings {
        max_streams: 8,
        max_header_list: 4096,
        ..Settings::default()
    };
    let mut c = Connection::new(settings);
    let mut buf: Vec<u8> = Vec::new();
    let mut user = 0u32;
    for piece in data.chunks(step) {
        buf.extend_from_slice(piece);
        let (mut out, mut events) = (Vec::new(), Vec::new());
        let res = c.receive(&buf, &mut out, &mut events);
        let mut opened = Vec::new();
        for e in &events {
            if let Event::Request { stream, .. } = e {
                opened.push(*stream);
            }
        }
        drop(events);
        match res {
            Ok(used) => {
                assert!(used <= buf.len());
                buf.drain(..used);
            }
            Err(_) => {
                assert!(c.going_away());
                assert!(contains_goaway(&out));
                return;
            }
        }
        for s in opened {
            user += 1;
            c.bind(s, user);
            let mut frames = Vec::new();
            let n = c.respond(s, ANSWER, &mut frames);
            assert!(n <= ANSWER.len());
            if n == ANSWER.len() {
                let before = frames.len();
                let (whole, at) = c.respond_run(s, &RUN, &mut frames);
                assert!(whole <= RUN.len());
                match RUN.get(whole) {
                    Some(part) => assert!(at < part.len()),
                    None => assert_eq!(at, 0),
                }
                let used: usize = RUN.iter().take(whole).map(|p| p.len()).sum::<usize>() + at;
                assert!(data_bytes(frames.get(before..).unwrap_or_default()) <= used);
            }
            let _ = c.end(s, &mut frames);
        }
        // An odd first byte lets a second pass between reads (the flood counts start again,
        // and what passes is given back when empty), as between a worker's sweeps.
        if cut % 2 == 1 {
            c.tick();
        }
        let was = parked(&c);
        c = match c.doze(&settings) {
            Ok(d) => d.wake(settings),
            Err(c) => c,
        };
        assert_eq!(parked(&c), was);
    }
});

fn parked(c: &Connection) -> Vec<u8> {
    let mut v = Vec::new();
    c.park(&mut v);
    v
}

/// Events after the answer's head, one of them empty.
const RUN: [&[u8]; 3] = [b"data: a\n\n", b"", b"data: bb\n\n"];

/// The DATA payload bytes in `out`.
fn data_bytes(out: &[u8]) -> usize {
    let mut rest = out;
    let mut n = 0;
    while let Ok(Some((f, used))) = parse(rest, 1 << 24) {
        if let Frame::Data { data, .. } = f {
            n += data.len();
        }
        rest = &rest[used..];
    }
    n
}

fn contains_goaway(out: &[u8]) -> bool {
    let mut rest = out;
    while let Ok(Some((f, used))) = parse(rest, 1 << 24) {
        if matches!(f, Frame::GoAway { .. }) {
            return true;
        }
        rest = &rest[used..];
    }
    false
}
