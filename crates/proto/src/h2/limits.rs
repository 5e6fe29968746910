//! What a client may spend on one connection, and what this side holds for it meanwhile: the
//! per-second budgets of the frames that cost work without carrying a request (SETTINGS past
//! the preface's, PING, empty DATA, resets either side sends), the bounds of a header block
//! (bytes, CONTINUATION frames, and the caller's deadline), and the stream errors counted for
//! the caller. All of it lives in one box ([`Passing`]), made when first needed and given back
//! by [`Connection::tick`] once it holds nothing, so an idle connection keeps none of it.

use super::{Block, Connection, ErrorCode, Fatal};

/// Frames of each costly kind a client may send per second (see [`Connection::tick`]).
const FLOOD_BUDGET: u32 = 200;
/// CONTINUATION frames one header block may span.
const MAX_CONTINUATIONS: u32 = 32;
/// The reason of the GOAWAY that ends a connection past a flood budget.
pub(super) const TOO_MANY: &str = "too many control frames or resets";

#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Flood {
    pub(super) settings: u32,
    pub(super) pings: u32,
    pub(super) empty: u32,
    pub(super) resets: u32,
}

/// What a connection holds only for a while: a header block being received, this second's
/// flood counts and the stream errors the caller has not taken yet. Made on first use and
/// given back by [`Connection::tick`] once it holds nothing, so a connection that sits idle
/// (a browser's EventSource, an RFC 8441 WebSocket between messages) keeps 8 bytes for it
/// instead of 28.
#[derive(Debug, Default)]
pub(super) struct Passing {
    pub(super) block: Option<Block>,
    pub(super) flood: Flood,
    pub(super) stream_errors: u32,
}

impl Passing {
    pub(super) fn is_empty(&self) -> bool {
        self.block.is_none() && self.flood == Flood::default() && self.stream_errors == 0
    }
}

impl Connection {
    /// The header block being received.
    pub(super) fn block(&self) -> Option<&Block> {
        self.passing.as_ref()?.block.as_ref()
    }

    pub(super) fn passing(&mut self) -> &mut Passing {
        self.passing.get_or_insert_with(Box::default)
    }

    pub(super) fn flood(&self) -> Option<&Flood> {
        self.passing.as_ref().map(|p| &p.flood)
    }

    pub(super) fn grow_block_check(&mut self, out: &mut Vec<u8>) -> Result<(), Fatal> {
        match self.block().map(|b| (b.bytes.len(), b.frames)) {
            Some((len, frames)) => self.block_size_check(len, frames, out),
            None => Ok(()),
        }
    }

    /// A header block of `len` bytes so far, in `frames` frames, must stay within bounds.
    pub(super) fn block_size_check(
        &mut self,
        len: usize,
        frames: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Fatal> {
        let limit = self.settings.max_header_list as usize * 2 + 1024;
        if len > limit || frames > MAX_CONTINUATIONS {
            return Err(self.fail(
                ErrorCode::EnhanceYourCalm,
                "header block too large or in too many frames",
                out,
            ));
        }
        Ok(())
    }

    /// A stream reset (or answered 431) for the client's error: spends the reset budget and
    /// counts for [`Connection::take_stream_errors`].
    pub(super) fn stream_error(&mut self, out: &mut Vec<u8>) -> Result<(), Fatal> {
        let p = self.passing();
        p.stream_errors = p.stream_errors.saturating_add(1);
        self.spend(|f| &mut f.resets, out)
    }

    /// Counts one frame of a costly kind against its per-second budget.
    pub(super) fn spend(
        &mut self,
        which: fn(&mut Flood) -> &mut u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Fatal> {
        let budget = self.budget();
        let n = which(&mut self.passing().flood);
        *n = n.saturating_add(1);
        if *n > budget {
            return Err(self.fail(ErrorCode::EnhanceYourCalm, TOO_MANY, out));
        }
        Ok(())
    }

    /// Frames of each costly kind allowed per second: a client that uses all its streams
    /// and resets each once per second stays within it.
    pub(super) fn budget(&self) -> u32 {
        FLOOD_BUDGET.max(self.settings.max_streams.saturating_mul(2))
    }

    /// Starts a new second of the flood budgets (the caller's once-a-second sweep), and
    /// gives back what passed ([`Passing`]) once nothing of it is held.
    pub fn tick(&mut self) {
        if let Some(p) = self.passing.as_mut() {
            p.flood = Flood::default();
            if p.is_empty() {
                self.passing = None;
            }
        }
    }

    /// Streams reset, refused or answered `431` for the client's error since the last call
    /// (malformed requests, streams past the limit, stream errors), for the caller's counter.
    pub fn take_stream_errors(&mut self) -> u32 {
        self.passing
            .as_mut()
            .map_or(0, |p| std::mem::take(&mut p.stream_errors))
    }

    /// Whether a header block has begun and not ended: until it does, the client can send
    /// nothing else, so the caller bounds how long it may take.
    pub fn pending_header_block(&self) -> bool {
        self.block().is_some()
    }

    /// The caller's deadline for the pending header block has passed (a client trickling
    /// CONTINUATION frames, slowloris-style): GOAWAY `PROTOCOL_ERROR`; the connection must end
    /// once it is written.
    pub fn header_block_late(&mut self, out: &mut Vec<u8>) -> Fatal {
        self.fail(
            ErrorCode::ProtocolError,
            "header block not completed in time",
            out,
        )
    }
}
