//! Capped reading of untrusted input.

use std::borrow::Cow;
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

/// `bytes` as text, each sequence that is not UTF-8 replaced by U+FFFD (as
/// `String::from_utf8_lossy`, and as Go's JSON decoder reads it). Valid UTF-8 is checked by
/// `str::from_utf8`, which takes ASCII a word at a time; the lossy decoder walks every byte
/// (about 80,000 instructions for a 12 KiB `config.json`, a fifth of a no-share hook's), so
/// it runs only on bytes that need it.
pub fn text(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text is the lossy decoder's, borrowed when the bytes are UTF-8 already.
    #[test]
    fn text_is_the_lossy_reading_borrowed_when_valid() {
        let rows: [&[u8]; 6] = [
            b"",
            b"{\"annotations\":{\"gpu.share\":\"mps\"}}",
            "caf\u{e9} \u{1f600}".as_bytes(),
            b"gpu\xffshare \xc3",
            b"\xed\xa0\x80 surrogate",
            b"ok\xe2\x82 cut \xf0\x9f\x98",
        ];
        for bytes in rows {
            let got = text(bytes);
            assert_eq!(got, String::from_utf8_lossy(bytes), "{bytes:?}");
            assert_eq!(
                matches!(got, Cow::Borrowed(_)),
                std::str::from_utf8(bytes).is_ok(),
                "{bytes:?}"
            );
        }
    }
}
