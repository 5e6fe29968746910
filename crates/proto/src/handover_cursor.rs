//! The cursor the hand-over format is read with ([`crate::handover`] frames and the connection
//! state section of [`crate::handover_state`]), and the error it reports: every read checks
//! what is left, and none panics.

/// Why bytes are not a hand-over frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The frame does not start with [`MAGIC`](crate::handover::MAGIC): not a Clarion hand-over peer.
    #[error("not a hand-over frame (bad magic)")]
    Magic,
    /// An unknown frame type (a newer format would have said so in its hello).
    #[error("unknown frame type {0}")]
    Type(u8),
    /// The body is longer than [`MAX_BODY`](crate::handover::MAX_BODY).
    #[error("frame body of {0} bytes is over the limit")]
    TooLong(usize),
    /// The body ends before a field it announces, or a field is out of range.
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    /// Bytes left over after the body's last field.
    #[error("{0} frame has trailing bytes")]
    Trailing(&'static str),
}

/// A cursor over a body that fails, never panics, when a field runs past the end.
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if n > self.buf.len() {
            return Err(Error::Malformed(self.what));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn at_most(&mut self, max: u8) -> Result<u8, Error> {
        let v = self.u8()?;
        if v > max {
            return Err(Error::Malformed(self.what));
        }
        Ok(v)
    }

    pub(crate) fn flag(&mut self) -> Result<bool, Error> {
        Ok(self.at_most(1)? == 1)
    }

    pub(crate) fn u16(&mut self) -> Result<u16, Error> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, Error> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn str_of(&mut self, n: usize) -> Result<&'a str, Error> {
        std::str::from_utf8(self.take(n)?).map_err(|_| Error::Malformed(self.what))
    }

    pub(crate) fn str8(&mut self) -> Result<&'a str, Error> {
        let n = usize::from(self.u8()?);
        self.str_of(n)
    }

    pub(crate) fn str16(&mut self) -> Result<&'a str, Error> {
        let n = usize::from(self.u16()?);
        self.str_of(n)
    }

    pub(crate) fn bytes32(&mut self) -> Result<&'a [u8], Error> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}
