//! The streams scenario's bookkeeping, without I/O: the fragments each stream is made of, and
//! what one subscriber of one topic must receive, live and across its resume, checked event by
//! event (the client's fold rule of docs/protocol.md, "Appendable messages").

/// The fragments of stream `stream`: `count` texts of 4 to 8 bytes of `abcdefgh ` (like
/// bench/append_streams.py), the same for the same `seed`.
pub fn fragments(seed: u64, stream: usize, count: usize) -> Vec<String> {
    let mut rng = Rng::new(seed ^ (stream as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..count)
        .map(|_| {
            let len = 4 + rng.below(5);
            (0..len)
                .map(|_| char::from(*b"abcdefgh ".get(rng.below(9)).unwrap_or(&b'a')))
                .collect()
        })
        .collect()
}

/// A small deterministic generator (xorshift64*): which subscribers resume, and where.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        if n == 0 {
            0
        } else {
            ((x >> 11) % n as u64) as usize
        }
    }
}

/// What a subscriber of one topic has received, checked against the fragments published to it.
/// Plain phase: each message is the next fragment as a message of its own. Stream phase: each
/// event is the next `append`, except the one folded message a resume begins with.
#[derive(Debug, Clone, Default)]
pub struct Follower {
    /// Fragments held: the text so far is the first `held` fragments.
    pub held: usize,
    /// The stream's last fragment (`"done":true`) has arrived.
    pub done: bool,
    /// The id of the last event, to resume from.
    pub last_id: String,
    /// After a resume: the fragments the publisher had acknowledged when the resuming request
    /// was sent (the least the folded text may hold), until the first event settles it.
    pub resuming_from: Option<usize>,
    /// What the resume delivered, once it has.
    pub resumed: Option<Resumed>,
}

/// What a resume delivered before the live appends went on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Resumed {
    /// Messages received that the resume replayed (stream phase: the folded message, 1;
    /// plain phase: one per fragment published since the cursor, up to the live ones).
    pub messages: u64,
    /// Their `data` bytes.
    pub data_bytes: u64,
    /// Their WebSocket frames' bytes (header and JSON envelope).
    pub frame_bytes: u64,
    /// The text so far at that moment: the bytes of the fragments the folded message holds
    /// (plain phase: of those the replayed messages held).
    pub text_bytes: u64,
}

/// One event from the server, as the check needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// `append` (true) or `message`.
    pub append: bool,
    /// The fragment count (`seq`) of a stream event.
    pub seq: Option<usize>,
    pub data: &'a str,
    pub done: bool,
    /// The bytes of the frame that carried it.
    pub frame_len: usize,
}

impl Follower {
    /// The subscriber closes to resume from `last_id`; the publisher has had `acked` fragments
    /// of this topic accepted so far.
    pub fn resume(&mut self, acked: usize) {
        self.resuming_from = Some(acked.max(self.held));
        self.resumed = Some(Resumed::default());
    }

    /// Checks a plain-phase message: the next fragment, as it was published.
    pub fn on_plain(&mut self, script: &[String], e: &Event<'_>) -> Result<(), String> {
        if e.append || e.seq.is_some() {
            return Err("a stream event in the plain phase".into());
        }
        let want = script
            .get(self.held)
            .ok_or("a message past the last one published")?;
        if e.data != want {
            return Err(format!(
                "message {} is {:?}, published {want:?}",
                self.held + 1,
                e.data
            ));
        }
        // A resume replays from the cursor: every message up to what was published when the
        // resume was asked for counts as replayed.
        if let (Some(from), Some(r)) = (self.resuming_from, self.resumed.as_mut()) {
            if self.held < from {
                r.messages += 1;
                r.data_bytes += e.data.len() as u64;
                r.frame_bytes += e.frame_len as u64;
                r.text_bytes += want.len() as u64;
            } else {
                self.resuming_from = None;
            }
        }
        self.held += 1;
        self.done = self.held == script.len();
        Ok(())
    }

    /// Checks a stream-phase event. A folded message is allowed only as the first event after a
    /// resume: its text must be the first `seq` fragments, and `seq` at least what was
    /// acknowledged when the resume was asked for and at most one more than `acked_now` (what
    /// is acknowledged as it arrives, and the fragment then in flight); then every append must
    /// be the next fragment, exactly.
    pub fn on_stream(
        &mut self,
        script: &[String],
        e: &Event<'_>,
        acked_now: usize,
    ) -> Result<(), String> {
        let seq = e.seq.ok_or("a stream event without seq")?;
        if e.append {
            // After a resume, fragments published past the cursor come folded first: an
            // append first is right only when nothing had been published past it.
            if let Some(from) = self.resuming_from.take() {
                if from > self.held {
                    return Err(format!(
                        "an append (seq {seq}) where the resume should have given the text so                          far ({from} fragments) as one message"
                    ));
                }
            }
            if seq != self.held + 1 {
                return Err(format!(
                    "append seq {seq} after {} fragments held (a gap or a duplicate)",
                    self.held
                ));
            }
            let want = script
                .get(self.held)
                .ok_or("an append past the last fragment")?;
            if e.data != want {
                return Err(format!(
                    "fragment {seq} is {:?}, published {want:?}",
                    e.data
                ));
            }
            self.held = seq;
        } else {
            let from = self
                .resuming_from
                .take()
                .ok_or_else(|| format!("a folded message (seq {seq}) that no resume asked for"))?;
            if seq < from || seq > acked_now.max(from) + 1 || seq > script.len() {
                return Err(format!(
                    "the folded message holds {seq} fragments; {from} were published when the \
                     resume was asked for, {acked_now} when it arrived"
                ));
            }
            let so_far: String = script.iter().take(seq).map(String::as_str).collect();
            if e.data != so_far {
                return Err(format!(
                    "the folded message's text ({} bytes) is not the text so far ({} bytes)",
                    e.data.len(),
                    so_far.len()
                ));
            }
            if let Some(r) = self.resumed.as_mut() {
                r.messages += 1;
                r.data_bytes += e.data.len() as u64;
                r.frame_bytes += e.frame_len as u64;
                r.text_bytes += so_far.len() as u64;
            }
            self.held = seq;
        }
        if e.done != (self.held == script.len()) {
            return Err(format!(
                "\"done\" is {} at fragment {} of {}",
                e.done,
                self.held,
                script.len()
            ));
        }
        self.done = e.done;
        Ok(())
    }

    /// Whether everything published has arrived.
    pub fn complete(&self, script: &[String]) -> bool {
        self.held == script.len() && self.done
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// What the publisher has had acknowledged as an event arrives, in these tests.
    const A: usize = 2;

    fn script() -> Vec<String> {
        ["Hel", "lo", " wor", "ld"].map(String::from).to_vec()
    }

    fn append(seq: usize, data: &str, done: bool) -> Event<'_> {
        Event {
            append: true,
            seq: Some(seq),
            data,
            done,
            frame_len: 60,
        }
    }

    fn folded(seq: usize, data: &str, done: bool) -> Event<'_> {
        Event {
            append: false,
            ..append(seq, data, done)
        }
    }

    #[test]
    fn fragments_are_small_and_repeatable() {
        let a = fragments(52, 3, 400);
        assert_eq!(a.len(), 400);
        assert!(a.iter().all(|f| (4..=8).contains(&f.len())));
        assert_eq!(a, fragments(52, 3, 400));
        assert_ne!(a, fragments(52, 4, 400));
    }

    #[test]
    fn live_appends_must_follow_exactly() {
        let s = script();
        let mut f = Follower::default();
        f.on_stream(&s, &append(1, "Hel", false), A).unwrap();
        f.on_stream(&s, &append(2, "lo", false), A).unwrap();
        // A duplicate, a gap, another text, an early done: each is an error.
        assert!(f.clone().on_stream(&s, &append(2, "lo", false), A).is_err());
        assert!(f.clone().on_stream(&s, &append(4, "ld", true), A).is_err());
        assert!(f
            .clone()
            .on_stream(&s, &append(3, " war", false), A)
            .is_err());
        assert!(f
            .clone()
            .on_stream(&s, &append(3, " wor", true), A)
            .is_err());
        // An unasked-for folded message is an error too.
        assert!(f
            .clone()
            .on_stream(&s, &folded(3, "Hello wor", false), A)
            .is_err());
        f.on_stream(&s, &append(3, " wor", false), A).unwrap();
        assert!(!f.complete(&s));
        f.on_stream(&s, &append(4, "ld", true), A).unwrap();
        assert!(f.complete(&s));
    }

    #[test]
    fn a_resume_gets_one_folded_message_of_the_text_so_far() {
        let s = script();
        let mut f = Follower::default();
        f.on_stream(&s, &append(1, "Hel", false), A).unwrap();
        // Two fragments acknowledged when the resume is asked for: the folded text holds two
        // or three (the one in flight), never fewer, and is exactly their text.
        f.resume(2);
        assert!(f
            .clone()
            .on_stream(&s, &folded(1, "Hel", false), A)
            .is_err());
        assert!(f
            .clone()
            .on_stream(&s, &folded(4, "Hello world", true), A)
            .is_err());
        assert!(f
            .clone()
            .on_stream(&s, &folded(2, "Hello ", false), A)
            .is_err());
        // Fragments after the cursor replayed one by one instead of folded: an error.
        assert!(f.clone().on_stream(&s, &append(2, "lo", false), A).is_err());
        let mut g = f.clone();
        g.on_stream(&s, &folded(3, "Hello wor", false), A).unwrap();
        assert!(g.on_stream(&s, &folded(3, "Hello wor", false), A).is_err());
        f.on_stream(&s, &folded(2, "Hello", false), A).unwrap();
        assert!(f.clone().on_stream(&s, &append(4, "ld", true), A).is_err());
        f.on_stream(&s, &append(3, " wor", false), A).unwrap();
        f.on_stream(&s, &append(4, "ld", true), A).unwrap();
        assert!(f.complete(&s));
        let r = f.resumed.unwrap();
        assert_eq!((r.messages, r.data_bytes, r.text_bytes), (1, 5, 5));
        assert_eq!(r.frame_bytes, 60);
    }

    #[test]
    fn a_resume_after_the_end_gets_the_whole_text_done() {
        let s = script();
        let mut f = Follower::default();
        f.on_stream(&s, &append(1, "Hel", false), A).unwrap();
        f.resume(4);
        assert!(f
            .clone()
            .on_stream(&s, &folded(4, "Hello world", false), A)
            .is_err());
        f.on_stream(&s, &folded(4, "Hello world", true), A).unwrap();
        assert!(f.complete(&s));
        // Nothing published past the cursor: the next live append is the first event.
        let mut g = Follower::default();
        g.on_stream(&s, &append(1, "Hel", false), A).unwrap();
        g.resume(1);
        g.on_stream(&s, &append(2, "lo", false), A).unwrap();
    }

    #[test]
    fn a_plain_resume_replays_message_by_message() {
        let s = script();
        let plain = |data| Event {
            append: false,
            seq: None,
            data,
            done: false,
            frame_len: 50,
        };
        let mut f = Follower::default();
        f.on_plain(&s, &plain("Hel")).unwrap();
        assert!(f.clone().on_plain(&s, &plain("Hel")).is_err());
        assert!(f.clone().on_plain(&s, &append(2, "lo", false)).is_err());
        f.resume(3);
        for d in ["lo", " wor", "ld"] {
            f.on_plain(&s, &plain(d)).unwrap();
        }
        assert!(f.complete(&s));
        assert!(f.on_plain(&s, &plain("x")).is_err());
        let r = f.resumed.unwrap();
        assert_eq!((r.messages, r.data_bytes, r.text_bytes), (2, 6, 6));
    }
}
