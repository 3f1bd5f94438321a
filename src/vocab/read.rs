//! Capped reading of untrusted input.

use std::io::Read;

/// Reads at most `cap` bytes; `None` when the input is larger.
///
/// # Errors
/// Any read error.
pub fn read_capped(r: impl Read, cap: u64) -> std::io::Result<Option<Vec<u8>>> {
    // Room for a typical file up front: `read_to_end` into an empty vector starts with 32-byte
    // reads and doubles (a dozen read calls for a 12 KiB config.json).
    let mut buf = Vec::with_capacity(
        usize::try_from(cap.saturating_add(1))
            .unwrap_or(usize::MAX)
            .min(16 << 10),
    );
    r.take(cap + 1).read_to_end(&mut buf)?;
    Ok((buf.len() as u64 <= cap).then_some(buf))
}
