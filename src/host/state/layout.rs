//! The record's bytes (layout 3). The record's file, `gpus/<uuid>.json`: a header line,
//! `{"version":3,"uuid":…,"index":…,"restore_compute_mode":…,"domains":{…},"tally":{…},
//! "base":{"file":…,"bytes":…},"bytes":N}`, then `N` bytes of client lines
//! ([`super::clients`]). With no `base`, those lines are every client. With one, every client
//! as of the last fold is in the base file it names (`gpus/<uuid>.<stamp>.lines`, written once
//! and never changed), and the lines here are the changes since: a client's line as it now is,
//! `["<id>",null]` for one removed. A save writes the record's file alone (the changes, a few
//! KiB at most) until the changes outgrow [`super::clients::CHANGES_MAX`]; then it writes a new
//! base first and the record's file naming it second, so that the rename of the record's file
//! is the one moment the change happens, whatever else a crash leaves. Layout 2 (one object
//! with a `clients` map, written before the lines) is still read, and written as layout 3 by
//! the next save.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::clients::{BaseOut, Client, Clients, Tally};
use super::record::{Domain, Record, RECORD_VERSION};
use crate::vocab::ComputeMode;

/// The layout before the clients' lines, still read.
const LAYOUT_MAP: u32 = 2;

/// What a record file's bytes say is wrong with them.
#[derive(Debug)]
pub enum Problem {
    Json(serde_json::Error),
    Version(u32),
    /// The base file named cannot be read (gone: a fold that raced an unlocked read).
    Base(String, std::io::Error),
}

fn problem(msg: impl std::fmt::Display) -> Problem {
    Problem::Json(<serde_json::Error as serde::de::Error>::custom(msg))
}

/// A base file as the header names it.
#[derive(Serialize, Deserialize)]
struct BaseRef {
    file: String,
    bytes: u64,
}

#[derive(Serialize)]
struct HeadOut<'a> {
    version: u32,
    uuid: &'a str,
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    restore_compute_mode: Option<ComputeMode>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    domains: &'a BTreeMap<String, Domain>,
    tally: &'a Tally,
    #[serde(skip_serializing_if = "Option::is_none")]
    base: Option<BaseRef>,
    bytes: usize,
}

#[derive(Deserialize)]
struct HeadIn {
    uuid: String,
    index: u32,
    #[serde(default)]
    restore_compute_mode: Option<ComputeMode>,
    #[serde(default)]
    domains: BTreeMap<String, Domain>,
    #[serde(default)]
    tally: Option<Tally>,
    #[serde(default)]
    base: Option<BaseRef>,
    #[serde(default)]
    bytes: Option<u64>,
    /// Layout 2's clients.
    #[serde(default)]
    clients: Option<BTreeMap<String, Client>>,
}

#[derive(Deserialize)]
struct Version {
    version: u32,
}

/// What a save writes.
pub struct Encoding<'a> {
    /// The record's file: the header line, then these lines.
    pub head: Vec<u8>,
    pub lines: Cow<'a, [u8]>,
    /// A new base file to write first: its name and bytes.
    pub new_base: Option<(String, Vec<u8>)>,
    /// The base file the header names.
    pub base: Option<String>,
}

/// A base file's name for GPU `uuid`: `<uuid>.<stamp>.lines`, the stamp 16 hex digits.
pub fn base_name(uuid: &str, stamp: u64) -> String {
    format!("{uuid}.{stamp:016x}.lines")
}

/// Whether `name` is one of GPU `uuid`'s base files.
pub fn is_base_of(name: &str, uuid: &str) -> bool {
    name.strip_prefix(uuid)
        .and_then(|r| r.strip_prefix('.'))
        .and_then(|r| r.strip_suffix(".lines"))
        .is_some_and(|stamp| stamp.len() == 16 && stamp.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The bytes of `rec`; a new base is named with `stamp` (see [`base_name`]). With
/// `base_gone`, the base `rec` was read with is written anew from the bytes read (a save this
/// one undoes removed it).
pub fn encode(rec: &Record, stamp: u64, base_gone: bool) -> Encoding<'_> {
    let enc = rec.clients.encoded();
    let base = match enc.base {
        BaseOut::Keep(..) if base_gone => BaseOut::New(rec.clients.base_bytes().to_vec()),
        other => other,
    };
    let (named, new_base) = match base {
        BaseOut::None => (None, None),
        BaseOut::Keep(file, bytes) => (
            Some(BaseRef {
                file: file.to_owned(),
                bytes: bytes as u64,
            }),
            None,
        ),
        BaseOut::New(bytes) => {
            let file = base_name(&rec.uuid, stamp);
            (
                Some(BaseRef {
                    file: file.clone(),
                    bytes: bytes.len() as u64,
                }),
                Some((file, bytes)),
            )
        }
    };
    let base = named.as_ref().map(|b| b.file.clone());
    let mut head = serde_json::to_vec(&HeadOut {
        version: RECORD_VERSION,
        uuid: &rec.uuid,
        index: rec.index,
        restore_compute_mode: rec.restore_compute_mode,
        domains: &rec.domains,
        tally: &enc.tally,
        base: named,
        bytes: enc.changes.len(),
    })
    .expect("record header serialises");
    head.push(b'\n');
    Encoding {
        head,
        lines: enc.changes,
        new_base,
        base,
    }
}

/// Checks that `lines` are `bytes` long and end a line.
fn measured(lines: &[u8], bytes: u64, what: &str) -> Result<(), Problem> {
    if lines.len() as u64 != bytes {
        return Err(problem(format_args!(
            "the header says {bytes} bytes of {what}, there are {}",
            lines.len()
        )));
    }
    if !lines.is_empty() && !lines.ends_with(b"\n") {
        return Err(problem(format_args!(
            "the last line of {what} is cut short"
        )));
    }
    Ok(())
}

/// Reads a record from its file's bytes, and the base file it names with `read_base`. Its
/// clients are parsed when first asked for; the lines are only measured against the header
/// here (see [`Clients::check`] for the rest).
pub fn decode(
    buf: Vec<u8>,
    read_base: impl FnOnce(&str) -> std::io::Result<Vec<u8>>,
) -> Result<Record, Problem> {
    let mut first = serde_json::Deserializer::from_slice(&buf).into_iter::<Version>();
    let version = match first.next() {
        Some(Ok(v)) => v.version,
        Some(Err(e)) => return Err(Problem::Json(e)),
        None => return Err(problem("the file is empty")),
    };
    let end = first.byte_offset();
    if version != RECORD_VERSION && version != LAYOUT_MAP {
        return Err(Problem::Version(version));
    }
    let head: HeadIn = serde_json::from_slice(&buf[..end]).map_err(Problem::Json)?;
    let clients = if version == LAYOUT_MAP {
        let map = head
            .clients
            .ok_or_else(|| problem("missing field `clients`"))?;
        if buf[end..].iter().any(|b| !b.is_ascii_whitespace()) {
            return Err(problem("trailing bytes after the record"));
        }
        Clients::from_map(map)
    } else {
        let (Some(tally), Some(bytes)) = (head.tally, head.bytes) else {
            return Err(problem("the header has no `tally` or `bytes`"));
        };
        if buf.get(end) != Some(&b'\n') {
            return Err(problem("no line break after the header"));
        }
        measured(&buf[end + 1..], bytes, "client lines")?;
        let (base_name, base) = match head.base {
            None => (None, Vec::new()),
            Some(b) => {
                if !is_base_of(&b.file, &head.uuid) {
                    return Err(problem(format_args!(
                        "the header names {:?}, not a base file of {}",
                        b.file, head.uuid
                    )));
                }
                let bytes = read_base(&b.file).map_err(|e| Problem::Base(b.file.clone(), e))?;
                measured(&bytes, b.bytes, &b.file)?;
                (Some(b.file), bytes)
            }
        };
        // The changes are kept in the buffer they were read into: no copy of their own. That
        // the lines are the clients the tally counts is checked by a full read.
        Clients::stored(base_name, base, buf, end + 1, tally)
    };
    Ok(Record {
        version: RECORD_VERSION,
        uuid: head.uuid,
        index: head.index,
        restore_compute_mode: head.restore_compute_mode,
        domains: head.domains,
        clients,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::Mode;

    /// A record as layout 2 stored it (one object, written by serde from the record's fields).
    const LAYOUT_2: &str = r#"{"version":2,"uuid":"GPU-1","index":1,"restore_compute_mode":"EXCLUSIVE_PROCESS","domains":{"gpu":{"daemon":{"process":{"pid":10,"start_time":20}},"limits":{"cores":50,"memory_mib":1024},"uid":0,"reserved":{"pending-x":1700000000}}},"clients":{"c2":{"mode":"mps","process":null,"cores":30,"memory":null,"domain":"gpu","cap":{"bytes":536870912,"backend":"limiter","why":"no cgroup v2"}},"c1":{"mode":"mps","process":{"pid":11,"start_time":21},"cores":50,"memory":1073741824,"domain":"gpu","kube":{"namespace":"ns","pod":"p","container":"main"}}}}"#;

    fn decoded(bytes: &[u8]) -> Result<Record, Problem> {
        decode(bytes.to_vec(), |name| {
            Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                name.to_owned(),
            ))
        })
    }

    #[test]
    fn a_layout_2_record_is_read_and_saved_as_layout_3() {
        let old = decoded(LAYOUT_2.as_bytes()).expect("layout 2 reads");
        assert_eq!(old.uuid, "GPU-1");
        assert_eq!(old.index, 1);
        assert_eq!(
            old.restore_compute_mode,
            Some(ComputeMode::ExclusiveProcess)
        );
        assert_eq!(old.domains["gpu"].reserved["pending-x"], 1_700_000_000);
        assert_eq!(old.clients.keys().collect::<Vec<_>>(), ["c1", "c2"]);
        assert_eq!(old.clients["c1"].kube.pod.as_deref(), Some("p"));
        assert_eq!(
            old.clients["c2"].cap.as_ref().map(|k| k.bytes),
            Some(512 << 20)
        );
        let Encoding {
            head,
            lines,
            new_base,
            ..
        } = encode(&old, 1, false);
        assert!(new_base.is_none(), "two clients are kept inline");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&head),
            String::from_utf8_lossy(&lines)
        );
        let mut rows = text.lines();
        let header: serde_json::Value = serde_json::from_str(rows.next().unwrap()).unwrap();
        assert_eq!(header["version"], 3, "{text}");
        assert_eq!(header["bytes"], lines.len(), "{text}");
        assert_eq!(header["tally"]["count"], 2, "{text}");
        assert_eq!(header["tally"]["mps"], 2, "{text}");
        assert_eq!(header["tally"]["domains"]["gpu"], 2, "{text}");
        assert_eq!(header["tally"]["capped_bytes"], 512 << 20, "{text}");
        assert_eq!(header["tally"]["uncapped"], 1, "{text}");
        assert!(header.get("clients").is_none(), "{text}");
        let ids: Vec<String> = rows
            .map(|l| {
                serde_json::from_str::<(String, serde_json::Value)>(l)
                    .unwrap()
                    .0
            })
            .collect();
        assert_eq!(ids, ["c1", "c2"], "one line per client, by id");
        let new = decoded(text.as_bytes()).expect("layout 3 reads");
        assert_eq!(new, old);
        assert_eq!(new.clients.check(), Ok(()));
        assert_eq!(new.version, RECORD_VERSION);
    }

    #[test]
    fn a_file_whose_header_and_lines_disagree_is_refused() {
        let mut rec = Record::new("GPU-1", 0);
        rec.clients
            .insert("a".into(), Client::plain(Mode::Limit, None, 100));
        let Encoding { head, lines, .. } = encode(&rec, 1, false);
        let head = String::from_utf8(head).unwrap();
        let lines = String::from_utf8(lines.into_owned()).unwrap();
        assert!(
            decoded(format!("{head}{lines}").as_bytes()).is_ok(),
            "as written"
        );
        let rows = [
            (
                "cut short",
                format!("{head}{}", &lines[..lines.len() - 3]),
                "bytes",
            ),
            ("a line more", format!("{head}{lines}{lines}"), "bytes"),
            (
                "the last line cut short, the size kept",
                format!("{head} {}", lines.trim_end()),
                "cut short",
            ),
            (
                "no line break after the header",
                format!("{}{lines}", head.trim_end()),
                "line break",
            ),
            (
                "no tally",
                format!(
                    "{}\n{lines}",
                    head.trim_end().replace("\"tally\"", "\"other\"")
                ),
                "tally",
            ),
            ("empty", String::new(), "empty"),
            (
                "a layout 2 with bytes after it",
                format!("{LAYOUT_2}x"),
                "trailing",
            ),
        ];
        for (what, bytes, says) in rows {
            match decoded(bytes.as_bytes()) {
                Err(Problem::Json(e)) => assert!(e.to_string().contains(says), "{what}: {e}"),
                other => panic!("{what}: {other:?}"),
            }
        }
        // Lines that do not add up to the tally, the size kept: read (an acquire carries them),
        // and named by a full read.
        let two = format!("{lines}{lines}").replacen("[\"a\"", "[\"0\"", 1);
        let mut head2: serde_json::Value = serde_json::from_str(head.trim_end()).unwrap();
        head2["bytes"] = two.len().into();
        let carried = decoded(format!("{head2}\n{two}").as_bytes()).expect("read lazily");
        let err = carried.clients.check().unwrap_err();
        assert!(err.contains("does not add up"), "{err}");
        for version in [1, 4] {
            let other = head.replacen("\"version\":3", &format!("\"version\":{version}"), 1);
            assert!(
                matches!(decoded(format!("{other}{lines}").as_bytes()), Err(Problem::Version(v)) if v == version),
                "{version}"
            );
        }
    }

    #[test]
    fn many_clients_go_to_a_base_file_the_header_names() {
        let mut rec = Record::new("GPU-1", 0);
        for i in 0..100 {
            rec.clients.insert(
                format!("container-{i:03}-{}", "f".repeat(40)),
                Client::plain(Mode::Limit, None, 100),
            );
        }
        let enc = encode(&rec, 0xabc, false);
        let (name, base) = enc.new_base.clone().expect("a base of its own");
        assert_eq!(name, "GPU-1.0000000000000abc.lines");
        assert!(is_base_of(&name, "GPU-1") && !is_base_of(&name, "GPU-2"));
        assert!(enc.lines.is_empty(), "no changes since");
        let file = [enc.head.clone(), enc.lines.to_vec()].concat();
        let header: serde_json::Value = serde_json::from_slice(&file[..file.len() - 1]).unwrap();
        assert_eq!(header["base"]["file"], name.as_str());
        assert_eq!(header["base"]["bytes"], base.len());
        let read = |bytes: Vec<u8>| {
            let name = name.clone();
            move |asked: &str| {
                assert_eq!(asked, name);
                Ok(bytes)
            }
        };
        let back = decode(file.clone(), read(base.clone())).expect("reads with its base");
        assert_eq!(back, rec);
        assert_eq!(back.clients.check(), Ok(()));
        // A change since, to a record read afresh (not parsed): the record's file alone.
        let mut changed = decode(file.clone(), read(base.clone())).unwrap();
        changed
            .clients
            .remove("container-007-ffffffffffffffffffffffffffffffffffffffff");
        let enc2 = encode(&changed, 0xdef, false);
        assert!(enc2.new_base.is_none(), "the base is kept");
        assert!(String::from_utf8_lossy(&enc2.lines).ends_with(",null]\n"));
        let file2 = [enc2.head.clone(), enc2.lines.to_vec()].concat();
        let back2 = decode(file2, read(base.clone())).unwrap();
        assert_eq!(back2.clients.len(), 99);
        assert_eq!(back2, changed);
        // The base as named but gone, cut short, or a name that is not a base of this GPU.
        match decoded(&file) {
            Err(Problem::Base(n, e)) => {
                assert_eq!(
                    (n.as_str(), e.kind()),
                    (name.as_str(), std::io::ErrorKind::NotFound)
                )
            }
            other => panic!("{other:?}"),
        }
        let short = base[..base.len() - 1].to_vec();
        assert!(matches!(
            decode(file.clone(), read(short)),
            Err(Problem::Json(_))
        ));
        let elsewhere = String::from_utf8(file.clone())
            .unwrap()
            .replace(&name, "../../etc/passwd");
        match decode(elsewhere.into_bytes(), |_| panic!("not read")) {
            Err(Problem::Json(e)) => assert!(e.to_string().contains("not a base file"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
