//! Capped reading of untrusted input.

use std::io::Read;

/// Reads at most `cap` bytes; `None` when the input is larger.
///
/// # Errors
/// Any read error.
pub fn read_capped(r: impl Read, cap: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    r.take(cap + 1).read_to_end(&mut buf)?;
    Ok((buf.len() as u64 <= cap).then_some(buf))
}
