//! Dropping privileges for good before exec: capabilities reduced to a mask, and NoNewPrivs.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Arranges for `cmd` to exec with only the capabilities in `keep` (a mask of `CAP_*` bits) in
/// its bounding, permitted and effective sets, none inheritable or ambient, and NoNewPrivs, so
/// that it can never gain more. Runs after any `pre_exec` set up before it (a sandbox that
/// needs `CAP_SYS_ADMIN` for its mounts).
pub fn drop_privileges_on_exec(cmd: &mut Command, keep: u64) {
    // SAFETY: pre_exec's closure runs in the forked child, where only async-signal-safe calls
    // are allowed (another thread may have held a lock at the fork). This one only makes raw
    // system calls (prctl, capset) on data on its own stack; it allocates nothing and takes no
    // locks, and its error is an errno turned into an io::Error without allocating.
    unsafe {
        cmd.pre_exec(move || drop_privileges(keep).map_err(std::io::Error::from));
    }
}

/// The work of [`drop_privileges_on_exec`], async-signal-safe.
fn drop_privileges(keep: u64) -> nix::Result<()> {
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes integers only and reads or writes no memory of
    // this process; it changes only this (forked) process's ambient set.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    nix::errno::Errno::result(r)?;
    for cap in 0..64u32 {
        if keep & (1u64 << cap) != 0 {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes integers only and touches no memory of this process;
        // a capability number the kernel does not know is refused with EINVAL, handled below.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        // EINVAL: past the last capability this kernel knows.
        if r != 0 && nix::errno::Errno::last() != nix::errno::Errno::EINVAL {
            return Err(nix::errno::Errno::last());
        }
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    for (i, d) in data.iter_mut().enumerate() {
        let word = (keep >> (32 * i)) as u32;
        d.effective = word;
        d.permitted = word;
    }
    // SAFETY: capset(2) with version 3 reads one header and two data structs: `header` and
    // `data` are #[repr(C)] copies of `__user_cap_header_struct` and `__user_cap_data_struct`
    // (two of them, as version 3 wants), on this stack frame for the whole call.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) };
    nix::errno::Errno::result(r)?;
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integers only and touches no memory of this process.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    nix::errno::Errno::result(r).map(drop)
}
