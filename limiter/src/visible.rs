//! Which CUDA ordinal an NVML device is, from `CUDA_VISIBLE_DEVICES` alone (pure): what NVML
//! reports before the program made any CUDA call, when no CUDA process of the container has
//! recorded the device's UUID yet.
#![forbid(unsafe_code)]

/// The CUDA ordinal of the NVML device with index `index` and UUID `uuid` (`GPU-…`) under
/// `CUDA_VISIBLE_DEVICES=visible`: the position of the entry naming it, by index or by a UUID
/// prefix, as CUDA reads the list (entries after the first invalid one are ignored). `None`
/// when the device is not visible, or an entry is of a form this does not resolve (MIG
/// instances).
///
/// CUDA orders devices fastest first by default; like the limiter's other NVML-index
/// mappings, this assumes that order is NVML's (PCI bus) order, which holds for a machine of
/// identical GPUs and for `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
pub fn ordinal(visible: &str, index: usize, uuid: &str) -> Option<usize> {
    for (ord, entry) in visible.split(',').map(str::trim).enumerate() {
        if let Ok(i) = entry.parse::<usize>() {
            if i == index {
                return Some(ord);
            }
        } else if entry.len() > 4 && entry.starts_with("GPU-") {
            if uuid.starts_with(entry) {
                return Some(ord);
            }
        } else {
            // Invalid or unresolved: CUDA stops reading here.
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn ordinals() {
        let u = "GPU-5a1e0000-0000-4000-8000-000000000001";
        let rows: &[(&str, &str, usize, Option<usize>)] = &[
            ("the only one", "0", 0, Some(0)),
            ("not listed", "0", 1, None),
            ("second of two", "0,1", 1, Some(1)),
            ("reordered", "1,0", 1, Some(0)),
            ("by UUID", u, 1, Some(0)),
            (
                "by UUID prefix",
                "GPU-5a1e0000-0000-4000-8000-00000000000",
                1,
                Some(0),
            ),
            ("after an invalid entry", "0,x,1", 1, None),
            ("empty", "", 0, None),
            ("MIG", "MIG-0c5f0000", 1, None),
            ("spaces", " 2 , 1", 1, Some(1)),
        ];
        for (what, visible, index, want) in rows {
            assert_eq!(super::ordinal(visible, *index, u), *want, "{what}");
        }
    }
}
