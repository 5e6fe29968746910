#![allow(clippy::unwrap_used)]

use super::*;
use crate::test_rng::Rng;

const LIMITS: StreamLimits = StreamLimits {
    max_fragments: 4,
    max_bytes: 10,
    max_open_per_topic: 2,
};

#[test]
fn an_accumulator_counts_fragments_and_refuses_past_its_limits_and_after_done() {
    let mut a = Accumulator::open("He", &LIMITS).unwrap();
    assert_eq!(a.append("llo", false, &LIMITS), Ok(2));
    assert_eq!(
        a.append(", world", false, &LIMITS),
        Err(AppendError::Bytes(10))
    );
    assert_eq!(
        (a.text(), a.seq()),
        ("Hello", 2),
        "a refusal changes nothing"
    );
    assert_eq!(a.append("!", false, &LIMITS), Ok(3));
    assert_eq!(a.append("", false, &LIMITS), Ok(4));
    assert_eq!(a.append("", true, &LIMITS), Err(AppendError::Fragments(4)));
    assert_eq!(
        a.close(CloseReason::Timeout),
        Some(5),
        "a close passes the limit"
    );
    assert_eq!(a.closed(), Some(CloseReason::Timeout));
    assert_eq!(a.append("x", false, &LIMITS), Err(AppendError::Closed));
    assert_eq!(a.close(CloseReason::Done), None);
    let mut b = Accumulator::open("", &LIMITS).unwrap();
    assert_eq!(b.append("end", true, &LIMITS), Ok(2));
    assert_eq!(b.append("", true, &LIMITS), Err(AppendError::Closed));
}

#[test]
fn append_and_folded_events_are_typed_json_with_their_position_and_stream() {
    let e = StreamEvent {
        topic: "chat",
        id: "ab-7",
        stream: "ab-3",
        seq: 2,
        data: "lo \"x\"",
        closed: None,
    };
    assert_eq!(
        append_json(&e),
        r#"{"type":"append","topic":"chat","id":"ab-7","stream":"ab-3","seq":2,"data":"lo \"x\""}"#
    );
    let done = StreamEvent {
        closed: Some(CloseReason::Done),
        ..e
    };
    assert!(folded_json(&done).starts_with(r#"{"type":"message","#));
    assert!(folded_json(&done).ends_with(r#""done":true}"#));
    let timeout = StreamEvent {
        closed: Some(CloseReason::Timeout),
        ..e
    };
    assert!(append_json(&timeout).ends_with(r#""done":true,"reason":"timeout"}"#));
}

fn frag(pos: u64, stream: u64, data: &str, done: bool) -> Entry {
    Entry::Fragment {
        pos,
        stream,
        data: data.into(),
        closed: done.then_some(CloseReason::Done),
    }
}

#[test]
fn a_replay_folds_each_stream_into_one_message_at_its_latest_fragment() {
    let log = [
        frag(1, 1, "Hel", false),
        Entry::Message { pos: 2 },
        frag(3, 1, "lo", false),
        frag(4, 4, "A", false),
        Entry::Message { pos: 5 },
        frag(6, 1, "!", true),
    ];
    let folded = |pos, stream, seq, text: &str, done: bool| Replayed::Folded {
        pos,
        stream,
        seq,
        text: text.into(),
        closed: done.then_some(CloseReason::Done),
    };
    assert_eq!(
        fold(&log, 0),
        vec![
            Replayed::Message { pos: 2 },
            folded(4, 4, 1, "A", false),
            Replayed::Message { pos: 5 },
            folded(6, 1, 3, "Hello!", true),
        ]
    );
    assert_eq!(
        fold(&log, 4),
        vec![
            Replayed::Message { pos: 5 },
            folded(6, 1, 3, "Hello!", true)
        ]
    );
    assert_eq!(fold(&log, 6), vec![]);
}

#[test]
fn a_reader_drops_appends_it_holds_and_notices_missing_ones() {
    let mut r = Reader::default();
    assert_eq!(r.append("s", 1, "a", None), Seen::Applied);
    assert_eq!(r.folded("s", 3, "abc", None), Seen::Applied);
    assert_eq!(r.append("s", 2, "b", None), Seen::Stale);
    assert_eq!(r.append("s", 3, "c", None), Seen::Stale);
    assert_eq!(r.folded("s", 2, "ab", None), Seen::Stale);
    assert_eq!(r.append("s", 5, "e", None), Seen::Missing);
    assert_eq!(
        r.append("s", 4, "d", Some(CloseReason::Done)),
        Seen::Applied
    );
    assert_eq!(r.get("s"), Some(("abcd", 4, Some(CloseReason::Done))));
}

/// What a client applies, an event at a time.
fn live(r: &mut Reader, e: &Entry, seqs: &mut HashMap<u64, u32>) -> Seen {
    match e {
        Entry::Message { .. } => Seen::Applied,
        Entry::Fragment {
            stream,
            data,
            closed,
            ..
        } => {
            let seq = seqs.entry(*stream).or_insert(0);
            *seq += 1;
            r.append(&stream.to_string(), *seq, data, *closed)
        }
    }
}

/// A random topic log: messages and the fragments of up to four streams, some closed.
fn random_log(rng: &mut Rng) -> Vec<Entry> {
    let len = 1 + rng.below(30);
    let mut open: Vec<u64> = Vec::new();
    let mut log = Vec::with_capacity(len);
    for pos in 1..=len as u64 {
        let data: String = (0..rng.below(4))
            .map(|_| char::from(b'a' + rng.below(26) as u8))
            .collect();
        match rng.below(4) {
            0 => log.push(Entry::Message { pos }),
            1 if open.len() < 4 => {
                open.push(pos);
                log.push(frag(pos, pos, &data, false));
            }
            _ if !open.is_empty() => {
                let i = rng.below(open.len());
                let stream = open[i];
                let done = rng.below(5) == 0;
                if done {
                    open.remove(i);
                }
                log.push(frag(pos, stream, &data, done));
            }
            _ => log.push(Entry::Message { pos }),
        }
    }
    log
}

/// The whole text, seq and close of every stream of `log`.
fn whole(log: &[Entry]) -> HashMap<String, (String, u32, Option<CloseReason>)> {
    let mut out: HashMap<String, (String, u32, Option<CloseReason>)> = HashMap::new();
    for e in log {
        if let Entry::Fragment {
            stream,
            data,
            closed,
            ..
        } = e
        {
            let s = out.entry(stream.to_string()).or_default();
            s.0.push_str(data);
            s.1 += 1;
            s.2 = *closed;
        }
    }
    out
}

/// A client that followed the topic live up to cursor `c`, reconnected, was replayed what
/// history held at `t` after `c`, then got live events again from `from` (at or before `t`:
/// the replay and the live feed may overlap): every stream's text is exact, and the replay
/// gave each stream at most one message.
#[test]
fn a_reconnect_at_every_fragment_boundary_gives_the_exact_text() {
    let mut rng = Rng(0x5EED_A99E);
    for _ in 0..120 {
        let log = random_log(&mut rng);
        let want = whole(&log);
        for c in 0..=log.len() {
            for t in c..=log.len() {
                let from = t - rng.below(t - c + 1);
                let mut r = Reader::default();
                let mut seqs = HashMap::new();
                for e in &log[..c] {
                    assert_eq!(live(&mut r, e, &mut seqs), Seen::Applied);
                }
                let replay = fold(&log[..t], c as u64);
                let mut per_stream: HashMap<u64, usize> = HashMap::new();
                for x in &replay {
                    match x {
                        Replayed::Message { pos } => assert!(*pos > c as u64),
                        Replayed::Folded {
                            pos,
                            stream,
                            seq,
                            text,
                            closed,
                        } => {
                            assert!(*pos > c as u64 && *pos <= t as u64);
                            *per_stream.entry(*stream).or_default() += 1;
                            r.folded(&stream.to_string(), *seq, text, *closed);
                        }
                    }
                }
                assert!(per_stream.values().all(|n| *n == 1), "{replay:?}");
                // The live feed from `from`: the client's seqs are the publisher's.
                let mut seqs = HashMap::new();
                for e in &log[..from] {
                    if let Entry::Fragment { stream, .. } = e {
                        *seqs.entry(*stream).or_insert(0) += 1;
                    }
                }
                for e in &log[from..] {
                    let seen = live(&mut r, e, &mut seqs);
                    assert_ne!(seen, Seen::Missing, "log {log:?} c {c} t {t} from {from}");
                }
                for (stream, (text, seq, closed)) in &want {
                    assert_eq!(
                        r.get(stream),
                        Some((text.as_str(), *seq, *closed)),
                        "log {log:?} c {c} t {t} from {from}"
                    );
                }
            }
        }
    }
}
