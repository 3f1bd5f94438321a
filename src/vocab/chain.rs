//! The one-line rendering of an error chain.

use std::error::Error as StdError;

/// Renders an error and its sources as one line: `outer: cause: root cause`.
/// Transparent wrappers and causes that repeat the previous text are skipped.
pub fn chain(err: &dyn StdError) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&dyn StdError> = Some(err);
    while let Some(e) = cur {
        let s = e.to_string().replace('\n', " ");
        if !s.is_empty() && parts.last().is_none_or(|p| !p.ends_with(&s)) {
            parts.push(s);
        }
        cur = e.source();
    }
    parts.join(": ")
}
