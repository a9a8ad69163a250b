#!/usr/bin/env bash
# Installs Strider's system packages (Debian 12) when missing, then configures and builds.
#   scripts/setup.sh [BUILD_DIR [TARGET...]]     default BUILD_DIR: build, TARGET: everything
# Environment: STRIDER_BUILD_TYPE (RelWithDebInfo), STRIDER_JOBS (nproc), STRIDER_CMAKE_ARGS (extra
# configure arguments, e.g. -DSTRIDER_SANITIZE=thread).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev libopenblas0-openmp
  libzmq3-dev cppzmq-dev capnproto libcapnp-dev
  librocksdb-dev rocksdb-tools
  libboost-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libgtest-dev
  clang python3-zmq python3-numpy python3-torch
  chromium zlib1g-dev   # tests/integration/report_browser_test.cc renders report.html headless
  python3-prometheus-client   # tests read the services' /metrics with its parser
  libpcre2-dev libicu-dev   # common/tokenizer: split patterns (PCRE2 JIT), NFC (ICU)
)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

build_dir="${1:-build}"
shift $(( $# > 0 ? 1 : 0 ))
targets=()
for target in "$@"; do targets+=(--target "$target"); done
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.ccache}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
# shellcheck disable=SC2086  # STRIDER_CMAKE_ARGS is a list of words
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${STRIDER_BUILD_TYPE:-RelWithDebInfo}" \
  ${STRIDER_CMAKE_ARGS:-} >/dev/null
# LibTorch translation units need about 1.1 GB of compiler memory each; two jobs fit easily.
cmake --build "$build_dir" -j "${STRIDER_JOBS:-$(nproc)}" "${targets[@]}"
