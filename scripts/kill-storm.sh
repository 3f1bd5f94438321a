#!/usr/bin/env bash
# Kill storm: ROUNDS rounds (seeded by SEED) of 1-16 concurrent createRuntime/poststop hooks on
# 1-4 TEST-ONLY simulated GPUs, a random subset SIGKILLed after a random delay, then `gc` and the
# invariants of scripts/check-invariants.py, then a fresh acquire. Exit 1 on any violation.
# Needs root and a built workspace (cargo build --workspace).
#   scripts/kill-storm.sh ROUNDS SEED
set -euo pipefail
exec python3 "$(dirname "$0")/storm.py" storm "${1:?ROUNDS}" "${2:?SEED}"
