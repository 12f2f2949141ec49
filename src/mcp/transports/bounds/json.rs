//! How deep a JSON body nests, counted without parsing it.

/// Nesting deeper than `max` (arrays and objects, outside strings)?
pub fn json_too_deep(bytes: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &c in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_string = false;
            }
            continue;
        }
        match c {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth() {
        assert!(!json_too_deep(br#"{"a":[1,{"b":"[[[[["}]}"#, 3));
        assert!(json_too_deep(br#"{"a":[1,{"b":[[]]}]}"#, 3));
        assert!(!json_too_deep(br#""\"[[[[""#, 1));
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(json_too_deep(deep.as_bytes(), 128));
    }
}
