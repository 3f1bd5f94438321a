//! The layout of the limiter's shared accounting region: one memory-mapped file per container
//! (`containers/<id>/shared/cache` in the state dir, `CUDA_DEVICE_MEMORY_SHARED_CACHE` inside
//! the container) through which all its processes share one memory cap.
//!
//! The one definition of the file's format: its magic, version and sizes, where each field of
//! the header, of a device entry and of a process slot is, and how a GPU's UUID is keyed. The
//! limiter maps the file as a `#[repr(C)]` struct of atomics whose field offsets it checks
//! against these at compile time (`limiter/src/region.rs`); the host reads a copy of the
//! file's bytes through [`View`]. The file is writable from inside the container, so [`View`]
//! takes it as untrusted bytes: a wrong size, magic or version reads as nothing.
//!
//! All integers are little-endian (the limiter runs on x86_64 and aarch64 Linux).

#![forbid(unsafe_code)]

/// "GPSHLIM\0".
pub const MAGIC: u64 = u64::from_le_bytes(*b"GPSHLIM\0");
/// Bump on any layout change.
pub const VERSION: u32 = 1;
/// Device entries per container (GPUs a container may use).
pub const MAX_DEVICES: usize = 16;
/// Process slots per container.
pub const MAX_PROCS: usize = 512;
/// A slot's pid while its slot is being reclaimed.
pub const RECLAIMING: u32 = u32::MAX;
/// A device entry's state when it is in use (0: free).
pub const DEV_IN_USE: u32 = 1;

/// Byte offsets of the header's fields: magic (u64), version (u32), size (u32), max_devices
/// (u32), max_procs (u32), proc_hwm (u32, slots ever used), padding (u32).
pub mod header {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const SIZE: usize = 12;
    pub const MAX_DEVICES: usize = 16;
    pub const MAX_PROCS: usize = 20;
    pub const PROC_HWM: usize = 24;
    /// The header's length.
    pub const LEN: usize = 32;
}

/// Byte offsets within a device entry: state (u32), padding (u32), uuid (2 × u64, the UUID's
/// 16 bytes in order), limit (u64, the cap the first process that used the device recorded).
pub mod dev {
    pub const STATE: usize = 0;
    pub const UUID: usize = 8;
    pub const LIMIT: usize = 24;
    /// A device entry's length.
    pub const LEN: usize = 32;
}

/// Byte offsets within a process slot: pid (u32), padding (u32), start time (u64, field 22 of
/// `/proc/<pid>/stat`), used bytes per device entry (`MAX_DEVICES` × u64).
pub mod slot {
    pub const PID: usize = 0;
    pub const START_TIME: usize = 8;
    pub const USED: usize = 16;
    /// A process slot's length.
    pub const LEN: usize = USED + 8 * super::MAX_DEVICES;
}

/// Where the device entries start.
pub const DEVS: usize = header::LEN;
/// Where the process slots start.
pub const PROCS: usize = DEVS + dev::LEN * MAX_DEVICES;
/// The whole region's size in bytes.
pub const SIZE: usize = PROCS + slot::LEN * MAX_PROCS;

/// Offset of device entry `i`.
pub const fn dev_at(i: usize) -> usize {
    DEVS + i * dev::LEN
}

/// Offset of process slot `i`.
pub const fn slot_at(i: usize) -> usize {
    PROCS + i * slot::LEN
}

/// The 16 bytes of an NVML UUID (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, dashes anywhere
/// after the prefix), as the region keys devices; `None` for anything else.
pub fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    let hex: String = s
        .strip_prefix("GPU-")?
        .chars()
        .filter(|c| *c != '-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The two u64 words a device entry stores a UUID's 16 bytes as (bytes 0–7, 8–15).
pub fn uuid_words(uuid: &[u8; 16]) -> [u64; 2] {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&uuid[..8]);
    b.copy_from_slice(&uuid[8..]);
    [u64::from_le_bytes(a), u64::from_le_bytes(b)]
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// A region's bytes whose size, magic and version are this layout's.
#[derive(Clone, Copy)]
pub struct View<'a>(&'a [u8]);

impl<'a> View<'a> {
    /// `b` as a region, or `None` when its length, magic, version or recorded size is not this
    /// layout's.
    pub fn new(b: &'a [u8]) -> Option<Self> {
        (b.len() == SIZE
            && u64_at(b, header::MAGIC) == MAGIC
            && u32_at(b, header::VERSION) == VERSION
            && u32_at(b, header::SIZE) as usize == SIZE)
            .then_some(View(b))
    }

    /// The entry index of the device with `uuid`, if a process recorded it.
    pub fn dev_of(&self, uuid: &[u8; 16]) -> Option<usize> {
        let w = uuid_words(uuid);
        (0..MAX_DEVICES).find(|&i| {
            let at = dev_at(i);
            u32_at(self.0, at + dev::STATE) == DEV_IN_USE
                && u64_at(self.0, at + dev::UUID) == w[0]
                && u64_at(self.0, at + dev::UUID + 8) == w[1]
        })
    }

    /// The cap recorded with device entry `dev`.
    pub fn limit(&self, dev: usize) -> u64 {
        u64_at(self.0, dev_at(dev) + dev::LIMIT)
    }

    /// `(pid, start time)` of every live slot (neither free nor being reclaimed) below the
    /// high-water mark, with the slot's index.
    pub fn live(&self) -> impl Iterator<Item = (usize, u32, u64)> + '_ {
        let hwm = (u32_at(self.0, header::PROC_HWM) as usize).min(MAX_PROCS);
        (0..hwm).filter_map(|i| {
            let at = slot_at(i);
            let pid = u32_at(self.0, at + slot::PID);
            (pid != 0 && pid != RECLAIMING).then(|| (i, pid, u64_at(self.0, at + slot::START_TIME)))
        })
    }

    /// Bytes slot `i` counts on device entry `dev`.
    pub fn used_by(&self, i: usize, dev: usize) -> u64 {
        u64_at(self.0, slot_at(i) + slot::USED + 8 * dev)
    }

    /// Bytes all live slots count on device entry `dev`.
    pub fn used(&self, dev: usize) -> u64 {
        self.live().fold(0u64, |acc, (i, _, _)| {
            acc.saturating_add(self.used_by(i, dev))
        })
    }
}

/// Bytes the live processes of the region `b` hold on the GPU `uuid`; `None` when `b` is not a
/// region of this layout or the GPU is not in it.
pub fn used_in(b: &[u8], uuid: &[u8; 16]) -> Option<u64> {
    let v = View::new(b)?;
    Some(v.used(v.dev_of(uuid)?))
}

/// A region's bytes built field by field, as the limiter lays them out (for tests and tools
/// that write a region without the limiter).
pub struct Image(Vec<u8>);

impl Default for Image {
    fn default() -> Self {
        Self::new()
    }
}

impl Image {
    /// An empty region with this layout's header.
    pub fn new() -> Self {
        let mut b = vec![0u8; SIZE];
        b[header::MAGIC..header::MAGIC + 8].copy_from_slice(&MAGIC.to_le_bytes());
        b[header::VERSION..header::VERSION + 4].copy_from_slice(&VERSION.to_le_bytes());
        b[header::SIZE..header::SIZE + 4].copy_from_slice(&(SIZE as u32).to_le_bytes());
        b[header::MAX_DEVICES..header::MAX_DEVICES + 4]
            .copy_from_slice(&(MAX_DEVICES as u32).to_le_bytes());
        b[header::MAX_PROCS..header::MAX_PROCS + 4]
            .copy_from_slice(&(MAX_PROCS as u32).to_le_bytes());
        Image(b)
    }

    fn put(&mut self, at: usize, v: &[u8]) {
        self.0[at..at + v.len()].copy_from_slice(v);
    }

    /// Device entry `i` in use for `uuid` with cap `limit`.
    pub fn dev(mut self, i: usize, uuid: &[u8; 16], limit: u64) -> Self {
        let at = dev_at(i);
        self.put(at + dev::STATE, &DEV_IN_USE.to_le_bytes());
        self.put(at + dev::UUID, uuid);
        self.put(at + dev::LIMIT, &limit.to_le_bytes());
        self
    }

    /// Process slot `i` held by `pid` (started at `start`) counting `used` bytes on each
    /// `(device entry, bytes)`; raises the high-water mark to cover it.
    pub fn slot(mut self, i: usize, pid: u32, start: u64, used: &[(usize, u64)]) -> Self {
        let at = slot_at(i);
        self.put(at + slot::PID, &pid.to_le_bytes());
        self.put(at + slot::START_TIME, &start.to_le_bytes());
        for &(d, n) in used {
            self.put(at + slot::USED + 8 * d, &n.to_le_bytes());
        }
        let hwm = u32_at(&self.0, header::PROC_HWM).max(i as u32 + 1);
        self.hwm(hwm)
    }

    /// Sets the high-water mark of slots ever used.
    pub fn hwm(mut self, n: u32) -> Self {
        self.put(header::PROC_HWM, &n.to_le_bytes());
        self
    }

    /// The bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: &str = "GPU-5a1e0000-0000-4000-8000-000000000001";
    const H: &str = "GPU-5a1e0000-0000-4000-8000-000000000002";

    #[test]
    fn sizes_are_the_limiters_repr_c_layout() {
        // Written out independently of the constants above: 32-byte header, 16 device entries
        // of 32 bytes, 512 slots of 16 + 16 × 8 bytes.
        assert_eq!(SIZE, 32 + 16 * 32 + 512 * (16 + 16 * 8));
        assert_eq!(SIZE, 74_272);
        assert_eq!(MAGIC.to_le_bytes(), *b"GPSHLIM\0");
    }

    #[test]
    fn an_image_round_trips_through_a_view() {
        let g = uuid_bytes(G).unwrap();
        let h = uuid_bytes(H).unwrap();
        let b = Image::new()
            .dev(3, &g, 1 << 30)
            .dev(5, &h, 2 << 30)
            .slot(0, 10, 77, &[(3, 1 << 20), (5, 9)])
            .slot(1, 0, 0, &[(3, 999)])
            .slot(2, RECLAIMING, 0, &[(3, 7)])
            .slot(3, 11, 78, &[(3, 3 << 20)])
            .into_bytes();
        let v = View::new(&b).expect("own layout");
        assert_eq!(v.dev_of(&g), Some(3));
        assert_eq!(v.dev_of(&h), Some(5));
        assert_eq!(v.limit(3), 1 << 30);
        assert_eq!(v.limit(5), 2 << 30);
        assert_eq!(
            v.live().collect::<Vec<_>>(),
            [(0, 10, 77), (3, 11, 78)],
            "free and reclaiming slots are not live"
        );
        assert_eq!(v.used(3), 4 << 20);
        assert_eq!(used_in(&b, &g), Some(4 << 20));
        assert_eq!(used_in(&b, &h), Some(9));
        let other = uuid_bytes("GPU-5a1e0000-0000-4000-8000-000000000003").unwrap();
        assert_eq!(used_in(&b, &other), None, "GPU not in the region");
    }

    #[test]
    fn foreign_bytes_read_as_nothing() {
        let u = uuid_bytes(G).unwrap();
        let good = Image::new()
            .dev(0, &u, 0)
            .slot(0, 10, 1, &[(0, 5)])
            .into_bytes();
        assert_eq!(used_in(&good, &u), Some(5), "positive control");
        assert_eq!(used_in(&good[..SIZE - 1], &u), None, "short");
        let mut long = good.clone();
        long.push(0);
        assert_eq!(used_in(&long, &u), None, "long");
        let mut bad = good.clone();
        bad[0] ^= 1;
        assert_eq!(used_in(&bad, &u), None, "magic");
        let mut bad = good.clone();
        bad[header::VERSION] = 2;
        assert_eq!(used_in(&bad, &u), None, "version");
        let mut bad = good.clone();
        bad[header::SIZE] ^= 1;
        assert_eq!(used_in(&bad, &u), None, "recorded size");
        let huge = Image::new()
            .dev(0, &u, 0)
            .slot(0, 10, 1, &[(0, 5)])
            .hwm(u32::MAX)
            .into_bytes();
        assert_eq!(used_in(&huge, &u), Some(5), "hwm clamped");
    }

    #[test]
    fn uuids_parse_as_nvml_prints_them() {
        let b = uuid_bytes(G).unwrap();
        assert_eq!(
            b,
            [0x5a, 0x1e, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 1]
        );
        assert_eq!(
            uuid_words(&b),
            [0x0040_0000_0000_1e5a, 0x0100_0000_0000_0080]
        );
        for bad in [
            "GPU-zz",
            "",
            "MIG-5a1e0000-0000-4000-8000-000000000001",
            "GPU-5a1e",
        ] {
            assert_eq!(uuid_bytes(bad), None, "{bad}");
        }
    }
}
