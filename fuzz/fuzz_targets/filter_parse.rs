//! The filter parser on arbitrary text and JSON: never panics, enforces its bounds, and every
//! filter it accepts prints to text (and to JSON) that reads back to the same filter, which
//! evaluates without panicking.
#![no_main]

use clarion_proto::filter::json::{from_json, to_json};
use clarion_proto::filter::{parse, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let limits = Limits::default();
    // The canonical text of an accepted filter can be longer than its input (spaces are added,
    // `!=` becomes `not ==`): read it back with room for that.
    let roomy = Limits { max_len: limits.max_len * 4, ..limits };
    if let Ok(f) = parse(text, &limits) {
        let printed = f.to_string();
        assert_eq!(parse(&printed, &roomy).as_ref(), Ok(&f), "{printed}");
        assert_eq!(from_json(&to_json(&f), &roomy).as_ref(), Ok(&f));
        let tags: Vec<(String, String)> = vec![("a".into(), "1".into()), ("price".into(), "2.5".into())];
        let _ = f.matches(tags.as_slice());
    }
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
        if let Ok(f) = from_json(&v, &limits) {
            assert_eq!(from_json(&to_json(&f), &roomy).as_ref(), Ok(&f));
            assert_eq!(parse(&f.to_string(), &roomy).as_ref(), Ok(&f));
        }
    }
});
