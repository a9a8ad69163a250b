// The chunked pass: the one loop over chunks of a batch that the language-model loss and the RL
// objectives share, so the state carrying, routing replay and truncation rules are written once.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/model/tensor_pool.h"
#include "common/model/torch_status.h"
#include "common/tokenizer.h"
#include "learner/learner.h"

namespace strider {
namespace {

// Images whose placeholders lie in [begin, end) of their row; an error when one straddles.
Result<std::vector<ImageInput>> ImagesInChunk(const ModelInput& input, int64_t begin, int64_t end) {
  std::vector<ImageInput> chosen;
  if (input.images.empty()) return chosen;
  std::vector<int64_t> seen(input.tokens.size(0), 0);
  // Every maximal run of placeholders in a row is one image, in stream order.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> runs(input.tokens.size(0));
  at::Tensor cpu = input.tokens.cpu().to(at::kLong).contiguous();
  const int64_t* t = cpu.data_ptr<int64_t>();
  const int64_t length = input.tokens.size(1);
  for (int64_t b = 0; b < input.tokens.size(0); ++b) {
    for (int64_t i = 0; i < length; ++i) {
      if (t[b * length + i] != token::kImagePatch) continue;
      int64_t j = i;
      while (j < length && t[b * length + j] == token::kImagePatch) ++j;
      runs[b].emplace_back(i, j);
      i = j - 1;
    }
  }
  for (const ImageInput& image : input.images) {
    if (seen[image.sequence] >= static_cast<int64_t>(runs[image.sequence].size())) {
      return Status::InvalidArgument("more images than placeholder runs in sequence " +
                                     std::to_string(image.sequence));
    }
    const auto [first, last] = runs[image.sequence][seen[image.sequence]++];
    if (first >= begin && last <= end) {
      chosen.push_back(image);
    } else if (first < end && last > begin) {
      return Status::InvalidArgument(
          "an image's patches straddle a chunk boundary at token " + std::to_string(end) +
          "; train image data on the training path or align chunk_tokens");
    }
  }
  return chosen;
}

// The placeholder runs [first, end) of every row, by first position.
std::vector<std::pair<int64_t, int64_t>> PlaceholderRuns(const at::Tensor& tokens) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  at::Tensor cpu = tokens.cpu().to(at::kLong).contiguous();
  const int64_t* t = cpu.data_ptr<int64_t>();
  const int64_t length = tokens.size(1);
  for (int64_t b = 0; b < tokens.size(0); ++b) {
    for (int64_t i = 0; i < length; ++i) {
      if (t[b * length + i] != token::kImagePatch) continue;
      int64_t j = i;
      while (j < length && t[b * length + j] == token::kImagePatch) ++j;
      runs.emplace_back(i, j);
      i = j - 1;
    }
  }
  std::sort(runs.begin(), runs.end());
  return runs;
}

// Tokens in the chunk from `begin`: `chunk`, or fewer so that an image the boundary would cut
// starts the next chunk (the model embeds an image in one call) or a position fed alone does,
// one for a position fed alone, or more when an image starts at `begin` and is longer than a
// chunk. Images of several rows that no boundary clears are left to ImagesInChunk to refuse.
int64_t ChunkCount(const std::vector<std::pair<int64_t, int64_t>>& runs, int64_t begin,
                   int64_t chunk, int64_t length, const std::vector<int64_t>* fed_alone) {
  int64_t end = std::min(begin + chunk, length);
  if (fed_alone != nullptr) {
    // A position fed alone is a chunk of one; a run before one ends there.
    auto next = std::lower_bound(fed_alone->begin(), fed_alone->end(), begin);
    if (next != fed_alone->end() && *next == begin) return 1;
    if (next != fed_alone->end()) end = std::min(end, *next);
  }
  for (const auto& [first, last] : runs) {
    if (first < end && last > end) end = first > begin ? first : last;
  }
  return end - begin;
}

// The replay record's positions [begin, begin + count), its experts as the model indexes them
// (int64) where the model runs: a record may be held narrower (the RL learner's is int16) and on
// the host (built from segments), and is widened and sent a chunk at a time.
RoutingRecord SliceRouting(const RoutingRecord& record, int64_t begin, int64_t count,
                           const c10::Device& device) {
  RoutingRecord slice;
  for (const RoutingRecord::Layer& layer : record.layers) {
    RoutingRecord::Layer part;
    part.experts = layer.experts.narrow(1, begin, count).to(device, at::kLong);
    if (layer.scores.defined()) part.scores = layer.scores.narrow(1, begin, count).to(device);
    slice.layers.push_back(std::move(part));
  }
  return slice;
}

}  // namespace

Result<ChunkedPassResult> RunChunkedPass(const Model& model, const ModelInput& input,
                                         const ChunkedPassOptions& options,
                                         const ChunkObjective& objective) {
  if (!input.tokens.defined() || input.tokens.dim() != 2) {
    return Status::InvalidArgument("chunked pass: tokens must be (B, L)");
  }
  const int64_t rows = input.tokens.size(0);
  const int64_t length = input.tokens.size(1);
  const bool chunked = options.path == TrainingPath::kInference;
  if (!chunked && options.initial_state != nullptr) {
    return Status::InvalidArgument(
        "chunked pass: the training path starts from the beginning; an initial state needs the "
        "inference path");
  }
  if (options.replay_routing != nullptr) {
    for (const RoutingRecord::Layer& layer : options.replay_routing->layers) {
      if (layer.experts.dim() != 3 || layer.experts.size(0) != rows ||
          layer.experts.size(1) != length) {
        return Status::InvalidArgument(
            "chunked pass: routing replay must cover every position of the batch (" +
            std::to_string(rows) + "x" + std::to_string(length) + ")");
      }
    }
  }
  if (options.rounds != nullptr && options.backward && chunked && !options.truncated &&
      length > options.chunk_tokens) {
    return Status::InvalidArgument(
        "chunked pass: expert-parallel ranks backpropagate chunk by chunk (truncated backprop): "
        "a round is one call and its backward");
  }
  ChunkedPassResult result;
  STRIDER_RETURN_IF_ERROR(strider::model::Guarded("chunked pass", [&]() -> Status {
    at::AutoGradMode grad_mode(options.backward);
    const int64_t chunk = chunked ? std::max<int64_t>(1, options.chunk_tokens) : length;
    const std::vector<int64_t>* fed_alone = chunked ? options.fed_alone : nullptr;
    ForwardOptions forward;
    forward.record_routing = options.record_routing;
    forward.compute_values = options.values;
    forward.return_hidden = options.hidden;
    InferenceState state;
    if (chunked) {
      if (options.initial_state != nullptr) {
        if (options.initial_state->batch_size() != rows) {
          return Status::InvalidArgument("chunked pass: the initial state holds " +
                                         std::to_string(options.initial_state->batch_size()) +
                                         " sequences, the batch " + std::to_string(rows));
        }
        state = *options.initial_state;
      } else {
        STRIDER_ASSIGN_OR_RETURN(state, model.NewState(rows));
      }
      state.Reserve(state.length() + length);
    }
    std::vector<RoutingRecord> records;
    at::Tensor total;  // summed loss of chunks not yet backpropagated
    const std::vector<std::pair<int64_t, int64_t>> image_runs =
        chunked && !input.images.empty() ? PlaceholderRuns(input.tokens)
                                         : std::vector<std::pair<int64_t, int64_t>>();
    // The last chunk that records a graph: its backward is the pass's last.
    int64_t last_recorded = -1;
    if (options.backward && chunked && options.truncated && options.before_last_backward) {
      for (int64_t begin = 0, count = 0; begin < length; begin += count) {
        count = ChunkCount(image_runs, begin, chunk, length, fed_alone);
        if (!options.chunk_has_loss || options.chunk_has_loss(begin, count)) last_recorded = begin;
      }
    }
    bool recorded_before = false;
    for (int64_t begin = 0, count = 0; begin < length; begin += count) {
      count = ChunkCount(image_runs, begin, chunk, length, fed_alone);
      ModelInput part;
      part.tokens = chunked ? input.tokens.narrow(1, begin, count) : input.tokens;
      STRIDER_ASSIGN_OR_RETURN(part.images, ImagesInChunk(input, begin, begin + count));
      RoutingRecord replay;
      if (options.replay_routing != nullptr) {
        replay = SliceRouting(*options.replay_routing, begin, count, model.device());
        forward.replay_routing = &replay;
      }
      ForwardOutput out;
      // A chunk without a loss under truncated backpropagation only moves the state on.
      const bool record = options.backward && !(chunked && options.truncated &&
                                                options.chunk_has_loss &&
                                                !options.chunk_has_loss(begin, count));
      at::AutoGradMode chunk_grad_mode(record);
      forward.enable_grad = record;
      if (record && chunked && options.truncated && begin > 0 && !recorded_before) {
        // The chunks before recorded no graph: the pool caches their sizes, not this chunk's,
        // and would serve it from buffers up to twice a request or map beside them
        // (TrimTensorPool). A pass over a context without actions does this once per stretch of
        // actions; a trajectory within one chunk never.
        TrimTensorPool();
      }
      recorded_before = record;
      const int64_t live_before = record ? GetTensorPoolStats().in_use_bytes : 0;
      if (record) ResetTensorPoolWindow();
      if (options.rounds != nullptr) {
        STRIDER_RETURN_IF_ERROR(options.rounds->Enter(model, record));
        forward.expert_exchange = &options.rounds->exchange();
      }
      if (chunked) {
        STRIDER_ASSIGN_OR_RETURN(out, model.Append(&state, part, forward));
      } else {
        STRIDER_ASSIGN_OR_RETURN(out, model.Forward(part, forward));
      }
      if (options.record_routing) {
        // Records feed the routing balance, never a gradient. Kept in the graph, each chunk's
        // would hold its autograd nodes alive after backward, memory growing with the length.
        const int64_t stride = std::max<int64_t>(1, options.record_routing_stride);
        const int64_t first = (stride - begin % stride) % stride;  // chunk offset of p % n == 0
        for (RoutingRecord::Layer& layer : out.routing.layers) {
          auto keep = [&](const at::Tensor& t) {
            if (stride == 1) return t.detach();
            return first < count ? t.detach().slice(1, first, count, stride).contiguous()
                                 : t.detach().narrow(1, 0, 0).contiguous();
          };
          layer.experts = keep(layer.experts);
          if (layer.scores.defined()) layer.scores = keep(layer.scores);
        }
        records.push_back(std::move(out.routing));
      }
      ChunkView view;
      view.begin = begin;
      view.count = count;
      view.logits = std::move(out.logits);
      view.values = std::move(out.values);
      view.hidden = std::move(out.hidden);
      STRIDER_ASSIGN_OR_RETURN(at::Tensor loss, objective(view));
      if (!options.backward) continue;
      if (options.rounds != nullptr && record && !loss.defined()) {
        // The other ranks of this round run backward, and its exchanges pair with theirs.
        loss = view.logits.sum() * 0;
      }
      if (!record && loss.defined()) {
        return Status::Internal("chunked pass: the chunk at " + std::to_string(begin) +
                                " was declared loss-free but its objective returned a loss");
      }
      if (chunked && options.truncated) {
        if (loss.defined() && record) {
          if (begin == last_recorded && options.before_last_backward) {
            options.before_last_backward(loss);
          }
          loss.backward();
        }
        // Also after a chunk without a loss (an RL trajectory's context): otherwise the next
        // chunk's backward runs through it, and a long context before the first action keeps
        // its whole graph alive.
        state.DetachGraph();
        if (record) {
          result.chunk_activation_bytes =
              std::max(result.chunk_activation_bytes,
                       GetTensorPoolStats().window_peak_in_use_bytes - live_before);
        }
      } else if (loss.defined()) {
        total = total.defined() ? total + loss : loss;
      }
    }
    if (options.backward && total.defined()) {
      if (options.before_last_backward) options.before_last_backward(total);
      total.backward();
    }
    if (options.record_routing) result.routing = RoutingRecord::Concatenate(records);
    if (options.keep_final_state) {
      state.DetachGraph();
      result.final_state = std::move(state);
    }
    return Status::Ok();
  }));
  return result;
}

}  // namespace strider
