#include "envs/vision_count/vision_count.h"

#include <fmt/format.h>

#include <array>
#include <optional>
#include <random>
#include <regex>

#include "envs/options.h"
#include "envs/tools.h"

namespace strider::envs {
namespace {

struct Colour {
  const char* name;
  uint8_t rgb[3];
};
const Colour kColours[] = {{"red", {220, 40, 40}},
                           {"green", {40, 170, 60}},
                           {"blue", {40, 70, 220}},
                           {"yellow", {230, 200, 30}}};
const char* const kKinds[] = {"square", "plus", "dot"};
constexpr uint8_t kBackground = 255;

enum Kind { kSquare = 0, kPlus = 1, kDot = 2, kEmpty = -1 };

struct Cell {
  int kind = kEmpty;
  int colour = 0;
};

// Pixel (y, x) inside a cell of side `c` belongs to a shape of `kind`.
bool Covers(int kind, int c, int y, int x) {
  const int m = std::max(1, c / 8);  // margin
  const int w = std::max(2, c / 4);  // plus arm width, dot side
  const int lo = c / 2 - w / 2, hi = lo + w;
  switch (kind) {
    case kSquare:
      return y >= m && y < c - m && x >= m && x < c - m;
    case kPlus:
      return (y >= m && y < c - m && x >= lo && x < hi) ||
             (x >= m && x < c - m && y >= lo && y < hi);
    case kDot:
      return y >= lo && y < hi && x >= lo && x < hi;
    default:
      return false;
  }
}

const std::vector<std::string> kOptionKeys = {"grid", "cell", "colours", "fill"};

struct Settings {
  int grid = 4;
  int cell = 8;
  int colours = 3;
  int fill = 40;
};

Result<Settings> ReadSettings(const Options& config, const Options& episode) {
  OptionReader reader("vision_count", config, episode, kOptionKeys);
  Settings s;
  s.grid = static_cast<int>(reader.Int("grid", s.grid, 2, 8));
  s.cell = static_cast<int>(reader.Int("cell", s.cell, 8, 64));  // below 8 the kinds look alike
  s.colours = static_cast<int>(reader.Int("colours", s.colours, 2, 4));
  s.fill = static_cast<int>(reader.Int("fill", s.fill, 10, 90));
  STRIDER_RETURN_IF_ERROR(reader.status());
  if (s.cell % 4 != 0) {
    return Status::InvalidArgument(fmt::format(
        "vision_count: option 'cell': {} is not a multiple of the patch size 4", s.cell));
  }
  return s;
}

Image Render(const std::vector<Cell>& cells, int grid, int cell) {
  Image image;
  image.width = image.height = grid * cell;
  image.channels = 3;
  image.pixels.assign(static_cast<size_t>(image.width) * image.height * 3,
                      static_cast<char>(kBackground));
  for (int r = 0; r < grid; ++r) {
    for (int c = 0; c < grid; ++c) {
      const Cell& shape = cells[r * grid + c];
      if (shape.kind == kEmpty) continue;
      for (int y = 0; y < cell; ++y) {
        for (int x = 0; x < cell; ++x) {
          if (!Covers(shape.kind, cell, y, x)) continue;
          const size_t at = ((static_cast<size_t>(r * cell + y) * image.width) + c * cell + x) * 3;
          for (int k = 0; k < 3; ++k)
            image.pixels[at + k] = static_cast<char>(kColours[shape.colour].rgb[k]);
        }
      }
    }
  }
  return image;
}

Image Crop(const Image& image, int row, int col, int cell, int scale) {
  Image out;
  out.width = out.height = cell * scale;
  out.channels = 3;
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * 3);
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      const size_t from =
          ((static_cast<size_t>(row * cell + y / scale) * image.width) + col * cell + x / scale) *
          3;
      const size_t to = (static_cast<size_t>(y) * out.width + x) * 3;
      for (int k = 0; k < 3; ++k) out.pixels[to + k] = image.pixels[from + k];
    }
  }
  return out;
}

class VisionCount : public Environment {
 public:
  VisionCount(Options config, Settings settings)
      : config_(std::move(config)), settings_(settings) {}

  EnvironmentSpec Describe() const override {
    EnvironmentSpec spec;
    spec.name = "vision_count";
    spec.description = "count coloured shapes in an image; zoom into a cell";
    spec.tools.push_back({"zoom", R"({"row": "integer", "col": "integer"})",
                          "the cell at (row, col), counted from 0, enlarged 2x"});
    spec.max_turns = 12;
    spec.options = kOptionKeys;
    return spec;
  }

  Result<Observation> Reset(uint64_t seed, const Options& episode_options) override {
    STRIDER_ASSIGN_OR_RETURN(episode_, ReadSettings(config_, episode_options));
    std::mt19937_64 rng(seed);
    const int n = episode_.grid * episode_.grid;
    cells_.assign(n, Cell());
    for (Cell& cell : cells_) {
      if (static_cast<int>(rng() % 100) < episode_.fill) {
        cell.kind = static_cast<int>(rng() % 3);
        cell.colour = static_cast<int>(rng() % episode_.colours);
      }
    }
    colour_ = static_cast<int>(rng() % episode_.colours);
    kind_ = rng() % 2 == 0 ? kEmpty : static_cast<int>(rng() % 3);  // kEmpty: any kind
    answer_ = 0;
    for (const Cell& cell : cells_) answer_ += Asked(cell) ? 1 : 0;
    image_ = Render(cells_, episode_.grid, episode_.cell);
    turns_ = 0;
    active_ = true;
    Observation observation;
    observation.role = ObservationRole::kUser;
    observation.images.push_back(image_);
    observation.text = fmt::format(
        "The image is a {0}x{0} grid of cells. How many {1} {2} are there? Use zoom(row, col) "
        "to look closer, then reply 'Answer: <number>'.",
        episode_.grid, kColours[colour_].name,
        kind_ == kEmpty ? std::string("shapes")
                        : std::string(kKinds[kind_]) + (kind_ == kPlus ? "es" : "s"));
    return observation;
  }

  Result<StepResult> Step(const Action& action) override {
    if (!active_)
      return Status::FailedPrecondition("vision_count: Step before Reset or after done");
    ++turns_;
    StepResult result;
    result.observation.role = ObservationRole::kToolResult;
    auto label = [&](bool correct, std::string text) {
      result.observation.text = std::move(text);
      result.label = correct ? StepLabel::kCorrect : StepLabel::kIncorrect;
      result.reward = correct ? 1.0 : 0.0;
    };
    static const std::regex answer(R"(Answer:\s*(\d+))");
    static const std::regex zoom(R"(^\s*(-?\d+)\s*,\s*(-?\d+)\s*$)");
    std::smatch match;
    if (!action.tool_call_error.empty()) {
      label(false, ToolErrorText(action.tool_call_error));
    } else if (action.tool_call.has_value()) {
      const ToolCall& call = *action.tool_call;
      if (call.name != "zoom") {
        label(false, ToolErrorText("unknown tool '" + call.name + "'"));
      } else if (!std::regex_match(call.arguments, match, zoom)) {
        label(false, ToolErrorText("zoom takes two integers: zoom(row, col)"));
      } else {
        const int row = std::stoi(match[1].str()), col = std::stoi(match[2].str());
        if (row < 0 || col < 0 || row >= episode_.grid || col >= episode_.grid) {
          label(false, ToolErrorText(fmt::format("cell ({}, {}) is outside the {}x{} grid", row,
                                                 col, episode_.grid, episode_.grid)));
        } else {
          label(Asked(cells_[row * episode_.grid + col]), fmt::format("cell ({}, {})", row, col));
          result.observation.images.push_back(Crop(image_, row, col, episode_.cell, 2));
        }
      }
    } else if (std::regex_search(action.text, match, answer)) {
      const bool right = std::stoi(match[1].str()) == answer_;
      result.observation = {ObservationRole::kUser, "", {}};
      result.label = right ? StepLabel::kCorrect : StepLabel::kIncorrect;
      result.reward = result.outcome_reward = right ? 1.0 : 0.0;
      result.done = true;
      result.info["answer"] = std::to_string(answer_);
      active_ = false;
      return result;
    } else {
      result.observation.role = ObservationRole::kUser;
      result.observation.text = "Zoom into a cell, or reply 'Answer: <number>'.";
    }
    if (turns_ >= Describe().max_turns) {
      EndAtTurnLimit(&result);
      active_ = false;
    }
    return result;
  }

 private:
  bool Asked(const Cell& cell) const {
    return cell.kind != kEmpty && cell.colour == colour_ && (kind_ == kEmpty || cell.kind == kind_);
  }

  Options config_;
  Settings settings_;
  Settings episode_;
  std::vector<Cell> cells_;
  Image image_;
  int colour_ = 0;
  int kind_ = kEmpty;
  int answer_ = 0;
  int turns_ = 0;
  bool active_ = false;
};

// Reads the pixels: each cell's shape from three probe pixels (margin corner, edge middle,
// centre) and its colour from the centre. Zooms into the first matching cell, then answers.
class VisionCountPolicy : public ScriptedPolicy {
 public:
  Result<std::string> NextTurn(const std::vector<Observation>& observations) override {
    if (observations.empty() || observations.front().images.empty()) {
      return Status::InvalidArgument("vision_count policy: the first observation has no image");
    }
    static const std::regex question(R"((\d+)x\d+ grid of cells\. How many (\w+) (\w+) are)");
    std::smatch match;
    const Observation& first = observations.front();
    if (!std::regex_search(first.text, match, question)) {
      return Status::InvalidArgument("vision_count policy: no question in the first observation");
    }
    const int grid = std::stoi(match[1].str());
    const std::string colour = match[2].str(), kind = match[3].str();
    const Image& image = first.images.front();
    const int c = image.width / grid;
    auto pixel = [&](int y, int x) {
      const size_t at = (static_cast<size_t>(y) * image.width + x) * 3;
      return std::array<uint8_t, 3>{static_cast<uint8_t>(image.pixels[at]),
                                    static_cast<uint8_t>(image.pixels[at + 1]),
                                    static_cast<uint8_t>(image.pixels[at + 2])};
    };
    auto blank = [](const std::array<uint8_t, 3>& p) {
      return p[0] == kBackground && p[1] == kBackground && p[2] == kBackground;
    };
    const int m = std::max(1, c / 8);
    int count = 0;
    std::optional<std::pair<int, int>> first_match;
    for (int r = 0; r < grid; ++r) {
      for (int col = 0; col < grid; ++col) {
        const auto centre = pixel(r * c + c / 2, col * c + c / 2);
        if (blank(centre)) continue;
        const bool corner = !blank(pixel(r * c + m, col * c + m));
        const bool edge = !blank(pixel(r * c + m, col * c + c / 2));
        const char* seen_kind = corner ? "square" : edge ? "plus" : "dot";
        const char* seen_colour = "?";
        for (const Colour& known : kColours) {
          if (known.rgb[0] == centre[0] && known.rgb[1] == centre[1] && known.rgb[2] == centre[2]) {
            seen_colour = known.name;
          }
        }
        const bool kind_ok = kind == "shapes" || kind.rfind(seen_kind, 0) == 0;
        if (colour == seen_colour && kind_ok) {
          ++count;
          if (!first_match) first_match = {r, col};
        }
      }
    }
    if (first_match && observations.size() == 1) {
      return "Let me check one." +
             FormatToolCall("zoom", fmt::format("{}, {}", first_match->first, first_match->second));
    }
    return "Answer: " + std::to_string(count);
  }
};

}  // namespace

Result<std::unique_ptr<Environment>> MakeVisionCountEnvironment(const Options& options) {
  STRIDER_ASSIGN_OR_RETURN(Settings settings, ReadSettings(options, {}));
  return std::unique_ptr<Environment>(new VisionCount(options, settings));
}

std::unique_ptr<ScriptedPolicy> MakeVisionCountPolicy() {
  return std::make_unique<VisionCountPolicy>();
}

}  // namespace strider::envs
