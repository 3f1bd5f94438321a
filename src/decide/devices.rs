//! Which GPUs a container was given, and which of them it asked to share. Pure.

use thiserror::Error;

use crate::decide::request::{parse_selector, Selector, DEVICES_GRAMMAR};
use crate::vocab::Gpu;
use crate::vocab::Mode;

/// The container's GPU assignment does not fit its request.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DeviceError {
    #[error("the container asks for GPU sharing but was given no GPU; set NVIDIA_VISIBLE_DEVICES or add /dev/nvidia<N> devices")]
    NoGpu,
    #[error("NVIDIA_VISIBLE_DEVICES entry {0:?} is not valid: give all, none, void or {DEVICES_GRAMMAR}")]
    BadVisible(String),
    #[error("GPU {0} does not exist on this node")]
    Unknown(String),
    #[error("gpu.share.devices names GPU {0}, which the container was not given; use a subset of its GPUs")]
    NotAssigned(String),
    #[error("mps mode serves one GPU per container but {0} were selected; pick one with gpu.share.devices, or use gpu.share=timeslice or gpu.share=limit")]
    MpsMultiGpu(usize),
}

/// Finds the GPUs the container was given: `NVIDIA_VISIBLE_DEVICES` if set, else
/// `/dev/nvidia<N>` entries of `linux.devices` (by minor number), else none.
///
/// `NVIDIA_VISIBLE_DEVICES` is read as the NVIDIA container toolkit reads it: exactly `all`,
/// `none`, `void` or empty (lower case, no spaces), else a comma list of selectors; `ALL` or
/// `0, 1` are refused here because the toolkit would not give the container those GPUs.
///
/// # Errors
/// [`DeviceError`] for malformed or unknown entries.
pub fn assigned(
    visible: Option<&str>,
    linux_devices: &[String],
    inventory: &[Gpu],
) -> Result<Vec<Gpu>, DeviceError> {
    let mut out: Vec<Gpu> = Vec::new();
    let mut push = |g: &Gpu| {
        if !out.iter().any(|o| o.index == g.index) {
            out.push(g.clone());
        }
    };
    match visible {
        Some("all") => inventory.iter().for_each(&mut push),
        Some("" | "none" | "void") => {}
        Some(list) => {
            for part in list.split(',') {
                let sel = parse_selector(part)
                    .ok_or_else(|| DeviceError::BadVisible(part.chars().take(64).collect()))?;
                push(find(&sel, inventory)?);
            }
        }
        None => {
            for path in linux_devices {
                let Some(minor) = path
                    .strip_prefix("/dev/nvidia")
                    .filter(|n| {
                        !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit())
                    })
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let gpu = inventory
                    .iter()
                    .find(|g| g.minor == minor)
                    .ok_or_else(|| DeviceError::Unknown(path.clone()))?;
                push(gpu);
            }
        }
    }
    Ok(out)
}

/// Narrows the assignment to the requested subset and checks the mode's GPU count.
///
/// # Errors
/// [`DeviceError`] when nothing is assigned, a selector is outside the assignment, or mps
/// would serve more than one GPU.
pub fn select(
    assigned: &[Gpu],
    wanted: Option<&[Selector]>,
    mode: Mode,
    inventory: &[Gpu],
) -> Result<Vec<Gpu>, DeviceError> {
    if assigned.is_empty() {
        return Err(DeviceError::NoGpu);
    }
    let chosen: Vec<Gpu> = match wanted {
        None => assigned.to_vec(),
        Some(sels) => {
            let mut v: Vec<Gpu> = Vec::new();
            for sel in sels {
                let gpu = find(sel, inventory)?;
                if !assigned.iter().any(|a| a.index == gpu.index) {
                    return Err(DeviceError::NotAssigned(describe(sel)));
                }
                if !v.iter().any(|g| g.index == gpu.index) {
                    v.push(gpu.clone());
                }
            }
            v
        }
    };
    if mode == Mode::Mps && chosen.len() > 1 {
        return Err(DeviceError::MpsMultiGpu(chosen.len()));
    }
    Ok(chosen)
}

fn describe(sel: &Selector) -> String {
    match sel {
        Selector::Index(i) => i.to_string(),
        Selector::Uuid(u) => u.clone(),
    }
}

fn find<'a>(sel: &Selector, inventory: &'a [Gpu]) -> Result<&'a Gpu, DeviceError> {
    inventory
        .iter()
        .find(|g| match sel {
            Selector::Index(i) => g.index == *i,
            Selector::Uuid(u) => g.uuid.eq_ignore_ascii_case(u),
        })
        .ok_or_else(|| DeviceError::Unknown(describe(sel)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(n: u32) -> Vec<Gpu> {
        (0..n)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i:08x}"),
                minor: i,
            })
            .collect()
    }

    #[test]
    fn assignment_table() {
        let inv = inv(4);
        type Row<'a> = (
            &'a str,
            Option<&'a str>,
            Vec<&'a str>,
            Result<Vec<u32>, DeviceError>,
        );
        let rows: Vec<Row> = vec![
            ("all", Some("all"), vec![], Ok(vec![0, 1, 2, 3])),
            ("indices", Some("1,3"), vec![], Ok(vec![1, 3])),
            ("uuid", Some("GPU-00000002"), vec![], Ok(vec![2])),
            ("duplicates folded", Some("1,1"), vec![], Ok(vec![1])),
            ("none", Some("none"), vec!["/dev/nvidia0"], Ok(vec![])),
            ("void", Some("void"), vec![], Ok(vec![])),
            ("empty", Some(""), vec!["/dev/nvidia0"], Ok(vec![])),
            (
                "upper-case ALL",
                Some("ALL"),
                vec![],
                Err(DeviceError::BadVisible("ALL".into())),
            ),
            (
                "all with space",
                Some(" all"),
                vec![],
                Err(DeviceError::BadVisible(" all".into())),
            ),
            (
                "space after comma",
                Some("0, 1"),
                vec![],
                Err(DeviceError::BadVisible(" 1".into())),
            ),
            (
                "lower-case prefix",
                Some("gpu-00000001"),
                vec![],
                Err(DeviceError::BadVisible("gpu-00000001".into())),
            ),
            (
                "devices fallback",
                None,
                vec!["/dev/nvidiactl", "/dev/nvidia2"],
                Ok(vec![2]),
            ),
            ("nothing", None, vec![], Ok(vec![])),
            (
                "unknown index",
                Some("7"),
                vec![],
                Err(DeviceError::Unknown("7".into())),
            ),
            (
                "junk",
                Some("0;rm -rf"),
                vec![],
                Err(DeviceError::BadVisible("0;rm -rf".into())),
            ),
            (
                "unknown node",
                None,
                vec!["/dev/nvidia9"],
                Err(DeviceError::Unknown("/dev/nvidia9".into())),
            ),
        ];
        for (what, vis, devs, want) in rows {
            let devs: Vec<String> = devs.into_iter().map(String::from).collect();
            let got =
                assigned(vis, &devs, &inv).map(|v| v.iter().map(|g| g.index).collect::<Vec<_>>());
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn uuid_hex_matches_in_either_case() {
        let inv = vec![Gpu {
            index: 0,
            uuid: "GPU-ab12cd".into(),
            minor: 0,
        }];
        for v in ["GPU-AB12CD", "GPU-ab12cd", "GPU-Ab12cD"] {
            assert_eq!(assigned(Some(v), &[], &inv).unwrap().len(), 1, "{v}");
        }
    }

    #[test]
    fn selection_table() {
        let inv = inv(4);
        let given = vec![inv[1].clone(), inv[2].clone()];
        type Row<'a> = (
            &'a str,
            Vec<Gpu>,
            Option<Vec<Selector>>,
            Mode,
            Result<Vec<u32>, DeviceError>,
        );
        let rows: Vec<Row> = vec![
            (
                "all of one",
                vec![inv[0].clone()],
                None,
                Mode::Mps,
                Ok(vec![0]),
            ),
            (
                "subset",
                given.clone(),
                Some(vec![Selector::Index(2)]),
                Mode::Mps,
                Ok(vec![2]),
            ),
            (
                "subset by uuid",
                given.clone(),
                Some(vec![Selector::Uuid("gpu-00000001".into())]),
                Mode::Limit,
                Ok(vec![1]),
            ),
            (
                "two for limit",
                given.clone(),
                None,
                Mode::Limit,
                Ok(vec![1, 2]),
            ),
            (
                "two for mps",
                given.clone(),
                None,
                Mode::Mps,
                Err(DeviceError::MpsMultiGpu(2)),
            ),
            (
                "outside",
                given.clone(),
                Some(vec![Selector::Index(0)]),
                Mode::Mps,
                Err(DeviceError::NotAssigned("0".into())),
            ),
            (
                "no gpu",
                vec![],
                None,
                Mode::Timeslice,
                Err(DeviceError::NoGpu),
            ),
        ];
        for (what, given, wanted, mode, want) in rows {
            let got = select(&given, wanted.as_deref(), mode, &inv)
                .map(|v| v.iter().map(|g| g.index).collect::<Vec<_>>());
            assert_eq!(got, want, "{what}");
        }
    }
}
