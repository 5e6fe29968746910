//! What an HTTP/2 connection decodes from a client's header blocks, with the dynamic table
//! carried from block to block as on a connection. Nothing panics; the decoded list never
//! exceeds its limit (an HPACK bomb stops there); the table never exceeds the advertised size;
//! a Huffman string that decodes encodes back to a string that decodes the same; what the
//! encoder writes decodes back to the same fields. Two more decoders take the same blocks (so
//! the three tables share one list between blocks, copied by the block that changes it): they
//! decode exactly what the first does.
#![no_main]

use clarion_proto::h2::hpack::{field_size, Decoder, Encoder};
use clarion_proto::h2::huffman;
use libfuzzer_sys::fuzz_target;

const TABLE: u32 = 4096;
const LIST: usize = 16 * 1024;

fuzz_target!(|data: &[u8]| {
    let mut decoder = Decoder::new(TABLE);
    let mut twins = [Decoder::new(TABLE), Decoder::new(TABLE)];
    let mut fields = Vec::new();
    // The input is cut into blocks at 0xfe bytes (a byte that often appears in blocks anyway).
    for block in data.split(|&b| b == 0xfe) {
        let mut total = 0usize;
        let start = fields.len();
        let r = decoder.decode(block, LIST, |(n, v, _)| {
            total += field_size(n, v);
            fields.push((n.to_vec(), v.to_vec()));
        });
        assert!(total <= LIST, "{total}");
        assert!(decoder.table_size() <= TABLE as usize);
        for twin in &mut twins {
            let mut same = Vec::new();
            let r2 = twin.decode(block, LIST, |(n, v, _)| same.push((n.to_vec(), v.to_vec())));
            assert_eq!(r2, r);
            assert_eq!(same[..], fields[start..]);
            assert_eq!(twin.table_size(), decoder.table_size());
        }
        if r.is_err() {
            break;
        }
    }
    let mut text = Vec::new();
    if huffman::decode(data, &mut text).is_ok() {
        let mut coded = Vec::new();
        huffman::encode(&text, &mut coded);
        let mut back = Vec::new();
        assert!(huffman::decode(&coded, &mut back).is_ok());
        assert_eq!(back, text);
    }
    // Fields that are valid strings go through the encoder and back.
    let strings: Vec<(String, String)> = fields
        .into_iter()
        .filter_map(|(n, v)| Some((String::from_utf8(n).ok()?, String::from_utf8(v).ok()?)))
        .take(32)
        .collect();
    let mut block = Vec::new();
    Encoder::new().encode(strings.iter().map(|(n, v)| (n.as_str(), v.as_str())), &mut block);
    let mut again = Vec::new();
    let mut fresh = Decoder::new(TABLE);
    if fresh
        .decode(&block, usize::MAX, |(n, v, _)| again.push((n.to_vec(), v.to_vec())))
        .is_ok()
    {
        let want: Vec<(Vec<u8>, Vec<u8>)> = strings
            .iter()
            .map(|(n, v)| (n.clone().into_bytes(), v.clone().into_bytes()))
            .collect();
        assert_eq!(again, want);
    } else {
        panic!("the encoder wrote a block its decoder refuses");
    }
});
