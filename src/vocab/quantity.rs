//! Parsing of memory quantities (`4Gi`, `4096Mi`, `4G`, `512M`, plain bytes) and percentages.

use thiserror::Error;

/// A quantity that could not be parsed.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum QuantityError {
    #[error("memory quantity {0:?} is not valid: use bytes or a number with Ki/Mi/Gi/Ti or K/M/G/T, e.g. 4Gi")]
    Memory(String),
    #[error("memory quantity {0:?} must be greater than zero")]
    ZeroMemory(String),
    #[error("cores {0:?} is not valid: give a whole percentage from 1 to 100")]
    Cores(String),
}

/// Parses a memory quantity into bytes. Binary suffixes (`Ki`, `Mi`, `Gi`, `Ti`) are powers of
/// 1024; decimal ones (`K`, `M`, `G`, `T`, as in Kubernetes) are powers of 1000. Lower-case
/// `k`/`m`/`g`/`t` are accepted as binary, as HAMi-core and CUDA tools read them.
///
/// # Errors
/// Returns [`QuantityError`] for anything else, for zero, and on overflow.
pub fn parse_memory(s: &str) -> Result<u64, QuantityError> {
    let bad = || QuantityError::Memory(s.to_owned());
    let t = s.trim();
    if t.is_empty() || t.len() > 32 {
        return Err(bad());
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(bad());
    }
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match suffix {
        "" => 1,
        "Ki" | "k" | "KiB" => 1 << 10,
        "Mi" | "m" | "MiB" => 1 << 20,
        "Gi" | "g" | "GiB" => 1 << 30,
        "Ti" | "t" | "TiB" => 1 << 40,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    let bytes = n.checked_mul(mult).ok_or_else(bad)?;
    if bytes == 0 {
        return Err(QuantityError::ZeroMemory(s.to_owned()));
    }
    Ok(bytes)
}

/// Parses an SM share in percent, 1 to 100.
///
/// # Errors
/// Returns [`QuantityError::Cores`] for anything outside 1..=100.
pub fn parse_cores(s: &str) -> Result<u8, QuantityError> {
    let t = s.trim().trim_end_matches('%');
    match t.parse::<u8>() {
        Ok(n) if (1..=100).contains(&n) && t.len() <= 3 => Ok(n),
        _ => Err(QuantityError::Cores(s.to_owned())),
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
            ("decimal gigabytes", "4G", Ok(4_000_000_000)),
            ("decimal megabytes", "512M", Ok(512_000_000)),
            ("plain bytes", "1048576", Ok(1 << 20)),
            ("lower-case as HAMi", "2g", Ok(2 << 30)),
            ("surrounding space", " 1Gi ", Ok(1 << 30)),
            ("unknown suffix", "12XB", Err(())),
            ("zero", "0", Err(())),
            ("zero with suffix", "0Gi", Err(())),
            ("negative", "-1Gi", Err(())),
            ("fraction", "1.5Gi", Err(())),
            ("empty", "", Err(())),
            ("suffix only", "Gi", Err(())),
            ("overflow", "99999999999999Ti", Err(())),
            ("too long", "1111111111111111111111111111111111", Err(())),
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
            ("negative", "-5", Err(())),
            ("word", "half", Err(())),
            ("leading zeros", "0050", Err(())),
        ];
        for (what, input, want) in rows {
            let got = parse_cores(input).map_err(|_| ());
            assert_eq!(&got, want, "{what}: {input:?}");
        }
    }
}
