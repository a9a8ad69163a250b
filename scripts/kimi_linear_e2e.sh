#!/usr/bin/env bash
# A tiny imported Kimi Linear checkpoint end to end (docs/models.md):
#   1. `strider model import` of a reference checkpoint (tests/model/hf_reference/);
#   2. a replay server and an actor playing calculator episodes with the imported weights (the
#      byte transcript: token ids in, log-probs out);
#   3. one RL learner step from the imported weights, with routing replay, whose log-prob
#      mismatch check (learner against behaviour) must stay within 1e-5 in fp32;
#   4. `strider model export` of the learner's checkpoint to the Hugging Face layout;
#   5. with REFERENCE_PYTHON (a Python with transformers 5.25, tests/model/hf_reference's pins):
#      transformers' kimi_linear loads the export and gives Strider's log-probs of the trained
#      weights within 1e-4.
#   scripts/kimi_linear_e2e.sh [FIXTURE_DIR]    (default tests/model/hf_reference/kimi_sharded_f32)
# Works in $WORK (default: a new temporary directory, kept for inspection).
set -euo pipefail
cd "$(dirname "$0")/.."
strider=${STRIDER_BIN:-./build/cli/strider}
fixture=${1:-tests/model/hf_reference/kimi_sharded_f32}
work=${WORK:-$(mktemp -d -t strider_kimi_e2e.XXXXXX)}
export OMP_WAIT_POLICY=PASSIVE
mkdir -p "$work"
echo "kimi_linear_e2e: $fixture in $work"

$strider model import --from-hf "$fixture" --out "$work/imported" > "$work/import.json"
model="$work/imported/model.yaml"
weights="$work/imported/weights.safetensors"

cat > "$work/replay.yaml" <<EOF
server: {stats_interval_s: 0}
tables:
  - name: groups
    unit: group
    sampler: fifo
    capacity: 1000
    rate_limiter: {min_fill: 1, max_times_sampled: 1}
EOF
$strider replay serve --db "$work/db" --config "$work/replay.yaml" --bind tcp://127.0.0.1:0 \
  --sample-bind tcp://127.0.0.1:0 > "$work/replay.log" 2>&1 &
replay_pid=$!
trap 'kill "$replay_pid" 2>/dev/null || true' EXIT
for _ in $(seq 300); do grep -q '"ready"' "$work/replay.log" && break; sleep 0.1; done
endpoint() {
  grep '"ready"' "$work/replay.log" | python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['$1'])"
}
actor_endpoint=$(endpoint actor_endpoint)
learner_endpoint=$(endpoint learner_endpoint)

cat > "$work/actor.yaml" <<EOF
actor:
  model: $model
  weights: $weights
  threads: 1
  episodes: 8
  episodes_in_flight: 8
  group_size: 4
  max_turns: 2
  max_episode_tokens: 512
  seed: 3
  segment_tokens: 128
  sampling: {temperature: 1.0, max_new_tokens: 24}
  engine: {cache_budget_mb: 64}
  replay: {endpoint: tcp://127.0.0.1:1}
  metrics: {interval_s: 5, progress: false}
env:
  name: calculator
  options: {difficulty: 1}
EOF
$strider actor --config "$work/actor.yaml" --replay "$actor_endpoint" --spill-dir "$work/spill" \
  > "$work/actor.log"

cat > "$work/learner.yaml" <<EOF
mode: rl
model_config: $model
init: $weights
seed: 7
threads: 1
replay: {table: groups, learner_id: l0, units_per_step: 2, sample_timeout_s: 60}
publish: {every_steps: 1}
optimizer: {learning_rate: 0.001, weight_decay: 0.0}
train: {steps: 1, ppo_epochs: 1, minibatches: 1, chunk_tokens: 64}
objective:
  advantages: {estimator: outcome_group}
  policy: {entropy_coef: 0.001}
checkpoint: {every_steps: 1}
EOF
$strider learner --config "$work/learner.yaml" --run-dir "$work/run" --replay "$learner_endpoint" \
  > "$work/learner.log"
python3 - "$work/run/metrics.jsonl" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
m = lines[0]["logprob_mismatch_max"]
print(f"kimi_linear_e2e: learner step 1: {lines[0]['trained_trajectories']} trajectories, "
      f"max |learner - behaviour| log-prob = {m:.3g}")
sys.exit(0 if m is not None and m <= 1e-5 else 1)
EOF

trained="$work/run/checkpoints/final/model.safetensors"
$strider model export --config "$model" --weights "$trained" --hf-layout "$work/imported/hf" \
  --to-hf "$work/exported" > "$work/export.json"
echo "kimi_linear_e2e: exported to $work/exported"

if [ -z "${REFERENCE_PYTHON:-}" ]; then
  echo "kimi_linear_e2e: REFERENCE_PYTHON unset: transformers' check of the export skipped"
  exit 0
fi
# transformers' kimi_linear normalises the MLA query and kv latents with 1e-6 whatever
# rms_norm_eps says (docs/model_math.md); Strider's import follows the serving engines, so the
# comparison evaluates Strider with transformers' epsilon.
sed 's/^\(    norm_epsilon:\) 0$/\1 1e-06/' "$model" > "$work/model_transformers_eps.yaml"
tokens="1,17,200,33,5,90,91,250,12,7,7,64,3,140,141,9"
$strider model eval --config "$work/model_transformers_eps.yaml" --weights "$trained" \
  --tokens "$tokens" --path train > "$work/strider_eval.json"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$REFERENCE_PYTHON" - "$work/exported" \
  "$work/strider_eval.json" "$tokens" <<'EOF'
import json, sys, torch
from transformers import KimiLinearForCausalLM
directory, strider_file, tokens = sys.argv[1], sys.argv[2], [int(t) for t in sys.argv[3].split(",")]
model, info = KimiLinearForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                    output_loading_info=True)
if any(info.values()):
    sys.exit(f"transformers did not load every tensor of {directory}: {info}")
with torch.no_grad():
    logp = torch.log_softmax(model(torch.tensor([tokens])).logits[0].double(), -1)
reference = logp[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]
strider = torch.tensor(json.load(open(strider_file))["logprobs"][1:], dtype=torch.float64)
worst = (reference - strider).abs().max().item()
print(f"kimi_linear_e2e: transformers on the export against Strider's trained weights: "
      f"max |log-prob difference| = {worst:.3g}")
sys.exit(0 if worst <= 1e-4 else 1)
EOF
