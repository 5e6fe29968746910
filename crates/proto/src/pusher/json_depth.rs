//! A bound on JSON nesting checked before parsing: a message of ten thousand `[` costs the
//! parser a stack frame each, so depth is refused in one flat pass over the bytes instead.

/// Whether `bytes` nest arrays and objects at most `max` deep (brackets inside strings do not
/// count). Malformed JSON may pass: the parser refuses it next.
pub fn within(bytes: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::within;

    #[test]
    fn nesting_is_counted_outside_strings_only() {
        assert!(within(br#"{"a":[1,{"b":2}]}"#, 3));
        assert!(!within(br#"{"a":[1,{"b":2}]}"#, 2));
        assert!(within(br#"{"a":"[[[[[[\"[[["}"#, 1));
        assert!(!within(&[b'['; 10_000], 64));
    }
}
