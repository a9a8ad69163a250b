// `vision_count`: count shapes in an image rendered in code, with a `zoom` tool.
//
// The observation image is a grid of cells (HWC uint8, RGB, white background); some cells hold
// a shape (square, plus or dot) in one of several colours. The question asks how many shapes of
// a colour (and sometimes of a kind) there are. `zoom(row, col)` returns that cell enlarged 2x
// as a tool-result image. Image sides are multiples of the model's patch size (4 in
// configs/model/tiny.yaml, whose 8x8 patch grid takes up to 32x32 pixels: the default).
//
// Step labels: a zoom is correct when the cell holds a shape the question asks about, incorrect
// otherwise (empty cell, other shape, out of range, malformed); the outcome is "Answer: N".
//
// Options: grid (cells per side, 2..8, default 4), cell (pixels per cell side, a multiple of 4
// from 8 to 64, default 8: smaller cells cannot tell the kinds apart), colours (2..4, default 3),
// fill (percent of cells with a shape, 10..90, default 40).
#pragma once

#include <memory>

#include "common/status.h"
#include "envs/environment.h"

namespace strider::envs {

Result<std::unique_ptr<Environment>> MakeVisionCountEnvironment(const Options& options);
std::unique_ptr<ScriptedPolicy> MakeVisionCountPolicy();

}  // namespace strider::envs
