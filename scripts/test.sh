#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (every label: unit, integration, slow) against
# Debian's LibTorch 1.13; then builds the libraries and unit tests against the CUDA LibTorch of
# torch 2.11.0 with clang's thread-safety analysis as errors and runs those unit tests on the
# CPU (scripts/thread_safety.sh, build-tsa/), so neither LibTorch breaks silently; then runs the
# LibTorch-free tests again under AddressSanitizer + UBSan and ThreadSanitizer
# (scripts/sanitize.sh). Each of those passes has its own build tree.
#   scripts/test.sh [ctest arguments...]     e.g. scripts/test.sh -L unit (no further pass then)
# STRIDER_THREAD_SAFETY_CHECK=0 skips the second LibTorch tree, STRIDER_SANITIZERS=0 the
# sanitizer pass.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh build
built=$(date +%s)
echo "setup and build: $((built - start)) s"
(cd build && ctest --output-on-failure --timeout 900 -j 2 "$@")
tested=$(date +%s)
echo "tests: $((tested - built)) s"
if [ $# -eq 0 ] && [ "${STRIDER_THREAD_SAFETY_CHECK:-1}" != 0 ]; then
  scripts/thread_safety.sh build-tsa
  echo "LibTorch 2.11 tree with thread safety: $(($(date +%s) - tested)) s"
fi
checked=$(date +%s)
if [ $# -eq 0 ] && [ "${STRIDER_SANITIZERS:-1}" != 0 ]; then
  scripts/sanitize.sh all
  echo "sanitizers: $(($(date +%s) - checked)) s"
fi
echo "total: $(($(date +%s) - start)) s"
