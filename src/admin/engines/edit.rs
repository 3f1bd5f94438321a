//! The editing every engine's files share: reading a file that may be missing, merging into
//! TOML with `toml_edit` (comments, order and layout kept), taking entries out again, JSON
//! written the way engines' files are, and shell quoting. Pure but for reading files.

use std::path::Path;

use serde_json::Value;
use toml_edit::{Array, DocumentMut, Item, Table};

use super::setup::{Change, ConfigureError, Edit};

/// The runtime handler's name in every engine's file.
pub const HANDLER: &str = "gpushare";

pub(super) fn read(path: &Path) -> Result<Option<String>, ConfigureError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigureError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

pub(super) fn change(path: &Path, before: Option<String>, after: String, mode: u32) -> Change {
    Change {
        path: path.to_owned(),
        before,
        after,
        mode,
    }
}

/// A TOML file to merge into, and the text to keep in front of it: a file of only comments
/// keeps them as a header (toml_edit would put new tables in front of them).
pub(super) fn parse_toml(path: &Path, text: &str) -> Result<(DocumentMut, String), ConfigureError> {
    let doc = text
        .parse::<DocumentMut>()
        .map_err(|source| ConfigureError::Toml {
            path: path.to_owned(),
            source,
        })?;
    if doc.as_table().is_empty() && !text.trim().is_empty() {
        let mut header = text.trim_end().to_owned();
        header.push('\n');
        return Ok((DocumentMut::new(), header));
    }
    Ok((doc, String::new()))
}

/// The table at `keys` under `root`, made (as a standard table, dotted parents implicit) when
/// missing.
pub(super) fn table_at<'a>(
    root: &'a mut Table,
    keys: &[&str],
    path: &Path,
) -> Result<&'a mut Table, ConfigureError> {
    let mut cur = root;
    for (i, k) in keys.iter().enumerate() {
        let last = i + 1 == keys.len();
        let item = cur.entry(k).or_insert_with(|| {
            let mut t = Table::new();
            t.set_implicit(!last);
            Item::Table(t)
        });
        if let Some(inline) = item.as_inline_table() {
            *item = Item::Table(inline.clone().into_table());
        }
        cur = item.as_table_mut().ok_or_else(|| ConfigureError::Shape {
            path: path.to_owned(),
            key: keys[..=i].join("."),
            want: "table",
        })?;
    }
    Ok(cur)
}

/// Sets `key` to the string `v` unless it already is (so an unchanged file stays byte for byte).
pub(super) fn set_str(t: &mut Table, key: &str, v: &str) {
    if t.get(key).and_then(Item::as_str) != Some(v) {
        t.insert(key, toml_edit::value(v));
    }
}

/// Makes `key` an array holding every one of `vals` (after what it holds, or `initial` when it
/// is missing).
pub(super) fn ensure_in_array(
    t: &mut Table,
    key: &str,
    initial: &[&str],
    vals: &[&str],
    path: &Path,
) -> Result<(), ConfigureError> {
    let a = array_mut(t, key, initial, path)?;
    for v in vals {
        if !a.iter().any(|x| x.as_str() == Some(v)) {
            a.push(*v);
        }
    }
    Ok(())
}

/// The array `key` of `t`, made from `initial` when missing.
///
/// # Errors
/// [`ConfigureError::Shape`] when `key` holds something else.
pub(super) fn array_mut<'t>(
    t: &'t mut Table,
    key: &str,
    initial: &[&str],
    path: &Path,
) -> Result<&'t mut Array, ConfigureError> {
    if !t.contains_key(key) {
        t.insert(
            key,
            toml_edit::value(initial.iter().copied().collect::<Array>()),
        );
    }
    t.get_mut(key)
        .and_then(Item::as_array_mut)
        .ok_or_else(|| ConfigureError::Shape {
            path: path.to_owned(),
            key: key.to_owned(),
            want: "array",
        })
}

/// Puts `v` first in the array `key` (removing it from further down), unless it is first.
pub(super) fn put_first(
    t: &mut Table,
    key: &str,
    v: &str,
    rest: &[&str],
    path: &Path,
) -> Result<(), ConfigureError> {
    let a = array_mut(t, key, rest, path)?;
    if a.get(0).and_then(|x| x.as_str()) != Some(v) {
        a.retain(|x| x.as_str() != Some(v));
        a.insert(0, v);
        a.fmt();
    }
    Ok(())
}

pub(super) fn finish_toml(
    path: &Path,
    before: Option<String>,
    header: &str,
    doc: &DocumentMut,
) -> Change {
    let after = format!("{header}{doc}");
    change(path, before, after, 0o644)
}

/// Sets `key` of `t` to the value `v` unless it already holds that value (compared without
/// formatting, so that a second run leaves the file byte for byte).
pub(super) fn copy_value(t: &mut Table, key: &str, v: &Item) {
    let same = match (t.get(key).and_then(Item::as_value), v.as_value()) {
        (Some(a), Some(b)) => a.to_string().trim() == b.to_string().trim(),
        _ => false,
    };
    if !same {
        if let Some(val) = v.as_value() {
            let mut val = val.clone();
            val.decor_mut().clear();
            t.insert(key, Item::Value(val));
        }
    }
}

/// Shell single quoting.
pub(super) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

pub(super) fn unchanged(path: &Path, text: String) -> Edit {
    Edit::Write(Change {
        path: path.to_owned(),
        before: Some(text.clone()),
        after: text,
        mode: 0o644,
    })
}

/// The standard or inline table at `keys`, if there is one.
pub(super) fn table<'a>(root: &'a mut Table, keys: &[&str]) -> Option<&'a mut Table> {
    let mut cur = root;
    for k in keys {
        cur = cur.get_mut(k)?.as_table_mut()?;
    }
    Some(cur)
}

pub(super) fn str_at<'a>(t: &'a dyn toml_edit::TableLike, key: &str) -> Option<&'a str> {
    t.get(key).and_then(Item::as_str)
}

/// Removes `HANDLER` from the table `key` of `t` when `ours` says it is gpushare's; an emptied
/// `key` goes too.
pub(super) fn remove_runtime(
    t: &mut Table,
    key: &str,
    ours: impl Fn(&dyn toml_edit::TableLike) -> bool,
) {
    let Some(r) = t.get_mut(key).and_then(Item::as_table_like_mut) else {
        return;
    };
    if r.get(HANDLER)
        .and_then(Item::as_table_like)
        .is_some_and(ours)
    {
        r.remove(HANDLER);
    }
    if r.is_empty() {
        t.remove(key);
    }
}

/// Takes `ours` out of the array `key`; when what is left is exactly `defaults` (what
/// configure put there to keep the engine's defaults), the key goes.
pub(super) fn remove_dirs(t: &mut Table, key: &str, ours: &[&Path], defaults: &[&str]) {
    let Some(a) = t.get_mut(key).and_then(Item::as_array_mut) else {
        return;
    };
    let ours: Vec<String> = ours
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| !defaults.contains(&p.as_str()))
        .collect();
    a.retain(|v| v.as_str().is_none_or(|s| !ours.iter().any(|o| o == s)));
    let left: Vec<&str> = a.iter().filter_map(|v| v.as_str()).collect();
    // Nothing left, or just the engine's own defaults: the key goes, and the engine's default
    // list is back (an empty list would mean no hooks at all).
    if left.is_empty() || left == defaults {
        t.remove(key);
    }
}

pub(super) fn remove_from_array(t: &mut Table, key: &str, ours: impl Fn(&str) -> bool) {
    if let Some(a) = t.get_mut(key).and_then(Item::as_array_mut) {
        a.retain(|v| v.as_str().is_none_or(|s| !ours(s)));
        a.fmt();
    }
}

/// Whether a TOML document holds no value at all (only empty tables).
pub(super) fn is_empty(t: &dyn toml_edit::TableLike) -> bool {
    t.iter().all(|(_, v)| match v {
        Item::Table(t) => is_empty(t),
        Item::Value(toml_edit::Value::InlineTable(t)) => is_empty(t),
        Item::None => true,
        _ => false,
    })
}

/// A TOML file of gpushare's (a drop-in): edited by `f`, deleted when nothing is left.
pub(super) fn toml_file(
    path: &Path,
    f: impl FnOnce(&mut DocumentMut),
) -> Result<Option<Edit>, ConfigureError> {
    Ok(match toml_edit_only(path, f)? {
        Some(Edit::Write(c))
            if c.changes()
                && is_empty(
                    c.after
                        .parse::<DocumentMut>()
                        .expect("printed TOML parses")
                        .as_table(),
                ) =>
        {
            Some(Edit::Delete {
                path: c.path,
                before: c.before.unwrap_or_default(),
            })
        }
        other => other,
    })
}

/// A TOML file edited by `f`; kept byte for byte when `f` changes nothing.
pub(super) fn toml_edit_only(
    path: &Path,
    f: impl FnOnce(&mut DocumentMut),
) -> Result<Option<Edit>, ConfigureError> {
    let Some(text) = read(path)? else {
        return Ok(None);
    };
    let mut doc = text
        .parse::<DocumentMut>()
        .map_err(|source| ConfigureError::Toml {
            path: path.to_owned(),
            source,
        })?;
    let was = doc.to_string();
    f(&mut doc);
    let now = doc.to_string();
    if now == was {
        return Ok(Some(unchanged(path, text)));
    }
    Ok(Some(Edit::Write(Change {
        path: path.to_owned(),
        before: Some(text),
        after: now,
        mode: 0o644,
    })))
}

/// A JSON file's text as it is, parsed (an empty or missing file is an empty object).
///
/// # Errors
/// [`ConfigureError::Json`] when it does not parse.
pub(super) fn parse_json(path: &Path, text: &str) -> Result<Value, ConfigureError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_str(text).map_err(|source| ConfigureError::Json {
        path: path.to_owned(),
        source,
    })
}

/// `v` as engines' JSON files are written: pretty, with a final newline.
pub(super) fn json_text(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("JSON value serialises");
    s.push('\n');
    s
}
