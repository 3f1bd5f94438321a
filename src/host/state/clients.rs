//! A GPU's clients: each [`Client`] (a container using the GPU), and the [`Clients`] of a GPU
//! as its record stores them ([`super::layout`]): one line each, `["<id>",{…}]`, sorted by
//! id, either all after the record's header line or in a base file with the changes since
//! after the header line, and their [`Tally`] in the header (how many there are in each mode
//! and isolation domain, and what memory caps they hold). The tally is all an acquire needs to
//! know of the others, so an acquire that adds or replaces one client finds its place by the
//! ids at the lines' starts and carries the other lines as bytes: they are parsed only when
//! something asks for them (a listing, a liveness check, the names in a refusal). With a base,
//! a save writes the changes alone, so neither what an acquire reads and parses nor what it
//! writes grows with the number of clients, but the base it reads.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut, Range};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use crate::decide::kube::KubeLabels;
use crate::host::procinfo::ProcId;
use crate::vocab::memcap::Backend;
use crate::vocab::Mode;

/// One container using a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Client {
    pub mode: Mode,
    /// The container's init process; `None` when the runtime gave no pid (then the client is
    /// only dropped by poststop).
    pub process: Option<ProcId>,
    pub cores: u8,
    pub memory: Option<u64>,
    /// `mps`: the key of the isolation domain it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// The container's Kubernetes names, when a CRI engine gave them (for metrics).
    #[serde(default, skip_serializing_if = "KubeLabels::is_empty")]
    pub kube: KubeLabels,
    /// Its memory cap for the whole container, and what enforces it (`None`: uncapped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<Cap>,
}

impl Client {
    /// A client of `mode` with `cores`, and no memory, domain, Kubernetes names or cap.
    pub fn plain(mode: Mode, process: Option<ProcId>, cores: u8) -> Self {
        Self {
            mode,
            process,
            cores,
            memory: None,
            domain: None,
            kube: KubeLabels::default(),
            cap: None,
        }
    }
}

/// A container's memory cap on one GPU (all its processes together) and what enforces it.
/// Stored flat (`{"bytes":…,"backend":…,"cgroup":…,"why":…}`), written and read field by field:
/// serde's `flatten` buffered every client's cap through a generic map, in every record load
/// and save.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "CapFields")]
pub struct Cap {
    pub bytes: u64,
    pub enforcement: crate::vocab::memcap::Enforcement,
}

/// [`Cap`] as stored.
#[derive(Deserialize)]
struct CapFields {
    bytes: u64,
    backend: crate::vocab::memcap::Backend,
    #[serde(default)]
    cgroup: Option<String>,
    #[serde(default)]
    why: Option<String>,
}

impl From<CapFields> for Cap {
    fn from(f: CapFields) -> Self {
        Self {
            bytes: f.bytes,
            enforcement: crate::vocab::memcap::Enforcement {
                backend: f.backend,
                cgroup: f.cgroup,
                why: f.why,
            },
        }
    }
}

impl Serialize for Cap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Fields<'a> {
            bytes: u64,
            backend: &'a crate::vocab::memcap::Backend,
            #[serde(skip_serializing_if = "Option::is_none")]
            cgroup: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            why: Option<&'a str>,
        }
        let e = &self.enforcement;
        Fields {
            bytes: self.bytes,
            backend: &e.backend,
            cgroup: e.cgroup.as_deref(),
            why: e.why.as_deref(),
        }
        .serialize(s)
    }
}

/// What the header says of the clients.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// How many there are.
    pub count: u64,
    /// How many there are in each mode.
    pub mps: u64,
    pub timeslice: u64,
    pub limit: u64,
    /// How many each MPS isolation domain has (none listed with 0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub domains: BTreeMap<String, u64>,
    /// Their memory caps added up, bytes (exact: no sum of u64 caps reaches u128's end).
    pub capped_bytes: u128,
    /// How many have no cap.
    pub uncapped: u64,
    /// How many have a cap the driver enforces on their cgroup.
    pub driver_caps: u64,
}

impl Tally {
    /// The tally of `clients`.
    pub fn of<'a>(clients: impl IntoIterator<Item = &'a Client>) -> Self {
        let mut t = Self::default();
        for c in clients {
            t.add(c);
        }
        t
    }

    fn mode(&mut self, m: Mode) -> &mut u64 {
        match m {
            Mode::Mps => &mut self.mps,
            Mode::Timeslice => &mut self.timeslice,
            Mode::Limit => &mut self.limit,
        }
    }

    fn add(&mut self, c: &Client) {
        self.count += 1;
        *self.mode(c.mode) += 1;
        if let Some(d) = &c.domain {
            *self.domains.entry(d.clone()).or_default() += 1;
        }
        match &c.cap {
            Some(k) => {
                self.capped_bytes += u128::from(k.bytes);
                if driver_cap(c) {
                    self.driver_caps += 1;
                }
            }
            None => self.uncapped += 1,
        }
    }

    /// Takes away a client [`Tally::add`] counted.
    fn remove(&mut self, c: &Client) {
        let less = |n: &mut u64| *n = n.saturating_sub(1);
        less(&mut self.count);
        less(self.mode(c.mode));
        if let Some(d) = &c.domain {
            if let Some(n) = self.domains.get_mut(d) {
                less(n);
                if *n == 0 {
                    self.domains.remove(d);
                }
            }
        }
        match &c.cap {
            Some(k) => {
                self.capped_bytes = self.capped_bytes.saturating_sub(u128::from(k.bytes));
                if driver_cap(c) {
                    less(&mut self.driver_caps);
                }
            }
            None => less(&mut self.uncapped),
        }
    }
}

/// Whether the driver enforces the client's cap on a cgroup (which no other client may share).
fn driver_cap(c: &Client) -> bool {
    c.cap
        .as_ref()
        .is_some_and(|k| k.enforcement.backend == Backend::Driver && k.enforcement.cgroup.is_some())
}

/// Change lines above this many bytes are folded into a new base at the next save.
pub(super) const CHANGES_MAX: usize = 8 << 10;

/// Clients whose lines take up to this many bytes are kept in the record's file itself, with
/// no base file.
pub(super) const INLINE_MAX: usize = 8 << 10;

/// The clients parsed from their lines, and what was wrong with the lines, if anything.
#[derive(Debug, Clone, Default)]
struct Parsed {
    map: BTreeMap<String, Client>,
    error: Option<String>,
}

/// Stored lines, sorted by id, each ending in `\n`: the bytes from `start` on in a buffer they
/// were read into (shared by clones, so a record kept to roll back to costs no copy).
#[derive(Clone, Default)]
struct Lines {
    buf: Arc<Vec<u8>>,
    start: usize,
}

impl Lines {
    fn new(buf: Vec<u8>, start: usize) -> Self {
        Self {
            buf: Arc::new(buf),
            start,
        }
    }

    fn bytes(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }

    /// The lines with `range` replaced by `with`, in one copy into a buffer of their own.
    fn replace(&mut self, range: Range<usize>, with: &[u8]) {
        let old = self.bytes();
        let mut new = Vec::with_capacity(old.len() - range.len() + with.len());
        new.extend_from_slice(&old[..range.start]);
        new.extend_from_slice(with);
        new.extend_from_slice(&old[range.end..]);
        *self = Self::new(new, 0);
    }
}

/// What a save writes of the clients.
pub(super) struct Encoded<'a> {
    /// The lines in the record's own file: the changes since the base (a removed client's
    /// line says `null`), or every client when there is no base.
    pub changes: Cow<'a, [u8]>,
    pub base: BaseOut<'a>,
    pub tally: Cow<'a, Tally>,
}

/// The base file a save leaves the record naming.
pub(super) enum BaseOut<'a> {
    None,
    /// The one it was read with (named, `bytes` long).
    Keep(&'a str, usize),
    /// A new one, with these lines.
    New(Vec<u8>),
}

/// A GPU's clients by container id: a map to whoever reads them, the stored lines to an
/// acquire. See the module's documentation.
#[derive(Clone)]
pub struct Clients {
    /// The base: every client as of the last fold, in a file the record names and nothing
    /// ever changes (empty when there is none).
    base: Lines,
    base_name: Option<String>,
    /// The changes since: a client's line as it now is, `null` for one removed from the base.
    changes: Lines,
    /// The tally of the clients (the base with the changes made).
    tally: Tally,
    /// Whether the lines and `tally` still say what the clients are: false once the map was
    /// changed (then the map does, and the lines are written from it).
    lines_valid: bool,
    parsed: OnceLock<Parsed>,
}

impl Default for Clients {
    fn default() -> Self {
        Self::from_lines(Vec::new(), Tally::default())
    }
}

impl Clients {
    /// Clients from their stored lines (no base) and the tally the header gave them; parsed
    /// when first asked for.
    pub(super) fn from_lines(lines: Vec<u8>, tally: Tally) -> Self {
        Self::stored(None, Vec::new(), lines, 0, tally)
    }

    /// Clients as stored: the base file `base_name` holding `base`, and the change lines from
    /// `start` on in `changes`, with the header's tally.
    pub(super) fn stored(
        base_name: Option<String>,
        base: Vec<u8>,
        changes: Vec<u8>,
        start: usize,
        tally: Tally,
    ) -> Self {
        Self {
            base: Lines::new(base, 0),
            base_name,
            changes: Lines::new(changes, start),
            tally,
            lines_valid: true,
            parsed: OnceLock::new(),
        }
    }

    /// Clients from a map (a record of the layout before the lines).
    pub(super) fn from_map(map: BTreeMap<String, Client>) -> Self {
        let parsed = OnceLock::new();
        let _ = parsed.set(Parsed { map, error: None });
        Self {
            base: Lines::default(),
            base_name: None,
            changes: Lines::default(),
            tally: Tally::default(),
            lines_valid: false,
            parsed,
        }
    }

    /// The base file the clients were read with.
    pub(super) fn base_name(&self) -> Option<&str> {
        self.base_name.as_deref()
    }

    /// The bytes of that base file, as read.
    pub(super) fn base_bytes(&self) -> &[u8] {
        self.base.bytes()
    }

    /// What a save writes: the base and changes as read and changed, unless the changes have
    /// grown past [`CHANGES_MAX`] or the map was changed; then every client, in the record's
    /// file when they fit in [`INLINE_MAX`], else in a new base. Changes whose ids cannot all be
    /// read are not folded (they are carried as they are, as a full read will say).
    pub(super) fn encoded(&self) -> Encoded<'_> {
        let (all, tally) = if self.lines_valid {
            let folded = (self.changes.bytes().len() > CHANGES_MAX)
                .then(|| self.folded())
                .flatten();
            let Some(all) = folded else {
                return Encoded {
                    changes: Cow::Borrowed(self.changes.bytes()),
                    base: match &self.base_name {
                        Some(n) => BaseOut::Keep(n, self.base.bytes().len()),
                        None => BaseOut::None,
                    },
                    tally: Cow::Borrowed(&self.tally),
                };
            };
            (all, Cow::Borrowed(&self.tally))
        } else {
            let map = &self.parsed().map;
            let mut out = Vec::with_capacity(map.len() * 160);
            for (id, c) in map {
                serde_json::to_writer(&mut out, &(id, c)).expect("client serialises");
                out.push(b'\n');
            }
            (out, Cow::Owned(Tally::of(map.values())))
        };
        if all.len() <= INLINE_MAX {
            Encoded {
                changes: Cow::Owned(all),
                base: BaseOut::None,
                tally,
            }
        } else {
            Encoded {
                changes: Cow::Borrowed(&[]),
                base: BaseOut::New(all),
                tally,
            }
        }
    }

    /// The base with the changes made, line by line (no line parsed); `None` when an id cannot
    /// be read from its line.
    fn folded(&self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(self.base.bytes().len() + self.changes.bytes().len());
        for (_, line) in merged(self.base.bytes(), self.changes.bytes()) {
            let line = line?;
            if !is_removal(line) {
                out.extend_from_slice(line);
            }
        }
        Some(out)
    }

    /// What is wrong with the stored clients, parsing them: a line that cannot be read, is out
    /// of order or repeats an id, or a tally that does not add them up.
    pub(super) fn check(&self) -> Result<(), String> {
        if let Some(e) = self.damage() {
            return Err(e.to_owned());
        }
        let counted = Tally::of(self.parsed().map.values());
        if self.lines_valid && counted != self.tally {
            return Err(format!(
                "the header's tally ({:?}) does not add up its {} clients ({counted:?})",
                self.tally, counted.count
            ));
        }
        Ok(())
    }

    fn parsed(&self) -> &Parsed {
        self.parsed.get_or_init(|| self.parse_lines())
    }

    /// Every stored line parsed (not kept: see [`Clients::parsed`]).
    fn parse_lines(&self) -> Parsed {
        parse(
            self.base.bytes(),
            self.changes.bytes(),
            self.base_name.is_some(),
        )
    }

    /// What was wrong with the stored lines (then the map holds the lines that could be read);
    /// parses them.
    pub fn damage(&self) -> Option<&str> {
        self.parsed().error.as_deref()
    }

    /// What the stored lines lost when the map was changed: the lines that could not be read
    /// (a save then refuses). Parses nothing.
    pub fn lost(&self) -> Option<&str> {
        if self.lines_valid {
            return None;
        }
        self.parsed.get().and_then(|p| p.error.as_deref())
    }

    fn map_mut(&mut self) -> &mut BTreeMap<String, Client> {
        self.parsed();
        self.lines_valid = false;
        &mut self.parsed.get_mut().expect("parsed above").map
    }

    /// Whether the lines are the cheaper way to a change: they say what the clients are and
    /// nobody has parsed them yet (once parsed, the map is changed instead, and kept).
    fn by_lines(&self) -> bool {
        self.lines_valid && self.parsed.get().is_none()
    }

    /// Their tally.
    pub fn tally(&self) -> Cow<'_, Tally> {
        if self.lines_valid {
            Cow::Borrowed(&self.tally)
        } else {
            Cow::Owned(Tally::of(self.parsed().map.values()))
        }
    }

    pub fn len(&self) -> usize {
        if self.lines_valid {
            usize::try_from(self.tally.count).unwrap_or(usize::MAX)
        } else {
            self.parsed().map.len()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the lines were parsed and kept so (then changes go through the map).
    #[cfg(test)]
    pub(super) fn is_parsed(&self) -> bool {
        self.parsed.get().is_some()
    }

    /// Each client's id and process. Read from the lines without keeping them parsed, so that
    /// the changes that follow (the removal of those that exited) still go by the lines.
    pub fn processes(&self) -> Vec<(String, Option<ProcId>)> {
        if self.by_lines() {
            let fresh = self.parse_lines();
            if fresh.error.is_none() {
                return fresh
                    .map
                    .into_iter()
                    .map(|(id, c)| (id, c.process))
                    .collect();
            }
        }
        self.iter().map(|(id, c)| (id.clone(), c.process)).collect()
    }

    /// Client `id` as the lines say, read from its line alone (the change line if there is
    /// one, else the base's; `None`: there is none), and whether the base has a line of it, in
    /// one look at each; `None`: a line cannot be read.
    fn current(&self, id: &str) -> Option<(Option<Client>, bool)> {
        let in_base = match find(self.base.bytes(), id)? {
            Found::At(r) => Some(r),
            Found::Before(_) => None,
        };
        let client = match find(self.changes.bytes(), id)? {
            Found::At(r) => line_value(&self.changes.bytes()[r])?,
            // A base line says a client: one saying `null` cannot be read.
            Found::Before(_) => match &in_base {
                Some(r) => Some(line_value(&self.base.bytes()[r.clone()])??),
                None => None,
            },
        };
        Some((client, in_base.is_some()))
    }

    pub fn contains_key(&self, id: &str) -> bool {
        if self.by_lines() {
            if let Some((c, _)) = self.current(id) {
                return c.is_some();
            }
        }
        self.parsed().map.contains_key(id)
    }

    /// The mode of the first client by id, if any.
    pub fn first_mode(&self) -> Option<Mode> {
        if self.by_lines() {
            let first = merged(self.base.bytes(), self.changes.bytes())
                .map(|(_, line)| line.map(line_value))
                .find(|v| !matches!(v, Some(Some(None))));
            match first {
                None => return None,
                Some(Some(Some(Some(c)))) => return Some(c.mode),
                Some(_) => {}
            }
        }
        self.parsed().map.values().next().map(|c| c.mode)
    }

    /// Sets client `id`'s change line to `line` (a client, or `null`), or takes it out.
    fn set_change(&mut self, id: &str, line: Option<Vec<u8>>) -> Option<()> {
        let range = match find(self.changes.bytes(), id)? {
            Found::At(r) => r,
            Found::Before(at) => at..at,
        };
        self.changes
            .replace(range, line.as_deref().unwrap_or_default());
        Some(())
    }

    /// Adds or replaces client `id`; returns the one it replaced.
    pub fn insert(&mut self, id: String, client: Client) -> Option<Client> {
        if self.by_lines() {
            if let Some((old, _)) = self.current(&id) {
                let mut line = serde_json::to_vec(&(&id, &client)).expect("client serialises");
                line.push(b'\n');
                if self.set_change(&id, Some(line)).is_some() {
                    if let Some(old) = &old {
                        self.tally.remove(old);
                    }
                    self.tally.add(&client);
                    return old;
                }
            }
        }
        self.map_mut().insert(id, client)
    }

    /// Removes client `id`; returns it.
    pub fn remove(&mut self, id: &str) -> Option<Client> {
        if self.by_lines() {
            if let Some((old, in_base)) = self.current(id) {
                // Not there: nothing to remove.
                let old = old?;
                let line = in_base.then(|| {
                    let mut l = serde_json::to_vec(&(id, ())).expect("id serialises");
                    l.push(b'\n');
                    l
                });
                if self.set_change(id, line).is_some() {
                    self.tally.remove(&old);
                    return Some(old);
                }
            }
        }
        self.map_mut().remove(id)
    }

    /// Removes every client; a save then writes none, and removes the base they were read
    /// with.
    pub fn clear(&mut self) {
        let read_with = self.base_name.take();
        *self = Self::from_map(BTreeMap::new());
        self.base_name = read_with;
    }

    pub fn into_keys(self) -> impl Iterator<Item = String> {
        self.into_map().into_keys()
    }

    pub fn into_map(mut self) -> BTreeMap<String, Client> {
        self.parsed();
        self.parsed.take().map(|p| p.map).unwrap_or_default()
    }
}

/// Where a line of `id` is, or would go.
enum Found {
    /// Its line.
    At(Range<usize>),
    /// The offset its line would be inserted at.
    Before(usize),
}

/// Finds client `id`'s line in `lines` (sorted by id) by the ids alone; `None` when a line
/// cannot be read that way (then the caller parses them all, which says what is wrong).
///
/// The searches here are `memchr`'s portable ones (a word at a time): its default ones choose
/// their code by asking the CPU first, with `cpuid`s that cost 4-5 µs each in a VM, on every
/// hook run.
fn find(lines: &[u8], id: &str) -> Option<Found> {
    let mut start = 0;
    while start < lines.len() {
        let end = memchr::arch::all::memchr::One::new(b'\n').find(&lines[start..])? + start + 1;
        let line_id = line_id(&lines[start..end])?;
        match line_id.as_ref().cmp(id) {
            Ordering::Less => start = end,
            Ordering::Equal => return Some(Found::At(start..end)),
            Ordering::Greater => return Some(Found::Before(start)),
        }
    }
    Some(Found::Before(lines.len()))
}

/// The lines of `lines`, each with its id (`None`: one that cannot be read that way).
fn each_line(lines: &[u8]) -> impl Iterator<Item = (Option<Cow<'_, str>>, &[u8])> {
    lines
        .split_inclusive(|b| *b == b'\n')
        .map(|l| (line_id(l), l))
}

/// The lines of `base` with `changes` made, in id order: a change line in place of the base's
/// line of the same id. An item is `None` when a line's id cannot be read (then the merge
/// stops).
fn merged<'a>(
    base: &'a [u8],
    changes: &'a [u8],
) -> impl Iterator<Item = (Option<Cow<'a, str>>, Option<&'a [u8]>)> {
    let mut b = each_line(base).peekable();
    let mut c = each_line(changes).peekable();
    let mut broken = false;
    std::iter::from_fn(move || {
        if broken {
            return None;
        }
        let next = match (b.peek(), c.peek()) {
            (None, None) => return None,
            (Some((None, _)), _) | (_, Some((None, _))) => {
                broken = true;
                return Some((None, None));
            }
            (Some(_), None) => b.next(),
            (None, Some(_)) => c.next(),
            (Some((Some(bi), _)), Some((Some(ci), _))) => match bi.as_ref().cmp(ci.as_ref()) {
                Ordering::Less => b.next(),
                Ordering::Greater => c.next(),
                Ordering::Equal => {
                    b.next();
                    c.next()
                }
            },
        };
        next.map(|(id, line)| (id, Some(line)))
    })
}

/// Whether a change line says its client was removed (`["<id>",null]`).
fn is_removal(line: &[u8]) -> bool {
    line.trim_ascii_end().ends_with(b",null]")
}

/// The id a line starts with: read in place when it has no escapes, as ids have.
fn line_id(line: &[u8]) -> Option<Cow<'_, str>> {
    let rest = line.strip_prefix(b"[\"")?;
    let q = memchr::arch::all::memchr::Two::new(b'"', b'\\').find(rest)?;
    if rest[q] == b'"' {
        return std::str::from_utf8(&rest[..q]).ok().map(Cow::Borrowed);
    }
    let (id, _): (String, serde::de::IgnoredAny) = serde_json::from_slice(line).ok()?;
    Some(Cow::Owned(id))
}

/// The client of one line (`None` inside: a removal); `None`: the line cannot be read.
fn line_value(line: &[u8]) -> Option<Option<Client>> {
    serde_json::from_slice::<(String, Option<Client>)>(line)
        .ok()
        .map(|(_, c)| c)
}

/// Reads every line of `lines`, in order: each id once and in order, or the first problem.
fn read_lines(
    lines: &[u8],
    what: &str,
    mut each: impl FnMut(String, Option<Client>),
) -> Option<String> {
    let mut problem = None;
    let mut last: Option<String> = None;
    for (n, line) in lines.split_inclusive(|b| *b == b'\n').enumerate() {
        let p = match serde_json::from_slice::<(String, Option<Client>)>(line) {
            Err(e) => Some(format!("{what} line {}: {e}", n + 1)),
            Ok((id, c)) => {
                let p = match last.as_deref().map(|l| l.cmp(&id)) {
                    Some(Ordering::Equal) => Some(format!("client {id} is listed twice")),
                    Some(Ordering::Greater) => {
                        Some(format!("{what} line {} ({id}) is out of order", n + 1))
                    }
                    _ => None,
                };
                last = Some(id.clone());
                each(id, c);
                p
            }
        };
        if let Some(p) = p {
            problem.get_or_insert(p);
        }
    }
    if !lines.is_empty() && !lines.ends_with(b"\n") {
        problem.get_or_insert_with(|| format!("the last {what} line is cut short"));
    }
    problem
}

/// Parses every line: the base's, then the changes made; a line that cannot be read, is out of
/// order or repeats an id is named in the error, the others kept.
fn parse(base: &[u8], changes: &[u8], has_base: bool) -> Parsed {
    let mut out = Parsed::default();
    let mut removal_in_base = None;
    let e1 = read_lines(base, "base", |id, c| match c {
        Some(c) => {
            out.map.insert(id, c);
        }
        None => {
            removal_in_base.get_or_insert(id);
        }
    });
    let what = if has_base { "change" } else { "client" };
    let e2 = read_lines(changes, what, |id, c| match c {
        Some(c) => {
            out.map.insert(id, c);
        }
        None => {
            out.map.remove(&id);
        }
    });
    out.error = e1
        .or(e2)
        .or(removal_in_base.map(|id| format!("the base lists client {id} as removed")));
    out
}

impl Deref for Clients {
    type Target = BTreeMap<String, Client>;

    fn deref(&self) -> &Self::Target {
        &self.parsed().map
    }
}

impl DerefMut for Clients {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.map_mut()
    }
}

impl<'a> IntoIterator for &'a Clients {
    type Item = (&'a String, &'a Client);
    type IntoIter = std::collections::btree_map::Iter<'a, String, Client>;

    fn into_iter(self) -> Self::IntoIter {
        self.parsed().map.iter()
    }
}

impl PartialEq for Clients {
    fn eq(&self, other: &Self) -> bool {
        self.parsed().map == other.parsed().map
    }
}

impl Eq for Clients {}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(&self.parsed().map).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::memcap::Enforcement;

    #[test]
    fn a_cap_is_stored_flat_as_before() {
        use crate::vocab::memcap::Backend;
        // (cap, its stored form: the bytes the flattened form wrote)
        let rows = [
            (
                Cap {
                    bytes: 1 << 30,
                    enforcement: Enforcement {
                        backend: Backend::Driver,
                        cgroup: Some("/sys/fs/cgroup/a.scope".into()),
                        why: None,
                    },
                },
                r#"{"bytes":1073741824,"backend":"driver","cgroup":"/sys/fs/cgroup/a.scope"}"#,
            ),
            (
                Cap {
                    bytes: 512,
                    enforcement: Enforcement {
                        backend: Backend::Limiter,
                        cgroup: None,
                        why: Some("no cgroup v2".into()),
                    },
                },
                r#"{"bytes":512,"backend":"limiter","why":"no cgroup v2"}"#,
            ),
        ];
        for (cap, stored) in rows {
            assert_eq!(serde_json::to_string(&cap).unwrap(), stored);
            assert_eq!(serde_json::from_str::<Cap>(stored).unwrap(), cap);
        }
        // A member it does not know is passed over, as before; a missing one is an error.
        let extra = r#"{"bytes":1,"backend":"limiter","later":true}"#;
        assert_eq!(serde_json::from_str::<Cap>(extra).unwrap().bytes, 1);
        assert!(serde_json::from_str::<Cap>(r#"{"bytes":1}"#).is_err());
    }

    /// A client of `mode`, in `domain`, capped at `cap` bytes (the driver enforcing it on
    /// `/sys/fs/cgroup/<n>` when `driver`).
    fn client(n: u64, mode: Mode, domain: Option<&str>, cap: Option<u64>, driver: bool) -> Client {
        Client {
            mode,
            process: Some(ProcId {
                pid: 100 + n as i32,
                start_time: n,
            }),
            cores: 10 + (n % 90) as u8,
            memory: cap,
            domain: domain.map(str::to_owned),
            kube: Default::default(),
            cap: cap.map(|bytes| Cap {
                bytes,
                enforcement: Enforcement {
                    backend: if driver {
                        Backend::Driver
                    } else {
                        Backend::Limiter
                    },
                    cgroup: driver.then(|| format!("/sys/fs/cgroup/{n}")),
                    why: None,
                },
            }),
        }
    }

    /// Counted here by hand, not by [`Tally::add`].
    fn counted(map: &BTreeMap<String, Client>) -> Tally {
        let n = |f: &dyn Fn(&Client) -> bool| map.values().filter(|c| f(c)).count() as u64;
        let mut domains = BTreeMap::new();
        for d in map.values().filter_map(|c| c.domain.clone()) {
            *domains.entry(d).or_insert(0) += 1;
        }
        Tally {
            count: map.len() as u64,
            mps: n(&|c| c.mode == Mode::Mps),
            timeslice: n(&|c| c.mode == Mode::Timeslice),
            limit: n(&|c| c.mode == Mode::Limit),
            domains,
            capped_bytes: map
                .values()
                .filter_map(|c| c.cap.as_ref())
                .map(|k| u128::from(k.bytes))
                .sum(),
            uncapped: n(&|c| c.cap.is_none()),
            driver_caps: n(&|c| {
                c.cap
                    .as_ref()
                    .is_some_and(|k| k.enforcement.backend == Backend::Driver)
            }),
        }
    }

    /// The lines a map is stored as, written here line by line.
    fn stored(map: &BTreeMap<String, Client>) -> Vec<u8> {
        let mut out = Vec::new();
        for (id, c) in map {
            out.extend_from_slice(serde_json::to_string(&(id, c)).unwrap().as_bytes());
            out.push(b'\n');
        }
        out
    }

    /// A small deterministic generator (the same sequence on every run).
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self, below: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % below
        }
    }

    /// What a save writes, read back as the next load would: the base it names (the one kept,
    /// the new one, or none) and the change lines.
    fn saved_and_read(c: &Clients, n: u64) -> Clients {
        let enc = c.encoded();
        let (name, base) = match enc.base {
            BaseOut::None => (None, Vec::new()),
            BaseOut::Keep(name, bytes) => {
                assert_eq!(bytes, c.base.bytes().len());
                (Some(name.to_owned()), c.base.bytes().to_vec())
            }
            BaseOut::New(bytes) => (Some(format!("G.{n:016x}.lines")), bytes),
        };
        Clients::stored(name, base, enc.changes.to_vec(), 0, enc.tally.into_owned())
    }

    #[test]
    fn changes_made_on_the_lines_store_what_the_same_changes_to_a_map_would() {
        // Ids that sort every which way, one needing escapes (read by the slow path); enough
        // of them that the clients outgrow what is kept inline, and shrink back.
        let ids: Vec<String> = (0..90)
            .map(|i| format!("c{:02}-{}", (i * 7) % 90, "x".repeat(i % 5)))
            .chain(["a\"q\\b".to_owned(), "Z".to_owned(), "zz".to_owned()])
            .collect();
        let mut rng = Lcg(7);
        let mut oracle: BTreeMap<String, Client> = BTreeMap::new();
        let any = |rng: &mut Lcg, n: u64| {
            let mode = [Mode::Mps, Mode::Timeslice, Mode::Limit][rng.next(3) as usize];
            let domain = ["gpu", "g-a", "g-b"][rng.next(3) as usize];
            let cap = (rng.next(3) > 0).then(|| (rng.next(1 << 20) + 1) << 12);
            let driver = cap.is_some() && rng.next(2) == 0;
            client(n, mode, (mode == Mode::Mps).then_some(domain), cap, driver)
        };
        for n in 0..70 {
            let id = ids[rng.next(ids.len() as u64) as usize].clone();
            oracle.insert(id, any(&mut rng, n));
        }
        // Read from a base, with no changes yet.
        let mut clients = Clients::stored(
            Some("G.0000000000000000.lines".into()),
            stored(&oracle),
            Vec::new(),
            0,
            counted(&oracle),
        );
        let (mut folds, mut inline, mut removals) = (0, 0, 0);
        for step in 0..3000u64 {
            let id = ids[rng.next(ids.len() as u64) as usize].clone();
            // Removals more often while there are many, inserts while there are few.
            let remove_below = if oracle.len() > 60 { 6 } else { 3 };
            let what = match rng.next(10) {
                r if r < remove_below => {
                    let got = clients.remove(&id);
                    assert_eq!(got, oracle.remove(&id), "step {step}: remove {id}");
                    "remove"
                }
                r if r < remove_below + 1 => {
                    assert_eq!(
                        clients.contains_key(&id),
                        oracle.contains_key(&id),
                        "step {step}: contains {id}"
                    );
                    "contains"
                }
                _ => {
                    let c = any(&mut rng, step);
                    let got = clients.insert(id.clone(), c.clone());
                    assert_eq!(
                        got,
                        oracle.insert(id.clone(), c),
                        "step {step}: insert {id}"
                    );
                    "insert"
                }
            };
            // The change went by the lines: nothing parsed them all.
            assert!(
                clients.parsed.get().is_none(),
                "step {step}: {what} parsed the lines"
            );
            assert_eq!(clients.len(), oracle.len(), "step {step}: {what}");
            assert_eq!(
                *clients.tally(),
                counted(&oracle),
                "step {step}: {what} {id}"
            );
            assert_eq!(
                clients.first_mode(),
                oracle.values().next().map(|c| c.mode),
                "step {step}: {what}"
            );
            assert_eq!(
                String::from_utf8_lossy(&clients.folded().expect("ids readable")),
                String::from_utf8_lossy(&stored(&oracle)),
                "step {step}: {what} {id}"
            );
            removals += usize::from(clients.changes.bytes().windows(6).any(|w| w == b",null]"));
            // A save and a load now and then, as acquires and releases come one by one.
            if step % 7 == 0 {
                let had = clients.base_name.clone();
                clients = saved_and_read(&clients, step);
                assert!(clients.changes.bytes().len() <= CHANGES_MAX + 400);
                match (&had, &clients.base_name) {
                    (_, None) => inline += 1,
                    (a, b) if a != b => folds += 1,
                    _ => {}
                }
                assert_eq!(*clients.tally(), counted(&oracle), "step {step}: saved");
                // Checked on a copy: a full read parses, and the next changes go by the lines.
                assert_eq!(clients.clone().check(), Ok(()), "step {step}: saved");
            }
        }
        // Positive controls: the sequence went through every form a record takes.
        assert!(folds > 3, "changes folded into a new base: {folds}");
        assert!(inline > 3, "few enough clients to keep inline: {inline}");
        assert!(removals > 10, "removals from a base: {removals}");
        // The lines, read in full, are the map, and check out.
        assert_eq!(*clients, oracle);
        assert_eq!(clients.check(), Ok(()));
    }

    #[test]
    fn a_change_to_the_parsed_map_is_what_gets_stored() {
        let mut map = BTreeMap::new();
        map.insert(
            "a".to_owned(),
            client(1, Mode::Limit, None, Some(4096), false),
        );
        let mut clients = Clients::from_lines(stored(&map), counted(&map));
        // Read first (a listing), then changed: the map is the truth from then on.
        assert_eq!(clients.keys().collect::<Vec<_>>(), ["a"]);
        clients.insert("b".into(), client(2, Mode::Mps, Some("gpu"), None, false));
        clients.get_mut("a").unwrap().cores = 99;
        map.insert("b".into(), client(2, Mode::Mps, Some("gpu"), None, false));
        map.get_mut("a").unwrap().cores = 99;
        let enc = clients.encoded();
        assert!(
            matches!(enc.base, BaseOut::None),
            "few enough to keep inline"
        );
        assert_eq!(*enc.changes, stored(&map));
        assert_eq!(*enc.tally, counted(&map));
        assert_eq!(clients.tally().into_owned(), counted(&map));
        clients.clear();
        assert!(clients.is_empty() && clients.encoded().changes.is_empty());
    }

    #[test]
    fn damaged_lines_are_named_by_a_full_read_and_never_written_over() {
        let mut map = BTreeMap::new();
        for (id, n) in [("a", 1), ("b", 2), ("c", 3)] {
            map.insert(id.to_owned(), client(n, Mode::Limit, None, None, false));
        }
        let good = String::from_utf8(stored(&map)).unwrap();
        let rows = [
            (
                "a mode it does not know",
                good.replacen(
                    "[\"b\",{\"mode\":\"limit\"",
                    "[\"b\",{\"mode\":\"LIMIT\"",
                    1,
                ),
                "client line 2",
            ),
            (
                "out of order",
                good.replacen("[\"c\"", "[\"0\"", 1),
                "out of order",
            ),
            ("twice", good.replacen("[\"c\"", "[\"b\"", 1), "twice"),
            ("cut short", good[..good.len() - 1].to_owned(), "cut short"),
        ];
        for (what, lines, says) in rows {
            let clients = Clients::from_lines(lines.clone().into_bytes(), counted(&map));
            let err = clients.check().expect_err(what);
            assert!(err.contains(says), "{what}: {err}");
            // Changed without being read: the lines go back as they were, with the change.
            let mut changed = Clients::from_lines(lines.clone().into_bytes(), counted(&map));
            changed.insert("d".into(), client(4, Mode::Limit, None, None, false));
            match changed.lost() {
                // Stored by its lines: every line read is still there.
                None => assert!(
                    String::from_utf8_lossy(&changed.encoded().changes)
                        .starts_with(lines.trim_end()),
                    "{what}"
                ),
                Some(e) => assert!(e.contains(says), "{what}: {e}"),
            }
        }
        // Positive control: a change that must read the damaged line (its own client's) says
        // the lines were lost, which a save refuses.
        let bad = good.replacen(
            "[\"b\",{\"mode\":\"limit\"",
            "[\"b\",{\"mode\":\"LIMIT\"",
            1,
        );
        assert_ne!(bad, good);
        let mut changed = Clients::from_lines(bad.into_bytes(), counted(&map));
        assert_eq!(changed.remove("b"), None, "b cannot be read");
        let lost = changed.lost().expect("the damaged line is said to be lost");
        assert!(lost.contains("client line 2"), "{lost}");
    }

    #[test]
    fn a_header_tally_that_does_not_add_up_is_named() {
        let mut map = BTreeMap::new();
        map.insert(
            "a".to_owned(),
            client(1, Mode::Mps, Some("gpu"), Some(1 << 30), false),
        );
        let mut wrong = counted(&map);
        wrong.capped_bytes = 1;
        let err = Clients::from_lines(stored(&map), wrong)
            .check()
            .unwrap_err();
        assert!(err.contains("does not add up"), "{err}");
        assert_eq!(
            Clients::from_lines(stored(&map), counted(&map)).check(),
            Ok(())
        );
    }

    #[test]
    fn changes_whose_ids_cannot_all_be_read_are_carried_not_folded() {
        let mut map = BTreeMap::new();
        for n in 0..100 {
            map.insert(
                format!("c{n:03}-{}", "x".repeat(60)),
                client(n, Mode::Limit, None, None, false),
            );
        }
        let good = stored(&map);
        assert!(good.len() > CHANGES_MAX, "enough to fold");
        let with = |changes: Vec<u8>| {
            Clients::stored(
                Some("G.0000000000000000.lines".into()),
                Vec::new(),
                changes,
                0,
                counted(&map),
            )
        };
        // Positive control: readable, they fold (here into a new base).
        assert!(matches!(with(good.clone()).encoded().base, BaseOut::New(_)));
        // One line whose id cannot be read: carried as it is, base and all; nothing is lost.
        let bad = String::from_utf8(good)
            .unwrap()
            .replacen("[\"c050", "[c050", 1)
            .into_bytes();
        let c = with(bad.clone());
        let enc = c.encoded();
        assert!(matches!(
            enc.base,
            BaseOut::Keep("G.0000000000000000.lines", 0)
        ));
        assert_eq!(*enc.changes, *bad);
        assert!(c.check().is_err(), "a full read names it");
    }
}
