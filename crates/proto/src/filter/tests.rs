//! Unit and property tests of the filter language.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use super::canon::normalise;
use super::json::{from_json, to_json};
use super::*;
use crate::test_rng::Rng;

fn p(s: &str) -> Filter {
    parse(s, &Limits::default()).unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn err(s: &str) -> FilterError {
    parse(s, &Limits::default()).expect_err(s)
}

fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn hash_of(f: &Filter) -> u64 {
    let mut h = DefaultHasher::new();
    f.hash(&mut h);
    h.finish()
}

#[test]
fn the_documented_example_evaluates_as_written() {
    let f =
        p(r#"sport == "football" and (league in ["a", "b"] or not live == "no") and price >= 2.5"#);
    let t = tags(&[
        ("sport", "football"),
        ("league", "c"),
        ("live", "yes"),
        ("price", "2.5"),
    ]);
    assert!(f.matches(&t));
    let t = tags(&[
        ("sport", "football"),
        ("league", "c"),
        ("live", "no"),
        ("price", "2.5"),
    ]);
    assert!(!f.matches(&t));
    let t = tags(&[
        ("sport", "football"),
        ("league", "a"),
        ("live", "no"),
        ("price", "3"),
    ]);
    assert!(f.matches(&t));
    let t = tags(&[("sport", "football"), ("league", "a"), ("price", "2.4")]);
    assert!(!f.matches(&t));
}

#[test]
fn missing_and_non_numeric_tags_fail_comparisons_and_pass_their_negation() {
    let t = tags(&[("price", "n/a")]);
    assert!(!p("price < 5").matches(&t));
    assert!(!p("price >= 5").matches(&t));
    assert!(!p("size > 0").matches(&t));
    assert!(p(r#"size != "0""#).matches(&t));
    assert!(!p(r#"size == "0""#).matches(&t));
    assert!(!p("price < 5").matches(&tags(&[("price", "inf")])));
    assert!(p("price < 5").matches(&tags(&[("price", " 4.99 ")])));
    assert!(p("price > -1e3").matches(&tags(&[("price", "-999")])));
}

#[test]
fn filters_that_differ_in_order_repetition_and_nesting_are_equal_and_hash_the_same() {
    let same = [
        r#"a == "1" and b == "2""#,
        r#"b == "2" and a == "1""#,
        r#"(b == "2") and (a == "1" and a == "1")"#,
        r#"not not (a == "1" and b == "2")"#,
        r#"a in ["1"] and b == "2""#,
    ];
    let first = p(same[0]);
    for s in same {
        assert_eq!(p(s), first, "{s}");
        assert_eq!(hash_of(&p(s)), hash_of(&first), "{s}");
    }
    assert_eq!(p(r#"k in ["b", "a", "b"]"#), p(r#"k in ["a","b"]"#));
    assert_eq!(p(r#"k != "x""#), p(r#"not k == "x""#));
    assert_ne!(p(r#"a == "1" or b == "2""#), first);
    assert_eq!(p("x < 1.50").to_string(), "x < 1.5");
    assert_eq!(p("x < -0").to_string(), "x < 0");
}

#[test]
fn the_canonical_text_is_pinned() {
    assert_eq!(
        p(r#"z == "q\"" or (b in ["y","x"] and not (c < 1 or c > 2))"#).to_string(),
        r#"z == "q\"" or b in ["x", "y"] and not (c < 1 or c > 2)"#
    );
    assert_eq!(p("n >= 1e300").to_string(), "n >= 1e300");
}

#[test]
fn syntax_errors_say_where_and_what() {
    assert_eq!(err(""), FilterError::Empty);
    assert_eq!(err("   "), FilterError::Empty);
    assert_eq!(
        err(r#"a == "1" b"#),
        FilterError::Unexpected {
            at: 9,
            expected: "`and`, `or` or the end of the filter",
            found: "'b'".into()
        }
    );
    assert!(matches!(
        err(r#"a = "1""#),
        FilterError::Unexpected { at: 2, .. }
    ));
    assert_eq!(err(r#"a == "1"#), FilterError::UnterminatedString { at: 5 });
    assert_eq!(err(r#"a == "\n""#), FilterError::BadEscape { at: 6 });
    assert_eq!(err("a < 1e999"), FilterError::BadNumber { at: 4 });
    assert_eq!(err("a < 1."), FilterError::BadNumber { at: 4 });
    assert!(matches!(
        err("a == 3"),
        FilterError::TypeMismatch { op: "==", .. }
    ));
    assert!(matches!(
        err(r#"a < "3""#),
        FilterError::TypeMismatch { op: "<", .. }
    ));
    assert!(matches!(
        err(r#"in == "3""#),
        FilterError::BadKey { at: 0, .. }
    ));
    assert!(matches!(
        err(r#"(a == "1""#),
        FilterError::Unexpected {
            expected: "`)`",
            ..
        }
    ));
    assert!(matches!(err(r#"a in []"#), FilterError::Unexpected { .. }));
    assert!(matches!(
        err(r#"a in ["x""#),
        FilterError::Unexpected {
            expected: "`,` or `]`",
            ..
        }
    ));
    assert_eq!(err(r#"a == "1" é"#).reason(), "syntax");
    let msg = err("a == 3").to_string();
    assert!(msg.contains("write key == \"3\""), "{msg}");
}

#[test]
fn bounds_are_enforced_while_parsing() {
    let l = Limits::default();
    let long = format!(r#"a == "{}""#, "x".repeat(2000));
    assert_eq!(
        parse(&long, &l),
        Err(FilterError::TooLong {
            len: long.len(),
            max: 1024
        })
    );
    let deep = format!("{}a == \"1\"{}", "(".repeat(9), ")".repeat(9));
    assert_eq!(parse(&deep, &l), Err(FilterError::TooDeep { max: 8 }));
    let ok_deep = format!("{}a == \"1\"{}", "(".repeat(8), ")".repeat(8));
    assert!(parse(&ok_deep, &l).is_ok());
    assert_eq!(
        parse(&"not ".repeat(9).to_string().add("a == \"1\""), &l),
        Err(FilterError::TooDeep { max: 8 })
    );
    let many: Vec<String> = (0..33).map(|i| format!("k{i} == \"v\"")).collect();
    assert_eq!(
        parse(&many.join(" or "), &l),
        Err(FilterError::TooManyTerms { max: 32 })
    );
    let list: Vec<String> = (0..65).map(|i| format!("\"{i}\"")).collect();
    assert_eq!(
        parse(&format!("k in [{}]", list.join(",")), &l),
        Err(FilterError::ListTooLong { max: 64 })
    );
    let big = Limits { max_len: 4096, ..l };
    let value = format!(r#"a == "{}""#, "x".repeat(257));
    assert_eq!(
        parse(&value, &big),
        Err(FilterError::ValueTooLong { max: 256 })
    );
}

trait Add {
    fn add(self, s: &str) -> String;
}
impl Add for String {
    fn add(mut self, s: &str) -> String {
        self.push_str(s);
        self
    }
}

#[test]
fn the_json_form_reads_as_the_text_form() {
    let l = Limits::default();
    let v: serde_json::Value = serde_json::from_str(
        r#"{"and":[{"eq":["sport","football"]},{"or":[{"in":["league",["b","a"]]},{"ne":["live","no"]}]},{"gte":["price",2.5]}]}"#,
    )
    .unwrap();
    let f = from_json(&v, &l).unwrap();
    assert_eq!(
        f,
        p(r#"sport == "football" and (league in ["a", "b"] or live != "no") and price >= 2.5"#)
    );
    assert_eq!(from_json(&to_json(&f), &l), Ok(f));
    for (bad, want) in [
        (r#"[]"#, "a filter is an object with one operator key"),
        (
            r#"{"eq":["a","b"],"ne":["a","b"]}"#,
            "a filter object has exactly one key",
        ),
        (r#"{"and":[]}"#, "and/or take a non-empty array of filters"),
        (r#"{"eq":["a"]}"#, "a comparison is [key, value]"),
        (r#"{"eq":["a","b","c"]}"#, "a comparison is [key, value]"),
        (r#"{"lt":["a","1"]}"#, "lt/lte/gt/gte compare with a number"),
        (r#"{"eq":["a",1]}"#, "eq/ne/in compare with strings"),
        (
            r#"{"xor":[]}"#,
            "unknown operator (eq, ne, in, lt, lte, gt, gte, and, or, not)",
        ),
    ] {
        let v: serde_json::Value = serde_json::from_str(bad).unwrap();
        assert_eq!(from_json(&v, &l), Err(FilterError::Json(want)), "{bad}");
    }
    let mut deep = serde_json::json!({"eq":["a","b"]});
    for _ in 0..9 {
        deep = serde_json::json!({ "not": deep });
    }
    assert_eq!(from_json(&deep, &l), Err(FilterError::TooDeep { max: 8 }));
}

/// splitmix64, so a failure repeats with its seed.
const KEYS: [&str; 4] = ["a", "b.c", "ns:k", "x-y/z"];
const VALUES: [&str; 5] = ["1", "2", "q\"uo\\te", "é €", ""];

fn random_filter(rng: &mut Rng, depth: usize) -> Filter {
    let key = KEYS[rng.below(KEYS.len())].to_string();
    match rng.below(if depth == 0 { 3 } else { 6 }) {
        0 => Filter::Eq {
            key,
            value: VALUES[rng.below(VALUES.len())].into(),
        },
        1 => Filter::In {
            key,
            values: (0..1 + rng.below(4))
                .map(|_| VALUES[rng.below(VALUES.len())].to_string())
                .collect(),
        },
        2 => {
            let nums = [0.0, -1.5, 2.0, 1e300, 1e-7, 123.456];
            let op = [CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge][rng.below(4)];
            Filter::Cmp {
                key,
                op,
                num: Num::new(nums[rng.below(nums.len())]).unwrap(),
            }
        }
        3 => Filter::Not(Box::new(random_filter(rng, depth - 1))),
        4 => Filter::And(
            (0..1 + rng.below(3))
                .map(|_| random_filter(rng, depth - 1))
                .collect(),
        ),
        _ => Filter::Or(
            (0..1 + rng.below(3))
                .map(|_| random_filter(rng, depth - 1))
                .collect(),
        ),
    }
}

fn random_tags(rng: &mut Rng) -> BTreeMap<String, String> {
    let mut t = BTreeMap::new();
    for k in KEYS {
        match rng.below(4) {
            0 => {}
            1 => {
                t.insert(
                    k.to_string(),
                    ["0", "-1.5", "2", "1e-7", "200"][rng.below(5)].to_string(),
                );
            }
            _ => {
                t.insert(k.to_string(), VALUES[rng.below(VALUES.len())].to_string());
            }
        }
    }
    t
}

#[test]
fn canonical_form_round_trips_through_text_and_json_and_keeps_the_meaning() {
    let l = Limits {
        max_len: 1 << 16,
        max_depth: 16,
        max_terms: 1000,
        max_list: 64,
    };
    let mut rng = Rng(51);
    for case in 0..3000 {
        let raw = random_filter(&mut rng, 4);
        let f = normalise(raw.clone());
        assert_eq!(normalise(f.clone()), f, "idempotent, case {case}");
        let text = f.to_string();
        assert_eq!(parse(&text, &l).as_ref(), Ok(&f), "case {case}: {text}");
        assert_eq!(
            from_json(&to_json(&f), &l).as_ref(),
            Ok(&f),
            "case {case}: json"
        );
        for _ in 0..8 {
            let t = random_tags(&mut rng);
            assert_eq!(
                raw.matches(&t),
                f.matches(&t),
                "case {case}: {text} on {t:?}"
            );
        }
    }
}
