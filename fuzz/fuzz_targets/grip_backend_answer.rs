//! A GRIP backend's answer head, as the proxy reads it: the response head parser never panics,
//! respects its limits, frames the body consistently, and the `Grip-*` instructions parsed from
//! its headers never panic either.
#![no_main]

use clarion_proto::grip::parse_instruct;
use clarion_proto::http1::{parse_response_head, ResponseBody};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(Some(head)) = parse_response_head(data, 32, 8192) else {
        return;
    };
    assert!(head.head_len <= data.len() && head.head_len <= 8192);
    assert!(head.headers.len() <= 32);
    if let Ok(ResponseBody::Length(_) | ResponseBody::Chunked) = head.body("HEAD") {
        panic!("a HEAD answer has no body");
    }
    let _ = head.body("GET");
    let _ = parse_instruct(&head.headers);
});
