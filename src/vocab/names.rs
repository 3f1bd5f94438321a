//! Names that may become one path component.

/// Whether `s` can safely become one path component: ASCII letters, digits, `_-.:`, 1 to 128
/// bytes, not starting with `.`.
pub fn is_safe_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}
