//! `packaging/kubernetes/`: the node installer (`install.sh`, what the DaemonSet runs) run for
//! real against scratch node roots and checked file by file, and every manifest validated
//! offline against Kubernetes' schemas (`kubernetes-validate`, installed by
//! `scripts/install-deps.sh`). A missing validator fails the test when `CI=true` and is reported
//! loudly otherwise.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpushare::config::Config;

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// The image's `/opt/gpushare` laid out from the binaries under test.
fn image_src(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    let target = PathBuf::from(env!("CARGO_BIN_EXE_gpushare-hook"))
        .parent()
        .unwrap()
        .to_owned();
    let limiter = target.join("libgpushare_limiter.so");
    assert!(
        limiter.exists(),
        "{} is missing: run `cargo build --workspace` before `cargo test`",
        limiter.display()
    );
    for (from, to) in [
        (
            PathBuf::from(env!("CARGO_BIN_EXE_gpushare-hook")),
            "bin/gpushare-hook",
        ),
        (
            PathBuf::from(env!("CARGO_BIN_EXE_gpushare-runtime")),
            "bin/gpushare-runtime",
        ),
        (limiter, "lib/libgpushare_limiter.so"),
        (repo("packaging/config.toml.example"), "config.toml.example"),
    ] {
        let to = src.join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    }
    src
}

/// Where a scratch node keeps its glibc (Debian's multiarch layout).
const NODE_LIBC: &str = "lib/x86_64-linux-gnu/libc.so.6";

/// A node's libc.so.6 as far as the installer reads it: glibc's banner, with its version.
fn plant_libc(root: &Path, version: &str) {
    let p = root.join(NODE_LIBC);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(
        &p,
        format!("\x7fELF\0\0GNU C Library (Debian GLIBC {version}-9) stable release version {version}.\nCopyright (C) 2024 Free Software Foundation, Inc.\0"),
    )
    .unwrap();
}

/// Runs the installer on `root` (a node with glibc 2.36 unless it already has a libc).
fn install(src: &Path, root: &Path, env: &[(&str, &str)]) -> Output {
    if root.is_dir() && !root.join(NODE_LIBC).exists() {
        plant_libc(root, "2.36");
    }
    Command::new("sh")
        .arg(repo("packaging/kubernetes/install.sh"))
        .env("SRC", src)
        .env("HOST_ROOT", root)
        .env_remove("PREFIX")
        .env_remove("ENGINE")
        .env_remove("RESTART")
        .env_remove("GPUSHARE_CONFIG")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Every file under `root`: relative path -> (mode, content).
fn tree(root: &Path) -> BTreeMap<String, (u32, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (u32, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                if rel == NODE_LIBC {
                    continue;
                }
                out.insert(
                    rel,
                    (m.permissions().mode() & 0o7777, std::fs::read(&p).unwrap()),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The checks every installed node shares: binaries, limiter, policy.
fn check_common(src: &Path, files: &BTreeMap<String, (u32, Vec<u8>)>, root: &Path) {
    for (node, from, mode) in [
        ("usr/local/bin/gpushare-hook", "bin/gpushare-hook", 0o755),
        (
            "usr/local/bin/gpushare-runtime",
            "bin/gpushare-runtime",
            0o755,
        ),
        (
            "usr/local/lib/gpushare/libgpushare_limiter.so",
            "lib/libgpushare_limiter.so",
            0o644,
        ),
    ] {
        let (m, bytes) = &files[node];
        assert_eq!(*m, mode, "{node} mode");
        assert!(
            *bytes == std::fs::read(src.join(from)).unwrap(),
            "{node} differs from the image's {from}"
        );
    }
    let (m, policy) = &files["etc/gpushare/config.toml"];
    assert_eq!(*m, 0o644);
    let policy = String::from_utf8(policy.clone()).unwrap();
    let mut cfg = Config::parse(&policy, Path::new("config.toml")).unwrap();
    assert_eq!(
        cfg.runtime.hook,
        Path::new("/usr/local/bin/gpushare-hook"),
        "policy's hook"
    );
    assert_eq!(
        cfg.limit.library,
        Path::new("/usr/local/lib/gpushare/libgpushare_limiter.so"),
        "policy's limiter"
    );
    // Everything else is the default policy.
    let d = Config::default();
    cfg.runtime.hook = d.runtime.hook.clone();
    cfg.limit.library = d.limit.library.clone();
    assert_eq!(cfg, d);
    // Node paths only: nothing names the scratch root the installer saw the node under.
    let scratch = root.to_string_lossy().into_owned();
    for (name, (_, bytes)) in files {
        assert!(
            !String::from_utf8_lossy(bytes).contains(&scratch),
            "{name} names {scratch}"
        );
    }
}

#[test]
fn installer_on_a_crio_node_writes_exactly_these_files() {
    let t = tempfile::tempdir().unwrap();
    let src = image_src(t.path());
    let root = t.path().join("node");
    std::fs::create_dir_all(root.join("etc/crio")).unwrap();
    let out = install(&src, &root, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let files = tree(&root);
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "etc/containers/oci/hooks.d/gpushare-createRuntime.json",
            "etc/containers/oci/hooks.d/gpushare-poststop.json",
            "etc/crio/crio.conf.d/10-gpushare.conf",
            "etc/gpushare/config.toml",
            "usr/local/bin/gpushare-hook",
            "usr/local/bin/gpushare-runtime",
            "usr/local/lib/gpushare/libgpushare_limiter.so",
        ]
    );
    check_common(&src, &files, &root);

    let crio: toml::Value = toml::from_str(
        std::str::from_utf8(&files["etc/crio/crio.conf.d/10-gpushare.conf"].1).unwrap(),
    )
    .unwrap();
    let handler = &crio["crio"]["runtime"]["runtimes"]["gpushare"];
    assert_eq!(
        handler["runtime_path"].as_str(),
        Some("/usr/local/bin/gpushare-runtime")
    );
    // CRI-O drops a handler whose allowed_annotations names anything but its own annotations
    // (tests/crio.rs); the pod's gpu.share* annotations reach the spec without it.
    assert!(handler.get("allowed_annotations").is_none(), "{handler:?}");
    assert_eq!(
        crio["crio"]["runtime"]["hooks_dir"].as_array().unwrap()[0].as_str(),
        Some("/etc/containers/oci/hooks.d")
    );
    for stage in ["createRuntime", "poststop"] {
        let f = format!("etc/containers/oci/hooks.d/gpushare-{stage}.json");
        let h: serde_json::Value = serde_json::from_slice(&files[&f].1).unwrap();
        assert_eq!(h["hook"]["path"], "/usr/local/bin/gpushare-hook", "{f}");
        assert_eq!(h["stages"], serde_json::json!([stage]), "{f}");
        let env = h["hook"]["env"].as_array().unwrap();
        assert!(
            env.iter()
                .filter_map(|e| e.as_str())
                .filter(|e| e.starts_with("GPUSHARE_CONFIG="))
                .all(|e| e == "GPUSHARE_CONFIG=/etc/gpushare/config.toml"),
            "{f}: {env:?}"
        );
    }
    let said = text(&out);
    assert!(said.contains("systemctl restart crio"), "{said}");

    // Again: nothing changes, nothing is installed anew.
    let out2 = install(&src, &root, &[]);
    assert!(out2.status.success(), "{}", text(&out2));
    assert_eq!(tree(&root), files);
    assert!(!text(&out2).contains("installed"), "{}", text(&out2));

    // The admin's own policy is kept; a newer binary in the image replaces the node's.
    let policy = root.join("etc/gpushare/config.toml");
    std::fs::write(&policy, "[policy]\nmax_cores = 50\ndefault_cores = 50\n").unwrap();
    std::fs::write(src.join("bin/gpushare-runtime"), b"#!/bin/sh\n# newer\n").unwrap();
    let out3 = install(&src, &root, &[]);
    assert!(out3.status.success(), "{}", text(&out3));
    assert_eq!(
        std::fs::read_to_string(&policy).unwrap(),
        "[policy]\nmax_cores = 50\ndefault_cores = 50\n"
    );
    assert_eq!(
        std::fs::read(root.join("usr/local/bin/gpushare-runtime")).unwrap(),
        b"#!/bin/sh\n# newer\n"
    );
    assert!(text(&out3).contains("kept the node's /etc/gpushare/config.toml"));
    // No temp files left next to what was replaced.
    assert_eq!(tree(&root).len(), files.len());
}

#[test]
fn installer_on_a_containerd_node() {
    let t = tempfile::tempdir().unwrap();
    let src = image_src(t.path());
    let root = t.path().join("node");
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    std::fs::write(root.join("etc/containerd/config.toml"), "version = 2\n").unwrap();
    let out = install(&src, &root, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let files = tree(&root);
    check_common(&src, &files, &root);
    let said = text(&out);
    let can_merge = Command::new(src.join("bin/gpushare-hook"))
        .args(["configure", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--path"))
        .unwrap();
    // containerd's handler goes into its main config: merged there by `configure --path` where
    // gpushare-hook can, else kept next to the policy for the admin, who is told where.
    let (file, expect_files) = if can_merge {
        ("etc/containerd/config.toml", 5)
    } else {
        assert!(
            said.contains(
                "merge /etc/gpushare/containerd-gpushare.toml into /etc/containerd/config.toml"
            ),
            "{said}"
        );
        assert!(said.contains("not restarting containerd"), "{said}");
        assert_eq!(
            files["etc/containerd/config.toml"].1, b"version = 2\n",
            "left alone"
        );
        ("etc/gpushare/containerd-gpushare.toml", 6)
    };
    // `configure --path` keeps the previous file next to it (`<file>.bak-<time>`).
    let backups: Vec<&String> = files.keys().filter(|k| k.contains(".bak-")).collect();
    if can_merge {
        assert_eq!(backups.len(), 1, "{:?}", files.keys());
        assert_eq!(
            files[backups[0]].1, b"version = 2\n",
            "backup of the node's file"
        );
    }
    assert_eq!(
        files.len() - backups.len(),
        expect_files,
        "{:?}",
        files.keys()
    );
    let c: toml::Value = toml::from_str(std::str::from_utf8(&files[file].1).unwrap()).unwrap();
    let h = &c["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["gpushare"];
    assert_eq!(
        h["options"]["BinaryName"].as_str(),
        Some("/usr/local/bin/gpushare-runtime"),
        "{file}"
    );
    assert!(h["pod_annotations"].as_array().is_some(), "{file}");
}

#[test]
fn installer_restarts_the_runtime_through_the_nodes_systemd_when_asked() {
    let t = tempfile::tempdir().unwrap();
    let src = image_src(t.path());
    let root = t.path().join("node");
    std::fs::create_dir_all(root.join("etc/crio")).unwrap();
    // A stand-in for nsenter that records how it was called (the real one would enter the
    // node's pid 1 namespaces).
    let bin = t.path().join("fakebin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = t.path().join("nsenter.args");
    std::fs::write(
        bin.join("nsenter"),
        format!("#!/bin/sh\necho \"$*\" >>{}\n", log.display()),
    )
    .unwrap();
    std::fs::set_permissions(bin.join("nsenter"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = install(&src, &root, &[("RESTART", "true"), ("PATH", &path)]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "-t 1 -m -u -i -n -p -- systemctl restart crio\n"
    );
    assert!(text(&out).contains("restarted crio"), "{}", text(&out));

    // containerd whose handler still has to be merged by the admin: never restarted.
    let root2 = t.path().join("node2");
    std::fs::create_dir_all(root2.join("etc/containerd")).unwrap();
    std::fs::remove_file(&log).unwrap();
    let out = install(&src, &root2, &[("RESTART", "true"), ("PATH", &path)]);
    assert!(out.status.success(), "{}", text(&out));
    if text(&out).contains("merge /etc/gpushare/containerd-gpushare.toml") {
        assert!(!log.exists(), "restarted before the merge");
        assert!(text(&out).contains("not restarting containerd"));
    }

    // A restart that fails fails the install, saying so (something changed: a binary was gone).
    std::fs::write(bin.join("nsenter"), "#!/bin/sh\nexit 3\n").unwrap();
    std::fs::remove_file(root.join("usr/local/bin/gpushare-runtime")).unwrap();
    let out = install(&src, &root, &[("RESTART", "true"), ("PATH", &path)]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("'systemctl restart crio' on the node failed"),
        "{}",
        text(&out)
    );
}

#[test]
fn installer_refuses_bad_input_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let src = image_src(t.path());
    let broken_src = t.path().join("broken");
    std::fs::create_dir_all(broken_src.join("bin")).unwrap();
    // (description, node dirs, env, SRC, expected message)
    type Row<'a> = (
        &'a str,
        &'a [&'a str],
        Vec<(&'a str, &'a str)>,
        &'a Path,
        &'a str,
    );
    let rows: Vec<Row> = vec![
        (
            "no runtime on the node",
            &[],
            vec![],
            &src,
            "found container runtimes:  none",
        ),
        (
            "two runtimes",
            &["etc/crio", "etc/containerd"],
            vec![],
            &src,
            "set ENGINE to containerd or crio",
        ),
        (
            "unknown engine",
            &["etc/crio"],
            vec![("ENGINE", "docker")],
            &src,
            "ENGINE=docker",
        ),
        (
            "relative prefix",
            &["etc/crio"],
            vec![("PREFIX", "usr/local")],
            &src,
            "must be an absolute path",
        ),
        (
            "bad RESTART",
            &["etc/crio"],
            vec![("RESTART", "yes")],
            &src,
            "RESTART=yes must be true or false",
        ),
        (
            "image without binaries",
            &["etc/crio"],
            vec![],
            &broken_src,
            "missing from the image",
        ),
        (
            "the node's policy is refused",
            &["etc/crio", "etc/gpushare"],
            vec![],
            &src,
            "fix /etc/gpushare/config.toml on the node",
        ),
    ];
    for (i, (what, dirs, env, src, want)) in rows.into_iter().enumerate() {
        let root = t.path().join(format!("node{i}"));
        std::fs::create_dir_all(&root).unwrap();
        for d in dirs {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        if dirs.contains(&"etc/gpushare") {
            std::fs::write(
                root.join("etc/gpushare/config.toml"),
                "[policy]\nmax_cores = 50\n",
            )
            .unwrap();
        }
        let before = tree(&root);
        let out = install(src, &root, &env);
        assert!(!out.status.success(), "{what}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{what}: {err}");
        assert_eq!(
            err.trim()
                .lines()
                .filter(|l| l.starts_with("gpushare-install:"))
                .count(),
            1,
            "{what}: one line: {err}"
        );
        assert_eq!(tree(&root), before, "{what}: the node root changed");
    }
    let out = install(&src, &t.path().join("absent"), &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a directory"));
}

fn python() -> Option<PathBuf> {
    let p = std::env::var_os("GS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("GS_ENGINES")
                .map_or_else(|| "/var/cache/gpushare-engines".into(), PathBuf::from)
                .join("venv/bin/python")
        });
    Command::new(&p)
        .args(["-c", "import kubernetes_validate"])
        .output()
        .is_ok_and(|o| o.status.success())
        .then_some(p)
}

fn skip(why: &str) {
    let msg = format!("SKIPPED: kubernetes manifests: {why}");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg} (CI=true requires it)");
    }
    eprintln!("\n******** {msg} ********\n");
}

fn manifests() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["packaging/kubernetes", "packaging/kubernetes/examples"] {
        for e in std::fs::read_dir(repo(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "yaml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn validate(python: &Path, files: &[PathBuf]) -> Output {
    Command::new(python)
        .args(["-m", "kubernetes_validate", "--strict", "--no-warn"])
        .args(files)
        .output()
        .unwrap()
}

#[test]
fn manifests_validate_offline_against_kubernetes_schemas() {
    let files = manifests();
    assert!(files.len() >= 6, "{files:?}");
    // The annotations the examples use are the contract's.
    let keys = [
        "gpu.share",
        "gpu.share.devices",
        "gpu.share.memory",
        "gpu.share.cores",
        "gpu.share.timeslice",
        "gpu.share.group",
    ];
    for f in &files {
        let t = std::fs::read_to_string(f).unwrap();
        for l in t.lines().map(str::trim) {
            if let Some((k, _)) = l.split_once(':') {
                if k.starts_with("gpu.share") {
                    assert!(keys.contains(&k), "{}: unknown key {k}", f.display());
                }
            }
        }
        if t.contains("kind: Pod\n") {
            assert!(
                t.contains("runtimeClassName: gpushare") && t.contains("nvidia.com/gpu: 1"),
                "{}: an example pod names the gpushare class and one device-plugin GPU",
                f.display()
            );
        }
    }
    let Some(py) = python() else {
        skip("kubernetes-validate missing (scripts/install-deps.sh)");
        return;
    };
    let out = validate(&py, &files);
    let said = text(&out);
    print!("{said}");
    assert!(out.status.success(), "manifests do not validate:\n{said}");
    assert_eq!(said.matches(" passed for resource ").count(), 7, "{said}");

    // The validator does refuse: a misspelt field and a wrong type.
    let t = tempfile::tempdir().unwrap();
    let ds = std::fs::read_to_string(repo("packaging/kubernetes/daemonset.yaml")).unwrap();
    for (what, bad) in [
        (
            "misspelt field",
            ds.replace("      nodeSelector:", "      nodeSelectr:"),
        ),
        (
            "wrong type",
            ds.replace(
                "priorityClassName: system-node-critical",
                "priorityClassName: [1]",
            ),
        ),
    ] {
        assert_ne!(bad, ds, "{what}: the replacement applies");
        let f = t.path().join("bad.yaml");
        std::fs::write(&f, bad).unwrap();
        let out = validate(&py, &[f]);
        assert!(!out.status.success(), "{what} validated:\n{}", text(&out));
    }
}

/// A fake `nsenter` on PATH recording its arguments to `log`; returns the PATH to use.
fn fake_nsenter(dir: &Path, log: &Path) -> String {
    let bin = dir.join("fakebin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(
        bin.join("nsenter"),
        format!("#!/bin/sh\necho \"$*\" >>{}\n", log.display()),
    )
    .unwrap();
    std::fs::set_permissions(bin.join("nsenter"), std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn installer_refuses_a_node_whose_glibc_is_too_old_before_copying() {
    let t = tempfile::tempdir().unwrap();
    let src = image_src(t.path());
    let root = t.path().join("node");
    std::fs::create_dir_all(root.join("etc/crio")).unwrap();
    plant_libc(&root, "2.12");
    let before = tree(&root);
    let out = install(&src, &root, &[]);
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "gpushare-install: the node's glibc is 2.12 (/lib/x86_64-linux-gnu/libc.so.6); gpushare's binaries need glibc 2.17 or newer; nothing was installed\n"
    );
    assert_eq!(tree(&root), before, "nothing written");
    // Positive control: the same node passes with a lower minimum.
    let out = install(&src, &root, &[("MIN_GLIBC", "2.12")]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("node glibc 2.12 (needs 2.12 or newer)"));

    // A node without any glibc (musl, or an unusual layout) is refused as well.
    let bare = t.path().join("bare");
    std::fs::create_dir_all(bare.join("etc/crio")).unwrap();
    let out = Command::new("sh")
        .arg(repo("packaging/kubernetes/install.sh"))
        .env("SRC", &src)
        .env("HOST_ROOT", &bare)
        .env_remove("ENGINE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .starts_with("gpushare-install: no glibc found on the node"),
        "{}",
        text(&out)
    );
    assert!(!bare.join("usr").exists(), "nothing written");
}

#[test]
fn installer_uninstall_removes_what_it_wrote_and_restarts_only_when_something_changed() {
    let t = tempfile::tempdir().unwrap();
    let src = image_src(t.path());
    let log = t.path().join("nsenter.args");
    let path = fake_nsenter(t.path(), &log);
    let restarts = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count()
    };
    for (engine, main, original) in [
        (
            "crio",
            "etc/crio/crio.conf",
            "[crio.runtime]\nlog_level = \"info\"\n",
        ),
        ("containerd", "etc/containerd/config.toml", "version = 2\n"),
    ] {
        let root = t.path().join(format!("node-{engine}"));
        std::fs::create_dir_all(root.join(main).parent().unwrap()).unwrap();
        std::fs::write(root.join(main), original).unwrap();
        let empty = tree(&root);
        let env = [("RESTART", "true"), ("PATH", path.as_str())];

        let n = restarts();
        let out = install(&src, &root, &env);
        assert!(out.status.success(), "{engine}: {}", text(&out));
        assert_eq!(restarts(), n + 1, "{engine}: restarted after the install");
        let installed = tree(&root);
        assert!(installed.contains_key("usr/local/bin/gpushare-runtime"));

        // Reinstall: nothing changed, so no restart.
        let out = install(&src, &root, &env);
        assert!(out.status.success(), "{engine}: {}", text(&out));
        assert_eq!(
            restarts(),
            n + 1,
            "{engine}: no restart when nothing changed"
        );
        assert!(
            text(&out).contains("nothing changed on the node; "),
            "{engine}: {}",
            text(&out)
        );

        // Uninstall: everything the install wrote is gone (backups of edited files stay).
        let out = install(
            &src,
            &root,
            &[
                ("ACTION", "uninstall"),
                ("RESTART", "true"),
                ("PATH", &path),
            ],
        );
        assert!(out.status.success(), "{engine}: {}", text(&out));
        assert_eq!(restarts(), n + 2, "{engine}: restarted after the uninstall");
        let left: BTreeMap<_, _> = tree(&root)
            .into_iter()
            .filter(|(k, _)| !k.contains(".bak-"))
            .collect();
        assert_eq!(left, empty, "{engine}: {}", text(&out));
        assert!(
            text(&out).contains("removed /usr/local/bin/gpushare-hook"),
            "{engine}: {}",
            text(&out)
        );
        // Again: nothing to do, no restart.
        let out = install(
            &src,
            &root,
            &[
                ("ACTION", "uninstall"),
                ("RESTART", "true"),
                ("PATH", &path),
            ],
        );
        assert!(out.status.success(), "{engine}: {}", text(&out));
        assert_eq!(
            restarts(),
            n + 2,
            "{engine}: no restart when nothing changed"
        );

        // Install after uninstall: the same files as the first time.
        let out = install(&src, &root, &[]);
        assert!(out.status.success(), "{engine}: {}", text(&out));
        let again: BTreeMap<_, _> = tree(&root)
            .into_iter()
            .filter(|(k, _)| !k.contains(".bak-"))
            .collect();
        let first: BTreeMap<_, _> = installed
            .into_iter()
            .filter(|(k, _)| !k.contains(".bak-"))
            .collect();
        assert_eq!(
            again.keys().collect::<Vec<_>>(),
            first.keys().collect::<Vec<_>>(),
            "{engine}"
        );

        // An admin-edited policy survives the uninstall, and the output says so.
        let policy = root.join("etc/gpushare/config.toml");
        std::fs::write(&policy, "[policy]\nmax_cores = 50\ndefault_cores = 50\n").unwrap();
        let out = install(&src, &root, &[("ACTION", "uninstall")]);
        assert!(out.status.success(), "{engine}: {}", text(&out));
        assert!(policy.exists(), "{engine}");
        assert!(
            text(&out).contains("kept /etc/gpushare/config.toml"),
            "{engine}"
        );
    }
}

#[test]
fn the_daemonset_asks_for_host_pid_only_with_restart() {
    let ds = std::fs::read_to_string(repo("packaging/kubernetes/daemonset.yaml")).unwrap();
    assert!(
        !ds.lines().any(|l| l.trim() == "hostPID: true"),
        "hostPID is on by default"
    );
    assert!(
        ds.contains("# hostPID: true"),
        "the way to turn it on is shown"
    );
    assert!(ds.contains("value: \"false\""), "RESTART is off by default");
    assert!(ds.contains("name: ACTION"), "the uninstall mode is there");
    // One RuntimeClass in the repository.
    let classes: Vec<_> = [
        "packaging",
        "packaging/kubernetes",
        "packaging/containerd",
        "packaging/crio",
    ]
    .iter()
    .flat_map(|d| std::fs::read_dir(repo(d)).into_iter().flatten().flatten())
    .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("kind: RuntimeClass")))
    .map(|e| e.path())
    .collect();
    assert_eq!(classes.len(), 1, "{classes:?}");
}

#[test]
fn the_crio_drop_in_adds_to_the_nodes_hooks_dirs_instead_of_replacing_them() {
    let t = tempfile::tempdir().unwrap();
    let src = image_src(t.path());
    let root = t.path().join("node");
    std::fs::create_dir_all(root.join("etc/crio/crio.conf.d")).unwrap();
    // As CRI-O's own crio.conf has it: commented defaults, then the admin's list.
    std::fs::write(
        root.join("etc/crio/crio.conf"),
        "[crio.runtime]\n# hooks_dir = [\n#   \"/usr/share/containers/oci/hooks.d\",\n# ]\nhooks_dir = [\n  \"/etc/containers/oci/hooks.d\",\n  \"/opt/vendor/hooks.d\",\n]\n",
    )
    .unwrap();
    let out = install(&src, &root, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let d: toml::Table =
        std::fs::read_to_string(root.join("etc/crio/crio.conf.d/10-gpushare.conf"))
            .unwrap()
            .parse()
            .unwrap();
    let dirs: Vec<&str> = d["crio"]["runtime"]["hooks_dir"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        dirs,
        // gpushare's hook files go to /etc/containers/oci/hooks.d, which the node lists already.
        ["/etc/containers/oci/hooks.d", "/opt/vendor/hooks.d"]
    );
    assert!(
        d["crio"]["runtime"]["runtimes"]["gpushare"]["runtime_path"].is_str(),
        "{d:?}"
    );
    // A later drop-in of the node's wins over crio.conf.
    std::fs::write(
        root.join("etc/crio/crio.conf.d/01-site.conf"),
        "[crio.runtime]\nhooks_dir = [\"/site/hooks.d\"]\n",
    )
    .unwrap();
    let out = install(&src, &root, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let text2 =
        std::fs::read_to_string(root.join("etc/crio/crio.conf.d/10-gpushare.conf")).unwrap();
    assert!(
        text2.contains("\"/site/hooks.d\"") && !text2.contains("/opt/vendor"),
        "{text2}"
    );
    // Uninstall takes the drop-in away whole.
    let out = install(&src, &root, &[("ACTION", "uninstall")]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!root.join("etc/crio/crio.conf.d/10-gpushare.conf").exists());
}
