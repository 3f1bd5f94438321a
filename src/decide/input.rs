//! Parsing untrusted input: the OCI state and the bundle's `config.json`, as bytes the caller
//! read (the container layer reads them, capped). Nothing here reads a file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::decide::oci_state::State;
use serde::Deserialize;
use serde_json::{Map, Value};
use thiserror::Error;

/// Input that cannot be used.
#[derive(Debug, Error)]
pub enum InputError {
    #[error("the OCI state on stdin is not valid JSON; the hook must be run by an OCI runtime")]
    ParseState(#[source] serde_json::Error),
    #[error("container id {0:?} is not a safe name (letters, digits, '_', '-', '.', at most 128, not starting with '.')")]
    BadId(String),
    #[error("the OCI state has no bundle path; the hook must be run by an OCI runtime")]
    NoBundle,
    #[error("{path} is not a valid OCI config")]
    ParseConfig {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot start a thread to read a deeply nested config")]
    DeepThread(#[source] std::io::Error),
    #[error("{path} nests arrays and objects deeper than 10000 levels, which runc refuses too")]
    TooDeep { path: PathBuf },
    #[error("the OCI state has no valid pid for the container ({0}); it must be run at createRuntime or prestart")]
    BadPid(i64),
}

/// The parts of `config.json` the decision needs. Unknown fields are ignored here; the spec
/// editor works on the raw JSON so that they are preserved there.
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct SpecView {
    pub annotations: HashMap<String, String>,
    pub process: ProcessView,
    pub linux: LinuxView,
    pub root: Option<RootView>,
    pub mounts: Vec<MountView>,
    pub hooks: HooksView,
}

/// The spec's `hooks`, as far as gpushare reads them.
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HooksView {
    pub create_runtime: Vec<HookView>,
}

/// One hook entry.
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct HookView {
    pub path: String,
    pub args: Vec<String>,
    pub env: Vec<String>,
}

/// One of the spec's `mounts`, as far as gpushare reads it.
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct MountView {
    pub destination: String,
    pub source: Option<PathBuf>,
}

#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ProcessView {
    pub env: Vec<String>,
    pub user: UserView,
}

#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct UserView {
    pub uid: u32,
}

#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct LinuxView {
    pub devices: Vec<DeviceView>,
    /// `linux.cgroupsPath`: where the engine asked the runtime to put the container.
    #[serde(rename = "cgroupsPath")]
    pub cgroups_path: Option<String>,
}

#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct DeviceView {
    pub path: String,
}

#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RootView {
    pub path: PathBuf,
}

/// Parses and validates the OCI state a runtime passes to a hook.
///
/// # Errors
/// [`InputError`] for a malformed state, or an unsafe container id.
pub fn parse_state(bytes: &[u8]) -> Result<State, InputError> {
    let state: State = serde_json::from_slice(bytes).map_err(InputError::ParseState)?;
    check_id(state.id())?;
    if state.bundle().as_os_str().is_empty() {
        return Err(InputError::NoBundle);
    }
    Ok(state)
}

/// Checks that a container id can safely become a file name.
///
/// # Errors
/// [`InputError::BadId`] otherwise.
pub fn check_id(id: &str) -> Result<(), InputError> {
    if crate::vocab::is_safe_name(id) {
        Ok(())
    } else {
        Err(InputError::BadId(id.chars().take(80).collect()))
    }
}

/// The deepest nesting of arrays and objects Go's `encoding/json`, and so runc, reads.
pub const MAX_DEPTH: usize = 10_000;
/// Nesting up to this depth is parsed on the caller's stack; deeper, on a thread with a stack
/// large enough for [`MAX_DEPTH`].
const SHALLOW_DEPTH: usize = 64;
/// Stack for a deep config: enough for [`MAX_DEPTH`] levels of recursive parse, compare,
/// serialise and drop, even unoptimised (which needs between 16 and 64 MiB) or under a sanitizer.
const DEEP_STACK: usize = 256 << 20;

/// How deeply arrays and objects nest in `bytes`, read as JSON (strings skipped). Stops counting
/// past `MAX_DEPTH + 1`.
pub fn nesting_depth(bytes: &[u8]) -> usize {
    // `memchr`'s portable search, a word at a time (its default one would ask the CPU what it
    // supports first, which traps to the hypervisor in a VM).
    let quote = memchr::arch::all::memchr::Two::new(b'"', b'\\');
    let (mut depth, mut max, mut i) = (0usize, 0usize, 0usize);
    while let Some(&b) = bytes.get(i) {
        match b {
            // A string: skipped to the quote that ends it, a backslash and the byte after it at
            // a time (most of a config's bytes are in strings).
            b'"' => loop {
                let Some(n) = bytes.get(i + 1..).and_then(|rest| quote.find(rest)) else {
                    return max;
                };
                i += 1 + n;
                if bytes[i] == b'"' {
                    break;
                }
                // The escaped byte is skipped with the backslash.
                i += 1;
            },
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
                if max > MAX_DEPTH {
                    return max;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    max
}

/// Runs `f` on a stack deep enough for the config `bytes`: the caller's when the config nests
/// shallowly (the common case, no thread), else a scoped thread's. Everything that walks a
/// parsed config recursively (parse, compare, serialise, drop) must run inside.
///
/// # Errors
/// `f`'s, or [`InputError::DeepThread`] when no such thread can be started.
pub fn deep_scope<T: Send, E: Send + From<InputError>>(
    bytes: &[u8],
    f: impl FnOnce() -> Result<T, E> + Send,
) -> Result<T, E> {
    scope_for_depth(nesting_depth(bytes), f)
}

/// [`deep_scope`] for a config whose [`nesting_depth`] the caller has.
fn scope_for_depth<T: Send, E: Send + From<InputError>>(
    depth: usize,
    f: impl FnOnce() -> Result<T, E> + Send,
) -> Result<T, E> {
    if depth <= SHALLOW_DEPTH {
        return f();
    }
    std::thread::scope(|s| {
        match std::thread::Builder::new()
            .name("deep-config".into())
            .stack_size(DEEP_STACK)
            .spawn_scoped(s, f)
        {
            Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            Err(e) => Err(InputError::DeepThread(e).into()),
        }
    })
}

/// A JSON value read as Go's `encoding/json` reads it into runc's spec types: a member whose key
/// repeats one before it in the same object is merged into it when both are objects (as Go
/// decodes into the same struct or map) and replaces it otherwise (as Go does for strings,
/// numbers, arrays and `null`).
struct GoValue;

impl<'de> serde::de::DeserializeSeed<'de> for GoValue {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for GoValue {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = a.next_element_seed(GoValue)? {
            v.push(x);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut m = Map::new();
        while let Some(k) = a.next_key::<String>()? {
            let v = a.next_value_seed(GoValue)?;
            merge_member(&mut m, k, v);
        }
        Ok(Value::Object(m))
    }
}

/// Which members of a config object the decision reads ([`SpecView`]): the members whose keys
/// Go matches to one of these field names are read as [`GoValue`] reads them (`Whole`) or
/// pruned again (`Members`); the others are read and checked but not kept ([`Skip`]; a podman config's
/// seccomp profile is most of its bytes, and the view never reads it).
enum Keep {
    Whole,
    Members(&'static [(&'static str, Keep)]),
}

/// The members [`SpecView`] reads, by Go field name, at each level.
const VIEW: Keep = Keep::Members(&[
    ("annotations", Keep::Whole),
    (
        "process",
        Keep::Members(&[("env", Keep::Whole), ("user", Keep::Whole)]),
    ),
    (
        "linux",
        Keep::Members(&[("devices", Keep::Whole), ("cgroupsPath", Keep::Whole)]),
    ),
    ("root", Keep::Whole),
    ("mounts", Keep::Whole),
    ("hooks", Keep::Whole),
]);

/// [`GoValue`] keeping only what `Keep` names: the same value as [`GoValue`] gives, less the
/// members no [`SpecView`] field can be read from.
struct Pruned(&'static Keep);

impl<'de> serde::de::DeserializeSeed<'de> for Pruned {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        match self.0 {
            Keep::Whole => GoValue.deserialize(d),
            Keep::Members(_) => d.deserialize_any(self),
        }
    }
}

impl<'de> serde::de::Visitor<'de> for Pruned {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        GoValue.visit_bool(v)
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        GoValue.visit_i64(v)
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        GoValue.visit_u64(v)
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        GoValue.visit_f64(v)
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        GoValue.visit_str(v)
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        GoValue.visit_unit()
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, a: A) -> Result<Value, A::Error> {
        // Not the object the view expects: kept whole, for the view to refuse as before.
        GoValue.visit_seq(a)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let Keep::Members(fields) = self.0 else {
            return GoValue.visit_map(a);
        };
        let mut m = Map::new();
        while let Some(k) = a.next_key::<String>()? {
            match fields.iter().find(|(f, _)| go_field_match(&k, f)) {
                Some((_, keep)) => {
                    let v = a.next_value_seed(Pruned(keep))?;
                    merge_member(&mut m, k, v);
                }
                None => a.next_value_seed(Skip)?,
            }
        }
        Ok(Value::Object(m))
    }
}

/// A JSON value read and checked as [`GoValue`] reads it (numbers in range included), and
/// dropped as it is read: nothing is built.
struct Skip;

impl<'de> serde::de::DeserializeSeed<'de> for Skip {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Skip {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        while a.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        while a.next_key_seed(Skip)?.is_some() {
            a.next_value_seed(Skip)?;
        }
        Ok(())
    }
}

/// Adds `key: value` to `m` as Go decodes a repeated key: objects merge, anything else replaces.
fn merge_member(m: &mut Map<String, Value>, key: String, value: Value) {
    match (m.get_mut(&key), value) {
        (Some(Value::Object(old)), Value::Object(new)) => {
            for (k, v) in new {
                merge_member(old, k, v);
            }
        }
        (Some(old), new) => *old = new,
        (None, new) => {
            m.insert(key, new);
        }
    }
}

/// Whether `key` names the field `name` as Go matches JSON keys to struct fields: exactly, else
/// without regard to case (with the Kelvin sign folding to `k` and the long s to `s`).
fn go_field_match(key: &str, name: &str) -> bool {
    let fold = |c: char| match c {
        '\u{212a}' => 'k',
        '\u{17f}' => 's',
        c => c.to_ascii_lowercase(),
    };
    key.chars().map(fold).eq(name.chars().map(fold))
}

/// Renames the members of `v` (an object) that Go would decode into one of `fields` to that
/// field's name, merging repeats in document order, and drops the ones that are `null` (Go sets
/// such a pointer, slice or map field to nil, that is absent).
fn canonical_fields(v: &mut Value, fields: &[&str]) {
    let Some(obj) = v.as_object_mut() else { return };
    if !obj.iter().any(|(k, v)| {
        fields
            .iter()
            .any(|f| go_field_match(k, f) && (k != f || v.is_null()))
    }) {
        return;
    }
    let mut out = Map::new();
    for (k, val) in std::mem::take(obj) {
        match fields.iter().find(|f| go_field_match(&k, f)) {
            Some(f) if val.is_null() => {
                out.shift_remove(*f);
            }
            Some(f) => merge_member(&mut out, (*f).to_owned(), val),
            None => merge_member(&mut out, k, val),
        }
    }
    *obj = out;
}

/// The members of a spec whose keys gpushare reads or edits, per object.
fn canonical_spec(v: &mut Value) {
    canonical_fields(
        v,
        &["annotations", "process", "linux", "root", "mounts", "hooks"],
    );
    let Some(root) = v.as_object_mut() else {
        return;
    };
    if let Some(p) = root.get_mut("process") {
        canonical_fields(p, &["env"]);
    }
    if let Some(r) = root.get_mut("root") {
        canonical_fields(r, &["path"]);
    }
    if let Some(l) = root.get_mut("linux") {
        canonical_fields(l, &["devices", "cgroupsPath"]);
        if let Some(devs) = l.get_mut("devices").and_then(Value::as_array_mut) {
            devs.iter_mut().for_each(|d| canonical_fields(d, &["path"]));
        }
    }
    if let Some(h) = root.get_mut("hooks") {
        canonical_fields(
            h,
            &[
                "prestart",
                "createRuntime",
                "createContainer",
                "startContainer",
                "poststart",
                "poststop",
            ],
        );
    }
    if let Some(ms) = root.get_mut("mounts").and_then(Value::as_array_mut) {
        for m in ms {
            canonical_fields(m, &["destination", "source", "type", "options"]);
        }
    }
}

/// Reads a `config.json` the way runc does (Go's `encoding/json` into the spec types), as one
/// JSON value with the members gpushare uses under their canonical names: the first JSON value
/// of the input (trailing bytes are not read, as Go's decoder does not read them); invalid UTF-8
/// replaced by U+FFFD; nesting up to [`MAX_DEPTH`]; repeated keys merged or replaced as Go does;
/// keys matched to the fields gpushare uses as Go matches them, `null` there meaning absent.
/// Every entry point (createRuntime, precreate, the runtime wrapper) reads a config through
/// here. Call it inside [`deep_scope`] for the same `bytes`.
///
/// # Errors
/// [`InputError::ParseConfig`] for what runc refuses too, [`InputError::TooDeep`] past
/// [`MAX_DEPTH`].
pub fn parse_config(bytes: &[u8], path: &Path) -> Result<Value, InputError> {
    read_config_value(bytes, nesting_depth(bytes), path, GoValue)
}

/// [`parse_config`] with `seed` reading the value, of `bytes` whose [`nesting_depth`] is `depth`.
fn read_config_value(
    bytes: &[u8],
    depth: usize,
    path: &Path,
    seed: impl for<'de> serde::de::DeserializeSeed<'de, Value = Value>,
) -> Result<Value, InputError> {
    if depth > MAX_DEPTH {
        return Err(InputError::TooDeep {
            path: path.to_owned(),
        });
    }
    let text = crate::vocab::text(bytes);
    let mut de = serde_json::Deserializer::from_str(&text);
    de.disable_recursion_limit();
    let mut v = seed
        .deserialize(&mut de)
        .map_err(|source| InputError::ParseConfig {
            path: path.to_owned(),
            source,
        })?;
    canonical_spec(&mut v);
    Ok(v)
}

/// The decision's view of a config read by [`parse_config`].
///
/// # Errors
/// [`InputError::ParseConfig`] when the members it uses have the wrong shape.
pub fn view_of(v: &Value, path: &Path) -> Result<SpecView, InputError> {
    SpecView::deserialize(v).map_err(|source| InputError::ParseConfig {
        path: path.to_owned(),
        source,
    })
}

/// Parses the decision's view of a config: what [`parse_config`] then [`view_of`] give, with
/// the members the view never reads skipped rather than built (tested against those two).
///
/// # Errors
/// [`InputError`] as those two.
pub fn parse_spec(bytes: &[u8], path: &Path) -> Result<SpecView, InputError> {
    // One scan of the bytes for their depth serves the stack's choice and the depth's bound.
    let depth = nesting_depth(bytes);
    scope_for_depth(depth, || {
        view_of(&read_config_value(bytes, depth, path, Pruned(&VIEW))?, path)
    })
}

/// The container's rootfs as a host path, from `root.path` (relative to the bundle).
pub fn rootfs_of(spec: &SpecView, bundle: Option<&Path>) -> Option<PathBuf> {
    let p = &spec.root.as_ref()?.path;
    if p.is_absolute() {
        Some(p.clone())
    } else {
        bundle.map(|b| b.join(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_inputs() {
        let good = r#"{"ociVersion":"1.0.2","id":"abc-1","status":"creating","pid":42,"bundle":"/b","annotations":{"gpu.share":"mps"}}"#;
        let st = parse_state(good.as_bytes()).unwrap();
        assert_eq!(st.id(), "abc-1");
        assert_eq!(st.pid(), &Some(42));

        let rows: Vec<(&str, String, &str)> = vec![
            ("not json", "{nope".into(), "not valid JSON"),
            ("empty", "".into(), "not valid JSON"),
            (
                "path id",
                r#"{"id":"../etc","bundle":"/b"}"#.into(),
                "not a safe name",
            ),
            (
                "slash id",
                r#"{"id":"a/b","bundle":"/b"}"#.into(),
                "not a safe name",
            ),
            (
                "empty id",
                r#"{"id":"","bundle":"/b"}"#.into(),
                "not a safe name",
            ),
            ("no bundle", r#"{"id":"a"}"#.into(), "no bundle"),
        ];
        for (what, input, want) in rows {
            let err = parse_state(input.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(want), "{what}: {err}");
        }
    }

    /// The view read with the unread members skipped is the view of the whole document, for
    /// the configs engines write and for the ways Go reads keys (case, repeats, `null`).
    #[test]
    fn the_pruned_view_is_the_view_of_the_whole_config() {
        let full =
            |b: &[u8]| parse_config(b, Path::new("c")).and_then(|v| view_of(&v, Path::new("c")));
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut rows: Vec<(String, Vec<u8>)> = [
            "podman-mps.json",
            "containerd-mps.json",
            "docker-env-mps.json",
        ]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(fixtures.join(f)).unwrap()))
        .collect();
        for (what, text) in [
            (
                "linux twice, merged",
                r#"{"linux":{"devices":[{"path":"/dev/a"}],"seccomp":{"x":1}},"linux":{"cgroupsPath":"/c","seccomp":[1]}}"#,
            ),
            (
                "keys in other cases",
                r#"{"LINUX":{"Devices":[{"PATH":"/dev/a"}],"CgroupsPath":"/c"},"Process":{"ENV":["A=1"],"User":{"uid":7}},"Annotations":{"gpu.share":"mps"}}"#,
            ),
            (
                "Kelvin sign",
                r#"{"hoo\u212as":{"createRuntime":[{"path":"/x"}]},"pro\u017fess":{"env":["A=1"]}}"#,
            ),
            (
                "null members",
                r#"{"linux":null,"process":{"env":null},"annotations":{"a":"b"},"Annotations":null}"#,
            ),
            (
                "a member of the wrong type",
                r#"{"process":[1,2],"linux":{"seccomp":"x"}}"#,
            ),
            (
                "a wrong type in a skipped member",
                r#"{"linux":{"seccomp":"not an object","devices":[]},"process":{"capabilities":7}}"#,
            ),
            (
                "a syntax error in a skipped member",
                r#"{"linux":{"seccomp":{"a":[1,2,}}}"#,
            ),
            ("trailing bytes", r#"{"annotations":{"a":"b"}} {"x""#),
            ("not an object", r#"[1]"#),
            (
                "a big number where it is skipped",
                r#"{"linux":{"resources":{"x":1e999}}}"#,
            ),
        ] {
            rows.push((what.to_owned(), text.as_bytes().to_vec()));
        }
        for (what, bytes) in rows {
            let (pruned, whole) = (parse_spec(&bytes, Path::new("c")), full(&bytes));
            match (&pruned, &whole) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}"),
                (Err(a), Err(b)) => {
                    assert_eq!(crate::vocab::chain(a), crate::vocab::chain(b), "{what}")
                }
                _ => panic!("{what}: pruned {pruned:?}, whole {whole:?}"),
            }
        }
        // Positive controls: the pruned read really skipped podman's seccomp profile, and the
        // case-folded cgroupsPath is read as runc reads it.
        let podman = std::fs::read(fixtures.join("podman-mps.json")).unwrap();
        let whole = parse_config(&podman, Path::new("c")).unwrap();
        let pruned = read_config_value(
            &podman,
            nesting_depth(&podman),
            Path::new("c"),
            Pruned(&VIEW),
        )
        .unwrap();
        assert!(whole["linux"].get("seccomp").is_some());
        assert!(
            pruned["linux"].get("seccomp").is_none(),
            "seccomp was built"
        );
        assert!(pruned.get("ociVersion").is_none());
        let v = parse_spec(br#"{"linux":{"CgroupsPath":"/c"}}"#, Path::new("c")).unwrap();
        assert_eq!(v.linux.cgroups_path.as_deref(), Some("/c"));
    }

    #[test]
    fn spec_view_ignores_unknown_fields() {
        let s = br#"{"ociVersion":"1.0","x-new":{"a":1},"process":{"env":["A=1"],"args":["sh"]},"linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}]}}"#;
        let v = parse_spec(s, Path::new("c")).unwrap();
        assert_eq!(v.process.env, vec!["A=1"]);
        assert_eq!(v.linux.devices[0].path, "/dev/nvidia0");
        assert!(parse_spec(b"[1]", Path::new("c")).is_err());
    }

    fn nested(levels: usize) -> String {
        format!("{}{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn configs_read_as_runc_reads_them() {
        let p = Path::new("c");
        let read = |text: &str| -> Result<Value, String> {
            deep_scope(text.as_bytes(), || parse_config(text.as_bytes(), p))
                .map_err(|e| crate::vocab::chain(&e))
        };
        // Rows: (what, input, Ok(expected JSON) or Err(part of the message)).
        let rows: Vec<(&str, String, Result<Value, &str>)> = vec![
            (
                "repeated object members merge",
                r#"{"annotations":{"a":"1","b":"1"},"x":1,"annotations":{"b":"2"}}"#.into(),
                Ok(serde_json::json!({"annotations":{"a":"1","b":"2"},"x":1})),
            ),
            (
                "repeated process merges, a repeated env replaces",
                r#"{"process":{"env":["A=1"],"cwd":"/"},"process":{"env":["B=2"]}}"#.into(),
                Ok(serde_json::json!({"process":{"env":["B=2"],"cwd":"/"}})),
            ),
            (
                "a later non-object replaces",
                r#"{"annotations":{"a":"1"},"annotations":null}"#.into(),
                Ok(serde_json::json!({})),
            ),
            (
                "keys matched without regard to case, merged in order",
                r#"{"Annotations":{"a":"1"},"annotations":{"b":"2"},"PROCESS":{"Env":["A=1"]}}"#
                    .into(),
                Ok(serde_json::json!({"annotations":{"a":"1","b":"2"},"process":{"env":["A=1"]}})),
            ),
            (
                "Kelvin sign and long s fold as Go folds them",
                "{\"proce\u{17f}s\":{\"env\":[\"A=1\"]}}".into(),
                Ok(serde_json::json!({"process":{"env":["A=1"]}})),
            ),
            (
                "unknown keys kept with their case",
                r#"{"X-Keep":{"Deep":[1]},"x-keep":2}"#.into(),
                Ok(serde_json::json!({"X-Keep":{"Deep":[1]},"x-keep":2})),
            ),
            (
                "trailing bytes are not read",
                r#"{"a":1} trailing"#.into(),
                Ok(serde_json::json!({"a":1})),
            ),
            (
                "invalid UTF-8 becomes U+FFFD",
                "{\"a\":\"x\u{fffd}\"}".into(),
                Ok(serde_json::json!({"a":"x\u{fffd}"})),
            ),
            ("not JSON", "{nope".into(), Err("not a valid OCI config")),
            ("empty", "".into(), Err("not a valid OCI config")),
        ];
        for (what, input, want) in rows {
            match (read(&input), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{what}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{what}: {got}"),
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
        let bad_utf8 = b"{\"a\":\"x\xff\"}";
        assert_eq!(
            parse_config(bad_utf8, p).unwrap(),
            serde_json::json!({"a":"x\u{fffd}"})
        );
    }

    #[test]
    fn nesting_depth_skips_strings_with_escaped_quotes() {
        assert_eq!(nesting_depth(br#"{"a":[[1]]}"#), 3);
        // The escaped quote does not end the string; the one after it does.
        assert_eq!(nesting_depth(br#"{"a":"x\"[[[[","b":[[1]]}"#), 3);
        assert_eq!(nesting_depth(br#"{"a":"x\\","b":[[1]]}"#), 3);
        // An unterminated string, a backslash as the last byte.
        assert_eq!(nesting_depth(br#"[[{"a":"[["#), 3);
        assert_eq!(nesting_depth(b"[[\"\\"), 2);
        assert_eq!(nesting_depth(b""), 0);
    }

    /// The depth as a byte-at-a-time reader of JSON's strings finds it: in or out of a string,
    /// after a backslash or not.
    fn depth_byte_by_byte(bytes: &[u8]) -> usize {
        let (mut depth, mut max, mut in_str, mut esc) = (0usize, 0usize, false, false);
        for &b in bytes {
            if in_str {
                match (esc, b) {
                    (true, _) => esc = false,
                    (false, b'\\') => esc = true,
                    (false, b'"') => in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'[' | b'{' => {
                    depth += 1;
                    max = max.max(depth);
                    if max > MAX_DEPTH {
                        return max;
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        max
    }

    /// The string-skipping scan gives what a byte-at-a-time reader gives: on the engines'
    /// configs, and on 200,000 strings of the bytes that matter (quotes, backslashes, brackets)
    /// and others, up to 40 bytes long, including their ends in the middle of a string or an
    /// escape.
    #[test]
    fn nesting_depth_is_what_a_byte_at_a_time_reader_finds() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        for f in [
            "podman-mps.json",
            "containerd-mps.json",
            "docker-env-mps.json",
        ] {
            let b = std::fs::read(fixtures.join(f)).unwrap();
            assert!(nesting_depth(&b) > 2, "{f}: positive control, it nests");
            assert_eq!(nesting_depth(&b), depth_byte_by_byte(&b), "{f}");
        }
        // `#` and `]` are one above `"` and `\`, 0xa2 and 0xdc (bytes of UTF-8) differ from them
        // in the high bit only: where a word-at-a-time search could go wrong.
        let alphabet = b"\"\\[]{}a #\xa2\xdc";
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut deep = 0;
        for _ in 0..200_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 41) as usize;
            let mut x = seed;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    alphabet[(x >> 33) as usize % alphabet.len()]
                })
                .collect();
            let want = depth_byte_by_byte(&bytes);
            deep += usize::from(want > 2);
            assert_eq!(
                nesting_depth(&bytes),
                want,
                "{:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
        assert!(deep > 1000, "positive control: the inputs nest ({deep})");
    }

    #[test]
    fn the_rootfs_is_root_path_absolute_or_under_the_bundle() {
        let spec = |j: &str| parse_spec(j.as_bytes(), Path::new("c")).unwrap();
        let b = Some(Path::new("/b"));
        let abs = spec(r#"{"root":{"path":"/r/fs"}}"#);
        assert_eq!(rootfs_of(&abs, b), Some(PathBuf::from("/r/fs")));
        assert_eq!(rootfs_of(&abs, None), Some(PathBuf::from("/r/fs")));
        let rel = spec(r#"{"root":{"path":"rootfs"}}"#);
        assert_eq!(rootfs_of(&rel, b), Some(PathBuf::from("/b/rootfs")));
        assert_eq!(
            rootfs_of(&rel, None),
            None,
            "relative, and no bundle to be under"
        );
        assert_eq!(rootfs_of(&spec("{}"), b), None, "no root");
    }

    #[test]
    fn every_scalar_is_read_as_written() {
        let v = parse_config(
            br#"{"t":true,"f":false,"n":-5,"u":7,"x":1.5,"s":"a","z":null}"#,
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"t":true,"f":false,"n":-5,"u":7,"x":1.5,"s":"a","z":null})
        );
    }

    #[test]
    fn nesting_up_to_go_limit_is_read_deeper_is_refused() {
        let p = Path::new("c");
        // 9,999 arrays in a member: 10,000 levels with the document itself, as deep as Go reads.
        let ok = format!(
            r#"{{"x":{},"annotations":{{"gpu.share":"mps"}}}}"#,
            nested(9_999)
        );
        assert_eq!(nesting_depth(ok.as_bytes()), MAX_DEPTH);
        let view = parse_spec(ok.as_bytes(), p).unwrap();
        assert_eq!(view.annotations["gpu.share"], "mps");
        let round = deep_scope(ok.as_bytes(), || -> Result<usize, InputError> {
            let v = parse_config(ok.as_bytes(), p)?;
            Ok(nesting_depth(&serde_json::to_vec(&v).unwrap()))
        })
        .unwrap();
        assert_eq!(round, MAX_DEPTH);
        let deep = format!(r#"{{"x":{}}}"#, nested(10_000));
        let e = parse_spec(deep.as_bytes(), p).unwrap_err().to_string();
        assert!(e.contains("deeper than 10000"), "{e}");
        // Brackets inside strings do not count.
        let s = format!(r#"{{"x":"{}\"[["}}"#, "[".repeat(20_000));
        assert_eq!(nesting_depth(s.as_bytes()), 1);
    }
}
