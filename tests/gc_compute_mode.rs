//! `gc` puts back a compute mode that no daemon and no record explain (a simulated GPU left in
//! EXCLUSIVE_PROCESS with no gpushare daemon and no record), and only under a policy that sets
//! that mode itself.

mod common;

use common::Sandbox;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The simulated driver's stored mode of GPU `i` set to EXCLUSIVE_PROCESS (NVML value 3), as a
/// hook killed at the wrong moment or a lost record leaves it.
fn leave_exclusive(sb: &Sandbox, i: usize) {
    std::fs::write(sb.sim_state().join(format!("compute_mode.{i}")), "3\n").unwrap();
    assert_eq!(
        sb.compute_mode(i),
        3,
        "positive control: the GPU is EXCLUSIVE_PROCESS"
    );
}

#[test]
fn gc_puts_back_an_unexplained_exclusive_process() {
    let sb = Sandbox::new(2);
    leave_exclusive(&sb, 1);
    assert!(
        !sb.state_dir().join("gpus").exists()
            || std::fs::read_dir(sb.state_dir().join("gpus"))
                .unwrap()
                .next()
                .is_none(),
        "no record"
    );
    let out = sb.hook(&["gc"], "");
    let o = text(&out.stdout);
    assert!(out.status.success(), "{o}{}", text(&out.stderr));
    assert!(
        o.contains(&format!(
            "{}: put back compute mode DEFAULT (was EXCLUSIVE_PROCESS with no gpushare MPS daemon and no record of it)",
            Sandbox::uuid(1)
        )),
        "{o}"
    );
    assert_eq!(sb.compute_mode(1), 0, "GPU 1 back in DEFAULT");
    assert_eq!(sb.compute_mode(0), 0, "GPU 0 untouched");
    let out = sb.hook(&["gc"], "");
    assert_eq!(text(&out.stdout), "nothing to do\n");
}

#[test]
fn gc_leaves_a_mode_this_policy_never_sets_and_says_what_to_do() {
    let sb = Sandbox::with_policy(1, "[mps]\nexclusive_compute_mode = false\n");
    leave_exclusive(&sb, 0);
    let out = sb.hook(&["gc"], "");
    let o = text(&out.stdout);
    // Not a problem of gpushare's state (an admin may have set it): said, exit 0.
    assert_eq!(out.status.code(), Some(0), "{o}{}", text(&out.stderr));
    assert!(
        o.contains("note: compute mode EXCLUSIVE_PROCESS, which this policy never sets")
            && o.contains("run `nvidia-smi -i 0 -c DEFAULT`"),
        "{o}"
    );
    assert_eq!(sb.compute_mode(0), 3, "left as it is");
}
