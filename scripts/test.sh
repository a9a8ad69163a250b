#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (every label: unit, integration, slow), then the
# LibTorch-free tests again under AddressSanitizer + UBSan and ThreadSanitizer
# (scripts/sanitize.sh, their own build trees).
#   scripts/test.sh [ctest arguments...]     e.g. scripts/test.sh -L unit (no sanitizer pass then)
# STRIDER_SANITIZERS=0 skips the sanitizer pass.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh build
built=$(date +%s)
echo "setup and build: $((built - start)) s"
(cd build && ctest --output-on-failure --timeout 900 -j 2 "$@")
tested=$(date +%s)
echo "tests: $((tested - built)) s"
if [ $# -eq 0 ] && [ "${STRIDER_SANITIZERS:-1}" != 0 ]; then
  scripts/sanitize.sh all
  echo "sanitizers: $(($(date +%s) - tested)) s"
fi
echo "total: $(($(date +%s) - start)) s"
