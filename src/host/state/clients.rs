//! A GPU's clients: each [`Client`] (a container using the GPU), and the [`Clients`] of a GPU
//! as its record stores them: one line each, `["<id>",{…}]`, sorted by id,
//! after the record's header line, and their [`Tally`] in the header (how many there are in
//! each mode and isolation domain, and what memory caps they hold). The tally is all an
//! acquire needs to know of the others, so an acquire that adds or replaces one client carries
//! the other lines as bytes: they are parsed only when something asks for them (a listing, a
//! liveness check, the names in a refusal), and its cost does not grow with their number.

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

/// The clients parsed from their lines, and what was wrong with the lines, if anything.
#[derive(Debug, Clone, Default)]
struct Parsed {
    map: BTreeMap<String, Client>,
    error: Option<String>,
}

/// A GPU's clients by container id: a map to whoever reads them, the stored lines to an
/// acquire. See the module's documentation.
#[derive(Clone)]
pub struct Clients {
    /// The lines, sorted by id, each ending in `\n`, from `start` on in `buf` (the buffer the
    /// record was read into; shared by clones, so a record kept to roll back to costs no copy).
    buf: Arc<Vec<u8>>,
    start: usize,
    /// Their tally.
    tally: Tally,
    /// Whether `lines` and `tally` still say what the clients are: false once the map was
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
    /// Clients from their stored lines and the tally the header gave them; parsed when first
    /// asked for.
    pub(super) fn from_lines(lines: Vec<u8>, tally: Tally) -> Self {
        Self::from_buffer(lines, 0, tally)
    }

    /// [`Clients::from_lines`] of the lines from `start` on in `buf`.
    pub(super) fn from_buffer(buf: Vec<u8>, start: usize, tally: Tally) -> Self {
        Self {
            buf: Arc::new(buf),
            start,
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
            buf: Arc::default(),
            start: 0,
            tally: Tally::default(),
            lines_valid: false,
            parsed,
        }
    }

    /// The lines to store and their tally: as read when nothing changed them, else written
    /// anew from the map.
    pub(super) fn encoded(&self) -> (Cow<'_, [u8]>, Cow<'_, Tally>) {
        if self.lines_valid {
            return (Cow::Borrowed(self.lines()), Cow::Borrowed(&self.tally));
        }
        let map = &self.parsed().map;
        let mut out = Vec::with_capacity(map.len() * 160);
        for (id, c) in map {
            serde_json::to_writer(&mut out, &(id, c)).expect("client serialises");
            out.push(b'\n');
        }
        (Cow::Owned(out), Cow::Owned(Tally::of(map.values())))
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
                "the header's tally ({:?}) does not add up its {} client lines ({counted:?})",
                self.tally, counted.count
            ));
        }
        Ok(())
    }

    /// The stored lines.
    fn lines(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }

    fn parsed(&self) -> &Parsed {
        self.parsed.get_or_init(|| parse(self.lines()))
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

    pub fn contains_key(&self, id: &str) -> bool {
        if self.by_lines() {
            match find(self.lines(), id) {
                Some(Found::At(_)) => return true,
                Some(Found::Before(_)) => return false,
                None => {}
            }
        }
        self.parsed().map.contains_key(id)
    }

    /// The mode of the first client by id, if any.
    pub fn first_mode(&self) -> Option<Mode> {
        if self.by_lines() {
            let end = memchr::memchr(b'\n', self.lines())?;
            if let Ok((_, c)) = serde_json::from_slice::<(String, Client)>(&self.lines()[..end]) {
                return Some(c.mode);
            }
        }
        self.parsed().map.values().next().map(|c| c.mode)
    }

    /// Adds or replaces client `id`; returns the one it replaced.
    pub fn insert(&mut self, id: String, client: Client) -> Option<Client> {
        if self.by_lines() {
            if let Some(found) = find(self.lines(), &id) {
                let mut line = serde_json::to_vec(&(&id, &client)).expect("client serialises");
                line.push(b'\n');
                let (range, old) = match found {
                    Found::At(r) => {
                        let old = line_client(&self.lines()[r.clone()]);
                        match old {
                            Some(old) => (r, Some(old)),
                            None => return self.map_mut().insert(id, client),
                        }
                    }
                    Found::Before(at) => (at..at, None),
                };
                if let Some(old) = &old {
                    self.tally.remove(old);
                }
                self.tally.add(&client);
                self.replace_lines(range, &line);
                return old;
            }
        }
        self.map_mut().insert(id, client)
    }

    /// Removes client `id`; returns it.
    pub fn remove(&mut self, id: &str) -> Option<Client> {
        if self.by_lines() {
            match find(self.lines(), id) {
                Some(Found::Before(_)) => return None,
                Some(Found::At(r)) => {
                    if let Some(old) = line_client(&self.lines()[r.clone()]) {
                        self.tally.remove(&old);
                        self.replace_lines(r, b"");
                        return Some(old);
                    }
                }
                None => {}
            }
        }
        self.map_mut().remove(id)
    }

    /// The lines with `range` replaced by `with`, in one copy into a buffer of their own.
    fn replace_lines(&mut self, range: Range<usize>, with: &[u8]) {
        let old = self.lines();
        let mut new = Vec::with_capacity(old.len() - range.len() + with.len());
        new.extend_from_slice(&old[..range.start]);
        new.extend_from_slice(with);
        new.extend_from_slice(&old[range.end..]);
        self.buf = Arc::new(new);
        self.start = 0;
    }

    pub fn clear(&mut self) {
        *self = Self::from_lines(Vec::new(), Tally::default());
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
fn find(lines: &[u8], id: &str) -> Option<Found> {
    let mut start = 0;
    while start < lines.len() {
        let end = memchr::memchr(b'\n', &lines[start..])? + start + 1;
        let line_id = line_id(&lines[start..end])?;
        match line_id.as_ref().cmp(id) {
            Ordering::Less => start = end,
            Ordering::Equal => return Some(Found::At(start..end)),
            Ordering::Greater => return Some(Found::Before(start)),
        }
    }
    Some(Found::Before(lines.len()))
}

/// The id a line starts with: read in place when it has no escapes, as ids have.
fn line_id(line: &[u8]) -> Option<Cow<'_, str>> {
    let rest = line.strip_prefix(b"[\"")?;
    let q = memchr::memchr2(b'"', b'\\', rest)?;
    if rest[q] == b'"' {
        return std::str::from_utf8(&rest[..q]).ok().map(Cow::Borrowed);
    }
    let (id, _): (String, serde::de::IgnoredAny) = serde_json::from_slice(line).ok()?;
    Some(Cow::Owned(id))
}

/// The client of one line.
fn line_client(line: &[u8]) -> Option<Client> {
    serde_json::from_slice::<(String, Client)>(line)
        .ok()
        .map(|(_, c)| c)
}

/// Parses every line; one that cannot be read, is out of order or repeats an id is named in
/// the error, the others kept.
fn parse(lines: &[u8]) -> Parsed {
    let mut out = Parsed::default();
    let mut last: Option<String> = None;
    for (n, line) in lines.split_inclusive(|b| *b == b'\n').enumerate() {
        let problem = match serde_json::from_slice::<(String, Client)>(line) {
            Err(e) => Some(format!("client line {}: {e}", n + 1)),
            Ok((id, c)) => {
                let problem = match last.as_deref().map(|l| l.cmp(&id)) {
                    Some(Ordering::Equal) => Some(format!("client {id} is listed twice")),
                    Some(Ordering::Greater) => {
                        Some(format!("client line {} ({id}) is out of order", n + 1))
                    }
                    _ => None,
                };
                last = Some(id.clone());
                out.map.insert(id, c);
                problem
            }
        };
        if let Some(p) = problem {
            out.error.get_or_insert(p);
        }
    }
    if !lines.is_empty() && !lines.ends_with(b"\n") {
        out.error
            .get_or_insert_with(|| "the last client line is cut short".to_owned());
    }
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

    #[test]
    fn changes_made_on_the_lines_store_what_the_same_changes_to_a_map_would() {
        // Ids that sort every which way, one needing escapes (read by the slow path).
        let ids: Vec<String> = (0..24)
            .map(|i| format!("c{:02}-{}", (i * 7) % 24, "x".repeat(i % 5)))
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
        for n in 0..8 {
            let id = ids[rng.next(ids.len() as u64) as usize].clone();
            oracle.insert(id, any(&mut rng, n));
        }
        let mut clients = Clients::from_lines(stored(&oracle), counted(&oracle));
        for step in 0..600u64 {
            let id = ids[rng.next(ids.len() as u64) as usize].clone();
            let what = match rng.next(4) {
                0 => {
                    let got = clients.remove(&id);
                    assert_eq!(got, oracle.remove(&id), "step {step}: remove {id}");
                    "remove"
                }
                1 => {
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
                clients.first_mode(),
                oracle.values().next().map(|c| c.mode),
                "step {step}: {what}"
            );
            let (lines, tally) = clients.encoded();
            assert_eq!(
                String::from_utf8_lossy(&lines),
                String::from_utf8_lossy(&stored(&oracle)),
                "step {step}: {what} {id}"
            );
            assert_eq!(*tally, counted(&oracle), "step {step}: {what} {id}");
        }
        assert!(oracle.len() > 5, "the sequence kept a few clients");
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
        let (lines, tally) = clients.encoded();
        assert_eq!(*lines, stored(&map));
        assert_eq!(*tally, counted(&map));
        assert_eq!(clients.tally().into_owned(), counted(&map));
        clients.clear();
        assert!(clients.is_empty() && clients.encoded().0.is_empty());
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
                    String::from_utf8_lossy(&changed.encoded().0).starts_with(lines.trim_end()),
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
}
