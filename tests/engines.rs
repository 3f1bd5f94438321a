//! End-to-end tests with real engines (podman, containerd, Docker, runc), checked from inside
//! the container. Each test runs one script of `tests/engines/` (they take a host-wide lock, so
//! they run one at a time). A script that cannot run its engine exits 77 after printing
//! `SKIPPED: <why>`: that fails the test when `CI=true` and is reported loudly otherwise.

mod script;

use script::{judge, run_script, run_script_with};

#[test]
fn skips_are_loud_and_fail_under_ci() {
    // Rows: (description, exit code, stdout, CI, passes)
    let rows: &[(&str, Option<i32>, &str, bool, bool)] = &[
        ("pass", Some(0), "", true, true),
        (
            "skip outside CI",
            Some(77),
            "SKIPPED: podman not installed\n",
            false,
            true,
        ),
        (
            "skip under CI",
            Some(77),
            "SKIPPED: podman not installed\n",
            true,
            false,
        ),
        ("failure", Some(1), "FAIL: x\n", false, false),
        ("killed", None, "", false, false),
    ];
    for (what, code, out, ci, passes) in rows {
        let r = judge("x.sh", *code, out, *ci);
        assert_eq!(r.is_ok(), *passes, "{what}: {r:?}");
        if let Err(e) = r {
            if *code == Some(77) {
                assert!(
                    e.contains("SKIPPED: x.sh: podman not installed"),
                    "{what}: {e}"
                );
            }
        }
    }
}

#[test]
fn podman_hooks_dir_precreate_limit_and_lifecycle() {
    run_script("podman_hooks.sh");
}

#[test]
fn noexec_on_every_tenant_writable_mount_on_every_path() {
    run_script("noexec.sh");
}

#[test]
fn runc_runtime_wrapper_and_hook_alone() {
    run_script("runc.sh");
}

#[test]
fn podman_runtime_wrapper() {
    run_script("podman_runtime.sh");
}

#[test]
fn containerd_ctr_runc_binary() {
    run_script("containerd.sh");
}

#[test]
fn docker_add_runtime_env_fallback() {
    run_script_with("docker.sh", &[("DOCKER_ENGINE", "system")]);
}

#[test]
fn docker_26_debian13_annotation_and_env_fallback() {
    run_script_with("docker.sh", &[("DOCKER_ENGINE", "trixie")]);
}

#[test]
fn cdi_share_device_on_podman_beside_nvidias_gpu_device() {
    run_script_with("cdi_share.sh", &[("CDI_ENGINE", "podman")]);
}

#[test]
fn cdi_share_device_on_docker_26_without_a_runtime() {
    run_script_with("cdi_share.sh", &[("CDI_ENGINE", "docker26")]);
}

#[test]
fn chaining_wrappers_in_front_and_behind_and_loops() {
    run_script("chaining.sh");
}

#[test]
fn security_hostile_images_and_hook_env() {
    run_script("security.sh");
}

#[test]
fn cri_containerd_1_6_system() {
    run_script_with("cri.sh", &[("CRI_CONTAINERD", "system")]);
}

#[test]
fn cri_containerd_1_7_debian13() {
    run_script_with("cri.sh", &[("CRI_CONTAINERD", "trixie")]);
}

#[test]
fn kubernetes_installer_image_podman_build_offline() {
    run_script("k8s_image.sh");
}

#[test]
fn cri_containerd_2_debian_unstable_config_v3() {
    run_script_with("cri.sh", &[("CRI_CONTAINERD", "sid")]);
}

#[test]
fn containerd_1_6_configure_on_stock_kubeadm_and_empty_files() {
    run_script_with("containerd_configs.sh", &[("CRI_CONTAINERD", "system")]);
}

#[test]
fn containerd_1_7_configure_on_stock_kubeadm_and_empty_files() {
    run_script_with("containerd_configs.sh", &[("CRI_CONTAINERD", "trixie")]);
}

#[test]
fn containerd_2_configure_on_v3_stock_and_missing_files() {
    run_script_with("containerd_configs.sh", &[("CRI_CONTAINERD", "sid")]);
}

#[test]
fn old_glibc_and_minimal_images_under_limit_runc() {
    run_script_with("oldglibc.sh", &[("ENGINE", "runc")]);
}

#[test]
fn old_glibc_and_minimal_images_under_limit_podman() {
    run_script_with("oldglibc.sh", &[("ENGINE", "podman")]);
}

#[test]
fn podman_cdi_nvidia_spec_device_with_mps_and_limit() {
    run_script("podman_cdi.sh");
}

#[test]
fn docker_26_cdi_nvidia_spec_on_gpushare_default_runtime() {
    run_script("docker_cdi.sh");
}

#[test]
fn cri_cdi_containerd_1_7_nvidia_spec_share_device_with_annotations_noexec() {
    run_script_with("cri_cdi.sh", &[("CRI_CONTAINERD", "trixie")]);
}

#[test]
fn cri_cdi_containerd_2_nvidia_spec_share_device_with_annotations_noexec() {
    run_script_with("cri_cdi.sh", &[("CRI_CONTAINERD", "sid")]);
}

#[test]
fn chaining_nvidia_cdi_mode_both_orders() {
    run_script("chaining_cdi.sh");
}

#[test]
fn the_readmes_engine_examples_run_as_written_on_the_simulated_driver() {
    run_script("readme_engines.sh");
}

#[test]
fn the_install_guides_engine_examples_run_as_written_on_the_simulated_driver() {
    run_script_with("readme_engines.sh", &[("GS_DOC", "docs/install.md")]);
}
