//! The fuzzed functions and the properties checked on each input. Shared by the cargo-fuzz
//! targets (`fuzz_targets/`, nightly) and by `tests/fuzz_corpus.rs`, which replays the committed
//! corpus through the same functions on stable. A property that does not hold panics.

use std::collections::HashMap;
use std::path::Path;

use gpushare::config::Config;
use gpushare::container::spec_edit::{self, Edit};
use gpushare::decide::input::{self, InputError};
use gpushare::decide::{devices, request};
use gpushare::vocab::quantity;
use gpushare::vocab::Gpu;
use serde_json::Value;

/// The OCI state a runtime passes on a hook's stdin.
pub fn oci_state(data: &[u8]) {
    if let Ok(st) = gpushare::container::intake::read_state(data) {
        assert!(gpushare::vocab::is_safe_name(st.id()), "unsafe id accepted");
        assert!(!st.bundle().as_os_str().is_empty(), "empty bundle accepted");
    }
}

/// A `config.json` as every entry point reads it: the view, and the document it came from.
pub fn config_json(data: &[u8]) {
    let p = Path::new("config.json");
    let view = input::parse_spec(data, p);
    let doc = input::deep_scope(data, || -> Result<Option<Vec<u8>>, InputError> {
        let v = input::parse_config(data, p)?;
        // A document read is a document that reads back the same.
        let text = serde_json::to_vec(&v).expect("a value serialises");
        let again = input::parse_config(&text, p).expect("serialised config reads back");
        assert_eq!(again, v, "config does not read back the same");
        Ok(Some(text))
    });
    match (&view, &doc) {
        (Ok(_), Err(e)) => panic!("view read but document refused: {e}"),
        (_, Ok(_)) | (Err(_), Err(_)) => {}
    }
    // The view, read with what it never reads skipped, is the view of the whole document.
    let whole = input::deep_scope(data, || {
        input::parse_config(data, p).and_then(|v| input::view_of(&v, p))
    });
    match (&view, &whole) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the pruned view differs"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "the errors differ"),
        _ => panic!("pruned {view:?}, whole {whole:?}"),
    }
}

fn inventory() -> Vec<Gpu> {
    (0..4)
        .map(|i| Gpu {
            index: i,
            uuid: format!("GPU-{i:08x}-0000-4000-8000-000000000000"),
            minor: i,
        })
        .collect()
}

/// Request values: memory, cores, device selectors and lists, and whole requests (one
/// `key=value` per line; keys starting with `GPU_` or `NVIDIA_` go to the env).
pub fn request(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    if let Ok(b) = quantity::parse_memory(&s) {
        assert!(
            (quantity::MIN_MEMORY..=quantity::MAX_MEMORY).contains(&b),
            "{s:?}: {b}"
        );
        assert_eq!(quantity::parse_memory(&b.to_string()), Ok(b), "{s:?}");
    }
    if let Ok(c) = quantity::parse_cores(&s) {
        assert!((1..=100).contains(&c), "{s:?}: {c}");
        assert!(
            s == c.to_string() || s == format!("{c}%"),
            "{s:?} read as {c}"
        );
    }
    match request::parse_selector(&s) {
        Some(request::Selector::Index(i)) => assert_eq!(s, i.to_string()),
        Some(request::Selector::Uuid(u)) => {
            assert_eq!(s, u);
            assert!(gpushare::vocab::is_safe_name(&u), "{u:?}");
        }
        None => {}
    }
    let inv = inventory();
    if let Ok(v) = devices::assigned(Some(&s), &[], &inv) {
        assert!(v.len() <= inv.len());
    }
    let mut annotations = HashMap::new();
    let mut env = Vec::new();
    for line in s.lines() {
        if let Some((k, v)) = line.split_once('=') {
            if k.starts_with("GPU_") || k.starts_with("NVIDIA_") {
                env.push(line.to_owned());
            } else {
                annotations.insert(k.to_owned(), v.to_owned());
            }
        }
    }
    let src = request::Sources {
        annotations: &annotations,
        env: &env,
    };
    let cfg = Config::default();
    if let Ok(Some(r)) = request::parse(&src, &cfg) {
        assert!(
            request::wants_share(&src, true),
            "a request that the fast check misses"
        );
        assert!((1..=100).contains(&r.cores));
        if let Some(m) = r.memory {
            assert!((quantity::MIN_MEMORY..=quantity::MAX_MEMORY).contains(&m));
        }
    }
}

/// The admin's policy file.
pub fn policy(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = Config::parse(text, Path::new("config.toml")) {
        if let Some(m) = cfg.max_memory_bytes() {
            assert!((quantity::MIN_MEMORY..=quantity::MAX_MEMORY).contains(&m));
        }
        assert!((1..=100).contains(&cfg.policy.max_cores));
    }
}

/// A GPU's state record, loaded as the host reads it (from a file under a scratch state dir,
/// removed again after each input).
pub fn state_record(data: &[u8]) {
    let dir = std::env::temp_dir().join(format!("gpushare-fuzz-state-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("gpus")).expect("scratch state dir");
    let sd = gpushare::host::state::StateDir::new(&dir);
    let uuid = "GPU-fuzz";
    std::fs::write(sd.record_path(uuid), data).expect("write scratch record");
    // Saved where it was read from (a record is saved under the GPU it names).
    let full = sd.load(uuid).map(|r| {
        r.map(|mut r| {
            r.uuid = uuid.to_owned();
            r
        })
    });
    // As an acquire reads it: a client added by the lines alone, where the record reads at all.
    if let Ok(Some(mut lazy)) = sd.load_lazy(uuid) {
        lazy.uuid = uuid.to_owned();
        let probe = gpushare::host::state::Client::plain(gpushare::vocab::Mode::Limit, None, 100);
        lazy.clients.insert("fuzz-probe".into(), probe.clone());
        if sd.save(&lazy).is_ok() {
            if let Ok(Some(rec)) = &full {
                // A record that read in full takes the client as a map would.
                let again = sd
                    .load(uuid)
                    .expect("a saved record loads")
                    .expect("present");
                let mut rec = rec.clone();
                rec.clients.insert("fuzz-probe".into(), probe);
                assert_eq!(again, rec);
            }
        }
        std::fs::write(sd.record_path(uuid), data).expect("write scratch record");
    }
    if let Ok(Some(rec)) = full.as_ref().map(|r| r.clone().filter(|r| !r.is_empty())) {
        // What was loaded saves as text that loads back the same.
        std::fs::remove_file(sd.record_path(uuid)).expect("scratch record");
        sd.save(&rec).expect("a record saves");
        let again = sd
            .load(uuid)
            .expect("a saved record loads")
            .expect("present");
        assert_eq!(again, rec);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Members of `before` other than `touched` are in `after`, unchanged.
fn kept(before: &Value, after: &Value, touched: &[&str], what: &str) {
    let (Some(b), Some(a)) = (before.as_object(), after.as_object()) else {
        return;
    };
    for (k, v) in b {
        if !touched.contains(&k.as_str()) {
            assert_eq!(a.get(k), Some(v), "{what}: member {k:?} not kept");
        }
    }
}

/// The spec edit: the edited document is valid JSON that reads back the same, keeps every member
/// it does not edit, and a second edit changes nothing.
pub fn spec_edit(data: &[u8]) {
    let p = Path::new("config.json");
    let _ = input::deep_scope(data, || -> Result<(), InputError> {
        let before = input::parse_config(data, p)?;
        let mut after = before.clone();
        if spec_edit::apply(&mut after, &Edit::example()).is_err() {
            return Ok(());
        }
        let text = serde_json::to_vec(&after).expect("an edited spec serialises");
        let again = input::parse_config(&text, p).expect("an edited spec is valid JSON");
        assert_eq!(again, after, "edited spec does not read back the same");
        kept(&before, &after, &["process", "mounts", "hooks"], "document");
        kept(&before["process"], &after["process"], &["env"], "process");
        kept(
            &before["hooks"],
            &after["hooks"],
            &["createRuntime", "poststop"],
            "hooks",
        );
        if let (Some(b), Some(a)) = (before["mounts"].as_array(), after["mounts"].as_array()) {
            // Only stale mounts onto the edit's target under the state dir go.
            for m in b {
                let ours = m["destination"] == "/tmp/nvidia-mps"
                    && m["source"]
                        .as_str()
                        .is_some_and(|s| s.starts_with("/run/gpushare"));
                assert!(ours || a.contains(m), "mount {m} not kept");
            }
        }
        let mut twice = after.clone();
        spec_edit::apply(&mut twice, &Edit::example()).expect("a second edit applies");
        assert_eq!(twice, after, "the edit is not idempotent");
        Ok(())
    });
}
