#!/usr/bin/env bash
# Sets up, builds the `strider` binary (not the tests) and runs the main job: a run that learns.
#   1. a short warm start: `strider pretrain` on calculator transcripts in the actor's format,
#      whose last part guesses the answer without the tool (configs/pretrain/calculator_quickstart.yaml;
#      kept when runs/quickstart/warm already has it); with the output in a file or a CI log it
#      prints a progress line every 10 s, on a terminal a progress bar;
#   2. `strider launch configs/quickstart.yaml`: a replay server, the RL learner and an actor on
#      the calculator for 15 learner steps, evaluated on held-out problems as versions are
#      published; the progress line shows step, reward and success;
#   3. `strider report runs/quickstart/rl`: report.html with the curves; its path is printed.
# Runs in runs/quickstart/ (a previous RL run there is replaced).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build strider
strider=${STRIDER_BIN:-./build/cli/strider}
# Each process computes on one core; a waiting OpenMP thread must not spin on the other's.
export OMP_WAIT_POLICY=PASSIVE

warm=runs/quickstart/warm
if [ ! -f "$warm/checkpoints/guess/final/model.safetensors" ]; then
  rm -rf "$warm"
  echo "quickstart: warm start (configs/pretrain/calculator_quickstart.yaml) in $warm"
  $strider pretrain --config configs/pretrain/calculator_quickstart.yaml --run-dir "$warm"
fi
rm -rf runs/quickstart/rl
echo "quickstart: RL on the calculator (configs/quickstart.yaml) in runs/quickstart/rl"
$strider launch configs/quickstart.yaml
$strider report runs/quickstart/rl
