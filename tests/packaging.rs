//! The shipped data files are well-formed: hooks (oci-hooks(5) 1.0.0), the example policy, the
//! engine snippets that are JSON or TOML.

use std::path::Path;

use serde_json::Value;

fn repo(p: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn hook_file(p: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(repo(p)).unwrap()).unwrap()
}

#[test]
fn hooks_are_oci_hooks_1_0_0() {
    // (file, stage, gated on the annotation)
    let rows = [
        (
            "hooks/oci/gpushare-createRuntime.json",
            "createRuntime",
            true,
        ),
        ("hooks/oci/gpushare-poststop.json", "poststop", true),
        (
            "hooks/podman-precreate/gpushare-precreate.json",
            "precreate",
            false,
        ),
    ];
    for (file, stage, gated) in rows {
        let h = hook_file(file);
        assert_eq!(h["version"], "1.0.0", "{file}");
        assert_eq!(h["stages"], serde_json::json!([stage]), "{file}");
        assert_eq!(h["hook"]["path"], "/usr/bin/gpushare-hook", "{file}");
        assert_eq!(h["hook"]["args"][1], stage, "{file}");
        if gated {
            assert_eq!(h["when"]["annotations"]["^gpu\\.share$"], ".*", "{file}");
        } else {
            assert_eq!(h["when"]["always"], true, "{file}");
        }
    }
    // CRI-O does not know the precreate stage and will not start with such a file in a hooks dir
    // it reads (tests/crio.rs): the directory CRI-O reads must hold no precreate file.
    for e in std::fs::read_dir(repo("hooks/oci")).unwrap() {
        let h = hook_file(&format!(
            "hooks/oci/{}",
            e.unwrap().file_name().to_string_lossy()
        ));
        assert!(
            h["stages"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s != "precreate"),
            "precreate in hooks/oci"
        );
    }
}

#[test]
fn example_policy_and_snippets_parse() {
    let text = std::fs::read_to_string(repo("packaging/config.toml.example")).unwrap();
    let cfg = gpushare::config::Config::parse(&text, Path::new("config.toml.example")).unwrap();
    assert_eq!(cfg, gpushare::config::Config::default());
    let d: Value = serde_json::from_str(
        &std::fs::read_to_string(repo("packaging/docker/daemon.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        d["runtimes"]["gpushare"]["path"],
        "/usr/bin/gpushare-runtime"
    );
    for f in [
        "packaging/containerd/config.toml",
        "packaging/crio/10-gpushare.conf",
        "packaging/podman/containers.conf",
    ] {
        let t = std::fs::read_to_string(repo(f)).unwrap();
        t.parse::<toml::Table>()
            .unwrap_or_else(|e| panic!("{f}: {e}"));
    }
}

mod script;

/// Builds the .deb and .rpm, installs the .deb here, configures podman and Docker with it, runs
/// both through the installed binaries, reinstalls, tries a removal in use, purges
/// (`tests/engines/package.sh`).
#[test]
fn deb_and_rpm_install_configure_run_refuse_removal_purge() {
    script::run_script("package.sh");
}
