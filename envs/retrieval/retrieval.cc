#include "envs/retrieval/retrieval.h"

#include <fmt/format.h>

#include <regex>

#include "common/random.h"
#include "envs/options.h"
#include "envs/tools.h"

namespace strider::envs {
namespace {

const char* const kSyllables[] = {"ka", "lo", "mi", "ren", "to", "va", "shi", "dor",
                                  "el", "fa", "gu", "ion", "ne", "pa", "quo", "sa"};
const char* const kColours[] = {"amber", "cobalt", "crimson", "jade",
                                "onyx",  "pearl",  "rust",    "slate"};

std::string Name(uint64_t r) {
  std::string name = kSyllables[r % 16];
  name += kSyllables[(r >> 4) % 16];
  name += kSyllables[(r >> 8) % 16];
  name[0] = static_cast<char>(std::toupper(name[0]));
  return name;
}

std::string Badge(uint64_t r) { return fmt::format("{}-{:04}", kColours[r % 8], (r >> 3) % 10000); }

// numeric_names: agents and badges are numbers, to be copied digit by digit like a calculator's
// operands, in place of made-up words.
std::string NumericName(uint64_t r) { return fmt::format("{:05}", r % 100000); }
std::string NumericBadge(uint64_t r) { return fmt::format("{:06}", r % 1000000); }

struct Episode {
  uint64_t seed = 0;
  int64_t records = 0;
  int64_t parts = 1;
  bool numeric = false;
  int64_t agent_record = 0;  // "Agent <agent> carries badge <badge>."
  int64_t vault_record = 0;  // "Badge <badge> opens vault <vault>."
  std::string agent;
  std::string badge;
  std::string vault;

  int64_t PartBegin(int64_t part) const { return records * part / parts; }
  std::string NameOf(uint64_t r) const { return numeric ? NumericName(r) : Name(r); }
  std::string BadgeOf(uint64_t r) const { return numeric ? NumericBadge(r) : Badge(r); }

  // Record `index`, exactly kRetrievalRecordBytes bytes with its newline.
  std::string Record(int64_t index) const {
    std::string body;
    if (index == agent_record) {
      body = fmt::format("Agent {} carries badge {}.", agent, badge);
    } else if (index == vault_record) {
      body = fmt::format("Badge {} opens vault {}.", badge, vault);
    } else {
      // Record i of an episode is a pure function of (seed, i).
      const uint64_t r = SplitMix64(seed * 0x100000001b3ULL + static_cast<uint64_t>(index));
      switch ((r >> 40) % 4) {
        case 0: {
          std::string name = NameOf(r);
          if (name == agent) name += "0";  // the answer's agent appears once
          body = fmt::format("Agent {} carries badge {}.", name, BadgeOf(r >> 12));
          break;
        }
        case 1: {
          std::string other = BadgeOf(r >> 12);
          if (other == badge) other[other.size() - 1] = other.back() == '0' ? '1' : '0';
          body = fmt::format("Badge {} opens vault {:05}.", other, (r >> 20) % 100000);
          break;
        }
        case 2:
          body = fmt::format("Courier {} logged crate {:04} at dock {:02}.", NameOf(r),
                             (r >> 12) % 10000, (r >> 26) % 100);
          break;
        default:
          body = fmt::format("Station {:02}: {} degrees, wind {:02} knots.", r % 100,
                             static_cast<int64_t>((r >> 8) % 60) - 20, (r >> 16) % 100);
          break;
      }
    }
    std::string line = fmt::format("[r{:06}] {}", index, body);
    line.resize(kRetrievalRecordBytes - 1, ' ');
    line += '\n';
    return line;
  }
};

const std::vector<std::string> kOptionKeys = {"total_tokens", "parts", "restate_question",
                                              "numeric_names"};

struct Settings {
  int64_t total_tokens = 16384;
  int64_t parts = 4;
  // Asks the question again after the last part, naming the agent as the records and a search
  // write it ("Agent Kalo"), as long-document QA puts the question after the documents. The
  // search still has to find both records: this only moves the name next to where it is used.
  bool restate_question = false;
  // Agents and badges are 5- and 6-digit numbers instead of made-up words (the vault is a number
  // either way), for models that copy digits before they copy letters.
  bool numeric_names = false;
};

Result<Settings> ReadSettings(const Options& config, const Options& episode) {
  OptionReader reader("retrieval", config, episode, kOptionKeys);
  Settings settings;
  settings.total_tokens = reader.Int("total_tokens", settings.total_tokens, 128, 1 << 20);
  settings.parts = reader.Int("parts", settings.parts, 1, 1024);
  settings.restate_question = reader.Bool("restate_question", settings.restate_question);
  settings.numeric_names = reader.Bool("numeric_names", settings.numeric_names);
  STRIDER_RETURN_IF_ERROR(reader.status());
  if (settings.parts > settings.total_tokens / kRetrievalRecordBytes) {
    return Status::InvalidArgument(
        fmt::format("retrieval: option 'parts': {} parts of {} tokens leave parts without a record",
                    settings.parts, settings.total_tokens));
  }
  return settings;
}

class Retrieval : public Environment {
 public:
  Retrieval(Options config, Settings settings) : config_(std::move(config)), settings_(settings) {}

  EnvironmentSpec Describe() const override {
    EnvironmentSpec spec;
    spec.name = "retrieval";
    spec.description = "long-context search: find facts far apart in documents shown in parts";
    spec.tools.push_back({"search", R"({"query": "string"})",
                          "up to 3 records shown so far that contain the query text"});
    // Every part, a few searches and the answer, with room for detours.
    spec.max_turns = static_cast<int32_t>(settings_.parts + 12);
    spec.options = kOptionKeys;
    return spec;
  }

  Result<Observation> Reset(uint64_t seed, const Options& episode_options) override {
    STRIDER_ASSIGN_OR_RETURN(Settings settings, ReadSettings(config_, episode_options));
    episode_ = Episode();
    episode_.seed = seed;
    episode_.records = settings.total_tokens / kRetrievalRecordBytes;
    episode_.parts = settings.parts;
    restate_question_ = settings.restate_question;
    episode_.numeric = settings.numeric_names;
    const uint64_t r = SplitMix64(seed ^ 0x5eedULL);
    // A word agent has a suffix no filler name has; a numeric one is renamed in fillers.
    episode_.agent = episode_.numeric ? NumericName(r) : Name(r) + "ar";
    episode_.badge = episode_.BadgeOf(r >> 16);
    episode_.vault = fmt::format("{:05}", (r >> 32) % 100000);
    const int64_t first_size = episode_.PartBegin(1);
    const int64_t last_begin = episode_.PartBegin(episode_.parts - 1);
    episode_.agent_record = static_cast<int64_t>(SplitMix64(r) % first_size);
    episode_.vault_record =
        last_begin + static_cast<int64_t>(SplitMix64(r + 1) % (episode_.records - last_begin));
    if (episode_.vault_record == episode_.agent_record) {
      episode_.vault_record = (episode_.agent_record + 1) % episode_.records;
    }
    revealed_ = 0;
    turns_ = 0;
    max_turns_ = static_cast<int>(settings.parts + 12);
    active_ = true;
    Observation observation;
    observation.role = ObservationRole::kUser;
    observation.text = fmt::format(
        "Question: which vault does the badge of agent {} open? The documents follow in {} "
        "parts; say 'next' for the next part, use search, and reply 'Answer: <vault number>'.\n",
        episode_.agent, episode_.parts);
    observation.text += RevealNext();
    return observation;
  }

  Result<StepResult> Step(const Action& action) override {
    if (!active_) return Status::FailedPrecondition("retrieval: Step before Reset or after done");
    ++turns_;
    StepResult result;
    result.observation.role = ObservationRole::kToolResult;
    auto label = [&](bool correct, std::string text) {
      result.observation.text = std::move(text);
      result.label = correct ? StepLabel::kCorrect : StepLabel::kIncorrect;
      result.reward = correct ? 1.0 : 0.0;
    };
    static const std::regex answer(R"(Answer:\s*(\d+))");
    std::smatch match;
    if (!action.tool_call_error.empty()) {
      label(false, ToolErrorText(action.tool_call_error));
    } else if (action.tool_call.has_value()) {
      if (action.tool_call->name != "search") {
        label(false, ToolErrorText("unknown tool '" + action.tool_call->name + "'"));
      } else {
        Search(action.tool_call->arguments, label);
      }
    } else if (std::regex_search(action.text, match, answer)) {
      const bool right = match[1].str() == episode_.vault;
      result.observation = {ObservationRole::kUser, "", {}};
      result.label = right ? StepLabel::kCorrect : StepLabel::kIncorrect;
      result.reward = result.outcome_reward = right ? 1.0 : 0.0;
      result.done = true;
      result.info["answer"] = episode_.vault;
      result.info["revealed_parts"] = std::to_string(revealed_);
      active_ = false;
      return result;
    } else {
      result.observation.role = ObservationRole::kUser;
      result.observation.text = revealed_ < episode_.parts
                                    ? RevealNext()
                                    : "All parts are shown. Search, or reply 'Answer: <vault>'.";
    }
    if (turns_ >= max_turns_) {
      EndAtTurnLimit(&result);
      active_ = false;
    }
    return result;
  }

 private:
  std::string RevealNext() {
    const int64_t part = revealed_++;
    std::string text = fmt::format("Part {}/{}:\n", part + 1, episode_.parts);
    const int64_t begin = episode_.PartBegin(part), end = episode_.PartBegin(part + 1);
    text.reserve(text.size() + (end - begin) * kRetrievalRecordBytes);
    for (int64_t i = begin; i < end; ++i) text += episode_.Record(i);
    if (restate_question_ && revealed_ == episode_.parts) {
      text += fmt::format("All {} parts are shown. Which vault does the badge of Agent {} open?\n",
                          episode_.parts, episode_.agent);
    }
    return text;
  }

  template <typename Label>
  void Search(std::string query, Label& label) {
    // Quotes around the query are allowed: search("Agent Kalo") and search(Agent Kalo) agree.
    while (!query.empty() && std::isspace(static_cast<unsigned char>(query.back())))
      query.pop_back();
    while (!query.empty() && std::isspace(static_cast<unsigned char>(query.front())))
      query.erase(0, 1);
    if (query.size() >= 2 && (query.front() == '"' || query.front() == '\'') &&
        query.back() == query.front()) {
      query = query.substr(1, query.size() - 2);
    }
    if (query.size() < 3) {
      label(false, ToolErrorText("search needs a query of at least 3 characters"));
      return;
    }
    if (query.size() > 200) {
      label(false, ToolErrorText("search query longer than 200 characters"));
      return;
    }
    std::string found;
    int hits = 0;
    bool key = false;
    const int64_t end = episode_.PartBegin(revealed_);
    for (int64_t i = 0; i < end && hits < 3; ++i) {
      const std::string record = episode_.Record(i);
      if (record.find(query) == std::string::npos) continue;
      found += record;
      ++hits;
      key = key || i == episode_.agent_record || i == episode_.vault_record;
    }
    label(key, hits == 0 ? "no records match '" + query + "'" : found);
  }

  Options config_;
  Settings settings_;
  Episode episode_;
  int64_t revealed_ = 0;
  bool restate_question_ = false;
  int turns_ = 0;
  int max_turns_ = 0;
  bool active_ = false;
};

// Reads every part, then searches for the agent, then for the badge, then answers.
class RetrievalPolicy : public ScriptedPolicy {
 public:
  Result<std::string> NextTurn(const std::vector<Observation>& observations) override {
    if (observations.empty()) return Status::InvalidArgument("retrieval policy: no observations");
    static const std::regex question(R"(agent (\S+) open\? The documents follow in (\d+) parts)");
    std::smatch match;
    const std::string& first = observations.front().text;
    if (!std::regex_search(first, match, question)) {
      return Status::InvalidArgument("retrieval policy: no question in the first observation");
    }
    const std::string agent = match[1].str();
    const int parts = std::stoi(match[2].str());
    int shown = 0;
    std::string badge, vault;
    static const std::regex badge_line(R"(carries badge (\S+)\.)");
    static const std::regex vault_line(R"(opens vault (\d+)\.)");
    for (const Observation& observation : observations) {
      if (observation.text.find("Part ") != std::string::npos &&
          observation.role == ObservationRole::kUser) {
        ++shown;
      }
      if (observation.role != ObservationRole::kToolResult) continue;
      std::smatch m;
      if (observation.text.find("Agent " + agent + " ") != std::string::npos &&
          std::regex_search(observation.text, m, badge_line)) {
        badge = m[1].str();
      } else if (!badge.empty() &&
                 observation.text.find("Badge " + badge + " ") != std::string::npos &&
                 std::regex_search(observation.text, m, vault_line)) {
        vault = m[1].str();
      }
    }
    if (shown < parts) return std::string("next");
    if (badge.empty())
      return "Who is the agent?" + FormatToolCall("search", "Agent " + agent + " ");
    if (vault.empty()) return "Now the badge." + FormatToolCall("search", "Badge " + badge + " ");
    return "Answer: " + vault;
  }
};

}  // namespace

Result<std::unique_ptr<Environment>> MakeRetrievalEnvironment(const Options& options) {
  STRIDER_ASSIGN_OR_RETURN(Settings settings, ReadSettings(options, {}));
  return std::unique_ptr<Environment>(new Retrieval(options, settings));
}

std::unique_ptr<ScriptedPolicy> MakeRetrievalPolicy() {
  return std::make_unique<RetrievalPolicy>();
}

}  // namespace strider::envs
