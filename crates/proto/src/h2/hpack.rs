//! HPACK (RFC 7541): header compression for HTTP/2, bounded against hostile peers.
//!
//! [`Decoder`] turns a complete header block (HEADERS plus its CONTINUATION frames, joined)
//! into fields, keeping the dynamic table within the size this side advertised
//! (`SETTINGS_HEADER_TABLE_SIZE`) once the peer has acknowledged it, and refusing a block whose decoded list would exceed the
//! header-list limit *while* decoding: an HPACK bomb (one small indexed reference repeated to
//! expand a large table entry many times) stops at the limit, having cost at most that much.
//!
//! [`Encoder`] writes a server's response and push headers without a dynamic table: static
//! indices where the static table has the field or its name, literals otherwise (Huffman-coded
//! when shorter). A server with a thousand idle streams keeps no compression state per
//! connection on its sending side, and the peer's table size needs no tracking beyond an
//! initial size update of zero.

use super::huffman;

mod table;

pub(crate) use table::Entry;
use table::Table;

/// Why a header block cannot be decoded: a connection error (`COMPRESSION_ERROR`), except
/// [`HpackError::ListTooLarge`], which the caller may answer per stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HpackError {
    /// The block ended inside a representation.
    Truncated,
    /// An integer beyond what any limit here allows.
    Overflow,
    /// An index that is neither in the static nor in the dynamic table (or index 0).
    BadIndex(u64),
    /// A Huffman-coded string with bad padding or EOS.
    Huffman,
    /// A string longer than the header-list limit on its own.
    StringTooLong,
    /// A dynamic table size update above the advertised size, or after the first field.
    BadSizeUpdate,
    /// The decoded list would exceed the header-list limit.
    ListTooLarge,
}

impl std::fmt::Display for HpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HpackError::Truncated => write!(f, "header block ends inside a field"),
            HpackError::Overflow => write!(f, "integer too large in header block"),
            HpackError::BadIndex(i) => write!(f, "header index {i} is not in the tables"),
            HpackError::Huffman => write!(f, "bad Huffman coding in header block"),
            HpackError::StringTooLong => write!(f, "header string too long"),
            HpackError::BadSizeUpdate => write!(f, "bad dynamic table size update"),
            HpackError::ListTooLarge => write!(f, "header list too large"),
        }
    }
}

impl std::error::Error for HpackError {}

/// The static table (RFC 7541 Appendix A), index 1 first.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// What an entry costs in a table and in a header list: its bytes plus 32 (RFC 7541 §4.1,
/// RFC 9113 §6.5.2).
pub fn field_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

/// The table size a connection starts with, before the peer has acknowledged ours (RFC 9113
/// §6.5.2).
pub const DEFAULT_TABLE_SIZE: u32 = 4_096;

/// Decodes the header blocks of one connection (the dynamic table lives across blocks).
#[derive(Debug)]
pub struct Decoder {
    table: Table,
}

/// One decoded field: name, value, and whether the peer asked that it never be indexed.
pub type Field<'a> = (&'a [u8], &'a [u8], bool);

impl Decoder {
    /// A decoder whose table size is `table_size` already, on both sides.
    pub fn new(table_size: u32) -> Decoder {
        Decoder {
            table: Table::new(table_size, table_size),
        }
    }

    /// The decoder of a new connection on which this side advertises a table of `advertised`
    /// bytes: until the peer acknowledges it ([`Decoder::acknowledged`]) the table is the
    /// protocol's default size.
    pub fn advertising(advertised: u32) -> Decoder {
        Decoder {
            table: Table::new(DEFAULT_TABLE_SIZE, advertised.max(DEFAULT_TABLE_SIZE)),
        }
    }

    /// The peer acknowledged our SETTINGS advertising a table of `advertised` bytes. From its
    /// acknowledgement on, every header block it sends starts with a size update to at most
    /// that (RFC 7541 §4.2; RFC 9113 §6.5.3), evicting whatever is above it before any entry
    /// can be referenced: so the table shrinks to it now, without waiting for the update.
    /// With a size of zero, the entries of the requests sent before the acknowledgement are
    /// freed at once instead of staying for the connection's life.
    pub fn acknowledged(&mut self, advertised: u32) {
        self.table.limit = advertised;
        if self.table.max > advertised {
            self.table.resize(advertised);
        }
    }

    /// Bytes the dynamic table holds now (entries plus their 32-byte overheads).
    pub fn table_size(&self) -> usize {
        self.table.size() as usize
    }

    /// Whether the dynamic table owns no memory.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Decodes one complete header block, calling `field` for each field in order. The sum of
    /// [`field_size`] over the list may not exceed `max_list`: past it no more fields are
    /// handed on, but the block is still decoded to its end so that the dynamic table stays in
    /// step with the peer's encoder (RFC 9113 §10.5.1), and the result is
    /// [`HpackError::ListTooLarge`]: the caller answers that stream and the connection goes
    /// on. Strings are bounded by the block itself.
    pub fn decode(
        &mut self,
        block: &[u8],
        max_list: usize,
        mut field: impl FnMut(Field<'_>),
    ) -> Result<(), HpackError> {
        let mut changed = false;
        let result = self.decode_fields(block, max_list, &mut field, &mut changed);
        if changed {
            // Between blocks a table is shared with any other of the same entries, so that
            // a browser's connections hold one list: made now, an equal list is freed at once
            // rather than when the connection rests, and leaves no hole in the heap.
            self.table.share();
        }
        result
    }

    /// [`Decoder::decode`]'s work; `changed` is set if the table may have changed.
    fn decode_fields(
        &mut self,
        mut block: &[u8],
        max_list: usize,
        field: &mut impl FnMut(Field<'_>),
        changed: &mut bool,
    ) -> Result<(), HpackError> {
        let mut list = 0usize;
        let mut over = false;
        let mut first = true;
        let mut name_buf = Vec::new();
        let mut value_buf = Vec::new();
        while let Some(&b) = block.first() {
            if b & 0x80 != 0 {
                // Indexed field (§6.1).
                let (index, rest) = integer(block, 7)?;
                block = rest;
                let (n, v) = self.lookup(index)?;
                match add(list, field_size(n, v), max_list) {
                    Ok(total) if !over => {
                        list = total;
                        field((n, v, false));
                    }
                    _ => over = true,
                }
            } else if b & 0xe0 == 0x20 {
                // Dynamic table size update (§6.3): only at the start of a block.
                let (size, rest) = integer(block, 5)?;
                block = rest;
                if !first || size > u64::from(self.table.limit) {
                    return Err(HpackError::BadSizeUpdate);
                }
                self.table.resize(size as u32);
                *changed = true;
                continue;
            } else {
                // Literal (§6.2): with indexing (01), without (0000) or never indexed (0001).
                let (indexing, never, prefix) = match b {
                    _ if b & 0xc0 == 0x40 => (true, false, 6),
                    _ if b & 0xf0 == 0x10 => (false, true, 4),
                    _ => (false, false, 4),
                };
                let (index, rest) = integer(block, prefix)?;
                block = rest;
                name_buf.clear();
                if index == 0 {
                    block = string(block, usize::MAX, &mut name_buf)?;
                } else {
                    let (n, _) = self.lookup(index)?;
                    name_buf.extend_from_slice(n);
                }
                value_buf.clear();
                block = string(block, usize::MAX, &mut value_buf)?;
                let fits = add(list, field_size(&name_buf, &value_buf), max_list);
                if indexing {
                    self.table.insert(&name_buf, &value_buf);
                    *changed = true;
                }
                match fits {
                    Ok(total) if !over => {
                        list = total;
                        field((&name_buf, &value_buf, never));
                    }
                    _ => over = true,
                }
            }
            first = false;
        }
        if over {
            return Err(HpackError::ListTooLarge);
        }
        Ok(())
    }

    /// The table's size now, the largest a size update may ask for, and the entries oldest
    /// first: what a hand-over carries (`super::server::park`).
    pub(crate) fn parts(&self) -> (u32, u32, impl Iterator<Item = (&[u8], &[u8])>) {
        (self.table.max, self.table.limit, self.table.iter())
    }

    /// A decoder from [`Decoder::parts`]; `None` if the entries do not fit the table or the
    /// table is above the limit (a state no peer could have led it to).
    pub(crate) fn from_parts(
        max: u32,
        limit: u32,
        entries: Vec<std::sync::Arc<Entry>>,
    ) -> Option<Decoder> {
        Some(Decoder {
            table: Table::with(max, limit, entries)?,
        })
    }

    /// Whether this decoder's table is the very list `other`'s is (for tests).
    #[cfg(test)]
    pub(crate) fn shares_table_with(&self, other: &Decoder) -> bool {
        self.table.shares_with(&other.table)
    }

    fn lookup(&self, index: u64) -> Result<(&[u8], &[u8]), HpackError> {
        let i = usize::try_from(index).map_err(|_| HpackError::BadIndex(index))?;
        if i == 0 {
            return Err(HpackError::BadIndex(0));
        }
        if let Some((n, v)) = STATIC.get(i - 1) {
            return Ok((n.as_bytes(), v.as_bytes()));
        }
        self.table
            .get(i - 1 - STATIC.len())
            .ok_or(HpackError::BadIndex(index))
    }
}

fn add(list: usize, size: usize, max: usize) -> Result<usize, HpackError> {
    let total = list.saturating_add(size);
    if total > max {
        return Err(HpackError::ListTooLarge);
    }
    Ok(total)
}

/// Reads an integer with an `n`-bit prefix (§5.1). Values are capped at 2^32: no limit here
/// is anywhere near, and the cap keeps the shift arithmetic safe.
fn integer(input: &[u8], n: u8) -> Result<(u64, &[u8]), HpackError> {
    let (&first, mut rest) = input.split_first().ok_or(HpackError::Truncated)?;
    let mask = (1u16 << n) - 1;
    let mut value = u64::from(u16::from(first) & mask);
    if value < u64::from(mask) {
        return Ok((value, rest));
    }
    let mut shift = 0u32;
    loop {
        let (&b, more) = rest.split_first().ok_or(HpackError::Truncated)?;
        rest = more;
        value += u64::from(b & 0x7f) << shift;
        if value > u64::from(u32::MAX) {
            return Err(HpackError::Overflow);
        }
        if b & 0x80 == 0 {
            return Ok((value, rest));
        }
        shift += 7;
        if shift > 28 {
            return Err(HpackError::Overflow);
        }
    }
}

/// Reads a string literal (§5.2) into `out`; refuses one longer than `max` before reading it.
fn string<'a>(input: &'a [u8], max: usize, out: &mut Vec<u8>) -> Result<&'a [u8], HpackError> {
    let huffman_coded = input.first().is_some_and(|b| b & 0x80 != 0);
    let (len, rest) = integer(input, 7)?;
    let len = usize::try_from(len).map_err(|_| HpackError::Overflow)?;
    if len > max {
        return Err(HpackError::StringTooLong);
    }
    let bytes = rest.get(..len).ok_or(HpackError::Truncated)?;
    if huffman_coded {
        huffman::decode(bytes, out).map_err(|_| HpackError::Huffman)?;
        if out.len() > max {
            return Err(HpackError::StringTooLong);
        }
    } else {
        out.extend_from_slice(bytes);
    }
    Ok(rest.get(len..).unwrap_or_default())
}

/// Writes header blocks without a dynamic table (see the module doc).
#[derive(Debug, Default)]
pub struct Encoder {
    /// The first block says the table is not used (size update to 0), so the peer may free it.
    started: bool,
}

impl Encoder {
    /// A new encoder for one connection.
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Whether the first block (with its size update to 0) has been written.
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// An encoder that has (or has not) written its first block.
    pub(crate) fn resumed(started: bool) -> Encoder {
        Encoder { started }
    }

    /// Appends one header block of `fields` (lowercase names) to `out`.
    pub fn encode<'a>(
        &mut self,
        fields: impl IntoIterator<Item = (&'a str, &'a str)>,
        out: &mut Vec<u8>,
    ) {
        if !self.started {
            self.started = true;
            write_integer(out, 0x20, 5, 0);
        }
        for (name, value) in fields {
            let exact = STATIC.iter().position(|&(n, v)| n == name && v == value);
            if let Some(i) = exact {
                write_integer(out, 0x80, 7, i as u64 + 1);
                continue;
            }
            // Literal without indexing (0000), with the static name where there is one.
            match STATIC.iter().position(|&(n, _)| n == name) {
                Some(i) => write_integer(out, 0x00, 4, i as u64 + 1),
                None => {
                    out.push(0x00);
                    write_string(out, name.as_bytes());
                }
            }
            write_string(out, value.as_bytes());
        }
    }
}

fn write_integer(out: &mut Vec<u8>, flags: u8, n: u8, value: u64) {
    let max = (1u64 << n) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

fn write_string(out: &mut Vec<u8>, s: &[u8]) {
    let coded = huffman::encoded_len(s);
    if coded < s.len() {
        write_integer(out, 0x80, 7, coded as u64);
        huffman::encode(s, out);
    } else {
        write_integer(out, 0x00, 7, s.len() as u64);
        out.extend_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use crate::h2::tests::hex;

    fn decode_all(d: &mut Decoder, block: &[u8]) -> Result<Vec<(String, String)>, HpackError> {
        let mut out = Vec::new();
        d.decode(block, 16 * 1024, |(n, v, _)| {
            out.push((
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            ))
        })?;
        Ok(out)
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn integers_as_in_rfc_c1() {
        let mut out = Vec::new();
        write_integer(&mut out, 0, 5, 10);
        write_integer(&mut out, 0, 5, 1337);
        write_integer(&mut out, 0, 8, 42);
        assert_eq!(out, [0x0a, 0x1f, 0x9a, 0x0a, 0x2a]);
        assert_eq!(integer(&[0x1f, 0x9a, 0x0a], 5).unwrap().0, 1337);
        assert_eq!(integer(&[0x1f, 0x9a], 5), Err(HpackError::Truncated));
        assert_eq!(
            integer(&[0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], 5),
            Err(HpackError::Overflow)
        );
    }

    #[test]
    fn requests_with_and_without_huffman_as_in_rfc_c3_c4() {
        for blocks in [
            [
                "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                "8286 84be 5808 6e6f 2d63 6163 6865",
                "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
            ],
            [
                "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                "8286 84be 5886 a8eb 1064 9cbf",
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ],
        ] {
            let mut d = Decoder::new(4096);
            let base = [
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ];
            assert_eq!(decode_all(&mut d, &hex(blocks[0])).unwrap(), pairs(&base));
            assert_eq!(d.table_size(), 57);
            let mut second = base.to_vec();
            second.push(("cache-control", "no-cache"));
            assert_eq!(decode_all(&mut d, &hex(blocks[1])).unwrap(), pairs(&second));
            assert_eq!(d.table_size(), 110);
            let third = [
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ];
            assert_eq!(decode_all(&mut d, &hex(blocks[2])).unwrap(), pairs(&third));
            assert_eq!(d.table_size(), 164);
        }
    }

    #[test]
    fn responses_evict_as_in_rfc_c5() {
        // A 256-byte table: the third response evicts the first entries.
        let mut d = Decoder::new(256);
        let blocks = [
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "4803 3330 37c1 c0bf",
            "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d 54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e 3d31",
        ];
        decode_all(&mut d, &hex(blocks[0])).unwrap();
        assert_eq!(d.table_size(), 222);
        let second = decode_all(&mut d, &hex(blocks[1])).unwrap();
        assert_eq!(second[0], (":status".into(), "307".into()));
        assert_eq!(d.table_size(), 222);
        let third = decode_all(&mut d, &hex(blocks[2])).unwrap();
        assert_eq!(third[0], (":status".into(), "200".into()));
        assert_eq!(third[3].0, "location");
        assert_eq!(third[4], ("content-encoding".into(), "gzip".into()));
        assert_eq!(d.table_size(), 215);
    }

    #[test]
    fn what_the_encoder_writes_the_decoder_reads() {
        let fields = [
            (":status", "200"),
            ("content-type", "text/event-stream; charset=utf-8"),
            ("cache-control", "no-cache"),
            ("access-control-allow-origin", "*"),
            ("x-clarion-node", "n1"),
        ];
        let mut e = Encoder::new();
        let mut d = Decoder::new(4096);
        for _ in 0..2 {
            let mut block = Vec::new();
            e.encode(fields.iter().copied(), &mut block);
            assert_eq!(decode_all(&mut d, &block).unwrap(), pairs(&fields));
            assert_eq!(d.table_size(), 0, "the encoder never indexes");
        }
    }

    #[test]
    fn hostile_blocks_are_refused_within_their_limits() {
        let mut d = Decoder::new(4096);
        // Index 0 and an index past both tables.
        assert_eq!(decode_all(&mut d, &[0x80]), Err(HpackError::BadIndex(0)));
        assert_eq!(decode_all(&mut d, &[0xbe]), Err(HpackError::BadIndex(62)));
        // A size update above what was advertised, and one after a field.
        assert_eq!(
            decode_all(&mut d, &[0x3f, 0xe2, 0x1f]),
            Err(HpackError::BadSizeUpdate)
        );
        assert_eq!(
            decode_all(&mut d, &[0x82, 0x20]),
            Err(HpackError::BadSizeUpdate)
        );
        // A string that claims more bytes than the block has.
        assert_eq!(
            decode_all(&mut d, &[0x00, 0x05, b'a']),
            Err(HpackError::Truncated)
        );
        // A string longer than the whole list may be is decoded (the block bounds it, and the
        // table must stay in step) but not handed on.
        let mut big = vec![0x00, 0x7f, 0xff, 0xff, 0x03];
        big.resize(5 + 65_662, b'a');
        big.push(0x00);
        assert_eq!(decode_all(&mut d, &big), Err(HpackError::ListTooLarge));
    }

    #[test]
    fn an_hpack_bomb_stops_at_the_list_limit() {
        // One 4,000-byte entry, then 10,000 one-byte references to it: 40 MB if expanded.
        let mut d = Decoder::new(4096);
        let mut block = vec![0x40, 0x01, b'x', 0x7f, 0x81, 0x1e];
        block.resize(block.len() + 3_968, b'v');
        block.extend(std::iter::repeat_n(0xbe, 10_000));
        let mut expanded = 0usize;
        let r = d.decode(&block, 64 * 1024, |(n, v, _)| expanded += n.len() + v.len());
        assert_eq!(r, Err(HpackError::ListTooLarge));
        assert!(expanded <= 64 * 1024, "{expanded}");
    }
}
