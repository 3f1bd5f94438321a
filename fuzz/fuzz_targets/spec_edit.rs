#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| gpushare_fuzz::spec_edit(data));
