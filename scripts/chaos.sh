#!/usr/bin/env bash
# Runs the fault-injection test (tests/chaos/chaos_test.cc) for longer than ctest does, once per
# seed, and prints each run's summary line.
#   scripts/chaos.sh [seconds per run, default 600] [seed ...]   (default seeds: 1 2 3)
# Needs a build (scripts/setup.sh build). As root it also fills a small tmpfs replay disk.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
seeds=("$@")
if [ ${#seeds[@]} -eq 0 ]; then
  seeds=(1 2 3)
fi
export STRIDER_SOURCE_DIR=$PWD STRIDER_BINARY_DIR=$PWD/build
for seed in "${seeds[@]}"; do
  echo "== seed ${seed}, ${seconds} s"
  log=build/tests/chaos/chaos_seed${seed}.log
  rc=0
  STRIDER_CHAOS_SEED=${seed} STRIDER_CHAOS_SECONDS=${seconds} \
    build/tests/chaos/chaos_test > "${log}" 2>&1 || rc=$?
  grep -E '^\{"chaos_seed"|Failure' "${log}" || true
  if [ "${rc}" -ne 0 ]; then
    echo "seed ${seed} failed; its log is ${log}"
    exit "${rc}"
  fi
done
