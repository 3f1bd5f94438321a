//! Sizes for people: bytes as `4.0 GiB`, `512.0 MiB`, `100 B`. The one form of every size
//! gpushare prints to people (status, doctor, refusals, logs, the DRA plugin's errors); what a
//! request or the policy is written in (`8Gi`, `8192Mi`, `vocab::quantity`) is read, not printed,
//! except where a message shows the value to write.

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

    /// Every size comes out as a number, one space and a binary unit (`80.0 GiB`), never in
    /// a request's grammar (`81920Mi`, `80Gi`).
    #[test]
    fn one_form_number_space_binary_unit() {
        let mut checked = 0;
        for shift in 0..60 {
            for b in [
                1u64 << shift,
                (1u64 << shift) + 1,
                (3u64 << shift) / 2,
                81920 << 20,
            ] {
                let s = super::human(b);
                let (num, unit) = s.split_once(' ').expect("a space");
                assert!(
                    ["B", "KiB", "MiB", "GiB", "TiB", "PiB"].contains(&unit),
                    "{b}: {s}"
                );
                if unit == "B" {
                    assert_eq!(num, b.to_string(), "{b}: {s}");
                } else {
                    let (whole, tenth) = num.split_once('.').expect("one decimal");
                    assert!(
                        !whole.is_empty()
                            && whole.bytes().all(|c| c.is_ascii_digit())
                            && tenth.len() == 1
                            && tenth.bytes().all(|c| c.is_ascii_digit()),
                        "{b}: {s}"
                    );
                }
                assert!(!s.ends_with("Mi") && !s.ends_with("Gi"), "{b}: {s}");
                checked += 1;
            }
        }
        assert_eq!(checked, 240, "positive control");
        // The sizes of the admission refusal (memory-caps.md's example).
        assert_eq!(super::human(81920 << 20), "80.0 GiB");
        assert_eq!(super::human(49152 << 20), "48.0 GiB");
        assert_eq!(super::human(4096 << 20), "4.0 GiB");
    }
}
