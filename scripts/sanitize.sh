#!/usr/bin/env bash
# Builds the LibTorch-free tests with sanitizers in their own build trees and runs them:
#   build-asan: AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer
#   build-tsan: ThreadSanitizer, on the tests that hold most of the threading
#               (replay server and client, transport, actor sender, environments)
#   scripts/sanitize.sh [asan|tsan|all]      default: all
# LibTorch and OpenMP are not instrumented (they would only add false reports), so tests that
# link LibTorch or start the `strider` binary are not in these lists; docs/reliability.md says
# what is covered. Any report fails the test that printed it.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}

# The code that reads bytes from outside (frames, stores, environment replies, tool calls,
# tokenizer files and the text they encode, chat templates) and the actor's sender. Launcher,
# report and reward tests are LibTorch-free too, and pass (STRIDER_SANITIZE_ALL=1 adds them),
# but cost CI minutes for code that handles no peer input.
asan_tests=(
  replay_schema_test replay_storage_test replay_table_test replay_learner_table_test
  replay_server_test weight_stream_test actor_stream_test envs_builtin_test envs_dataset_test
  envs_external_test envs_plugin_test envs_sandbox_test envs_tools_test bpe_tokenizer_test
  chat_template_test
)
if [ "${STRIDER_SANITIZE_ALL:-0}" = 1 ]; then
  asan_tests+=(transcript_test reward_test launcher_fleet_config_test learner_data_test
    report_test rl_report_test)
fi
# The server's ingest, sampling and retention threads, the clients, the weight stream and the
# sender's spill thread (envs_external_test adds the environment client's lifeline thread).
tsan_tests=(replay_table_test replay_server_test weight_stream_test actor_stream_test)
if [ "${STRIDER_SANITIZE_ALL:-0}" = 1 ]; then
  tsan_tests+=(envs_external_test envs_sandbox_test)
fi

# suppressions for reports inside libraries that are not ours live in scripts/sanitizers/.
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/sanitizers/tsan.supp"

run_tree() {  # build dir, sanitizers, tests...
  local dir=$1 sanitize=$2
  shift 2
  local start
  start=$(date +%s)
  STRIDER_CMAKE_ARGS="-DSTRIDER_SANITIZE=$sanitize -DSTRIDER_ENABLE_CUDA=OFF" \
    scripts/setup.sh "$dir" "$@"
  local built
  built=$(date +%s)
  local regex
  regex="^($(IFS='|'; echo "$*"))\$"
  (cd "$dir" && ctest --output-on-failure --timeout 900 -j 2 -R "$regex")
  echo "$dir ($sanitize): build $((built - start)) s, tests $(($(date +%s) - built)) s"
}

case "$which" in
  asan) run_tree build-asan address,undefined "${asan_tests[@]}" ;;
  tsan) run_tree build-tsan thread "${tsan_tests[@]}" ;;
  all)
    run_tree build-asan address,undefined "${asan_tests[@]}"
    run_tree build-tsan thread "${tsan_tests[@]}"
    ;;
  *) echo "usage: scripts/sanitize.sh [asan|tsan|all]" >&2; exit 2 ;;
esac
