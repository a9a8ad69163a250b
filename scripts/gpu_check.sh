#!/usr/bin/env bash
# The GPU check (docs/cuda.md, "The GPU check"): on a bare H100/H200 machine with only the
# working tree, what travels beside it and PyTorch 2.11 + CUDA 13, builds the CUDA tree and runs
# the correctness checks first, then the baseline figures, each stage under its own timeout and
# within one overall budget, writing its lines to OUT_DIR as soon as the stage ends.
#
#   scripts/gpu_check.sh OUT_DIR [TORCH_PREFIX]
#       TORCH_PREFIX: the torch package folder (holding share/cmake/Torch) or a Python
#       environment holding it; default /opt/torch/.venv, the GPU machines' PyTorch.
#   scripts/gpu_check.sh --fetch-deps DIR
#       Here (Debian 12, with network): downloads the .deb files of the libraries the build needs
#       that the GPU machines lack into DIR (about 46 MiB), to travel with the working tree.
#
# Environment:
#   STRIDER_GPU_DEPS     folder of those .deb files (default .gpu-deps); unpacked with dpkg -x
#                        into a private root, never into /
#   STRIDER_GPU_BUILD    a build tree made elsewhere for this machine's torch: no build stage
#   STRIDER_GPU_BUDGET_S the whole run's budget in seconds (default 300)
#   STRIDER_GPU_STAGES   comma-separated stages to run (build, kernels, model, fleet, distributed,
#                        cuda_bench, model_bench_decode, model_bench_train, learner_bench,
#                        fleet_bench); default all
#   STRIDER_GPU_DRY_RUN  1: no GPU needed, nothing built or run; each stage's command is
#                        printed and the staging (budget, timeouts, lines) runs as for real
#
# OUT_DIR receives (few files, as the device machines return at most eight):
#   stages.jsonl         one line per stage: name, status (ok, failed, timeout, skipped), rc,
#                        seconds, the stage's budget
#   results_cuda.jsonl   the benchmarks' JSON lines (device, driver and commit on each)
#   checks.jsonl         the figures the gpu tests print (two paths, CUDA vs CPU, learner vs
#                        actor, reward, loss)
#   gpu_check.log        every stage's output, in order, under a header per stage
# Exit status: 0 when every correctness stage passed, 1 when one failed or timed out, 2 for a
# usage error, 3 without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# Libraries the build needs beyond a compiler, CMake, ninja, CUDA and torch (Debian 12 names):
# headers and CMake packages, then the shared libraries they link at run time.
deps_packages=(
  librocksdb-dev libcapnp-dev capnproto libzmq3-dev cppzmq-dev libspdlog-dev libfmt-dev
  libyaml-cpp-dev libpcre2-dev libicu-dev libboost1.74-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev zlib1g-dev libsnappy-dev libgflags-dev liblz4-dev libzstd-dev libbz2-dev
  libsodium-dev libpgm-dev libnorm-dev
  librocksdb7.8 libcapnp-0.9.2 libzmq5 libspdlog1.10 libfmt9 libyaml-cpp0.7 libpcre2-8-0
  libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libicu72 libgflags2.2 libsnappy1v5 liblz4-1
  libzstd1 libbsd0 libmd0 libsodium23 libpgm-5.3-0 libnorm1 libgssapi-krb5-2 libkrb5-3
  libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 libbz2-1.0 zlib1g
)

if [ "${1:-}" = "--fetch-deps" ]; then
  dir=${2:?usage: scripts/gpu_check.sh --fetch-deps DIR}
  mkdir -p "$dir" && cd "$dir" || exit 2
  apt-get download "${deps_packages[@]}" || exit 1
  du -sh .
  exit 0
fi

if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  sed -n '2,34p' "$0" >&2
  exit 2
fi
out=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "gpu_check: cannot create $1" >&2; exit 2; }
torch_arg=${2:-/opt/torch/.venv}
dry=${STRIDER_GPU_DRY_RUN:-0}
budget=${STRIDER_GPU_BUDGET_S:-300}
start=$(date +%s)
log=$out/gpu_check.log
stages=$out/stages.jsonl
results=$out/results_cuda.jsonl
checks=$out/checks.jsonl
: >"$log"
: >"$stages"
: >"$results"
: >"$checks"
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then commit="$commit+dirty"; fi
export STRIDER_COMMIT=$commit

say() { echo "gpu_check: $*" | tee -a "$log" >&2; }
left() { echo $((budget - ($(date +%s) - start))); }
stage_line() {  # name status rc seconds budget [note]
  printf '{"stage":"%s","status":"%s","rc":%s,"seconds":%s,"budget_s":%s,"commit":"%s"%s}\n' \
    "$1" "$2" "$3" "$4" "$5" "$commit" "${6:+,\"note\":\"$6\"}" >>"$stages"
}

# run_stage NAME SECONDS MIN_SECONDS COMMAND...: runs COMMAND under min(SECONDS, budget left),
# skipping it when less than MIN_SECONDS is left; appends its output to the log and its line to
# stages.jsonl as soon as it ends. Returns the command's status (124 on a timeout).
failed_checks=0
run_stage() {
  local name=$1 limit=$2 minimum=$3
  shift 3
  if [ -n "${STRIDER_GPU_STAGES:-}" ] && [[ ",$STRIDER_GPU_STAGES," != *",$name,"* ]]; then
    stage_line "$name" skipped null 0 0 "not in STRIDER_GPU_STAGES"
    return 125
  fi
  local remaining
  remaining=$(left)
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  if [ "$limit" -lt "$minimum" ]; then
    say "stage $name skipped: ${remaining} s of the budget left, it needs ${minimum} s"
    stage_line "$name" skipped null 0 "$limit" "budget spent"
    return 125
  fi
  echo "=== stage $name (limit ${limit} s): $*" >>"$log"
  say "stage $name: limit ${limit} s"
  local t0 rc status
  t0=$(date +%s)
  if [ "$dry" = 1 ]; then
    echo "dry run: would run: $*" >>"$log"
    rc=0
  else
    # A shell of its own, so the limit covers the functions below and everything they start.
    timeout --kill-after=10 "$limit" bash -o pipefail -c '"$@"' stage "$@" >>"$log" 2>&1
    rc=$?
  fi
  status=ok
  [ $rc -ne 0 ] && status=failed
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && status=timeout
  stage_line "$name" "$status" "$rc" "$(($(date +%s) - t0))" "$limit"
  say "stage $name: $status (rc $rc, $(($(date +%s) - t0)) s)"
  return $rc
}

# --- what the stages run (each in a shell of its own under run_stage's timeout) -----------------
configure_and_build() {
  local targets=(cuda_kernels_test gpu_model_test gpu_fleet_test gpu_distributed_test strider
    strider_letter_env cuda_bench model_bench learner_bench fleet_bench)
  local prefix=() pkg=()
  if [ -d "$deps_root/usr" ]; then
    prefix=(-DCMAKE_PREFIX_PATH="$deps_root/usr" -DBOOST_ROOT="$deps_root/usr"
      -DCMAKE_INCLUDE_PATH="$deps_root/usr/include" -DCMAKE_PROGRAM_PATH="$deps_root/usr/bin")
    # The .pc files name /usr; the sysroot puts the private root in front of their paths.
    pkg=(PKG_CONFIG_SYSROOT_DIR="$deps_root"
      PKG_CONFIG_LIBDIR="$deps_root/usr/lib/x86_64-linux-gnu/pkgconfig:$deps_root/usr/share/pkgconfig")
  fi
  env "${pkg[@]}" cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DTorch_DIR="$torch_shadow/share/cmake/Torch" -DCaffe2_DIR="$torch_shadow/share/cmake/Caffe2" \
    -DSTRIDER_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}" \
    "${prefix[@]}" &&
    env "${pkg[@]}" cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
}
# gtest's figures (JSON lines the gpu tests print) go to checks.jsonl as well as the log.
run_test() {  # binary [gtest args...]
  local binary=$build/tests/cuda/$1
  shift
  # What ctest would set (cmake/StriderHelpers.cmake): the tests find configs and `strider` so.
  STRIDER_SOURCE_DIR=$root STRIDER_BINARY_DIR=$build "$binary" "$@" 2>&1 | tee -a "$checks.raw"
}
collect_checks() {
  [ -f "$checks.raw" ] && grep '^{"check"' "$checks.raw" >>"$checks"
  rm -f "$checks.raw"
}
bench_into_results() {  # command...: its JSON lines into results_cuda.jsonl
  "$@" | tee -a "$results.raw"
  local rc=${PIPESTATUS[0]}
  grep '^{' "$results.raw" >>"$results"
  rm -f "$results.raw"
  return "$rc"
}
# The end-to-end fleet on one GPU: the tiny calculator fleet with its learner and actor on it.
gpu_fleet() {
  local dir=$out/.fleet
  rm -rf "$dir" && mkdir -p "$dir"
  local fleet=configs/fleet/calculator_tiny.yaml
  local learner actor
  learner=$(sed -n '/^learner:/,/^[a-z]/s/^  config: *//p' "$fleet" | head -1)
  actor=$(sed -n '/^actors:/,/^[a-z]/s/^  config: *//p' "$fleet" | head -1)
  { cat "$learner"; echo "device: cuda"; } >"$dir/learner.yaml"
  sed 's/^actor:$/actor:\n  device: cuda/' "$actor" >"$dir/actor.yaml"
  sed -e "s#^\(  config: \)$learner#\1$dir/learner.yaml#" \
    -e "s#^\(  config: \)$actor#\1$dir/actor.yaml#" \
    -e "s#^\(  config: \)configs/#\1$root/configs/#" "$fleet" >"$dir/fleet.yaml"
  bench_into_results "$build/bench/fleet_bench" --fleet "$dir/fleet.yaml" --seconds 40 \
    --strider "$build/cli/strider"
  local rc=$?
  rm -rf "$dir"
  return $rc
}
# --- probe: a GPU must be there ------------------------------------------------------------------
if [ "$dry" != 1 ]; then
  if ! gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1) ||
     [ -z "$gpu" ]; then
    say "no GPU: nvidia-smi says: ${gpu:-nothing}"
    stage_line probe no_gpu 3 0 0 "nvidia-smi found no GPU"
    exit 3
  fi
  say "GPU: $gpu; commit $commit"
  stage_line probe ok 0 0 0 "$gpu"
else
  say "dry run: no GPU needed; commit $commit"
  stage_line probe ok 0 0 0 "dry run"
fi

# --- environment: torch, the carried libraries --------------------------------------------------
find_torch() {  # the torch package folder under $1
  local candidate
  for candidate in "$1" "$1"/lib/python3*/site-packages/torch "$1"/torch; do
    [ -d "$candidate/share/cmake/Torch" ] && { (cd "$candidate" && pwd); return 0; }
  done
  return 1
}
if [ -n "${STRIDER_GPU_BUILD:-}" ]; then
  build=$(cd "$STRIDER_GPU_BUILD" && pwd) || { say "STRIDER_GPU_BUILD=$STRIDER_GPU_BUILD is not a folder"; exit 2; }
else
  build=$root/build-gpu
fi
torch_dir=$(find_torch "$torch_arg") || torch_dir=""
if [ -z "$torch_dir" ] && [ "$dry" != 1 ]; then
  say "no torch package (share/cmake/Torch) under $torch_arg"
  stage_line environment failed 2 0 0 "no torch under $torch_arg"
  exit 2
fi
deps_root=/tmp/strider-gpu-deps
torch_shadow=/tmp/strider-gpu-torch
setup_environment() {
  # The wheel's fmt 12 headers would shadow Debian's fmt 9, which spdlog is built against
  # (docs/cuda.md): a prefix of links to the package without include/fmt.
  rm -rf "$torch_shadow" && mkdir -p "$torch_shadow/include" || return 1
  ln -s "$torch_dir/lib" "$torch_shadow/lib"
  cp -r "$torch_dir/share" "$torch_shadow/share"
  local entry
  for entry in "$torch_dir"/include/*; do
    [ "$(basename "$entry")" = fmt ] || ln -s "$entry" "$torch_shadow/include/"
  done
  # The carried .deb files, unpacked into a private root.
  local deps=${STRIDER_GPU_DEPS:-$root/.gpu-deps}
  if [ -d "$deps" ] && compgen -G "$deps/*.deb" >/dev/null; then
    rm -rf "$deps_root" && mkdir -p "$deps_root"
    for deb in "$deps"/*.deb; do
      if command -v dpkg >/dev/null; then
        dpkg -x "$deb" "$deps_root" || return 1
      else  # a .deb is an ar archive whose data.tar.* holds the files
        local member
        member=$(ar t "$deb" | grep '^data\.tar')
        case "$member" in
          *.zst) ar p "$deb" "$member" | tar -x --zstd -C "$deps_root" -f - ;;
          *) ar p "$deb" "$member" | tar -x --xz -C "$deps_root" -f - ;;
        esac || return 1
      fi
    done
  fi
  return 0
}
library_path() {  # the run-time search path: torch, its CUDA wheels, the carried libraries
  local path="$torch_dir/lib"
  local site
  site=$(dirname "$torch_dir")
  for lib in "$site"/nvidia/*/lib "$site"/nvidia/cu13/lib; do [ -d "$lib" ] && path="$path:$lib"; done
  [ -d "$deps_root/usr/lib/x86_64-linux-gnu" ] && path="$path:$deps_root/usr/lib/x86_64-linux-gnu"
  echo "$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
if [ "$dry" != 1 ]; then
  setup_environment || { say "setting up torch and the carried libraries failed"; exit 1; }
  export LD_LIBRARY_PATH
  LD_LIBRARY_PATH=$(library_path)
  [ -d "$deps_root/usr/bin" ] && export PATH="$deps_root/usr/bin:$PATH"
fi

# --- build ------------------------------------------------------------------------------------------
export root build out checks results deps_root torch_shadow torch_dir
export -f configure_and_build run_test bench_into_results gpu_fleet
if [ -n "${STRIDER_GPU_BUILD:-}" ]; then
  stage_line build skipped null 0 0 "prebuilt tree $build"
else
  # About 160 of the tree's 281 compile steps; at the 2-core clean build's average of about 4
  # CPU-seconds a step, some 600 CPU-seconds: about a minute on 16 cores, plus configuring.
  run_stage build 200 60 configure_and_build
  rc=$?
  if [ $rc -eq 125 ] && [ -n "${STRIDER_GPU_STAGES:-}" ] && [ -x "$build/bench/model_bench" ]; then
    say "using the existing tree $build"
  elif [ $rc -ne 0 ]; then
    say "no build (rc $rc): see $log"
    exit 1
  fi
fi

# --- correctness first ---------------------------------------------------------------------------
run_stage kernels 60 10 run_test cuda_kernels_test || failed_checks=1
collect_checks
run_stage model 90 20 run_test gpu_model_test || failed_checks=1
collect_checks
run_stage fleet 150 30 run_test gpu_fleet_test || failed_checks=1
collect_checks
# The learner group on the GPU (NCCL at world size 1, two ranks over Gloo, a rank killed): about
# 20 s, taken from what the figures below share of the 300 s; no other stage's limit is trimmed.
run_stage distributed 45 15 run_test gpu_distributed_test || failed_checks=1
collect_checks

# --- baseline figures ------------------------------------------------------------------------------
run_stage cuda_bench 40 10 bench_into_results "$build/bench/cuda_bench" --quick
run_stage model_bench_decode 90 20 bench_into_results "$build/bench/model_bench" --device cuda \
  --quick --gpu-sections decode,prefill --gpu-configs gpu_1b,small
run_stage model_bench_train 60 20 bench_into_results "$build/bench/model_bench" --device cuda \
  --quick --gpu-sections train,publish --gpu-configs gpu_1b
run_stage learner_bench 60 20 bench_into_results "$build/bench/learner_bench" --device cuda \
  --model gpu_1b --members 2 --turn-tokens 32

run_stage fleet_bench 70 50 gpu_fleet

say "done in $(($(date +%s) - start)) s; stages in $stages, figures in $results and $checks"
exit $failed_checks
