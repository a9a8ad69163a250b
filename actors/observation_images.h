// The actor's text and images on their way into a trajectory: an observation's images checked
// and converted once, and the transcript's runs as pieces the segmenter and the engine take.
// Used by the decode loop only (actor.cc); not thread-safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "actors/segmenter.h"
#include "common/model/config.h"
#include "common/schema/messages.h"
#include "common/status.h"
#include "common/transcript.h"
#include "envs/environment.h"

namespace strider::actors {

// The replay schema stores the transcript's roles by value (checked in the .cc).
inline schema::Role SchemaRole(transcript::Role role) { return static_cast<schema::Role>(role); }

// An observation's images (envs/environment.h) as the transcript, the segmenter and the engine
// take them: per image the number of patches (its placeholder run in the transcript), the image
// as stored with the trajectory, and the pixels as (H, W, C) floats in [0, 1].
struct ObservationImages {
  std::vector<int64_t> patches;
  std::vector<schema::Image> stored;
  std::vector<at::Tensor> pixels;
};

// InvalidArgument naming the image for one whose size does not match its pixel bytes or that
// the model's vision config does not take.
Result<ObservationImages> ReadImages(const VisionConfig& vision,
                                     const std::vector<envs::Image>& images);

// A run of context tokens with one role; an image run also carries the image it stands for.
struct PromptPiece {
  std::vector<int32_t> tokens;
  schema::Role role = schema::Role::kUser;
  std::optional<schema::Image> image;
};

// Transcript runs as pieces; each image run carries the next of `images`, in order.
std::vector<PromptPiece> ToPieces(std::vector<transcript::Run> runs,
                                  const std::vector<schema::Image>& images);

// Adds pieces to a trajectory (each image just before its run); returns the tokens added.
// The segmenter's error (one already finished, a role that is an action's) ends the episode.
Result<int64_t> AddPieces(Segmenter& segmenter, const std::vector<PromptPiece>& pieces);

// The pieces' tokens, in order, as the engine takes them.
std::vector<int64_t> Concatenate(const std::vector<PromptPiece>& pieces);

}  // namespace strider::actors
