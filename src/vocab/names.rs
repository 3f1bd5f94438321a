//! Names that may become one path component, and Kubernetes names.

/// Whether `s` can safely become one path component: ASCII letters, digits, `_-.:`, 1 to 128
/// bytes, not starting with `.`.
pub fn is_safe_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// Whether `s` is a Kubernetes namespace name (an RFC 1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`,
/// at most 63 bytes).
pub fn is_namespace(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}
