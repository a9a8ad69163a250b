#!/usr/bin/env bash
# Runs the load and soak test (tests/chaos/soak_test.cc) for longer than ctest does and prints
# its summary line: 32 stand-in actors, 2 real actors and a sampler against one replay server.
#   scripts/soak.sh [seconds, default 600] [seed, default 1]
# Needs a build (scripts/setup.sh build).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
seed=${2:-1}
export STRIDER_SOURCE_DIR=$PWD STRIDER_BINARY_DIR=$PWD/build OMP_WAIT_POLICY=PASSIVE
log=build/tests/chaos/soak.log
rc=0
STRIDER_SOAK_SECONDS=${seconds} STRIDER_SOAK_SEED=${seed} build/tests/chaos/soak_test > "${log}" 2>&1 || rc=$?
grep -E '^\{"|Failure|Expected|Which is|grew|slowed' "${log}" || true
if [ "${rc}" -ne 0 ]; then
  echo "soak failed; its log is ${log}"
  exit "${rc}"
fi
