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

/// A fake engine CLI on a private PATH: a shell script.
fn fake(dir: &Path, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The maintainer scripts' removal guard refuses while podman, Docker or a CRI runtime has a
/// container on gpushare, naming each; the engines' CLIs are fakes answering as the real ones
/// document (`podman inspect --format`, `docker inspect --format`, `crictl pods -o json`).
#[test]
fn prerm_refuses_while_any_engine_has_a_container_on_gpushare() {
    let t = tempfile::tempdir().unwrap();
    let bin = t.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    fake(
        &bin,
        "podman",
        r#"case "$1" in
ps) echo 1111111111111111; echo 2222222222222222 ;;
inspect) echo "gpushare 1111111111111111aaaa web running"; echo "runc 2222222222222222bbbb db running" ;;
esac"#,
    );
    fake(
        &bin,
        "docker",
        r#"case "$1" in
ps) echo d0c4e5 ;;
inspect) echo gpushare ;;
esac"#,
    );
    fake(
        &bin,
        "crictl",
        r#"cat <<'JSON'
{
  "items": [
    {
      "id": "podrunc",
      "metadata": {
        "name": "plain",
        "uid": "u1",
        "namespace": "default",
        "attempt": 0
      },
      "state": "SANDBOX_READY",
      "runtimeHandler": ""
    },
    {
      "id": "podgpu",
      "metadata": {
        "name": "gpu",
        "uid": "u2",
        "namespace": "default",
        "attempt": 0
      },
      "state": "SANDBOX_READY",
      "runtimeHandler": "gpushare"
    }
  ]
}
JSON"#,
    );
    let sock = t.path().join("containerd.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display());
    let run = |path: &str| {
        std::process::Command::new("sh")
            .arg(repo("packaging/deb/maintainer-scripts/prerm"))
            .arg("remove")
            .env_clear()
            .env("PATH", path)
            .env("GPUSHARE_CRI_SOCKETS", &sock)
            .env("TMPDIR", t.path())
            .output()
            .unwrap()
    };
    let out = run(&path);
    let e = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.starts_with("gpushare: not removing the package while containers use it."),
        "{e}"
    );
    for line in [
        "podman container web (111111111111, running) runs with --runtime gpushare",
        "Docker container d0c4e5 runs with --runtime gpushare",
        &format!(
            "CRI pod podgpu ({}) runs on the gpushare handler",
            sock.display()
        ),
    ] {
        assert!(e.contains(line), "{line}: {e}");
    }
    assert!(
        !e.contains(" db ") && !e.contains("podrunc"),
        "only gpushare's: {e}"
    );
    assert!(e.contains("The package stays installed and working"), "{e}");

    // Nothing on gpushare: the guard lets it go (where no installed gpushare-hook would be copied).
    fake(&bin, "docker", "exit 0");
    fake(&bin, "crictl", "echo '{\"items\": []}'");
    fake(
        &bin,
        "podman",
        r#"case "$1" in ps) echo 2222 ;; inspect) echo "runc 2222 db running" ;; esac"#,
    );
    if Path::new("/usr/bin/gpushare-hook").exists() {
        eprintln!("\n******** SKIPPED: prerm's pass case: /usr/bin/gpushare-hook is installed here ********\n");
        return;
    }
    let out = run(&path);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
