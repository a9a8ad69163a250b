#!/usr/bin/env bash
# Sets up, builds and runs the main job on the embedded defaults: the reference model's
# parameter and cache accounting, then the two-path contract check on the tiny model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
./build/cli/strider model info --config configs/model/reference.yaml
./build/cli/strider model check --config configs/model/tiny.yaml
