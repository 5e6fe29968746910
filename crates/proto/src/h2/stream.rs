//! One stream's state, shared by the two directions of [`super::server::Connection`]: what
//! the client may still send and what of the answer has gone out.

use crate::http1::ChunkedDecoder;

/// No handle bound.
pub const NO_USER: u32 = u32::MAX;

/// One stream, as long as either side may still send on it.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) id: u32,
    /// The layer above's handle for it; `NO_USER` until bound, and after it let go.
    pub(crate) user: u32,
    pub(crate) send_window: i32,
    pub(crate) recv_window: i32,
    pub(crate) remote_closed: bool,
    pub(crate) local_closed: bool,
    pub(crate) websocket: bool,
    pub(crate) head_only: bool,
    /// Request body bytes still announced by `content-length` (`u64::MAX`: none announced).
    pub(crate) expect: u64,
    pub(crate) out: Out,
}

/// Where a stream's answer is.
#[derive(Debug, Default)]
pub(crate) enum Out {
    /// Waiting for the head; the part of it that has arrived, if it came in pieces.
    #[default]
    Head,
    /// (A boxed `Vec`, one pointer wide, where a boxed slice would be two: every stream's
    /// state is then 8 bytes smaller.)
    #[allow(clippy::box_collection)]
    PartialHead(Box<Vec<u8>>),
    /// This many body bytes left.
    Length(u64),
    /// A chunked body (boxed: rare, and larger than the rest).
    Chunked(Box<Chunked>),
    /// Until the layer above ends it.
    Close,
    /// Sent in full.
    Done,
}

/// A chunked body being de-chunked.
#[derive(Debug)]
pub(crate) struct Chunked {
    pub(crate) decoder: ChunkedDecoder,
    /// Decoded bytes not sent yet (window closed).
    pub(crate) pending: Vec<u8>,
    /// The last chunk has been decoded.
    pub(crate) complete: bool,
}

/// A connection's open streams, in no particular order. The first is kept inline: most
/// connections of a push server hold one stream (an EventSource, an RFC 8441 WebSocket) for
/// their whole life, and the pump, which visits every connection a message reaches, then
/// finds it in the connection's own state instead of one more allocation away.
#[derive(Debug, Default)]
pub(crate) enum Streams {
    #[default]
    None,
    One(Stream),
    Many(Vec<Stream>),
}

impl Streams {
    /// Adds a stream (the order is not kept).
    pub(crate) fn push(&mut self, s: Stream) {
        match std::mem::take(self) {
            Streams::None => *self = Streams::One(s),
            Streams::One(first) => *self = Streams::Many(vec![first, s]),
            Streams::Many(mut v) => {
                v.push(s);
                *self = Streams::Many(v);
            }
        }
    }

    /// Removes the stream at `i`, the last taking its place.
    pub(crate) fn swap_remove(&mut self, i: usize) -> Option<Stream> {
        match std::mem::take(self) {
            Streams::None => None,
            Streams::One(s) if i == 0 => Some(s),
            one @ Streams::One(_) => {
                *self = one;
                None
            }
            Streams::Many(mut v) => {
                let s = (i < v.len()).then(|| v.swap_remove(i));
                *self = match v.len() {
                    0 => Streams::None,
                    _ => Streams::Many(v),
                };
                s
            }
        }
    }
}

impl From<Vec<Stream>> for Streams {
    fn from(mut v: Vec<Stream>) -> Streams {
        match v.len() {
            0 => Streams::None,
            1 => v.pop().map_or(Streams::None, Streams::One),
            _ => Streams::Many(v),
        }
    }
}

impl std::ops::Deref for Streams {
    type Target = [Stream];
    fn deref(&self) -> &[Stream] {
        match self {
            Streams::None => &[],
            Streams::One(s) => std::slice::from_ref(s),
            Streams::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Streams {
    fn deref_mut(&mut self) -> &mut [Stream] {
        match self {
            Streams::None => &mut [],
            Streams::One(s) => std::slice::from_mut(s),
            Streams::Many(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(id: u32) -> Stream {
        Stream {
            id,
            user: NO_USER,
            send_window: 0,
            recv_window: 0,
            remote_closed: false,
            local_closed: false,
            websocket: false,
            head_only: false,
            expect: u64::MAX,
            out: Out::default(),
        }
    }

    fn ids(s: &Streams) -> Vec<u32> {
        s.iter().map(|s| s.id).collect()
    }

    #[test]
    fn one_stream_is_inline_and_more_spill_to_a_list() {
        let mut s = Streams::default();
        assert!(s.swap_remove(0).is_none());
        s.push(stream(1));
        assert!(matches!(s, Streams::One(_)));
        assert!(s.swap_remove(1).is_none(), "out of range: nothing removed");
        assert_eq!(ids(&s), [1]);
        s.push(stream(3));
        s.push(stream(5));
        assert!(matches!(s, Streams::Many(_)));
        assert_eq!(s.swap_remove(0).map(|s| s.id), Some(1));
        assert_eq!(ids(&s), [5, 3]);
        assert!(s.swap_remove(7).is_none());
        s.iter_mut().for_each(|s| s.user = 9);
        assert_eq!(s.swap_remove(1).map(|s| s.user), Some(9));
        assert_eq!(s.swap_remove(0).map(|s| s.id), Some(5));
        assert!(matches!(s, Streams::None), "an emptied list is freed");
        assert!(matches!(Streams::from(vec![stream(7)]), Streams::One(_)));
        assert!(matches!(Streams::from(Vec::new()), Streams::None));
        assert_eq!(ids(&Streams::from(vec![stream(1), stream(3)])), [1, 3]);
    }
}
