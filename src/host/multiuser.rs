//! Which multi-user flag the installed `nvidia-cuda-mps-control` takes, read from the program
//! itself (its `-h` text), and the refusal where it takes none.
//!
//! What the drivers document: every man page of `nvidia-cuda-mps-control` from driver 331 to
//! 580 gives the synopsis `[-d | -f]` and the options `-d`, `-f`, `-h`; none names a
//! multi-user option. Without one, the control daemon starts one MPS server per user id and
//! queues clients of another user until the running server's clients are done, so containers of
//! different UIDs on one daemon are served one user at a time. Driver 535's daemon exits when
//! given `-multiuser-server`, and its `-h` text lists no option at all. So the flag is taken
//! from the help text of the installed program and never assumed: where a future driver lists a
//! multi-user option, it is used; where none is listed, `[mps] multiuser = true` is refused.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Multi-user options a control program's help text may list, in order of preference.
const KNOWN_FLAGS: [&str; 4] = [
    "-multiuser-server",
    "--multiuser-server",
    "-multiuser",
    "--multiuser",
];

/// The multi-user flag that `help_text` (the output of `nvidia-cuda-mps-control -h`) lists as
/// an option, if any. Only a whole word counts: a sentence mentioning multi-user use does not.
pub fn multiuser_flag(help_text: &str) -> Option<&'static str> {
    let words: Vec<&str> = help_text
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | '|' | '[' | ']' | '(' | ')'))
        .map(|w| w.split('=').next().unwrap_or(w))
        .collect();
    KNOWN_FLAGS.into_iter().find(|f| words.contains(f))
}

/// The help text of the control program `binary` (`-h`, stdout and stderr), or `None` when it
/// cannot be run or does not finish within two seconds.
pub fn control_help(binary: &Path) -> Option<String> {
    let mut child = Command::new(binary)
        .arg("-h")
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let out = child.wait_with_output().ok()?;
    Some(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// The NVIDIA driver's version, for messages: the loaded kernel module's, else the one in the
/// name of the installed `libcuda.so.<version>`; `None` without either.
pub fn driver_version() -> Option<String> {
    driver_version_in(
        Path::new("/sys/module/nvidia/version"),
        &[
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib",
        ],
    )
}

/// [`driver_version`] from the module's version file `module` and the library directories
/// `lib_dirs`.
fn driver_version_in(module: &Path, lib_dirs: &[&str]) -> Option<String> {
    if let Ok(v) = std::fs::read_to_string(module) {
        if !v.trim().is_empty() {
            return Some(v.trim().to_owned());
        }
    }
    lib_dirs
        .iter()
        .filter_map(|d| std::fs::canonicalize(Path::new(d).join("libcuda.so.1")).ok())
        .find_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            let v = name.strip_prefix("libcuda.so.")?;
            (v.contains('.') && v.chars().all(|c| c.is_ascii_digit() || c == '.'))
                .then(|| v.to_owned())
        })
}

/// The flag to start `binary` with for `[mps] multiuser = true`.
///
/// # Errors
/// A one-line reason, naming the driver and what to do, when the program lists no multi-user
/// option.
pub fn flag_for(binary: &Path) -> Result<&'static str, String> {
    let help = control_help(binary).unwrap_or_default();
    multiuser_flag(&help).ok_or_else(|| {
        let driver = driver_version()
            .map(|v| format!("driver {v}"))
            .unwrap_or_else(|| "the installed driver".to_owned());
        format!(
            "{driver} has no multi-user MPS option (the control program's -h lists none), so \
             MPS serves one user id at a time; set [mps] multiuser = false and run the \
             containers that share a GPU under one user id"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiuser_flag_table() {
        let driver_535 = "CUDA MPS Control for Linux/Unix.\nCopyright (C) 2003 - 2023 NVIDIA \
            Corporation.\n\n  This program allows multiple CUDA processes to share a single GPU \
            context. For information on how to use the CUDA MPS, see the \
            nvidia-cuda-mps-control manual page.\n";
        let rows: [(&str, &str, Option<&str>); 8] = [
            ("driver 535: no option listed", driver_535, None),
            ("empty help (program could not run)", "", None),
            (
                "an option list with -multiuser-server",
                "Usage: nvidia-cuda-mps-control [-d | -f] [-multiuser-server]\n",
                Some("-multiuser-server"),
            ),
            (
                "a described option",
                "  -d  daemon\n  -f  foreground\n  --multiuser-server   serve every user\n",
                Some("--multiuser-server"),
            ),
            (
                "a short -multiuser option",
                "options: -d, -f, -multiuser\n",
                Some("-multiuser"),
            ),
            (
                "prose about multi-user use is no option",
                "MPS can serve multiuser setups; see the manual (multiuser-server mode).\n",
                None,
            ),
            (
                "a longer word that only starts like the flag",
                "  -multiuser-server-legacy  old behaviour\n",
                None,
            ),
            (
                "both listed: the server form is preferred",
                "[-multiuser] [-multiuser-server]",
                Some("-multiuser-server"),
            ),
        ];
        for (what, help, want) in rows {
            assert_eq!(multiuser_flag(help), want, "{what}");
        }
    }

    #[test]
    fn the_driver_version_is_the_module_s_else_the_library_s() {
        let t = tempfile::tempdir().unwrap();
        let module = t.path().join("version");
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let dirs = [a.to_str().unwrap(), b.to_str().unwrap()];
        assert_eq!(driver_version_in(&module, &dirs), None, "neither");
        // libcuda.so.1 names its version through the link, in the first directory that has it.
        let lib = |dir: &Path, target: &str| {
            std::fs::write(dir.join(target), b"").unwrap();
            let link = dir.join("libcuda.so.1");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, link).unwrap();
        };
        lib(&b, "libcuda.so.535.104.05");
        assert_eq!(
            driver_version_in(&module, &dirs).as_deref(),
            Some("535.104.05")
        );
        for not_a_version in ["libcuda.so.535", "libcuda.so.5x.1", "libcuda-535.1.so"] {
            lib(&a, not_a_version);
            assert_eq!(
                driver_version_in(&module, &dirs).as_deref(),
                Some("535.104.05"),
                "{not_a_version} is passed over"
            );
        }
        lib(&a, "libcuda.so.580.65.06");
        assert_eq!(
            driver_version_in(&module, &dirs).as_deref(),
            Some("580.65.06")
        );
        // The loaded module's version comes first; an empty file is none.
        std::fs::write(&module, "\n").unwrap();
        assert_eq!(
            driver_version_in(&module, &dirs).as_deref(),
            Some("580.65.06")
        );
        std::fs::write(&module, "590.10\n").unwrap();
        assert_eq!(driver_version_in(&module, &dirs).as_deref(), Some("590.10"));
    }

    #[test]
    fn the_help_text_is_both_streams_and_a_program_that_hangs_is_given_up() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let p = t.path().join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let talks = script("talks", "echo \"usage: $1\"; echo ' -multiuser-server' >&2");
        let help = control_help(&talks).expect("runs");
        assert!(help.contains("usage: -h"), "{help:?}");
        assert_eq!(multiuser_flag(&help), Some("-multiuser-server"), "{help:?}");
        assert_eq!(flag_for(&talks), Ok("-multiuser-server"));
        assert_eq!(control_help(&t.path().join("missing")), None);
        let hangs = script("hangs", "exec sleep 30");
        let t0 = std::time::Instant::now();
        assert_eq!(control_help(&hangs), None);
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }

    #[test]
    fn installed_control_program_is_asked_and_refused_with_the_reason() {
        let Some(binary) = crate::host::mps::find_binary("nvidia-cuda-mps-control") else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "nvidia-cuda-mps-control missing (CI requires it)"
            );
            eprintln!("\n******** SKIPPED: nvidia-cuda-mps-control not installed ********\n");
            return;
        };
        let help = control_help(&binary).expect("runs -h");
        match multiuser_flag(&help) {
            Some(f) => assert_eq!(flag_for(&binary), Ok(f)),
            None => {
                let e = flag_for(&binary).unwrap_err();
                assert!(e.contains("has no multi-user MPS option"), "{e}");
                assert!(e.contains("[mps] multiuser = false"), "{e}");
                assert!(e.contains("driver"), "{e}");
            }
        }
    }
}
