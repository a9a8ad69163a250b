#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (every label: unit, integration, slow).
#   scripts/test.sh [ctest arguments...]     e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh build
built=$(date +%s)
echo "setup and build: $((built - start)) s"
cd build
ctest --output-on-failure --timeout 900 -j 2 "$@"
echo "tests: $(($(date +%s) - built)) s"
