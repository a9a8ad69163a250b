#!/usr/bin/env bash
# Installs Strider's system packages (Debian 12) when missing, then configures and builds.
#   scripts/setup.sh [BUILD_DIR [TARGET...]]     default BUILD_DIR: build, TARGET: everything
# Environment: STRIDER_BUILD_TYPE (RelWithDebInfo), STRIDER_JOBS (nproc), STRIDER_CMAKE_ARGS (extra
# configure arguments, e.g. -DSTRIDER_SANITIZE=thread).
# STRIDER_TORCH=cuda builds against the CUDA LibTorch of PyPI's torch 2.11.0 wheel instead of
# Debian's LibTorch 1.13 (CPU), with the CUDA toolkit in /usr/local/cuda (13.x); use a build
# folder of its own, e.g. `STRIDER_TORCH=cuda scripts/setup.sh build-cuda`. The wheels are
# fetched once into .cache/wheels and unpacked into .cache/torch-2.11.0 (docs/cuda.md).
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
torch_kind=${STRIDER_TORCH:-debian}
case "$torch_kind" in
  debian) ;;
  cuda) packages+=(python3-pip unzip) ;;  # pip download fetches the wheels; unzip unpacks them
  *) echo "setup: STRIDER_TORCH is '$torch_kind'; expected debian or cuda" >&2; exit 2 ;;
esac
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

# The CUDA LibTorch: torch 2.11.0 from PyPI, pinned exactly (LibTorch's C++ symbols change
# between minor versions). Of the wheel only torch/include, torch/lib and torch/share/cmake are
# used; no Python import is involved. libtorch_cuda also needs three libraries that
# /usr/local/cuda does not ship: their wheels are fetched at the versions the torch wheel's
# METADATA pins (cuSPARSELt and NVSHMEM directly, cuFile through cuda-toolkit[cufile]==13.0.2)
# and unpacked beside torch/ as nvidia/<name>/lib, where the torch libraries' own RUNPATH
# ($ORIGIN/../../nvidia/...) finds them; the rest (cudart, cuBLAS, cuDNN, NCCL, ...) come from
# the system CUDA. A stamp file marks a complete unpack, so an interrupted one is redone.
torch_version=2.11.0
torch_runtime_wheels=(nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 nvidia-cufile==1.15.1.6)
torch_prefix=.cache/torch-$torch_version
fetch_cuda_torch() {
  local wheels=.cache/wheels
  [ -f "$torch_prefix/.unpacked" ] && return
  local nvcc=${CUDACXX:-/usr/local/cuda/bin/nvcc}
  if ! "$nvcc" --version 2>/dev/null | grep -q 'release 13\.'; then
    echo "setup: STRIDER_TORCH=cuda needs CUDA 13 (the torch $torch_version wheel's), at $nvcc" >&2
    exit 1
  fi
  mkdir -p "$wheels"
  local fetch_start unpack_start
  fetch_start=$(date +%s)
  # One platform and Python tag, whatever python3 runs this: the same wheel on every machine.
  # (pip takes the platform tags literally: the runtime wheels are manylinux2014 ones.)
  local pip_args=(download --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64
    --platform manylinux2014_x86_64 --python-version 3.12 --dest "$wheels")
  local wheel=("$wheels"/torch-$torch_version-cp312-cp312-manylinux_2_28_x86_64.whl)
  [ -f "${wheel[0]}" ] || python3 -m pip "${pip_args[@]}" "torch==$torch_version"
  local metadata pin name
  metadata=$(unzip -p "${wheel[0]}" "torch-$torch_version.dist-info/METADATA")
  for pin in "${torch_runtime_wheels[@]:0:2}"; do
    grep -q "^Requires-Dist: $pin;" <<<"$metadata" ||
      { echo "setup: the torch wheel no longer pins $pin; update torch_runtime_wheels" >&2; exit 1; }
  done
  grep -q '^Requires-Dist: cuda-toolkit\[.*cufile.*\]==13\.0\.2;' <<<"$metadata" ||
    { echo "setup: the torch wheel no longer pins cuda-toolkit 13.0.2 (cuFile)" >&2; exit 1; }
  for pin in "${torch_runtime_wheels[@]}"; do
    name=${pin%%==*}
    compgen -G "$wheels/${name//-/_}-${pin#*==}-*.whl" >/dev/null ||
      python3 -m pip "${pip_args[@]}" "$pin"
  done
  unpack_start=$(date +%s)
  rm -rf "$torch_prefix"
  mkdir -p "$torch_prefix"
  # Without the wheel's fmt 12 headers: they would shadow Debian's fmt 9, which Debian's spdlog
  # is built against, in every file that includes both. LibTorch's own headers compile with 9.
  unzip -q "${wheel[0]}" 'torch/include/*' 'torch/lib/*' 'torch/share/cmake/*' \
    -x 'torch/include/fmt/*' -d "$torch_prefix"
  unzip -q "$wheels"/nvidia_cusparselt_cu13-0.8.0-*.whl 'nvidia/cusparselt/lib/*' -d "$torch_prefix"
  unzip -q "$wheels"/nvidia_nvshmem_cu13-3.4.5-*.whl 'nvidia/nvshmem/lib/libnvshmem_host.so*' \
    -d "$torch_prefix"
  unzip -q "$wheels"/nvidia_cufile-1.15.1.6-*.whl 'nvidia/cu13/lib/*' -d "$torch_prefix"
  touch "$torch_prefix/.unpacked"
  echo "setup: torch $torch_version wheels fetched in $((unpack_start - fetch_start)) s," \
    "unpacked into $torch_prefix in $(($(date +%s) - unpack_start)) s"
}
torch_args=()
if [ "$torch_kind" = cuda ]; then
  fetch_cuda_torch
  # Caffe2_DIR too: TorchConfig looks for Caffe2 on the system prefixes before its own folder,
  # and would find Debian's.
  torch_args=(-DTorch_DIR="$PWD/$torch_prefix/torch/share/cmake/Torch"
    -DCaffe2_DIR="$PWD/$torch_prefix/torch/share/cmake/Caffe2"
    -DCMAKE_CUDA_COMPILER="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
    -DCUDA_TOOLKIT_ROOT_DIR=/usr/local/cuda -DCUDAToolkit_ROOT=/usr/local/cuda)
fi

build_dir="${1:-build}"
shift $(( $# > 0 ? 1 : 0 ))
targets=()
for target in "$@"; do targets+=(--target "$target"); done
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.ccache}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
# A tree keeps the LibTorch it was configured with: cmake caches the library paths it found, so
# a tree switched between the two would mix them. One configured for the other kind is
# configured afresh.
cached_torch=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)
if [ -n "$cached_torch" ]; then
  cached_kind=debian
  [ "$cached_torch" = "$PWD/$torch_prefix/torch/share/cmake/Torch" ] && cached_kind=cuda
  if [ "$cached_kind" != "$torch_kind" ]; then
    echo "setup: $build_dir was configured against $cached_torch; configuring it afresh"
    rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
  fi
fi
configure_start=$(date +%s)
# shellcheck disable=SC2086  # STRIDER_CMAKE_ARGS is a list of words
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${STRIDER_BUILD_TYPE:-RelWithDebInfo}" \
  "${torch_args[@]}" ${STRIDER_CMAKE_ARGS:-} >/dev/null
echo "setup: $build_dir configured in $(($(date +%s) - configure_start)) s"
# LibTorch translation units need about 1.1 GB of compiler memory each; two jobs fit easily.
cmake --build "$build_dir" -j "${STRIDER_JOBS:-$(nproc)}" "${targets[@]}"
