// Built-in document generators, so pretraining needs no download. Each document is a pure
// function of (options, seed, index): shards can be rebuilt bit for bit and a document can be
// produced again on its own (evaluation regenerates its answers this way).
//
//   retrieval   "key=value" facts placed far apart in filler text, then every key asked again at
//               the end: "\n?KQ=73". Keys are one or two capital letters, values two digits, filler is
//               lower-case words without newlines, so a fact is recognisable by its form and only
//               attention over the whole document can answer. `answers` marks the value tokens
//               of the queries: a model retrieves a fact when it predicts all of them. In a
//               model's own format (`format`) the same text is encoded whole by its tokenizer
//               between the format's document markers, its filler sized so that the document
//               has at most the drawn number of tokens.
//   tool_use    episodes of an environment (`environment`: the calculator at difficulty 1, as
//               the tiny actor config plays it, unless another is named) by its scripted
//               policy (envs::PlayEpisode), rendered by the transcript format
//               (common/transcript.h) exactly as an actor shows them: the same system prompt
//               and tool list, tool calls and results, "Answer: N". On the calculator a
//               `flawed_fraction` of them contain a mistake (a call with a wrong operand, a
//               misread last result, an answer guessed without a tool call) so process rewards
//               later have something to correct; other environments' transcripts are played
//               as scripted. `flawed` is the environment's verdict.
//   image_text  an image placeholder (image-start, patch tokens, image-end) followed by its
//               caption ("a red circle at the top left on a blue background"). The caption fully
//               describes the picture, so RenderCaptionImage draws the pixels from it when a
//               batch is built: shards stay token-only and images are rendered in code.
//
// No LibTorch here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/transcript.h"
#include "envs/environment.h"

namespace strider::data {

enum class GeneratorKind { kRetrieval, kToolUse, kImageText };

Result<GeneratorKind> ParseGeneratorName(std::string_view name);

// The mistakes a flawed calculator transcript can carry (config names in quotes): a call with a
// wrong operand ("wrong_call"), the final answer off from the last result ("misread"), or an
// answer guessed before any tool call ("no_tool").
enum class ToolUseFlaw { kWrongCall, kMisread, kNoTool };

Result<ToolUseFlaw> ParseToolUseFlaw(std::string_view name);

struct GeneratorOptions {
  // retrieval: document length in tokens, BOS and EOT included (in a model's format at most
  // this many). When `min_length` > 0 each document's length is drawn uniformly from
  // [min_length, length].
  int64_t length = 1024;
  int64_t min_length = 0;
  int64_t facts = 4;              // retrieval: facts per document, all asked at the end
  // retrieval: capital letters per key, 1 or 2. One letter makes the look-up a plain
  // induction step (the token before "=" names the fact) that a tiny model learns in minutes;
  // two letters need a match on a token pair. Keys of a document are distinct, so at most 26
  // facts with one letter.
  int64_t key_letters = 2;
  double flawed_fraction = 0.2;   // tool_use: share of calculator transcripts with a mistake
  // tool_use: the kinds a flawed transcript draws its one mistake from, uniformly.
  std::vector<ToolUseFlaw> flaws = {ToolUseFlaw::kWrongCall, ToolUseFlaw::kMisread,
                                    ToolUseFlaw::kNoTool};
  // tool_use: the built-in environment played, with its options; an empty name is the
  // calculator at difficulty 1.
  envs::EnvironmentConfig environment;
  int64_t image_size = 32;        // image_text: square image side in pixels
  int64_t patch_size = 4;         // image_text: the model's patch side (placeholder count)
  // The model's own transcript format (docs/tokenizers.md); null: the byte format. A tool_use
  // document is then the template's rendering of the episode, with no begin- or end-of-text
  // tokens but those the template writes; a retrieval document is its text encoded by the
  // format's tokenizer after `begin_of_text` (when >= 0) and before `end_of_text` (the format's
  // last stop token when < 0). image_text writes byte ids only.
  std::shared_ptr<const transcript::Format> format;
  int32_t begin_of_text = -1;
  int32_t end_of_text = -1;
};

struct GeneratedDocument {
  // The byte format: starts with begin-of-text, ends with end-of-text.
  std::vector<int32_t> tokens;
  // retrieval: [begin, end) token ranges of each query's answer, in document order.
  std::vector<std::pair<int64_t, int64_t>> answers;
  // tool_use: the environment labelled a step incorrect or did not pay the answer.
  bool flawed = false;
  // tool_use: the seed the environment's episode was reset with, so evaluation and tests can
  // play the transcript's turns against the environment again.
  uint64_t episode_seed = 0;
};

GeneratedDocument Generate(GeneratorKind kind, const GeneratorOptions& options, uint64_t seed,
                           int64_t index);

// Pixels (H, W, 3) row-major in [0, 1] of the picture a caption from the image_text generator
// describes; an error for text that is not such a caption.
Result<std::vector<float>> RenderCaptionImage(std::string_view caption, int64_t size);

// The answer spans [begin, end) of every retrieval query ("\n?KQ=" or "\n?K=", then the value
// digits) in a
// token stream, found by their form, so packed training sequences (where the generator's
// `answers` are gone) can weight them. A value cut by the end of the stream is cut here too.
std::vector<std::pair<int64_t, int64_t>> FindRetrievalAnswers(const int32_t* tokens,
                                                              int64_t count);

// The same in a model's format: the answers are found in the tokens' bytes, and a span is
// every token that overlaps the value's digits.
std::vector<std::pair<int64_t, int64_t>> FindRetrievalAnswers(const transcript::Format& format,
                                                              const int32_t* tokens,
                                                              int64_t count);

// Where each token's bytes start in the decoded stream, plus the end: count + 1 offsets.
std::vector<int64_t> TokenByteOffsets(const transcript::Format& format, const int32_t* tokens,
                                      int64_t count);

// Shortest retrieval document the generator can make with `facts` facts of `key_letters`. A
// model's format makes it in as many tokens or fewer: a byte-level tokenizer's token holds at
// least one byte, and its document has at most the byte format's two markers.
int64_t MinimumRetrievalLength(int64_t facts, int64_t key_letters = 2);

}  // namespace strider::data
