#!/usr/bin/env bash
# Runs every libFuzzer target for longer than ctest does, one after another, from its seed
# corpus (new inputs go to build/tests/fuzz/found_<name>), and prints each target's final stats.
# Each target stops after the given seconds or FUZZ_RUNS executions (default 10 million),
# whichever comes first.
#   scripts/fuzz.sh [seconds per target, default 1800] [target ...]
# Needs a build (scripts/setup.sh build) with clang installed. A crash, slow input or leak leaves
# its input as build/tests/fuzz/<name>-crash-* (-slow-unit-*, ...) and a crash stops the script
# with libFuzzer's exit code.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-1800}
runs=${FUZZ_RUNS:-10000000}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(env_protocol tool_call safetensors config weight_stream snapshot)
fi
for name in "${targets[@]}"; do
  binary=build/tests/fuzz/${name}_fuzzer
  mkdir -p build/tests/fuzz/found_${name}
  echo "== ${name}: ${seconds} s or ${runs} executions"
  log=build/tests/fuzz/${name}.log
  rc=0
  "${binary}" -max_total_time="${seconds}" -runs="${runs}" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="build/tests/fuzz/${name}-" \
    build/tests/fuzz/found_${name} tests/fuzz/corpus/${name} > "${log}" 2>&1 || rc=$?
  grep -E '^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==ERROR|SUMMARY)' \
    "${log}" || true
  if [ "${rc}" -ne 0 ]; then
    echo "${name}: libFuzzer exited with ${rc}; its log is ${log}"
    exit "${rc}"
  fi
done
