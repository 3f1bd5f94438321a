//! Reads the limiter's shared accounting region of a container (`containers/<id>/shared/cache`
//! in the state dir, see `limiter/src/region.rs`) to tell how much device memory the
//! container's processes hold per GPU. The file is writable from inside the container, so it
//! is parsed as untrusted bytes: a wrong size, magic or version reads as nothing.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::host::state::StateDir;

/// The whole region, as the limiter lays it out (the shared definition, `gpushare_region`).
pub const SIZE: usize = gpushare_region::SIZE;

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

/// [`used_on`] over the region's bytes.
pub fn used_in(b: &[u8], uuid: &[u8; 16]) -> Option<u64> {
    gpushare_region::used_in(b, uuid)
}

/// The 16 bytes of an NVML UUID (`GPU-xxxxxxxx-xxxx-…`), as the limiter keys devices.
pub use gpushare_region::uuid_bytes;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpushare_region::RECLAIMING;

    /// A region as the limiter writes it: GPU `uuid` in device entry `dev`, and `(pid, bytes)`
    /// per process slot.
    pub(crate) fn region(uuid: &str, dev: usize, procs: &[(u32, u64)]) -> Vec<u8> {
        let mut image = gpushare_region::Image::new().dev(dev, &uuid_bytes(uuid).unwrap(), 0);
        for (i, (pid, used)) in procs.iter().enumerate() {
            image = image.slot(i, *pid, 0, &[(dev, *used)]);
        }
        image.into_bytes()
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
        bad[gpushare_region::header::VERSION] = 2;
        assert_eq!(used_in(&bad, &u), None, "version");
        let mut huge = good.clone();
        let hwm = gpushare_region::header::PROC_HWM;
        huge[hwm..hwm + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(used_in(&huge, &u), Some(5), "hwm clamped");
        assert_eq!(uuid_bytes("GPU-zz"), None);
    }

    #[test]
    fn the_region_is_the_container_s_shared_cache_file_of_exactly_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        let p = region_path(&sd, "c1");
        assert_eq!(p, dir.path().join("containers/c1/shared/cache"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let mut bytes = region(G, 0, &[(10, 42)]);
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(used_on(&p, G), Some(42));
        bytes.push(0);
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(used_on(&p, G), None, "one byte too long");
    }

    #[test]
    fn the_region_is_opened_close_on_exec_and_non_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cache");
        std::fs::write(&p, b"x").unwrap();
        let f = open_regular(&p).expect("a regular file opens");
        use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
        let fd_flags = FdFlag::from_bits_truncate(fcntl(&f, FcntlArg::F_GETFD).unwrap());
        let fl_flags = OFlag::from_bits_truncate(fcntl(&f, FcntlArg::F_GETFL).unwrap());
        assert!(fd_flags.contains(FdFlag::FD_CLOEXEC), "close-on-exec");
        assert!(fl_flags.contains(OFlag::O_NONBLOCK), "non-blocking");
        assert_eq!(fl_flags & OFlag::O_ACCMODE, OFlag::O_RDONLY, "read only");
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
