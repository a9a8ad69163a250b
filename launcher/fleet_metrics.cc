#include "launcher/fleet_metrics.h"

#include <unistd.h>

#include <cstdio>
#include <string_view>
#include <utility>

namespace strider::launcher {
namespace {

using nlohmann::json;

// Number or null.
json Optional(const std::optional<double>& value) { return value ? json(*value) : json(nullptr); }

}  // namespace

json ReplayFill(const json& stats) {
  if (!stats.is_object() || !stats.contains("tables") || !stats["tables"].is_array()) {
    return nullptr;
  }
  json fill = json::object();
  for (const json& table : stats["tables"]) {
    if (table.contains("name") && table.contains("fill")) fill[table["name"]] = table["fill"];
  }
  return fill;
}

std::vector<std::string> FileTail::NewLines() {
  std::vector<std::string> lines;
  std::ifstream in(path_, std::ios::binary);
  if (!in) return lines;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < offset_) offset_ = 0;  // replaced by a shorter file: read it from the start
  if (size == offset_) return lines;
  in.seekg(offset_);
  std::string chunk(static_cast<size_t>(size - offset_), '\0');
  in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  offset_ += in.gcount();
  partial_.append(chunk.data(), static_cast<size_t>(in.gcount()));
  size_t start = 0;
  for (size_t newline; (newline = partial_.find('\n', start)) != std::string::npos;
       start = newline + 1) {
    if (newline > start) lines.push_back(partial_.substr(start, newline - start));
  }
  partial_.erase(0, start);
  return lines;
}

Status FleetMetrics::Open(const std::filesystem::path& run_dir,
                          const std::vector<std::string>& actors, bool evaluation) {
  merged_.open(run_dir / "metrics.jsonl", std::ios::app);
  if (!merged_) return Status::IoError("cannot open " + (run_dir / "metrics.jsonl").string());
  if (evaluation) {
    eval_rows_.open(run_dir / "eval.jsonl", std::ios::app);
    if (!eval_rows_) return Status::IoError("cannot open " + (run_dir / "eval.jsonl").string());
  }
  for (const std::string& name : actors) {
    actors_.emplace_back((run_dir / "actors" / name / "metrics.jsonl").string());
    actors_.back().NewLines();  // skipped: an earlier launch's rows
  }
  actor_rows_.resize(actors_.size());
  learner_ = FileTail((run_dir / "learner" / "metrics.jsonl").string());
  replay_log_ = FileTail((run_dir / "logs" / "replay.log").string());
  replay_log_.NewLines();  // skipped: an earlier launch's stats describe another server
  return Status::Ok();
}

std::vector<json> FleetMetrics::Read() {
  std::vector<json> learner_rows;
  for (const std::string& line : learner_.NewLines()) {
    json row = json::parse(line, nullptr, false);
    if (!row.is_object() || !row.contains("step")) continue;
    const int64_t step = row.value("step", int64_t{0});
    sampled_by_step_[step] = row.value("trajectories", int64_t{0});
    learner_rows.push_back(row);
    learner_row_ = std::move(row);
  }
  samples_ = 0;
  for (const auto& [step, count] : sampled_by_step_) samples_ += count;
  // The server logs its stats every server.stats_interval_s; a client of its own in the
  // launcher would cost more than reading what it already writes.
  constexpr std::string_view kStats = "replay stats: ";
  for (const std::string& line : replay_log_.NewLines()) {
    const size_t at = line.find(kStats);
    if (at == std::string::npos) continue;
    json fill = ReplayFill(json::parse(line.substr(at + kStats.size()), nullptr, false));
    if (!fill.is_null()) replay_fill_ = std::move(fill);
  }
  for (size_t i = 0; i < actors_.size(); ++i) {
    for (const std::string& line : actors_[i].NewLines()) {
      json row = json::parse(line, nullptr, false);
      if (row.is_object()) actor_rows_[i] = std::move(row);
    }
  }
  return learner_rows;
}

json FleetMetrics::MergedLine(double elapsed_s, json restarts) const {
  const auto learner = [&](const char* key) -> json {
    if (!learner_row_ || !learner_row_->contains(key)) return nullptr;
    return (*learner_row_)[key];
  };
  std::optional<double> actor_tokens;
  for (const auto& row : actor_rows_) {
    if (row && row->contains("generated_tokens_per_s") &&
        (*row)["generated_tokens_per_s"].is_number()) {
      actor_tokens = actor_tokens.value_or(0) + (*row)["generated_tokens_per_s"].get<double>();
    }
  }
  return {{"elapsed_s", elapsed_s},
          {"learner_step", learner_row_ ? learner("step") : json(0)},
          {"policy_version", learner("policy_version")},
          {"reward_mean", learner("reward_mean")},
          {"success_rate", learner("success_rate")},
          {"eval_success_rate", Optional(eval_success_rate_)},
          {"samples", samples_},
          {"learner_tokens_per_s", learner("tokens_per_second")},
          {"actor_tokens_per_s", Optional(actor_tokens)},
          {"staleness_mean", learner("staleness_mean")},
          {"replay_fill", replay_fill_},
          {"restarts", std::move(restarts)}};
}

void FleetMetrics::AppendMerged(const json& line) { merged_ << line.dump() << "\n" << std::flush; }

void FleetMetrics::AppendEval(const json& row) {
  eval_rows_ << row.dump() << "\n" << std::flush;
  if (row.contains("success_rate") && row["success_rate"].is_number()) {
    eval_success_rate_ = row["success_rate"].get<double>();
  }
}

int64_t FleetMetrics::LearnerValue(const char* key, int64_t otherwise) const {
  return learner_row_ ? learner_row_->value(key, otherwise) : otherwise;
}

ProgressLine::ProgressLine() : on_terminal_(::isatty(STDERR_FILENO) == 1) {}

void ProgressLine::Show(const json& m, double elapsed, bool final_line) {
  if (!on_terminal_ && !final_line && elapsed - last_plain_ < kPlainPeriodS) return;
  last_plain_ = elapsed;
  const auto number = [](const json& value, const char* format) {
    if (!value.is_number()) return std::string("-");
    char text[32];
    std::snprintf(text, sizeof(text), format, value.get<double>());
    return std::string(text);
  };
  int64_t restarts = 0;
  for (const auto& [name, count] : m["restarts"].items()) restarts += count.get<int64_t>();
  char line[512];
  std::snprintf(line, sizeof(line),
                "%6.0fs step %s v%s | reward %s | success train %s eval %s | tok/s learner %s "
                "actors %s | staleness %s | restarts %lld",
                elapsed, number(m["learner_step"], "%.0f").c_str(),
                number(m["policy_version"], "%.0f").c_str(),
                number(m["reward_mean"], "%.3f").c_str(), number(m["success_rate"], "%.2f").c_str(),
                number(m["eval_success_rate"], "%.2f").c_str(),
                number(m["learner_tokens_per_s"], "%.0f").c_str(),
                number(m["actor_tokens_per_s"], "%.0f").c_str(),
                number(m["staleness_mean"], "%.1f").c_str(), static_cast<long long>(restarts));
  if (on_terminal_) {
    std::fprintf(stderr, "\r%s\x1b[K%s", line, final_line ? "\n" : "");
    open_ = !final_line;
  } else {
    std::fprintf(stderr, "launch: %s\n", line);
  }
  std::fflush(stderr);
}

void ProgressLine::Log(const std::string& message) {
  std::fprintf(stderr, "%slaunch: %s\n", open_ ? "\n" : "", message.c_str());
  open_ = false;
}

}  // namespace strider::launcher
