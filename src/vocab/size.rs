//! Sizes for people: bytes as `4.0 GiB`, `512.0 MiB`, `100 B`.

/// `bytes` in the largest binary unit that keeps the number at least 1, one decimal.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_table() {
        let rows: &[(&str, u64, &str)] = &[
            ("bytes", 100, "100 B"),
            ("one KiB", 1024, "1.0 KiB"),
            ("4 GiB", 4 << 30, "4.0 GiB"),
            ("80 GiB", 80 << 30, "80.0 GiB"),
            ("1.5 MiB", 3 << 19, "1.5 MiB"),
            ("decimal 4G", 4_000_000_000, "3.7 GiB"),
        ];
        for (what, b, want) in rows {
            assert_eq!(super::human(*b), *want, "{what}");
        }
    }
}
