#!/usr/bin/env bash
# Runs every benchmark program present in the build and writes bench/results.jsonl: a first line
# describing the machine, then each program's JSON lines (docs/design.md#benchmark-protocol).
#   scripts/bench.sh [build-dir] [extra arguments for every bench program, e.g. --quick]
# The programs run under the caller's OMP_WAIT_POLICY (recorded in the machine line and in each
# line as "policy"); their matmul and copy ceilings are measured at the default policy as well
# and the better is kept ("ceiling_policy", bench/ceiling.h), so ratios do not depend on it.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true
out=bench/results.jsonl
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

json_string() {  # quotes a value for JSON (backslashes and double quotes)
  local s=${1//\\/\\\\}
  printf '"%s"' "${s//\"/\\\"}"
}
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
memory_kib=$(awk '/MemTotal/ {print $2}' /proc/meminfo)
printf '{"bench":"machine","nproc":%s,"cpu":%s,"memory_gib":%s,"omp_wait_policy":%s,"date":%s,"commit":%s}\n' \
  "$(nproc)" "$(json_string "${cpu:-unknown}")" "$((memory_kib / 1024 / 1024))" \
  "$(json_string "${OMP_WAIT_POLICY:-default}")" \
  "$(json_string "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" \
  "$(json_string "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)")" > "$tmp"

ran=0
for program in model_bench replay_bench rollout_bench pretrain_bench envs_bench actor_bench learner_bench fleet_bench; do
  binary="$build_dir/bench/$program"
  if [[ -x "$binary" ]]; then
    echo "running $binary $*" >&2
    "$binary" "$@" >> "$tmp"
    ran=$((ran + 1))
  fi
done
if [[ $ran -eq 0 ]]; then
  echo "no bench programs under $build_dir/bench (build them first)" >&2
  exit 1
fi
mv "$tmp" "$out"
trap - EXIT
echo "wrote $out" >&2
