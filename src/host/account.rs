//! Reads the limiter's shared accounting region of a container (`containers/<id>/shared/cache`
//! in the state dir, see `limiter/src/region.rs`) to tell how much device memory the
//! container's processes hold per GPU. The file is writable from inside the container, so it
//! is parsed as untrusted bytes: a wrong size, magic or version reads as nothing.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::host::state::StateDir;

/// "GPSHLIM\0", the region's magic.
const MAGIC: u64 = u64::from_le_bytes(*b"GPSHLIM\0");
const VERSION: u32 = 1;
const MAX_DEVICES: usize = 16;
const MAX_PROCS: usize = 512;
/// A slot being reclaimed.
const RECLAIMING: u32 = u32::MAX;
/// Header: magic, version, size, max_devices, max_procs, proc_hwm, padding.
const HEADER: usize = 32;
/// Device entry: state, padding, uuid (2 × u64), limit.
const DEV: usize = 32;
/// Process slot: pid, padding, start time, used per device.
const SLOT: usize = 16 + 8 * MAX_DEVICES;
/// The whole region, as the limiter lays it out (`#[repr(C)]`).
pub const SIZE: usize = HEADER + DEV * MAX_DEVICES + SLOT * MAX_PROCS;

/// The accounting file of container `id`.
pub fn region_path(sd: &StateDir, id: &str) -> std::path::PathBuf {
    sd.container_dir(id).join("shared").join("cache")
}

/// Bytes of device memory the container's live processes hold on the GPU `uuid`, per the
/// region at `path`; `None` when there is no usable region or the GPU is not in it.
pub fn used_on(path: &Path, uuid: &str) -> Option<u64> {
    let want = uuid_bytes(uuid)?;
    let f = open_regular(path)?;
    let mut buf = Vec::with_capacity(SIZE + 1);
    f.take(SIZE as u64 + 1).read_to_end(&mut buf).ok()?;
    used_in(&buf, &want)
}

/// Opens `path` for reading only if it is a regular file, looked at before it is opened: an
/// `O_PATH` descriptor (which opens nothing: no FIFO waits, no device driver runs) is checked
/// with `fstat`, and only then is that same inode opened for reading, through the descriptor.
/// A link, FIFO, socket or device node a tenant planted there is never opened.
fn open_regular(path: &Path) -> Option<std::fs::File> {
    let probe = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    if !probe.metadata().ok()?.is_file() {
        return None;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", probe.as_raw_fd()))
        .ok()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// [`used_on`] over the region's bytes.
pub fn used_in(b: &[u8], uuid: &[u8; 16]) -> Option<u64> {
    if b.len() != SIZE
        || u64_at(b, 0) != MAGIC
        || u32_at(b, 8) != VERSION
        || u32_at(b, 12) as usize != SIZE
    {
        return None;
    }
    let (a, z) = uuid.split_at(8);
    let (a, z) = (
        u64::from_le_bytes(a.try_into().ok()?),
        u64::from_le_bytes(z.try_into().ok()?),
    );
    let dev = (0..MAX_DEVICES).find(|i| {
        let at = HEADER + i * DEV;
        u32_at(b, at) == 1 && u64_at(b, at + 8) == a && u64_at(b, at + 16) == z
    })?;
    let hwm = (u32_at(b, 24) as usize).min(MAX_PROCS);
    let procs = HEADER + DEV * MAX_DEVICES;
    Some((0..hwm).fold(0u64, |acc, i| {
        let at = procs + i * SLOT;
        let pid = u32_at(b, at);
        if pid == 0 || pid == RECLAIMING {
            acc
        } else {
            acc.saturating_add(u64_at(b, at + 16 + 8 * dev))
        }
    }))
}

/// The 16 bytes of an NVML UUID (`GPU-xxxxxxxx-xxxx-…`), as the limiter keys devices.
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A region as the limiter writes it: GPU `uuid` in device entry `dev`, and `(pid, bytes)`
    /// per process slot.
    pub(crate) fn region(uuid: &str, dev: usize, procs: &[(u32, u64)]) -> Vec<u8> {
        let mut b = vec![0u8; SIZE];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(SIZE as u32).to_le_bytes());
        b[24..28].copy_from_slice(&(procs.len() as u32).to_le_bytes());
        let u = uuid_bytes(uuid).unwrap();
        let at = HEADER + dev * DEV;
        b[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
        b[at + 8..at + 24].copy_from_slice(&u);
        for (i, (pid, used)) in procs.iter().enumerate() {
            let at = HEADER + DEV * MAX_DEVICES + i * SLOT;
            b[at..at + 4].copy_from_slice(&pid.to_le_bytes());
            let u = at + 16 + 8 * dev;
            b[u..u + 8].copy_from_slice(&used.to_le_bytes());
        }
        b
    }

    const G: &str = "GPU-5a1e0000-0000-4000-8000-000000000001";

    #[test]
    fn live_slots_are_summed_for_the_gpu() {
        let b = region(
            G,
            3,
            &[(10, 1 << 20), (0, 999), (RECLAIMING, 7), (11, 3 << 20)],
        );
        assert_eq!(used_in(&b, &uuid_bytes(G).unwrap()), Some(4 << 20));
        let other = uuid_bytes("GPU-5a1e0000-0000-4000-8000-000000000002").unwrap();
        assert_eq!(used_in(&b, &other), None, "GPU not in the region");
    }

    #[test]
    fn foreign_bytes_read_as_nothing() {
        let u = uuid_bytes(G).unwrap();
        let good = region(G, 0, &[(10, 5)]);
        assert_eq!(used_in(&good[..SIZE - 1], &u), None, "short");
        let mut bad = good.clone();
        bad[0] ^= 1;
        assert_eq!(used_in(&bad, &u), None, "magic");
        let mut bad = good.clone();
        bad[8] = 2;
        assert_eq!(used_in(&bad, &u), None, "version");
        let mut huge = good.clone();
        huge[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(used_in(&huge, &u), Some(5), "hwm clamped");
        assert_eq!(uuid_bytes("GPU-zz"), None);
    }

    #[test]
    fn files_are_read_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cache");
        std::fs::write(&p, region(G, 1, &[(10, 42)])).unwrap();
        assert_eq!(used_on(&p, G), Some(42));
        let l = dir.path().join("link");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        assert_eq!(used_on(&l, G), None, "a planted symlink is not followed");
    }

    #[test]
    fn a_planted_fifo_is_never_opened() {
        // A writer blocked in open(2) of a FIFO is let go the moment anyone opens its read end:
        // the oracle of whether the host opened the node at all.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cache");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = {
            let p = p.clone();
            std::thread::spawn(move || {
                let f = std::fs::OpenOptions::new().write(true).open(&p);
                tx.send(()).unwrap();
                f
            })
        };
        // Positive control: the writer is really blocked in open(2) before the host looks.
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(200))
                .is_err(),
            "the writer's open did not block"
        );
        assert_eq!(used_on(&p, G), None);
        let opened = rx
            .recv_timeout(std::time::Duration::from_millis(300))
            .is_ok();
        // Let the writer go, whatever happened.
        let _reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&p)
            .unwrap();
        writer.join().unwrap().unwrap();
        assert!(!opened, "used_on opened the planted FIFO");
    }
}
