//! What an operator meets with real podman: refusals shown to the user and logged, and a typo
//! in the policy file that stops nothing but the containers that ask (`tests/engines/
//! podman_refusals.sh`).

mod script;

#[test]
fn podman_refusals_are_shown_and_a_broken_policy_passes_plain_containers() {
    script::run_script("podman_refusals.sh");
}
