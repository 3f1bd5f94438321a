//! The grammar of the numbers a container or the admin may write: memory quantities and SM
//! percentages. One grammar per value, strict, the same in every message and in the README
//! ("Request grammar"):
//!
//! - memory: `DIGITS[SUFFIX]`, no sign, no leading zero, no space, no fraction; `SUFFIX` is one
//!   of `Ki` `Mi` `Gi` `Ti` (powers of 1024) or `K` `M` `G` `T` (powers of 1000, as Kubernetes
//!   reads them); no suffix means bytes. From [`MIN_MEMORY`] (1 MiB) to [`MAX_MEMORY`] (64 TiB).
//! - cores: `DIGITS[%]`, no sign, no leading zero, no space, from 1 to 100.

use thiserror::Error;

/// The memory grammar, as every message words it.
pub const MEMORY_GRAMMAR: &str =
    "a whole number of bytes, or one with a suffix Ki, Mi, Gi, Ti (x1024) or K, M, G, T (x1000), e.g. 4Gi; no sign, space or leading zero";
/// The cores grammar, as every message words it.
pub const CORES_GRAMMAR: &str =
    "a whole percentage from 1 to 100, e.g. 50 or 50%; no sign, space or leading zero";
/// Smallest memory cap accepted: below it no CUDA context fits.
pub const MIN_MEMORY: u64 = 1 << 20;
/// Largest memory cap accepted: far above any GPU, low enough that sums cannot overflow.
pub const MAX_MEMORY: u64 = 64 << 40;

/// A quantity that could not be parsed.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum QuantityError {
    #[error("memory {0:?} is not valid: give {MEMORY_GRAMMAR}")]
    Memory(String),
    #[error("memory {0:?} is below the minimum of 1Mi (1048576 bytes)")]
    MemoryTooSmall(String),
    #[error("memory {0:?} is above the maximum of 64Ti")]
    MemoryTooLarge(String),
    #[error("cores {0:?} is not valid: give {CORES_GRAMMAR}")]
    Cores(String),
}

/// The value shown in a message: at most 64 characters of it.
fn shown(s: &str) -> String {
    s.chars().take(64).collect()
}

/// `DIGITS` with no leading zero (a lone `0` is allowed here; callers refuse it by range).
fn canonical_digits(d: &str) -> bool {
    !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) && (d == "0" || !d.starts_with('0'))
}

/// Parses a memory quantity into bytes (grammar in the module doc).
///
/// # Errors
/// [`QuantityError`] for anything outside the grammar or the range.
pub fn parse_memory(s: &str) -> Result<u64, QuantityError> {
    let bad = || QuantityError::Memory(shown(s));
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if !canonical_digits(num) || num.len() > 20 {
        return Err(bad());
    }
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    match n.checked_mul(mult) {
        Some(b) if b < MIN_MEMORY => Err(QuantityError::MemoryTooSmall(shown(s))),
        Some(b) if b <= MAX_MEMORY => Ok(b),
        _ => Err(QuantityError::MemoryTooLarge(shown(s))),
    }
}

/// Parses an SM share in percent (grammar in the module doc).
///
/// # Errors
/// [`QuantityError::Cores`] for anything outside the grammar or 1..=100.
pub fn parse_cores(s: &str) -> Result<u8, QuantityError> {
    let num = s.strip_suffix('%').unwrap_or(s);
    match num.parse::<u8>() {
        Ok(n) if canonical_digits(num) && (1..=100).contains(&n) => Ok(n),
        _ => Err(QuantityError::Cores(shown(s))),
    }
}

/// Formats bytes as whole mebibytes, rounded down, at least 1 (`0=4096M` form for MPS).
pub fn to_mib(bytes: u64) -> u64 {
    (bytes >> 20).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_table() {
        let rows: &[(&str, &str, Result<u64, ()>)] = &[
            ("binary gibibytes", "4Gi", Ok(4 << 30)),
            ("binary mebibytes", "4096Mi", Ok(4096 << 20)),
            ("binary kibibytes", "1024Ki", Ok(1 << 20)),
            ("binary tebibytes", "2Ti", Ok(2 << 40)),
            ("decimal gigabytes", "4G", Ok(4_000_000_000)),
            ("decimal megabytes", "512M", Ok(512_000_000)),
            ("decimal terabytes", "1T", Ok(1_000_000_000_000)),
            ("plain bytes", "1048576", Ok(1 << 20)),
            ("minimum", "1Mi", Ok(MIN_MEMORY)),
            ("maximum", "64Ti", Ok(MAX_MEMORY)),
            ("one byte", "1", Err(())),
            ("below minimum", "1048575", Err(())),
            ("decimal below minimum", "1M", Err(())),
            ("above maximum", "65Ti", Err(())),
            ("u64 max", "18446744073709551615", Err(())),
            ("past u64", "18446744073709551616", Err(())),
            ("lower-case suffix", "2g", Err(())),
            ("milli as Kubernetes writes it", "512m", Err(())),
            ("byte suffix", "4GiB", Err(())),
            ("plus sign", "+4Gi", Err(())),
            ("leading zero", "04Gi", Err(())),
            ("surrounding space", " 1Gi ", Err(())),
            ("trailing newline", "1Gi\n", Err(())),
            ("space before suffix", "1 Gi", Err(())),
            ("unknown suffix", "12XB", Err(())),
            ("zero", "0", Err(())),
            ("zero with suffix", "0Gi", Err(())),
            ("negative", "-1Gi", Err(())),
            ("fraction", "1.5Gi", Err(())),
            ("exponent", "1e9", Err(())),
            ("empty", "", Err(())),
            ("suffix only", "Gi", Err(())),
            ("overflow", "99999999999999Ti", Err(())),
            ("too long", "1111111111111111111111111111111111", Err(())),
            ("non-ASCII digit", "４Gi", Err(())),
        ];
        for (what, input, want) in rows {
            let got = parse_memory(input).map_err(|_| ());
            assert_eq!(&got, want, "{what}: {input:?}");
        }
    }

    #[test]
    fn cores_table() {
        let rows: &[(&str, &str, Result<u8, ()>)] = &[
            ("lowest", "1", Ok(1)),
            ("highest", "100", Ok(100)),
            ("percent sign", "30%", Ok(30)),
            ("zero", "0", Err(())),
            ("above", "101", Err(())),
            ("far above", "300", Err(())),
            ("negative", "-5", Err(())),
            ("plus sign", "+50", Err(())),
            ("word", "half", Err(())),
            ("leading zero", "050", Err(())),
            ("leading zeros", "0050", Err(())),
            ("many percent signs", "50%%%", Err(())),
            ("percent only", "%", Err(())),
            ("trailing newline", "50\n", Err(())),
            ("surrounding space", " 50", Err(())),
            ("space before percent", "50 %", Err(())),
            ("fraction", "50.5", Err(())),
            ("empty", "", Err(())),
        ];
        for (what, input, want) in rows {
            let got = parse_cores(input).map_err(|_| ());
            assert_eq!(&got, want, "{what}: {input:?}");
        }
    }

    #[test]
    fn messages_name_the_grammar_and_the_value() {
        let m = parse_memory("+4Gi").unwrap_err().to_string();
        assert!(m.contains("\"+4Gi\"") && m.contains(MEMORY_GRAMMAR), "{m}");
        let m = parse_memory("1").unwrap_err().to_string();
        assert!(m.contains("minimum of 1Mi"), "{m}");
        let m = parse_cores("050").unwrap_err().to_string();
        assert!(m.contains("\"050\"") && m.contains(CORES_GRAMMAR), "{m}");
        let long = "9".repeat(500);
        assert!(parse_memory(&long).unwrap_err().to_string().len() < 300);
    }
}
