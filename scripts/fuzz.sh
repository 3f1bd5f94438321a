#!/usr/bin/env bash
# Fuzzes every cargo-fuzz target in fuzz/ for SECONDS each (default 60), starting from the
# committed seed corpus, and prints one summary line per target: executions, coverage (libFuzzer's
# cov and ft counters) and new corpus size. Needs the nightly toolchain; installs cargo-fuzz from
# crates.io when missing. New inputs go to target/fuzz-corpus/<target>, never into the committed
# corpus; a crash leaves its input under fuzz/artifacts/<target>/ and fails the script.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
# Fuzz binaries link with the host's cc as before (sanitizer runtimes), not the repository's
# glibc 2.17 linker of .cargo/config.toml: they are never shipped.
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=cc
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(oci_state config_json request policy state_record spec_edit)

rustup toolchain list | grep '^nightly' >/dev/null || { echo "fuzz.sh: the nightly toolchain is missing: rustup toolchain install nightly" >&2; exit 1; }
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

for t in "${targets[@]}"; do cargo +nightly fuzz build "$t" 2>&1 | tail -1 >&2; done
mkdir -p target/fuzz-logs
printf '| target | seconds | executions | execs/s | cov | ft | corpus |\n|---|---|---|---|---|---|---|\n'
status=0
for t in "${targets[@]}"; do
    work=target/fuzz-corpus/$t
    mkdir -p "$work"
    log=target/fuzz-logs/$t.log
    # -timeout: one input taking 10 s is a hang; -rss_limit_mb: deep configs use a large stack.
    if ! cargo +nightly fuzz run "$t" "$work" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=4096 >"$log" 2>&1; then
        echo "fuzz.sh: $t failed, see $log and fuzz/artifacts/$t/" >&2
        status=1
    fi
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' <<<"$last" | grep -o '[0-9]*')
    ft=$(grep -o 'ft: [0-9]*' <<<"$last" | grep -o '[0-9]*')
    corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' <<<"$last" | cut -d' ' -f2)
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$secs" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}"
done
exit $status
