//! `gpushare-dra` ships beside gpushare's other binaries and so keeps their baseline: nothing
//! newer than glibc 2.17 and no library beyond glibc's own (its dynamic section's `NEEDED`
//! entries and the symbol versions it requires, read with goblin; the workspace links through
//! zig against glibc 2.17's stubs).

use gpushare::container::inject::libc::{parse_version, BASELINE};

const GLIBC_OWN: [&str; 6] = [
    "libc.so.6",
    "ld-linux-x86-64.so.2",
    "libpthread.so.0",
    "libdl.so.2",
    "libm.so.6",
    "librt.so.1",
];

#[test]
fn the_plugin_needs_only_glibc_2_17() {
    let path = env!("CARGO_BIN_EXE_gpushare-dra");
    let bytes = std::fs::read(path).unwrap();
    let elf = goblin::elf::Elf::parse(&bytes).expect("an ELF file");
    let mut faults = Vec::new();
    for l in &elf.libraries {
        if !GLIBC_OWN.contains(l) {
            faults.push(format!("NEEDED {l}, which is not glibc's"));
        }
    }
    let mut versions = Vec::new();
    if let Some(vn) = &elf.verneed {
        for need in vn.iter() {
            for aux in need.iter() {
                if let Some(name) = elf.dynstrtab.get_at(aux.vna_name) {
                    versions.push(name.to_owned());
                }
            }
        }
    }
    // The positive control: a dynamic program that needs glibc at all.
    assert!(elf.libraries.contains(&"libc.so.6"), "{:?}", elf.libraries);
    assert!(
        versions.iter().any(|v| v.starts_with("GLIBC_2.")),
        "{versions:?}"
    );
    for v in &versions {
        match parse_version(v) {
            Some(g) if g > BASELINE => {
                faults.push(format!("needs {v}, newer than glibc {BASELINE}"))
            }
            Some(_) => {}
            None => faults.push(format!("needs symbol version {v}")),
        }
    }
    assert!(faults.is_empty(), "{path}: {faults:?}");
}
