//! Admission by memory: the memory caps of a GPU's shares add up to at most `[policy]
//! memory_overcommit` times its memory. A share without a cap reserves nothing under the
//! default `uncapped = "share"` (it is promised nothing either); under `uncapped = "whole-gpu"`
//! it counts as the whole GPU (and under `uncapped = "refuse"` it is refused before it gets
//! here). Pure: the holders in, a refusal that names the policy keys and the holders out.

use thiserror::Error;

use crate::vocab::memcap::Uncapped;
use crate::vocab::quantity::to_mib;
use crate::vocab::size::human;

/// A request that does not fit.
#[derive(Debug, Error, PartialEq)]
#[error("GPU {index} ({uuid}, {}) cannot take {asked}: its shares hold {} of the {} allowed ([policy] memory_overcommit = {overcommit}, uncapped = \"{uncapped}\"): {holders}. {advice}", human(*.total), human(*.held), human(*.budget))]
pub struct Overcommitted {
    pub index: u32,
    pub uuid: String,
    /// The GPU's memory, bytes.
    pub total: u64,
    pub asked: String,
    /// What its shares hold, bytes.
    pub held: u64,
    /// What they may hold, bytes.
    pub budget: u64,
    pub overcommit: f64,
    pub uncapped: Uncapped,
    /// Each holder and what it holds, e.g. `c1 8.0 GiB, c2 uncapped (counts as 80.0 GiB)`.
    pub holders: String,
    /// What the refused container (or an admin) can do that the next attempt is not refused
    /// for: never "ask for less" to a container that asked for no cap.
    pub advice: String,
}

/// What a share counts against the GPU: its cap; without one, nothing (`share`) or the whole
/// GPU (`whole-gpu`, `refuse`).
fn counted(cap: Option<u64>, total: u64, uncapped: Uncapped) -> u64 {
    match (cap, uncapped) {
        (Some(c), _) => c,
        (None, Uncapped::Share) => 0,
        (None, Uncapped::WholeGpu | Uncapped::Refuse) => total,
    }
}

/// What a GPU's shares hold: their caps added up, and how many have none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Bytes (exact: no sum of u64 caps reaches u128's end).
    pub caps: u128,
    pub uncapped: u64,
}

impl Held {
    /// What shares with caps `caps` (`None`: uncapped) hold.
    pub fn of(caps: impl IntoIterator<Item = Option<u64>>) -> Self {
        let mut held = Self::default();
        for c in caps {
            match c {
                Some(b) => held.caps += u128::from(b),
                None => held.uncapped += 1,
            }
        }
        held
    }

    /// What they count against a GPU of `total` bytes (an uncapped share counted as
    /// `uncapped` says), at most `u64::MAX`.
    pub fn committed(self, total: u64, uncapped: Uncapped) -> u64 {
        let each = u128::from(counted(None, total, uncapped));
        let sum = self
            .caps
            .saturating_add(each.saturating_mul(u128::from(self.uncapped)));
        u64::try_from(sum).unwrap_or(u64::MAX)
    }
}

/// What the caps of `caps` add up to on a GPU of `total` bytes (an uncapped share counted as
/// `uncapped` says).
pub fn committed(
    total: u64,
    caps: impl IntoIterator<Item = Option<u64>>,
    uncapped: Uncapped,
) -> u64 {
    Held::of(caps).committed(total, uncapped)
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
/// [`Overcommitted`] (boxed: it names every holder) when the caps would add up to more than
/// `overcommit` times `total`.
pub fn admit<'a>(
    index: u32,
    uuid: &str,
    total: u64,
    holders: impl IntoIterator<Item = (&'a str, Option<u64>)>,
    asked: Option<u64>,
    overcommit: f64,
    uncapped: Uncapped,
) -> Result<(), Box<Overcommitted>> {
    let holders: Vec<(String, Option<u64>)> = holders
        .into_iter()
        .map(|(id, c)| (id.to_owned(), c))
        .collect();
    let held = Held::of(holders.iter().map(|(_, c)| *c));
    admit_held(
        index,
        uuid,
        total,
        held,
        || holders,
        asked,
        overcommit,
        uncapped,
    )
}

/// [`admit`] from what the shares hold; `holders` (container id, cap) is asked for only to
/// name them in a refusal.
///
/// # Errors
/// As [`admit`].
#[allow(clippy::too_many_arguments)]
pub fn admit_held(
    index: u32,
    uuid: &str,
    total: u64,
    held: Held,
    holders: impl FnOnce() -> Vec<(String, Option<u64>)>,
    asked: Option<u64>,
    overcommit: f64,
    uncapped: Uncapped,
) -> Result<(), Box<Overcommitted>> {
    let budget = allowed(total, overcommit);
    let uncapped_holder = uncapped != Uncapped::Share && held.uncapped > 0;
    let held = held.committed(total, uncapped);
    if held.saturating_add(counted(asked, total, uncapped)) <= budget {
        return Ok(());
    }
    let list = holders()
        .iter()
        .map(|(id, c)| match (c, uncapped) {
            (Some(b), _) => format!("{id} {}", human(*b)),
            (None, Uncapped::Share) => format!("{id} uncapped (reserves nothing)"),
            (None, _) => format!("{id} uncapped (counts as {})", human(total)),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let room = budget.saturating_sub(held);
    let advice = match asked {
        // Under `share` an uncapped request always fits: only a strict setting refuses it.
        None => "A share without gpu.share.memory counts as the whole GPU under this setting: wait for them to stop, or ask an admin for [policy] uncapped = \"share\"".to_owned(),
        Some(_) if room >= 1 << 20 => format!(
            "Ask for at most {} (gpu.share.memory={}Mi), wait for one of them to stop, or ask an admin to raise memory_overcommit",
            human(room >> 20 << 20),
            to_mib(room)
        ),
        Some(_) if uncapped_holder => "Wait for them to stop, or ask an admin for [policy] uncapped = \"share\" (an uncapped share then reserves nothing) or a larger memory_overcommit".to_owned(),
        Some(_) => "Wait for one of them to stop, or ask an admin to raise memory_overcommit".to_owned(),
    };
    Err(Box::new(Overcommitted {
        index,
        uuid: uuid.to_owned(),
        total,
        asked: match asked {
            Some(b) => format!("{} more", human(b)),
            None => format!("an uncapped share (counts as {})", human(total)),
        },
        held,
        budget,
        overcommit,
        uncapped,
        holders: list,
        advice,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// (what, holders, asked, overcommit, uncapped, admitted)
    type Row = (
        &'static str,
        Vec<(&'static str, Option<u64>)>,
        Option<u64>,
        f64,
        Uncapped,
        bool,
    );

    #[test]
    fn admission_table() {
        use Uncapped::{Share, WholeGpu};
        let many: Vec<(&'static str, Option<u64>)> = vec![("u", None); 100];
        let rows: Vec<Row> = vec![
            ("empty GPU, cap", vec![], Some(8 * GIB), 1.0, Share, true),
            (
                "share: uncapped on an empty GPU",
                vec![],
                None,
                1.0,
                Share,
                true,
            ),
            (
                "share: a hundred uncapped and one more",
                many.clone(),
                None,
                1.0,
                Share,
                true,
            ),
            (
                "share: a cap next to a hundred uncapped",
                many,
                Some(80 * GIB),
                1.0,
                Share,
                true,
            ),
            (
                "share: uncapped next to a full GPU of caps",
                vec![("a", Some(80 * GIB))],
                None,
                1.0,
                Share,
                true,
            ),
            (
                "share: caps still count",
                vec![("a", Some(72 * GIB + 1)), ("b", None)],
                Some(8 * GIB),
                1.0,
                Share,
                false,
            ),
            (
                "exactly full",
                vec![("a", Some(72 * GIB))],
                Some(8 * GIB),
                1.0,
                Share,
                true,
            ),
            (
                "one byte over",
                vec![("a", Some(72 * GIB + 1))],
                Some(8 * GIB),
                1.0,
                WholeGpu,
                false,
            ),
            (
                "whole-gpu: empty GPU, uncapped takes it all",
                vec![],
                None,
                1.0,
                WholeGpu,
                true,
            ),
            (
                "whole-gpu: uncapped holder fills it",
                vec![("a", None)],
                Some(GIB),
                1.0,
                WholeGpu,
                false,
            ),
            (
                "whole-gpu: uncapped after a cap",
                vec![("a", Some(GIB))],
                None,
                1.0,
                WholeGpu,
                false,
            ),
            (
                "whole-gpu: two uncapped with overcommit 2",
                vec![("a", None)],
                None,
                2.0,
                WholeGpu,
                true,
            ),
            (
                "whole-gpu: three uncapped with overcommit 2",
                vec![("a", None), ("b", None)],
                None,
                2.0,
                WholeGpu,
                false,
            ),
            (
                "overcommit below 1 reserves headroom",
                vec![("a", Some(40 * GIB))],
                Some(40 * GIB),
                0.9,
                Share,
                false,
            ),
            (
                "huge caps do not wrap",
                vec![("a", Some(u64::MAX))],
                Some(u64::MAX),
                100.0,
                Share,
                false,
            ),
        ];
        for (what, holders, asked, oc, unc, ok) in rows {
            let got = admit(0, "GPU-0", 80 * GIB, holders, asked, oc, unc);
            assert_eq!(got.is_ok(), ok, "{what}: {got:?}");
        }
    }

    #[test]
    fn a_refusal_names_the_gpu_its_size_the_policy_keys_and_each_holder() {
        let e = admit(
            1,
            "GPU-abc",
            80 * GIB,
            [("c1", Some(76 * GIB)), ("c2", None)],
            Some(8 * GIB),
            2.0,
            Uncapped::WholeGpu,
        )
        .unwrap_err();
        let text = e.to_string();
        for want in [
            "GPU 1 (GPU-abc, 80.0 GiB)",
            "cannot take 8.0 GiB more",
            "hold 156.0 GiB of the 160.0 GiB allowed",
            "memory_overcommit = 2, uncapped = \"whole-gpu\"",
            "c1 76.0 GiB, c2 uncapped (counts as 80.0 GiB)",
            "Ask for at most 4.0 GiB (gpu.share.memory=4096Mi)",
        ] {
            assert!(text.contains(want), "{want:?} not in {text}");
        }
        // Sizes in one form: only the request value the advice suggests is in the request's.
        assert!(
            !text.replace("gpu.share.memory=4096Mi", "").contains("Mi"),
            "{text}"
        );
    }

    #[test]
    fn the_advice_names_the_uncapped_setting_only_when_an_uncapped_holder_counts() {
        // (what, holders, uncapped, advice names `uncapped = "share"`)
        type Holders = Vec<(&'static str, Option<u64>)>;
        let rows: [(&str, Holders, Uncapped, bool); 3] = [
            (
                "whole-gpu: an uncapped holder fills the GPU",
                vec![("c1", None)],
                Uncapped::WholeGpu,
                true,
            ),
            (
                "share: an uncapped holder reserves nothing, caps fill the GPU",
                vec![("c1", None), ("c2", Some(80 * GIB))],
                Uncapped::Share,
                false,
            ),
            (
                "whole-gpu: only caps fill the GPU",
                vec![("c2", Some(80 * GIB))],
                Uncapped::WholeGpu,
                false,
            ),
        ];
        for (what, holders, uncapped, names_share) in rows {
            let e = admit(0, "GPU-0", 80 * GIB, holders, Some(GIB), 1.0, uncapped).unwrap_err();
            // Positive control: the refusal is the no-room one, which gives no size to ask for.
            assert!(!e.advice.contains("Ask for"), "{what}: {}", e.advice);
            assert_eq!(
                e.advice.contains("uncapped = \"share\""),
                names_share,
                "{what}: {}",
                e.advice
            );
            assert!(e.advice.starts_with("Wait for"), "{what}: {}", e.advice);
        }
    }

    #[test]
    fn a_container_that_asked_for_no_cap_is_never_told_to_ask_for_less() {
        type Holders = Vec<(&'static str, Option<u64>)>;
        let rows: [(&str, Holders, Option<u64>); 3] = [
            ("uncapped after a cap", vec![("c1", Some(GIB))], None),
            ("uncapped after uncapped", vec![("c1", None)], None),
            (
                "a cap that cannot fit at all",
                vec![("c1", None)],
                Some(GIB),
            ),
        ];
        for (what, holders, asked) in rows {
            let text = admit(
                0,
                "GPU-0",
                80 * GIB,
                holders,
                asked,
                1.0,
                Uncapped::WholeGpu,
            )
            .unwrap_err()
            .to_string();
            assert!(!text.contains("Ask for"), "{what}: {text}");
            assert!(text.contains("uncapped = \"whole-gpu\""), "{what}: {text}");
            assert!(text.contains("c1 "), "{what}: the holder named: {text}");
            assert!(text.contains("uncapped = \"share\""), "{what}: {text}");
        }
    }
}
