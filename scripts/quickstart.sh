#!/usr/bin/env bash
# Sets up, builds and runs the main job on the embedded defaults:
#   1. the reference model's parameter and cache accounting, and the two-path contract check on
#      the tiny model;
#   2. a first taste of the RL data path: a replay server and one actor with the tiny model
#      (random weights) on the calculator environment stream a few dozen episodes, then
#      `strider replay inspect` shows the store's stats and one trajectory with its tool call.
# The run directory (store, spill directory, metrics, logs) is printed; STRIDER_RUN_DIR picks it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
strider=${STRIDER_BIN:-./build/cli/strider}
$strider model info --config configs/model/reference.yaml
$strider model check --config configs/model/tiny.yaml

run_dir="${STRIDER_RUN_DIR:-$(mktemp -d /tmp/strider-quickstart-XXXXXX)}"
mkdir -p "$run_dir"
echo "quickstart: run directory $run_dir"
# The replay server binds a free port and says which on its first stdout line.
$strider replay serve --db "$run_dir/db" --bind tcp://127.0.0.1:0 \
  >"$run_dir/replay.out" 2>"$run_dir/replay.log" &
server_pid=$!
trap 'kill $server_pid 2>/dev/null || true; wait $server_pid 2>/dev/null || true' EXIT
endpoint=""
for _ in $(seq 1 300); do
  endpoint=$(grep -o '"actor_endpoint":"[^"]*"' "$run_dir/replay.out" 2>/dev/null | cut -d'"' -f4 || true)
  [ -n "$endpoint" ] && break
  kill -0 $server_pid 2>/dev/null || { cat "$run_dir/replay.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$endpoint" ] || { echo "quickstart: the replay server did not start" >&2; exit 1; }

# 32 episodes: 16 live at once in groups of 4 sharing a prompt, decoded together.
$strider actor --config configs/actor/calculator_tiny.yaml --replay "$endpoint" \
  --spill-dir "$run_dir/spill" --metrics "$run_dir/metrics.jsonl" >"$run_dir/actor.out"
tail -n 1 "$run_dir/actor.out"

$strider replay inspect "$run_dir/db" stats
# One trajectory in which the model wrote a tool call (random weights rarely close one, so it is
# usually an error result the model then sees); any trajectory when none did.
trajectory=$($strider replay inspect "$run_dir/db" export --format jsonl |
  grep -E '"(malformed_)?tool_calls":"[1-9]' | grep -o '"trajectory_id":"[0-9a-f]*"' |
  head -n 1 | cut -d'"' -f4 || true)
if [ -z "$trajectory" ]; then
  trajectory=$($strider replay inspect "$run_dir/db" list --json | head -n 1 |
    grep -o '"trajectory_id":"[0-9a-f]*"' | cut -d'"' -f4)
fi
$strider replay inspect "$run_dir/db" show "$trajectory"
