#!/usr/bin/env bash
# Soak: CYCLES acquire/release cycles over 4 TEST-ONLY simulated GPUs with random concurrency and
# random SIGKILLs; prints createRuntime p50/p99 for the first and last thousand hooks, and the
# daemons' open fds, state dir size and file count and daemon count against the baseline.
# Exit 1 on an invariant violation or a figure above its baseline. Needs root and a built
# workspace.
#   scripts/soak.sh CYCLES [SEED]
set -euo pipefail
exec python3 "$(dirname "$0")/storm.py" soak "${1:?CYCLES}" "${2:-1}"
