//! The one description of the policy keys, and what is generated from it: the man page
//! gpushare-config(5) ([`crate::pages::config_page`]), the key reference in
//! `docs/configuration.md` ([`reference_md`]) and `packaging/config.toml.example`
//! ([`example_toml`]). Defaults come from `Config::default()`. `cargo run -p xtask -- keys`
//! rewrites the two repository files; a test fails when they differ from what it generates.

/// What each policy key does, by `section.key` (top-level keys without a section): the one
/// description of the keys. A key of `Config::default()` missing here, or one here that the
/// policy does not have, fails the tests.
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
    ("mps.pipe_readonly", "Mount the domain's MPS pipe directory read-only into containers; off until a GPU shows that clients attach through a read-only one (docs/mps-domains.md)."),
    ("limit.library", "The interception library mounted into limit-mode containers."),
    ("timeslice.smi", "nvidia-smi, by name or path; used to set a GPU's time slice."),
    ("policy.modes", "The modes containers may ask for: any of \"mps\", \"timeslice\", \"limit\"."),
    ("policy.env_fallback", "Also read requests from the container's GPU_SHARE* environment (for engines that pass no annotations)."),
    ("policy.max_memory", "Largest per-GPU memory a container may ask for (e.g. \"40Gi\"); unset: no maximum."),
    ("policy.max_cores", "Largest SM percentage a container may ask for (1 to 100)."),
    ("policy.default_cores", "SM percentage of a container that names none (1 to 100, at most max_cores)."),
    ("policy.memory_overcommit", "The memory caps of a GPU's shares add up to at most this times its memory (0.1 to 100); a request that would exceed it is refused, naming the GPU and what each container holds."),
    ("policy.uncapped", "How a share without gpu.share.memory counts: \"share\" (the default: it reserves nothing and is promised nothing, so any number of them share a GPU; caps are admitted against its memory), or, strict, \"whole-gpu\" (it counts as the whole GPU's memory) or \"refuse\" (every share must name its cap)."),
    ("runtime.next", "The runtimes gpushare-runtime runs next, the first found on PATH (never itself)."),
    ("runtime.hook", "gpushare-hook as containers' hooks name it (it may be a wrapper); configure writes engine entries that run the gpushare-runtime next to it."),
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
        "mps.group_namespaces",
        "[mps]\ngroup_namespaces = { team-a = [\"team-a\"] }\n",
    ),
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

/// The order sections are shown in: top-level keys first, then the tables as the policy
/// file has them.
const SECTION_ORDER: &[&str] = &[
    "",
    "nvml",
    "mps",
    "limit",
    "timeslice",
    "policy",
    "runtime",
    "serve",
    "profiles",
];

/// The section of `key`: `""` for a top-level value, the table name otherwise (`profiles`, a
/// table of tables, is its own section).
fn section_of(key: &str) -> &str {
    match key.split_once('.') {
        Some((sec, _)) => sec,
        None if key == "profiles" => "profiles",
        None => "",
    }
}

/// [`KEYS`] grouped by section, each section once, in [`SECTION_ORDER`] (then any other).
pub fn sections() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    let mut out: Vec<(&str, Vec<(&str, &str)>)> = Vec::new();
    for (key, what) in KEYS {
        let sec = section_of(key);
        match out.iter_mut().find(|(s, _)| *s == sec) {
            Some((_, v)) => v.push((key, what)),
            None => out.push((sec, vec![(key, what)])),
        }
    }
    let rank = |s: &str| {
        SECTION_ORDER
            .iter()
            .position(|x| *x == s)
            .unwrap_or(SECTION_ORDER.len())
    };
    out.sort_by_key(|(s, _)| rank(s));
    out
}

/// The default of `key` as TOML, `unset` for an optional key.
pub fn default_of(key: &str) -> String {
    defaults()
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
        .or_else(|| {
            OPTIONAL
                .iter()
                .any(|(o, _)| *o == key)
                .then(|| "unset".to_owned())
        })
        .unwrap_or_default()
}

/// `text` as `# ` comment lines of at most `width` columns.
fn comment(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::from("#");
    for w in text.split_whitespace() {
        if line.len() + 1 + w.len() > width && line != "#" {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(w);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// The marker lines around the generated part of `docs/configuration.md`.
pub const BEGIN: &str =
    "<!-- keys: generated from xtask/src/keys.rs by `cargo run -p xtask -- keys`; do not edit -->";
pub const END: &str = "<!-- end of keys -->";

/// The key reference in Markdown: a table per section, each key with its default.
pub fn reference_md() -> String {
    let mut out = String::new();
    for (sec, keys) in sections() {
        out.push_str(&if sec.is_empty() {
            "### Top-level keys\n\n".to_owned()
        } else if sec == "profiles" {
            "### `[profiles.NAME]`\n\n".to_owned()
        } else {
            format!("### `[{sec}]`\n\n")
        });
        out.push_str("| key | default | what it does |\n|---|---|---|\n");
        for (key, what) in keys {
            let name = key.split_once('.').map_or(key, |(_, n)| n);
            let default = default_of(key).replace('|', "\\|");
            out.push_str(&format!(
                "| `{name}` | `{default}` | {} |\n",
                what.replace('|', "\\|")
            ));
        }
        out.push('\n');
    }
    out
}

/// `docs/configuration.md` with its generated part replaced by [`reference_md`].
///
/// # Errors
/// The markers are missing.
pub fn with_reference(doc: &str) -> Result<String, String> {
    let (head, rest) = doc
        .split_once(BEGIN)
        .ok_or_else(|| format!("no line {BEGIN}"))?;
    let (_, tail) = rest
        .split_once(END)
        .ok_or_else(|| format!("no line {END}"))?;
    Ok(format!("{head}{BEGIN}\n\n{}{END}{tail}", reference_md()))
}

/// The example policy: every key with its default (optional ones commented out with an
/// example value), each after its description.
pub fn example_toml() -> String {
    let mut out = String::from(
        "# /etc/gpushare/config.toml: the gpushare policy. Every key is optional; the values below are\n# the defaults. gpushare-config(5) and docs/configuration.md describe each key (all three are\n# generated from one description, xtask/src/keys.rs).\n",
    );
    for (sec, keys) in sections() {
        out.push('\n');
        if !sec.is_empty() && sec != "profiles" {
            out.push_str(&format!("[{sec}]\n"));
        }
        for (key, what) in keys {
            let name = key.split_once('.').map_or(key, |(_, n)| n);
            out.push_str(&comment(what, 96));
            match defaults()
                .into_iter()
                .find(|(k, v)| k == key && v != "(none)")
            {
                Some((_, v)) => out.push_str(&format!("{name} = {v}\n")),
                None => {
                    let example = OPTIONAL
                        .iter()
                        .find(|(o, _)| *o == key)
                        .map_or("", |(_, e)| e);
                    for l in example.lines() {
                        // The section header of a plain key is already there.
                        if !sec.is_empty() && l == format!("[{sec}]") {
                            continue;
                        }
                        out.push_str(&format!("# {l}\n"));
                    }
                }
            }
        }
    }
    out
}
