#!/usr/bin/env bash
# The second LibTorch tree: builds every library and unit test with clang's thread-safety
# analysis as errors (STRIDER_THREAD_SAFETY=ON, cmake/ThreadSafety.cmake) against the CUDA
# LibTorch of PyPI's torch 2.11.0 (STRIDER_TORCH=cuda, scripts/setup.sh; nvcc from
# /usr/local/cuda for the .cu files), then runs the unit tests there on the CPU. One tree checks
# both the locking annotations and that the code base compiles, links and passes its unit tests
# against LibTorch 2.11 with CUDA, as the default tree does against Debian's 1.13 (docs/cuda.md).
#   scripts/thread_safety.sh [BUILD_DIR [ctest arguments...]]   default BUILD_DIR: build-tsa,
#                                                                ctest arguments: -L unit
# Environment: STRIDER_JOBS as for scripts/setup.sh, which installs clang and fetches the wheels;
# STRIDER_TORCH=debian checks against Debian's LibTorch 1.13 instead.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-tsa}
shift $(( $# > 0 ? 1 : 0 ))
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(-L unit)
start=$(date +%s)
# CC and CXX choose the compiler when the tree is first configured; cmake refuses the option
# under any other compiler.
CC=clang CXX=clang++ STRIDER_TORCH=${STRIDER_TORCH:-cuda} \
  STRIDER_CMAKE_ARGS="-DSTRIDER_THREAD_SAFETY=ON" \
  scripts/setup.sh "$dir" strider_libraries strider_unit_tests
built=$(date +%s)
(cd "$dir" && ctest --output-on-failure --timeout 900 -j 2 "${tests[@]}")
echo "$dir (thread safety, LibTorch ${STRIDER_TORCH:-cuda}): setup and build $((built - start)) s," \
  "tests $(($(date +%s) - built)) s"
