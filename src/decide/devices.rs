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

/// The `NVIDIA_VISIBLE_DEVICES` value that counts when `env` holds several: the last one.
///
/// CDI appends its `containerEdits.env` to the container's env instead of replacing entries,
/// so NVIDIA's generated specs (common `NVIDIA_VISIBLE_DEVICES=void`) leave a config.json with
/// both the user's value and `void`. The NVIDIA container toolkit reads the env into a map (the
/// last entry wins), and runc hands the process the last entry too, so the last one is what
/// every reader downstream sees. It names GPUs only through [`assigned`], which also counts the
/// device nodes, so a trailing `void` cannot hide a GPU the container was given.
pub fn visible(env: &[String]) -> Option<&str> {
    crate::decide::request::env_lookup(env, "NVIDIA_VISIBLE_DEVICES")
}

/// Finds the GPUs the container was really given: those named by `NVIDIA_VISIBLE_DEVICES`
/// (the value from [`visible`]), together with those whose `/dev/nvidia<N>` device nodes are in
/// `linux.devices` (by minor number), in either case once.
///
/// `all` names every GPU; `none`, `void` and empty name none but hide no device node: CDI
/// specs (as `nvidia-ctk cdi generate` writes them) and engines' `--device` hand out GPUs as
/// device nodes and set `void` only so that NVIDIA's legacy hook leaves the container alone.
/// A list names its GPUs. Values are taken exactly as written: `ALL` or `0, 1` are refused
/// (the toolkit would pass `ALL` on as an unknown device, and trims the spaces of `0, 1`;
/// gpushare asks for the exact form instead of guessing). docs/design.md, "Which GPUs a
/// container has", lists what the toolkit does with each value.
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
        None | Some("" | "none" | "void") => {}
        Some(list) => {
            for part in list.split(',') {
                let sel = parse_selector(part)
                    .ok_or_else(|| DeviceError::BadVisible(part.chars().take(64).collect()))?;
                push(find(&sel, inventory)?);
            }
        }
    }
    for path in linux_devices {
        let Some(minor) = path
            .strip_prefix("/dev/nvidia")
            .filter(|n| !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit()))
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
            ("none, no node", Some("none"), vec![], Ok(vec![])),
            ("void, no node", Some("void"), vec![], Ok(vec![])),
            ("empty, no node", Some(""), vec![], Ok(vec![])),
            // CDI (NVIDIA's generated spec): the GPU arrives as a device node, env says void.
            (
                "void with a CDI node",
                Some("void"),
                vec!["/dev/nvidiactl", "/dev/nvidia0"],
                Ok(vec![0]),
            ),
            (
                "none with a node",
                Some("none"),
                vec!["/dev/nvidia1"],
                Ok(vec![1]),
            ),
            (
                "empty with a node",
                Some(""),
                vec!["/dev/nvidia3"],
                Ok(vec![3]),
            ),
            (
                "list and other nodes: both",
                Some("2"),
                vec!["/dev/nvidia0"],
                Ok(vec![2, 0]),
            ),
            (
                "list and the same node: once",
                Some("1"),
                vec!["/dev/nvidia1"],
                Ok(vec![1]),
            ),
            (
                "all and a node",
                Some("all"),
                vec!["/dev/nvidia2"],
                Ok(vec![0, 1, 2, 3]),
            ),
            (
                "void with an unknown node",
                Some("void"),
                vec!["/dev/nvidia9"],
                Err(DeviceError::Unknown("/dev/nvidia9".into())),
            ),
            (
                "not GPU nodes",
                Some("void"),
                vec![
                    "/dev/nvidiactl",
                    "/dev/nvidia-uvm",
                    "/dev/nvidia-caps/nvidia-cap1",
                    "/dev/nvidia00000",
                ],
                Ok(vec![]),
            ),
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

    /// Several `NVIDIA_VISIBLE_DEVICES` entries: the last counts (as for the toolkit and runc),
    /// and the device nodes count whatever it says.
    #[test]
    fn several_entries_table() {
        let inv = inv(4);
        type Row<'a> = (
            &'a str,
            Vec<&'a str>,
            Vec<&'a str>,
            Option<&'a str>,
            Vec<u32>,
        );
        let rows: Vec<Row> = vec![
            (
                "one",
                vec!["NVIDIA_VISIBLE_DEVICES=1"],
                vec![],
                Some("1"),
                vec![1],
            ),
            (
                "unset",
                vec!["PATH=/bin"],
                vec!["/dev/nvidia2"],
                None,
                vec![2],
            ),
            (
                "user 0, CDI void appended, CDI node",
                vec!["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=void"],
                vec!["/dev/nvidia0"],
                Some("void"),
                vec![0],
            ),
            (
                "user 1, CDI void appended, CDI gave node 0",
                vec!["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=void"],
                vec!["/dev/nvidia0"],
                Some("void"),
                vec![0],
            ),
            (
                "void first, list last",
                vec!["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=3"],
                vec![],
                Some("3"),
                vec![3],
            ),
            (
                "an earlier bad entry is not read",
                vec!["NVIDIA_VISIBLE_DEVICES=junk", "NVIDIA_VISIBLE_DEVICES=2"],
                vec![],
                Some("2"),
                vec![2],
            ),
            (
                "a look-alike name is not the variable",
                vec!["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES_X=2"],
                vec![],
                Some("1"),
                vec![1],
            ),
        ];
        for (what, env, devs, want_value, want) in rows {
            let env: Vec<String> = env.into_iter().map(String::from).collect();
            let devs: Vec<String> = devs.into_iter().map(String::from).collect();
            assert_eq!(visible(&env), want_value, "{what}");
            let got: Vec<u32> = assigned(visible(&env), &devs, &inv)
                .unwrap()
                .iter()
                .map(|g| g.index)
                .collect();
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
                "two named for limit",
                given.clone(),
                Some(vec![Selector::Index(2), Selector::Index(1)]),
                Mode::Limit,
                Ok(vec![2, 1]),
            ),
            (
                "one named twice",
                given.clone(),
                Some(vec![
                    Selector::Index(1),
                    Selector::Uuid("gpu-00000001".into()),
                ]),
                Mode::Mps,
                Ok(vec![1]),
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
