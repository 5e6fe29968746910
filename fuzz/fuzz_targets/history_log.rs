//! Durable history files (`history_dir`), as read back after a crash or from a damaged disk:
//! scanning never panics; the intact records and the damaged regions tile the file in order
//! without overlapping; every intact record decodes alone to itself and re-encodes to the same
//! bytes; a file cut anywhere gives a prefix of the records.
#![no_main]

use clarion_proto::history_log::{
    decode, encode_clean, encode_header, encode_message, encode_stream, scan, Record,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = scan(data);
    let mut regions: Vec<(usize, usize)> = Vec::new();
    for (at, r) in &s.records {
        let (again, used) = decode(&data[*at..]).expect("an intact record decodes alone");
        assert_eq!(&again, r);
        let mut out = Vec::new();
        match r {
            Record::Header(h) => encode_header(h, &mut out),
            Record::Message(m) => encode_message(m, &mut out),
            Record::Clean(c) => encode_clean(c, &mut out),
            Record::Stream(r) => encode_stream(r, &mut out),
        }
        assert_eq!(&out[..], &data[*at..*at + used], "re-encodes to its bytes");
        regions.push((*at, used));
    }
    for d in s.damage.iter().chain(s.tail.iter()) {
        assert!(d.len > 0);
        regions.push((d.offset, d.len));
    }
    regions.sort_unstable();
    let mut end = 0;
    for (at, len) in regions {
        assert_eq!(at, end, "regions tile the file");
        end = at + len;
    }
    assert_eq!(end, data.len());
    let cut = scan(&data[..data.len() / 2]);
    for (i, (at, r)) in cut.records.iter().enumerate() {
        if i < s.records.len() && s.records[i].0 == *at {
            assert_eq!(&s.records[i].1, r);
        }
    }
});
