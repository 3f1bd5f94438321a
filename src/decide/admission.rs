//! Admission by memory: the memory caps of a GPU's shares add up to at most `[policy]
//! memory_overcommit` times its memory; a share without a cap counts as the whole GPU (or is
//! refused before it gets here, under `uncapped = "refuse"`). Pure: the holders in, a
//! refusal that names them out.

use thiserror::Error;

use crate::vocab::quantity::to_mib;

/// A request that does not fit.
#[derive(Debug, Error, PartialEq)]
#[error("GPU {index} ({uuid}, {total_mib}Mi) cannot take {asked}: its shares hold {held_mib}Mi of the {budget_mib}Mi allowed ([policy] memory_overcommit = {overcommit}): {holders}. Ask for less with gpu.share.memory, wait for one of them to stop, or raise memory_overcommit")]
pub struct Overcommitted {
    pub index: u32,
    pub uuid: String,
    pub total_mib: u64,
    pub asked: String,
    pub held_mib: u64,
    pub budget_mib: u64,
    pub overcommit: f64,
    /// Each holder and what it holds, e.g. `c1 8192Mi, c2 uncapped (counts as 81920Mi)`.
    pub holders: String,
}

/// What a share counts against the GPU: its cap, or the whole GPU.
fn counted(cap: Option<u64>, total: u64) -> u64 {
    cap.unwrap_or(total)
}

/// What the caps of `caps` add up to on a GPU of `total` bytes (an uncapped share counted as
/// the whole GPU).
pub fn committed(total: u64, caps: impl IntoIterator<Item = Option<u64>>) -> u64 {
    caps.into_iter()
        .map(|c| counted(c, total))
        .fold(0u64, u64::saturating_add)
}

/// What the caps on a GPU of `total` bytes may add up to under `overcommit`.
pub fn allowed(total: u64, overcommit: f64) -> u64 {
    // u64 → f64 loses nothing that matters below 2^53 bytes (8 PiB).
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let budget = (total as f64 * overcommit).floor() as u64;
    budget
}

/// Admits a request for `asked` (its cap; `None`: uncapped) on GPU `index`/`uuid` of `total`
/// bytes, whose current shares are `holders` (container id, cap).
///
/// # Errors
/// [`Overcommitted`] when the caps would add up to more than `overcommit` times `total`.
pub fn admit<'a>(
    index: u32,
    uuid: &str,
    total: u64,
    holders: impl IntoIterator<Item = (&'a str, Option<u64>)>,
    asked: Option<u64>,
    overcommit: f64,
) -> Result<(), Overcommitted> {
    let holders: Vec<(&str, Option<u64>)> = holders.into_iter().collect();
    let held: u64 = holders
        .iter()
        .map(|(_, c)| counted(*c, total))
        .fold(0u64, u64::saturating_add);
    // u64 → f64 loses nothing that matters below 2^53 bytes (8 PiB).
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let budget = (total as f64 * overcommit).floor() as u64;
    if held.saturating_add(counted(asked, total)) <= budget {
        return Ok(());
    }
    let list = holders
        .iter()
        .map(|(id, c)| match c {
            Some(b) => format!("{id} {}Mi", to_mib(*b)),
            None => format!("{id} uncapped (counts as {}Mi)", to_mib(total)),
        })
        .collect::<Vec<_>>()
        .join(", ");
    Err(Overcommitted {
        index,
        uuid: uuid.to_owned(),
        total_mib: to_mib(total),
        asked: match asked {
            Some(b) => format!("{}Mi more", to_mib(b)),
            None => format!("an uncapped share (counts as {}Mi)", to_mib(total)),
        },
        held_mib: to_mib(held),
        budget_mib: to_mib(budget),
        overcommit,
        holders: list,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// (what, holders, asked, overcommit, admitted)
    type Row = (
        &'static str,
        Vec<(&'static str, Option<u64>)>,
        Option<u64>,
        f64,
        bool,
    );

    #[test]
    fn admission_table() {
        let rows: Vec<Row> = vec![
            ("empty GPU, cap", vec![], Some(8 * GIB), 1.0, true),
            ("empty GPU, uncapped takes it all", vec![], None, 1.0, true),
            (
                "exactly full",
                vec![("a", Some(72 * GIB))],
                Some(8 * GIB),
                1.0,
                true,
            ),
            (
                "one byte over",
                vec![("a", Some(72 * GIB + 1))],
                Some(8 * GIB),
                1.0,
                false,
            ),
            (
                "uncapped holder fills it",
                vec![("a", None)],
                Some(GIB),
                1.0,
                false,
            ),
            (
                "uncapped after a cap",
                vec![("a", Some(GIB))],
                None,
                1.0,
                false,
            ),
            (
                "two uncapped with overcommit 2",
                vec![("a", None)],
                None,
                2.0,
                true,
            ),
            (
                "three uncapped with overcommit 2",
                vec![("a", None), ("b", None)],
                None,
                2.0,
                false,
            ),
            (
                "overcommit below 1 reserves headroom",
                vec![("a", Some(40 * GIB))],
                Some(40 * GIB),
                0.9,
                false,
            ),
            (
                "huge caps do not wrap",
                vec![("a", Some(u64::MAX))],
                Some(u64::MAX),
                100.0,
                false,
            ),
        ];
        for (what, holders, asked, oc, ok) in rows {
            let got = admit(0, "GPU-0", 80 * GIB, holders, asked, oc);
            assert_eq!(got.is_ok(), ok, "{what}: {got:?}");
        }
    }

    #[test]
    fn a_refusal_names_the_gpu_its_size_and_each_holder() {
        let e = admit(
            1,
            "GPU-abc",
            80 * GIB,
            [("c1", Some(76 * GIB)), ("c2", None)],
            Some(8 * GIB),
            2.0,
        )
        .unwrap_err();
        let text = e.to_string();
        for want in [
            "GPU 1 (GPU-abc, 81920Mi)",
            "cannot take 8192Mi more",
            "hold 159744Mi of the 163840Mi allowed",
            "memory_overcommit = 2",
            "c1 77824Mi, c2 uncapped (counts as 81920Mi)",
        ] {
            assert!(text.contains(want), "{want:?} not in {text}");
        }
    }
}
