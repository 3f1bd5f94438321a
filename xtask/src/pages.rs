//! The man pages that are not a clap command: `gpushare-runtime(1)` (the wrapper's own help
//! text, its environment and files) and `gpushare-config(5)` (every policy key, its default from
//! `Config::default()`, and what it does).

use std::ffi::OsString;

use clap_mangen::roff::{bold, italic, roman, Roff};

/// What each policy key does, by `section.key` (top-level keys without a section). A key of
/// `Config::default()` missing here, or one here that the policy does not have, fails the tests.
pub const KEYS: &[(&str, &str)] = &[
    ("state_dir", "Directory of gpushare's state (records, locks, MPS pipe and log directories). Must be absolute; a tmpfs such as /run/gpushare, mode 0700."),
    ("log_file", "File the hooks and the runtime append their log lines to; without it they log to stderr only."),
    ("lock_timeout_seconds", "How long a hook waits for a GPU's lock (1 to 3600)."),
    ("nvml.library", "Soname or path of NVML (libnvidia-ml)."),
    ("mps.control", "nvidia-cuda-mps-control, by name on the safe PATH or by path."),
    ("mps.exclusive_compute_mode", "Put a GPU in EXCLUSIVE_PROCESS compute mode while its MPS daemon runs, DEFAULT after."),
    ("mps.multiuser", "Serve clients of different uids from one daemon with the driver's multi-user option; refused where the driver has none."),
    ("mps.start_timeout_seconds", "How long a new MPS daemon may take to answer."),
    ("mps.isolation", "Which containers share one MPS daemon on a GPU: \"gpu\" (all), \"group\" (per gpu.share.group) or \"container\" (one each)."),
    ("mps.groups", "Admin-defined groups: [mps.groups.NAME] with cores and memory, the limits that group's daemon enforces."),
    ("mps.shm_size", "Size cap of each MPS domain's /dev/shm tmpfs (nosuid, nodev, noexec), the one its containers share; what engines give a container's /dev/shm by default."),
    ("mps.group_namespaces", "Groups bound to the Kubernetes namespaces that alone may name them, like { team-a = [\"team-a\"] }; on Kubernetes every group's domain is its namespace's own either way."),
    ("mps.pipe_readonly", "Mount the domain's MPS pipe directory read-only into containers; off until a GPU shows that clients attach through a read-only one (README)."),
    ("limit.library", "The interception library mounted into limit-mode containers."),
    ("timeslice.smi", "nvidia-smi, by name or path; used to set a GPU's time slice."),
    ("policy.modes", "The modes containers may ask for: any of \"mps\", \"timeslice\", \"limit\"."),
    ("policy.env_fallback", "Also read requests from the container's GPU_SHARE* environment (for engines that pass no annotations)."),
    ("policy.max_memory", "Largest per-GPU memory a container may ask for (e.g. \"40Gi\"); unset: no maximum."),
    ("policy.max_cores", "Largest SM percentage a container may ask for (1 to 100)."),
    ("policy.default_cores", "SM percentage of a container that names none (1 to 100, at most max_cores)."),
    ("policy.memory_overcommit", "The memory caps of a GPU's shares add up to at most this times its memory (0.1 to 100); a request that would exceed it is refused, naming the GPU and what each container holds."),
    ("policy.uncapped", "How a share without gpu.share.memory counts: \"whole-gpu\" (as the whole GPU's memory) or \"refuse\" (every share must name its cap)."),
    ("runtime.next", "The runtimes gpushare-runtime runs next, the first found on PATH (never itself)."),
    ("runtime.hook", "gpushare-hook as containers' hooks name it; gpushare-runtime is expected next to it."),
    ("serve.listen", "Address and port gpushare-hook serve answers /metrics and /healthz on."),
    ("serve.gc_interval_seconds", "How often gpushare-hook serve runs the healing pass of gc (1 to 86400)."),
    ("serve.events_file", "The JSON-lines event log (acquire, release, refusal, daemon and gc actions); unset: gpushare-events.jsonl next to log_file."),
    ("profiles", "Named requests, offered as CDI devices gpushare.io/share=NAME: [profiles.NAME] with mode (required), cores, memory, group and timeslice, each meaning what the annotation of that name means."),
];

/// Keys without a default value (absent from `Config::default()` when serialised), with a
/// policy line that sets them, so that the tests can prove they exist.
pub const OPTIONAL: &[(&str, &str)] = &[
    ("policy.max_memory", "[policy]\nmax_memory = \"40Gi\"\n"),
    ("mps.groups", "[mps.groups.ops]\ncores = 50\n"),
    (
        "serve.events_file",
        "[serve]\nevents_file = \"/var/log/ev.jsonl\"\n",
    ),
    ("profiles", "[profiles.small]\nmode = \"mps\"\ncores = 25\n"),
];

/// Every `section.key` of the default policy with its default as TOML.
pub fn defaults() -> Vec<(String, String)> {
    let v =
        toml::Value::try_from(gpushare::config::Config::default()).expect("the policy serialises");
    let mut out = Vec::new();
    for (k, x) in v.as_table().expect("a table") {
        match x {
            toml::Value::Table(t) if k != "groups" => {
                for (ik, iv) in t {
                    out.push((format!("{k}.{ik}"), shown(iv)));
                }
            }
            _ => out.push((k.clone(), shown(x))),
        }
    }
    out
}

fn shown(v: &toml::Value) -> String {
    match v {
        toml::Value::Table(t) if t.is_empty() => "(none)".into(),
        _ => v.to_string(),
    }
}

/// gpushare-config(5).
pub fn config_page() -> String {
    let defaults = defaults();
    let mut r = Roff::new();
    r.control(
        "TH",
        [
            "GPUSHARE-CONFIG",
            "5",
            "",
            &format!("gpushare {}", gpushare::VERSION),
        ],
    );
    r.control("SH", ["NAME"]);
    r.text([roman("gpushare-config - the gpushare policy file")]);
    r.control("SH", ["SYNOPSIS"]);
    r.text([
        bold(gpushare::config::DEFAULT_PATH),
        roman(" (or $GPUSHARE_CONFIG, or --config FILE)"),
    ]);
    r.control("SH", ["DESCRIPTION"]);
    r.text([roman("A TOML file. Every key is optional; a missing file means every default. An unknown key, a bad value or a file that is not TOML is refused with its line and column (gpushare-hook doctor shows where); status, gc and poststop then run on what can be read of it and the defaults for the rest.")]);
    let mut section = "-".to_owned();
    for (key, what) in KEYS {
        let (sec, name) = key.split_once('.').unwrap_or(("", key));
        if sec != section {
            section = sec.to_owned();
            r.control(
                "SH",
                [if sec.is_empty() {
                    "TOP-LEVEL KEYS".to_owned()
                } else {
                    format!("[{sec}]")
                }
                .as_str()],
            );
        }
        let default = defaults
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .or_else(|| {
                OPTIONAL
                    .iter()
                    .any(|(o, _)| o == key)
                    .then(|| "unset".to_owned())
            })
            .unwrap_or_default();
        r.control("TP", []);
        r.text([
            bold(name),
            roman(" (default: "),
            italic(&default),
            roman(")"),
        ]);
        r.text([roman(*what)]);
    }
    r.control("SH", ["SEE ALSO"]);
    r.text([roman("gpushare-hook(1), gpushare-runtime(1)")]);
    r.render()
}

/// gpushare-runtime(1).
pub fn runtime_page() -> std::io::Result<String> {
    let argv = [OsString::from("--help")];
    let args = gpushare::container::runtime::parse_args(&argv);
    let help = gpushare::container::runtime::own_answer(&argv, &args)
        .ok_or_else(|| std::io::Error::other("gpushare-runtime --help has no text of its own"))?;
    let mut r = Roff::new();
    r.control(
        "TH",
        [
            "GPUSHARE-RUNTIME",
            "1",
            "",
            &format!("gpushare {}", gpushare::VERSION),
        ],
    );
    r.control("SH", ["NAME"]);
    r.text([roman(
        "gpushare-runtime - an OCI runtime wrapper that shares NVIDIA GPUs between containers",
    )]);
    r.control("SH", ["SYNOPSIS"]);
    r.text([
        bold("gpushare-runtime"),
        roman(" ["),
        italic("runc global options"),
        roman("] "),
        italic("command"),
        roman(" ["),
        italic("arguments"),
        roman("]"),
    ]);
    r.control("SH", ["DESCRIPTION"]);
    for para in help.trim().split("\n\n") {
        r.control("PP", []);
        r.text([roman(para.replace('\n', " "))]);
    }
    r.control("SH", ["ENVIRONMENT"]);
    r.control("TP", []);
    r.text([bold(gpushare::config::ENV_PATH)]);
    r.text([roman(format!(
        "The policy file (default {}); see gpushare-config(5).",
        gpushare::config::DEFAULT_PATH
    ))]);
    r.control("SH", ["FILES"]);
    r.control("TP", []);
    r.text([bold(gpushare::config::DEFAULT_PATH)]);
    r.text([roman("The policy: [runtime] next names the runtime run next, [runtime] hook the hook put into containers.")]);
    r.control("SH", ["SEE ALSO"]);
    r.text([roman("gpushare-hook(1), gpushare-config(5), runc(8)")]);
    Ok(r.render())
}
