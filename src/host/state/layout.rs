//! The record file's bytes. Layout 3: a header line, `{"version":3,"uuid":…,"index":…,
//! "restore_compute_mode":…,"domains":{…},"tally":{…},"bytes":N}`, then the clients' lines
//! ([`super::clients`]), `N` bytes of them. Layout 2 (one JSON object with a `clients` map,
//! written before the lines) is still read, and written as layout 3 by the next save.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::clients::{Client, Clients, Tally};
use super::record::{Domain, Record, RECORD_VERSION};
use crate::vocab::ComputeMode;

/// The layout before the clients' lines, still read.
const LAYOUT_MAP: u32 = 2;

/// What a record file's bytes say is wrong with them.
#[derive(Debug)]
pub enum Problem {
    Json(serde_json::Error),
    Version(u32),
}

fn problem(msg: impl std::fmt::Display) -> Problem {
    Problem::Json(<serde_json::Error as serde::de::Error>::custom(msg))
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
    bytes: Option<u64>,
    /// Layout 2's clients.
    #[serde(default)]
    clients: Option<BTreeMap<String, Client>>,
}

#[derive(Deserialize)]
struct Version {
    version: u32,
}

/// The header and the clients' lines of `rec`, to be written one after the other.
pub fn encode(rec: &Record) -> (Vec<u8>, Cow<'_, [u8]>) {
    let (lines, tally) = rec.clients.encoded();
    let mut head = serde_json::to_vec(&HeadOut {
        version: RECORD_VERSION,
        uuid: &rec.uuid,
        index: rec.index,
        restore_compute_mode: rec.restore_compute_mode,
        domains: &rec.domains,
        tally: &tally,
        bytes: lines.len(),
    })
    .expect("record header serialises");
    head.push(b'\n');
    (head, lines)
}

/// Reads a record from its file's bytes. Its clients are parsed when first asked for; the
/// lines are only measured against the header here (see [`Clients::check`] for the rest).
pub fn decode(buf: Vec<u8>) -> Result<Record, Problem> {
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
        let lines = &buf[end + 1..];
        if lines.len() as u64 != bytes {
            return Err(problem(format_args!(
                "the header says {bytes} bytes of client lines, the file has {}",
                lines.len()
            )));
        }
        if !lines.is_empty() && !lines.ends_with(b"\n") {
            return Err(problem("the last client line is cut short"));
        }
        // Kept in the buffer they were read into: no copy of their own. That they are the
        // clients the tally counts is checked by a full read ([`Clients::check`]).
        Clients::from_buffer(buf, end + 1, tally)
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
        decode(bytes.to_vec())
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
        let (head, lines) = encode(&old);
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
        rec.clients.insert(
            "a".into(),
            Client {
                mode: Mode::Limit,
                process: None,
                cores: 100,
                memory: None,
                domain: None,
                kube: Default::default(),
                cap: None,
            },
        );
        let (head, lines) = encode(&rec);
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
}
