#!/usr/bin/env bash
# Builds every library with clang's thread-safety analysis as errors, in its own build tree
# (STRIDER_THREAD_SAFETY=ON, cmake/ThreadSafety.cmake), and runs the analysis' compile test
# there. Only the libraries: tests, benchmarks and the binary are not built, and nothing runs
# but that one test.
#   scripts/thread_safety.sh [BUILD_DIR]     default BUILD_DIR: build-tsa
# Environment: STRIDER_JOBS as for scripts/setup.sh, which installs clang.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-tsa}
start=$(date +%s)
# CC and CXX choose the compiler when the tree is first configured; cmake refuses the option
# under any other compiler.
CC=clang CXX=clang++ STRIDER_CMAKE_ARGS="-DSTRIDER_THREAD_SAFETY=ON -DSTRIDER_ENABLE_CUDA=OFF" \
  scripts/setup.sh "$dir" strider_libraries
built=$(date +%s)
(cd "$dir" && ctest --output-on-failure -R '^thread_safety_compile_test$')
echo "$dir (thread safety): build $((built - start)) s, test $(($(date +%s) - built)) s"
