#include "learner/pretrain/data/generators.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "common/random.h"
#include "common/tokenizer.h"
#include "common/transcript.h"
#include "envs/calculator/calculator.h"
#include "envs/environment.h"
#include "envs/episode.h"
#include "envs/tools.h"

namespace strider::data {
namespace {

// SplitMix64: tiny, fast and good enough to make documents; seeded per (seed, index) so any
// document can be regenerated alone.
class Rng {
 public:
  Rng(uint64_t seed, int64_t index, uint64_t stream)
      : state_(seed * kSplitMix64Increment ^ (static_cast<uint64_t>(index) + 1) * 0xD1B54A32D192ED03ull ^
               stream * 0x8CB92BA72F3D8DD7ull) {
    Next();
  }
  uint64_t Next() { return SplitMix64Next(&state_); }
  int64_t Uniform(int64_t n) { return static_cast<int64_t>(Next() % static_cast<uint64_t>(n)); }
  int64_t Range(int64_t low, int64_t high) { return low + Uniform(high - low + 1); }
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

void AppendText(std::vector<int32_t>& tokens, std::string_view text) {
  for (unsigned char c : text) tokens.push_back(c);
}

constexpr std::array<std::string_view, 32> kWords = {
    "the",   "river", "stone", "light", "slow",  "house", "green", "over",
    "under", "wind",  "small", "cold",  "field", "road",  "quiet", "night",
    "bird",  "water", "old",   "tree",  "and",   "with",  "far",   "near",
    "day",   "hill",  "soft",  "rain",  "moves", "sees",  "a",     "path"};

// `count` characters of lower-case filler: words and spaces, never a newline or a capital, so a
// fact stands out by its form.
std::string Filler(Rng& rng, int64_t count) {
  std::string text;
  text.reserve(count + 8);
  while (static_cast<int64_t>(text.size()) < count) {
    text += kWords[rng.Uniform(kWords.size())];
    text += ' ';
  }
  text.resize(count);
  return text;
}

// A fact is "\nKQ=73\n" (5 tokens besides the key), a query "\n?KQ=73" (5 besides the key).
constexpr int64_t kFactTokens = 5;
constexpr int64_t kValueTokens = 2;
constexpr int64_t kQueryTokens = 5;

// A retrieval document's text with `body` filler characters: the facts spread through the
// filler, then the queries; `values` are the byte ranges of the queries' values, in order.
struct RetrievalText {
  std::string text;
  std::vector<std::pair<int64_t, int64_t>> values;
};

RetrievalText ComposeRetrieval(Rng& rng, const std::vector<std::string>& keys,
                               const std::vector<std::string>& values, int64_t body) {
  // Fact i sits at a random point of the i-th of `facts` equal parts, so at long lengths facts
  // are far from each other and from the queries.
  const int64_t facts = static_cast<int64_t>(keys.size());
  const int64_t part = body / facts;
  RetrievalText out;
  int64_t filler_used = 0;
  for (int64_t i = 0; i < facts; ++i) {
    const int64_t before = rng.Uniform(part + 1);
    out.text += Filler(rng, before);
    out.text += "\n" + keys[i] + "=" + values[i] + "\n";
    const int64_t after = (i + 1 == facts) ? body - filler_used - before : part - before;
    out.text += Filler(rng, after);
    filler_used += before + after;
  }
  std::vector<int64_t> order(facts);
  for (int64_t i = 0; i < facts; ++i) order[i] = i;
  for (int64_t i = facts - 1; i > 0; --i) std::swap(order[i], order[rng.Uniform(i + 1)]);
  for (int64_t i : order) {
    out.text += "\n?" + keys[i] + "=";
    const int64_t begin = static_cast<int64_t>(out.text.size());
    out.text += values[i];
    out.values.emplace_back(begin, begin + kValueTokens);
  }
  return out;
}

// Token spans of the byte ranges `values` in a stream whose token t covers bytes
// [offsets[t], offsets[t + 1]): every token that overlaps the range.
std::vector<std::pair<int64_t, int64_t>> OverlappingTokens(
    const std::vector<int64_t>& offsets, const std::vector<std::pair<int64_t, int64_t>>& values) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& [begin, end] : values) {
    // First token ending after `begin`, first token starting at or after `end`.
    const int64_t first =
        std::upper_bound(offsets.begin() + 1, offsets.end(), begin) - offsets.begin() - 1;
    const int64_t last =
        std::lower_bound(offsets.begin(), offsets.end() - 1, end) - offsets.begin();
    if (last > first) spans.emplace_back(first, last);
  }
  return spans;
}

// A retrieval document in a model's format of at most `length` tokens. The filler's budget is
// in characters and the tokenizer's characters per token depend on the text, so the document
// is made again with a budget scaled from the last try's count (a secant step, bisection once
// a budget is known too long), keeping the longest that fits: a few encodings of one document.
GeneratedDocument RetrievalInFormat(const GeneratorOptions& options, const Rng& drawn,
                                    const std::vector<std::string>& keys,
                                    const std::vector<std::string>& values, int64_t length,
                                    int64_t byte_body) {
  const transcript::Format& format = *options.format;
  int32_t end_of_text = options.end_of_text;
  if (end_of_text < 0) end_of_text = format.stop_tokens().back();
  const int64_t markers = (options.begin_of_text >= 0 ? 1 : 0) + 1;
  auto make = [&](int64_t body) {
    Rng rng = drawn;
    RetrievalText text = ComposeRetrieval(rng, keys, values, body);
    GeneratedDocument document;
    if (options.begin_of_text >= 0) document.tokens.push_back(options.begin_of_text);
    const std::vector<int32_t> ids = format.Encode(text.text);
    document.tokens.insert(document.tokens.end(), ids.begin(), ids.end());
    document.tokens.push_back(end_of_text);
    const std::vector<int64_t> offsets = TokenByteOffsets(
        format, document.tokens.data(), static_cast<int64_t>(document.tokens.size()));
    // The values' byte offsets are in the text, which starts after the begin marker's bytes.
    const int64_t shift = options.begin_of_text >= 0 ? offsets[1] : 0;
    for (auto& [begin, end] : text.values) begin += shift, end += shift;
    document.answers = OverlappingTokens(offsets, text.values);
    return document;
  };
  // Each token holds at least one byte: the byte format's budget always fits.
  GeneratedDocument best = make(byte_body);
  int64_t low = byte_body, high = -1;
  int64_t low_tokens = static_cast<int64_t>(best.tokens.size());
  const int64_t empty_tokens = static_cast<int64_t>(make(0).tokens.size()) - markers;
  for (int tries = 0; tries < 8 && low_tokens < length && (high < 0 || high - low > 1); ++tries) {
    const double per_token = static_cast<double>(low) /
                             std::max<int64_t>(1, low_tokens - markers - empty_tokens);
    int64_t body = low + std::max<int64_t>(1, static_cast<int64_t>((length - low_tokens) *
                                                                    per_token * 0.98));
    if (high >= 0 && body >= high) body = low + (high - low) / 2;
    GeneratedDocument candidate = make(body);
    const int64_t tokens = static_cast<int64_t>(candidate.tokens.size());
    if (tokens <= length) {
      low = body;
      low_tokens = tokens;
      best = std::move(candidate);
    } else {
      high = body;
    }
  }
  return best;
}

GeneratedDocument Retrieval(const GeneratorOptions& options, uint64_t seed, int64_t index) {
  Rng rng(seed, index, 1);
  const int64_t letters = std::clamp<int64_t>(options.key_letters, 1, 2);
  const int64_t facts = std::clamp<int64_t>(options.facts, 1, letters == 1 ? 26 : 676);
  const int64_t minimum = MinimumRetrievalLength(facts, letters);
  int64_t length = std::max(options.length, minimum);
  if (options.min_length > 0 && options.min_length < length) {
    length = rng.Range(std::max(options.min_length, minimum), length);
  }
  std::vector<std::string> keys, values;
  while (static_cast<int64_t>(keys.size()) < facts) {
    std::string key;
    for (int64_t l = 0; l < letters; ++l) key += static_cast<char>('A' + rng.Uniform(26));
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    keys.push_back(key);
    values.push_back({static_cast<char>('0' + rng.Uniform(10)),
                      static_cast<char>('0' + rng.Uniform(10))});
  }
  // The byte format: one token per byte, so the filler's characters are what is left.
  const int64_t body = length - 2 - facts * (kFactTokens + kQueryTokens + 2 * letters);
  if (options.format) return RetrievalInFormat(options, rng, keys, values, length, body);
  const RetrievalText text = ComposeRetrieval(rng, keys, values, body);
  GeneratedDocument document;
  document.tokens.reserve(length);
  document.tokens.push_back(token::kBeginOfText);
  AppendText(document.tokens, text.text);
  document.tokens.push_back(token::kEndOfText);
  for (const auto& [begin, end] : text.values) document.answers.emplace_back(begin + 1, end + 1);
  return document;
}

// By default the calculator as the tiny actor config plays it
// (configs/actor/calculator_tiny.yaml): these transcripts warm a model up for RL on that
// environment. A problem has difficulty + 1 steps, one tool call each.
constexpr int64_t kToolUseDifficulty = 1;

envs::EnvironmentConfig ToolUseEnvironment(const GeneratorOptions& options) {
  envs::EnvironmentConfig config = options.environment;
  if (config.name.empty()) {
    config.name = "calculator";
    config.options = {{"difficulty", std::to_string(kToolUseDifficulty)}};
  }
  return config;
}

using Flaw = std::optional<ToolUseFlaw>;

// The environment's scripted policy, with at most one mistake: one call with a wrong operand
// (the environment computes it and labels it incorrect; the policy goes on from its result), the
// final answer off from the last result, or an answer guessed before any tool call. Keeps the
// turns it wrote, for the transcript.
class FlawedPolicy final : public envs::ScriptedPolicy {
 public:
  FlawedPolicy(std::unique_ptr<envs::ScriptedPolicy> policy, Flaw flaw, bool calculator, Rng& rng)
      : policy_(std::move(policy)),
        flaw_(flaw),
        calculator_(calculator),
        wrong_call_(rng.Uniform(kToolUseDifficulty + 1)),
        delta_(rng.Range(1, 9)),
        guess_(rng.Range(2, 200)) {}

  Result<std::string> NextTurn(const std::vector<envs::Observation>& observations) override {
    Result<std::string> turn = Turn(observations);
    if (turn.ok()) turns_.push_back(*turn);
    return turn;
  }

  const std::vector<std::string>& turns() const { return turns_; }

 private:
  Result<std::string> Turn(const std::vector<envs::Observation>& observations) {
    if (flaw_ == ToolUseFlaw::kNoTool && calculator_) return "Answer: " + std::to_string(guess_);
    STRIDER_ASSIGN_OR_RETURN(std::string text, policy_->NextTurn(observations));
    if (flaw_ == ToolUseFlaw::kNoTool) {
      // Another environment's policy reads as scripted up to its first tool call, which the
      // guess replaces (the retrieval policy says "next" through every part, then guesses).
      Result<std::optional<envs::ToolCall>> call = envs::ParseToolCall(text);
      if (call.ok() && call->has_value()) return "Answer: " + std::to_string(guess_);
      return text;
    }
    const bool answering = text.rfind("Answer: ", 0) == 0;
    if (answering && flaw_ == ToolUseFlaw::kMisread) {
      const double value = std::strtod(text.c_str() + 8, nullptr);
      return "Answer: " + envs::FormatNumber(value + 10.0 * delta_);
    }
    if (!answering && flaw_ == ToolUseFlaw::kWrongCall && calls_++ == wrong_call_) {
      Result<std::optional<envs::ToolCall>> call = envs::ParseToolCall(text);
      if (call.ok() && call->has_value()) {
        // The running value misread: its last digit changed.
        std::string arguments = (*call)->arguments;
        const size_t op = arguments.find_first_of("+-*/", 1);
        const size_t last = (op == std::string::npos ? arguments.size() : op) - 1;
        arguments[last] = static_cast<char>('0' + (arguments[last] - '0' + delta_) % 10);
        return text.substr(0, text.find(envs::kToolCallOpen)) +
               envs::FormatToolCall((*call)->name, arguments);
      }
    }
    return text;
  }

  std::unique_ptr<envs::ScriptedPolicy> policy_;
  Flaw flaw_;
  bool calculator_;
  int64_t wrong_call_;
  int64_t delta_;
  int64_t guess_;
  int64_t calls_ = 0;
  std::vector<std::string> turns_;
};

[[noreturn]] void GeneratorFailed(const Status& status) {
  // The config reader built this environment and its policy with these options
  // (CheckTranscribable): a failure here is a bug, not bad input.
  std::fprintf(stderr, "tool_use generator: %s\n", status.ToString().c_str());
  std::abort();
}

// One episode of the environment, played through the envs API and rendered by the transcript
// format exactly as an actor shows it to the model (common/transcript.h), then end-of-text.
GeneratedDocument ToolUse(const GeneratorOptions& options, uint64_t seed, int64_t index) {
  Rng rng(seed, index, 2);
  const envs::EnvironmentConfig config = ToolUseEnvironment(options);
  // wrong_call and misread are calculator mistakes (an operand, a number read back); other
  // environments' flawed transcripts can only guess. The draw is made either way, so the
  // calculator's documents stay the same bit for bit.
  Flaw flaw;
  const bool calculator = config.name == "calculator";
  const bool flawed = rng.Unit() < options.flawed_fraction;
  if (flawed && calculator && !options.flaws.empty()) {
    flaw = options.flaws[rng.Uniform(options.flaws.size())];
  } else if (flawed && !calculator &&
             std::find(options.flaws.begin(), options.flaws.end(), ToolUseFlaw::kNoTool) !=
                 options.flaws.end()) {
    // Elsewhere only the guess applies, and needs no draw: it replaces the first tool call.
    flaw = ToolUseFlaw::kNoTool;
  }
  GeneratedDocument document;
  document.episode_seed = rng.Next();
  Result<std::unique_ptr<envs::Environment>> env = envs::MakeEnvironment(config);
  if (!env.ok()) GeneratorFailed(env.status());
  Result<std::unique_ptr<envs::ScriptedPolicy>> scripted = envs::MakeScriptedPolicy(config);
  if (!scripted.ok()) GeneratorFailed(scripted.status());
  FlawedPolicy policy(std::move(*scripted), flaw, calculator, rng);

  const envs::EnvironmentSpec spec = (*env)->Describe();
  std::vector<envs::StepResult> steps;
  const envs::EpisodeReport report =
      envs::PlayEpisode(**env, policy, document.episode_seed, spec.max_turns, {},
                        [&](const envs::StepResult& step) { steps.push_back(step); });
  (*env)->Close();
  if (report.error) GeneratorFailed(Status::Internal(report.end));
  transcript::Transcript transcript(options.format);
  std::vector<transcript::Tool> tools;
  for (const envs::ToolSpec& tool : spec.tools) {
    tools.push_back({tool.name, tool.arguments, tool.description});
  }
  transcript.AddSystem(spec.description, envs::RenderToolList(spec.tools), tools);
  const envs::Observation& first = report.observations.front();
  transcript.AddObservation(envs::TranscriptRole(first.role), first.text);
  transcript.BeginModelTurn();
  for (size_t i = 0; i < steps.size(); ++i) {
    transcript.AddModelTurn(policy.turns()[i]);
    transcript.AddStepResult(envs::TranscriptRole(steps[i].observation.role),
                             steps[i].observation.text, {}, steps[i].done);
  }
  transcript.End();
  if (!transcript.status().ok()) GeneratorFailed(transcript.status());
  document.tokens = transcript.Tokens();
  // Flawed is what the environment says: a step it labels incorrect, or an unpaid outcome.
  document.flawed = report.incorrect > 0 || report.outcome.value_or(0.0) != 1.0;
  return document;
}

constexpr std::array<std::string_view, 6> kColors = {"red", "green", "blue",
                                                     "yellow", "white", "black"};
constexpr std::array<std::array<float, 3>, 6> kRgb = {{{0.9f, 0.1f, 0.1f},
                                                       {0.1f, 0.8f, 0.2f},
                                                       {0.1f, 0.2f, 0.9f},
                                                       {0.95f, 0.9f, 0.1f},
                                                       {1.0f, 1.0f, 1.0f},
                                                       {0.0f, 0.0f, 0.0f}}};
constexpr std::array<std::string_view, 3> kShapes = {"square", "circle", "cross"};
constexpr std::array<std::string_view, 3> kRows = {"top", "middle", "bottom"};
constexpr std::array<std::string_view, 3> kColumns = {"left", "center", "right"};

GeneratedDocument ImageText(const GeneratorOptions& options, uint64_t seed, int64_t index) {
  Rng rng(seed, index, 3);
  const int64_t color = rng.Uniform(kColors.size());
  int64_t background = rng.Uniform(kColors.size() - 1);
  if (background >= color) ++background;
  const std::string caption = "a " + std::string(kColors[color]) + " " +
                              std::string(kShapes[rng.Uniform(kShapes.size())]) + " at the " +
                              std::string(kRows[rng.Uniform(3)]) + " " +
                              std::string(kColumns[rng.Uniform(3)]) + " on a " +
                              std::string(kColors[background]) + " background";
  const int64_t grid = options.image_size / options.patch_size;
  GeneratedDocument document;
  document.tokens.push_back(token::kBeginOfText);
  document.tokens.push_back(token::kImageStart);
  document.tokens.insert(document.tokens.end(), grid * grid, token::kImagePatch);
  document.tokens.push_back(token::kImageEnd);
  AppendText(document.tokens, caption);
  document.tokens.push_back(token::kEndOfText);
  return document;
}

template <size_t N>
int64_t FindWord(const std::array<std::string_view, N>& words, std::string_view word) {
  for (size_t i = 0; i < N; ++i) {
    if (words[i] == word) return static_cast<int64_t>(i);
  }
  return -1;
}

// The [begin, end) ranges of every query's value ("\n?KQ=" or "\n?K=", then up to two digits) in
// a stream of byte ids or of bytes: the same scan serves the byte format's tokens and the
// decoded bytes of a model's own.
template <typename Unit>
std::vector<std::pair<int64_t, int64_t>> FindQueryValues(const Unit* units, int64_t count) {
  auto capital = [](Unit u) { return u >= 'A' && u <= 'Z'; };
  auto digit = [](Unit u) { return u >= '0' && u <= '9'; };
  std::vector<std::pair<int64_t, int64_t>> values;
  for (int64_t i = 0; i + 4 < count; ++i) {
    if (units[i] != '\n' || units[i + 1] != '?' || !capital(units[i + 2])) continue;
    const int64_t equals = capital(units[i + 3]) ? i + 4 : i + 3;  // one or two letters
    if (equals >= count || units[equals] != '=') continue;
    const int64_t begin = equals + 1;
    int64_t end = begin;
    while (end < count && end < begin + kValueTokens && digit(units[end])) ++end;
    if (end > begin) values.emplace_back(begin, end);
    i = std::max(i, end - 1);
  }
  return values;
}

}  // namespace

Result<GeneratorKind> ParseGeneratorName(std::string_view name) {
  if (name == "retrieval") return GeneratorKind::kRetrieval;
  if (name == "tool_use") return GeneratorKind::kToolUse;
  if (name == "image_text") return GeneratorKind::kImageText;
  return Status::InvalidArgument("unknown generator '" + std::string(name) +
                                 "' (known: retrieval, tool_use, image_text)");
}

Result<ToolUseFlaw> ParseToolUseFlaw(std::string_view name) {
  if (name == "wrong_call") return ToolUseFlaw::kWrongCall;
  if (name == "misread") return ToolUseFlaw::kMisread;
  if (name == "no_tool") return ToolUseFlaw::kNoTool;
  return Status::InvalidArgument("unknown flaw '" + std::string(name) +
                                 "' (known: wrong_call, misread, no_tool)");
}

std::vector<std::pair<int64_t, int64_t>> FindRetrievalAnswers(const int32_t* tokens,
                                                              int64_t count) {
  return FindQueryValues(tokens, count);
}

std::vector<int64_t> TokenByteOffsets(const transcript::Format& format, const int32_t* tokens,
                                      int64_t count) {
  std::vector<int64_t> offsets(count + 1, 0);
  for (int64_t i = 0; i < count; ++i) {
    offsets[i + 1] =
        offsets[i] + static_cast<int64_t>(format.DecodeBytes({tokens + i, 1}).size());
  }
  return offsets;
}

std::vector<std::pair<int64_t, int64_t>> FindRetrievalAnswers(const transcript::Format& format,
                                                              const int32_t* tokens,
                                                              int64_t count) {
  const std::vector<int64_t> offsets = TokenByteOffsets(format, tokens, count);
  const std::string bytes = format.DecodeBytes({tokens, static_cast<size_t>(count)});
  const std::vector<std::pair<int64_t, int64_t>> values =
      FindQueryValues(bytes.data(), static_cast<int64_t>(bytes.size()));
  return OverlappingTokens(offsets, values);
}

int64_t MinimumRetrievalLength(int64_t facts, int64_t key_letters) {
  return 2 + std::max<int64_t>(1, facts) *
                 (kFactTokens + kQueryTokens + 2 * std::clamp<int64_t>(key_letters, 1, 2));
}

GeneratedDocument Generate(GeneratorKind kind, const GeneratorOptions& options, uint64_t seed,
                           int64_t index) {
  switch (kind) {
    case GeneratorKind::kRetrieval: return Retrieval(options, seed, index);
    case GeneratorKind::kToolUse: return ToolUse(options, seed, index);
    case GeneratorKind::kImageText: return ImageText(options, seed, index);
  }
  return {};
}

Result<std::vector<float>> RenderCaptionImage(std::string_view caption, int64_t size) {
  // "a COLOR SHAPE at the ROW COLUMN on a COLOR background"
  std::vector<std::string_view> words;
  size_t start = 0;
  while (start <= caption.size()) {
    size_t end = caption.find(' ', start);
    if (end == std::string_view::npos) end = caption.size();
    words.push_back(caption.substr(start, end - start));
    start = end + 1;
  }
  auto bad = [&] {
    return Status::InvalidArgument("not an image_text caption: '" + std::string(caption) + "'");
  };
  if (words.size() != 11 || words[0] != "a" || words[3] != "at" || words[4] != "the" ||
      words[7] != "on" || words[8] != "a" || words[10] != "background") {
    return bad();
  }
  const int64_t color = FindWord(kColors, words[1]);
  const int64_t shape = FindWord(kShapes, words[2]);
  const int64_t row = FindWord(kRows, words[5]);
  const int64_t column = FindWord(kColumns, words[6]);
  const int64_t background = FindWord(kColors, words[9]);
  if (color < 0 || shape < 0 || row < 0 || column < 0 || background < 0 || size <= 0) return bad();
  std::vector<float> pixels(size * size * 3);
  const double cell = static_cast<double>(size) / 3.0;
  const double cy = (row + 0.5) * cell, cx = (column + 0.5) * cell, r = 0.4 * cell;
  for (int64_t y = 0; y < size; ++y) {
    for (int64_t x = 0; x < size; ++x) {
      const double dy = y + 0.5 - cy, dx = x + 0.5 - cx;
      bool inside = false;
      if (shape == 0) inside = std::abs(dx) <= r && std::abs(dy) <= r;
      if (shape == 1) inside = dx * dx + dy * dy <= r * r;
      if (shape == 2) {
        inside = (std::abs(dx) <= r && std::abs(dy) <= r / 3) ||
                 (std::abs(dy) <= r && std::abs(dx) <= r / 3);
      }
      const auto& rgb = kRgb[inside ? color : background];
      for (int c = 0; c < 3; ++c) pixels[(y * size + x) * 3 + c] = rgb[c];
    }
  }
  return pixels;
}

}  // namespace strider::data
