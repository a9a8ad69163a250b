// The RL report: several runs of `strider launch` overlaid on one page (report/report.h).
//
// Every plot draws one series per run, named by the run's label, so runs that differ only in
// their advantage estimator read as a comparison; the same colour is the same run everywhere
// because every plot lists the runs in the order given.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/config.h"
#include "report/report.h"
#include "report/report_html.h"

namespace strider {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using report_html::Escape;
using report_html::Number;
using report_html::NumberField;
using report_html::StringField;

struct ActorLog {
  std::string name;  // actors/<name>/metrics.jsonl
  std::vector<json> lines;
};

struct RlRun {
  std::string dir;        // as given
  std::string name;       // the directory's own name
  std::string estimator;  // "" when the learner config could not be read
  std::string label;      // what the plots' legends say
  bool have_ticks = false, have_eval = false, have_learner = false;
  std::vector<json> ticks;  // metrics.jsonl
  std::vector<json> evals;  // eval.jsonl, "eval" events only
  // Wall time of each tick and each evaluation across the run's launches (ContinueTime).
  std::vector<double> tick_wall, eval_wall;
  std::map<int64_t, json> steps;  // learner/metrics.jsonl by step, the last line of each
  std::vector<ActorLog> actors;   // by name
};

Status LineError(const std::string& path, int64_t line, const std::string& what) {
  return Status::InvalidArgument(path + ":" + std::to_string(line) + ": " + what);
}

// The lines of `path` and their numbers, or none when it does not exist: a run that has not
// evaluated yet has no eval.jsonl, and that is not an error. `*present` says which.
Result<std::vector<json>> ReadOptional(const std::string& path, bool* present,
                                       std::vector<int64_t>* line_numbers) {
  std::error_code error;
  *present = fs::is_regular_file(path, error);
  if (!*present) return std::vector<json>();
  return report_html::ReadJsonLines(path, line_numbers);
}

// The run's advantage estimator, "" when any step fails. The label is a convenience, so this
// reads only the two keys it needs and does not police the rest of either file: the launcher
// already checked the fleet file strictly when it started the run. The learner config is
// resolved the way the launcher resolved it (against the working directory, else the fleet
// file's directory and its parents).
std::string ReadEstimator(const std::string& run_dir) {
  const std::string fleet_path = run_dir + "/fleet.yaml";
  std::error_code error;
  if (!fs::is_regular_file(fleet_path, error)) return "";
  Result<ConfigReader> fleet = ConfigReader::FromFile(fleet_path);
  if (!fleet.ok()) return "";
  std::string learner_config;
  fleet->Section("learner").Optional("config", &learner_config);
  if (!fleet->status().ok() || learner_config.empty()) return "";
  Result<ConfigReader> learner =
      ConfigReader::FromFile(ResolveConfigPath(learner_config, fleet_path));
  if (!learner.ok()) return "";
  std::string estimator;
  learner->Section("objective").Section("advantages").Optional("estimator", &estimator);
  if (!learner->status().ok()) return "";
  return estimator;
}

// Wall time across resumed launches. Each launch counts elapsed_s from its own start (a resumed
// run's ticks start again at 0), so where elapsed_s falls a new launch begins, and it continues
// from where the previous one ended. The ends come from the ticks (`launch_ends`, filled when
// reading them); an evaluation of a launch the ticks do not cover continues from the previous
// evaluation.
std::vector<double> ContinueTime(const std::vector<json>& lines, std::vector<double>* launch_ends,
                                 bool record_ends) {
  std::vector<double> wall;
  double offset = 0, previous = -INFINITY, last_wall = 0;
  size_t launch = 0;
  for (const json& line : lines) {
    const double elapsed = NumberField(line, "elapsed_s");
    if (!std::isfinite(elapsed)) {
      wall.push_back(NAN);
      continue;
    }
    if (elapsed < previous) {
      if (record_ends) launch_ends->push_back(previous);
      offset += !record_ends && launch < launch_ends->size() ? (*launch_ends)[launch]
                                                             : last_wall - offset;
      ++launch;
    }
    previous = elapsed;
    last_wall = offset + elapsed;
    wall.push_back(last_wall);
  }
  return wall;
}

Result<RlRun> LoadRun(const std::string& dir) {
  RlRun run;
  run.dir = dir;
  // "runs/a/" normalises to a path whose last element is empty; its name is still "a".
  fs::path normal = fs::path(dir).lexically_normal();
  if (normal.filename().empty()) normal = normal.parent_path();
  run.name = normal.filename().empty() ? dir : normal.filename().string();
  run.estimator = ReadEstimator(dir);

  std::vector<int64_t> numbers;
  const std::string ticks_path = dir + "/metrics.jsonl";
  STRIDER_ASSIGN_OR_RETURN(run.ticks, ReadOptional(ticks_path, &run.have_ticks, &numbers));
  for (size_t i = 0; i < run.ticks.size(); ++i) {
    if (!std::isfinite(NumberField(run.ticks[i], "elapsed_s"))) {
      return LineError(ticks_path, numbers[i], "no numeric \"elapsed_s\"");
    }
  }

  const std::string eval_path = dir + "/eval.jsonl";
  std::vector<json> evals;
  numbers.clear();
  STRIDER_ASSIGN_OR_RETURN(evals, ReadOptional(eval_path, &run.have_eval, &numbers));
  for (size_t i = 0; i < evals.size(); ++i) {
    // Other events may share the file in future; only evaluations are plotted.
    if (evals[i].contains("event") && StringField(evals[i], "event") != "eval") continue;
    if (!std::isfinite(NumberField(evals[i], "success_rate"))) {
      return LineError(eval_path, numbers[i], "no numeric \"success_rate\"");
    }
    run.evals.push_back(std::move(evals[i]));
  }

  std::vector<double> launch_ends;
  run.tick_wall = ContinueTime(run.ticks, &launch_ends, /*record_ends=*/true);
  run.eval_wall = ContinueTime(run.evals, &launch_ends, /*record_ends=*/false);

  const std::string learner_path = dir + "/learner/metrics.jsonl";
  std::vector<json> learner;
  numbers.clear();
  STRIDER_ASSIGN_OR_RETURN(learner, ReadOptional(learner_path, &run.have_learner, &numbers));
  for (size_t i = 0; i < learner.size(); ++i) {
    if (learner[i].contains("event")) continue;  // not a step line
    const double step = NumberField(learner[i], "step");
    if (!std::isfinite(step)) return LineError(learner_path, numbers[i], "no numeric \"step\"");
    // A resumed learner repeats the steps after its checkpoint; the later line is the one that
    // counts, as the launcher counts samples.
    run.steps[static_cast<int64_t>(step)] = std::move(learner[i]);
  }

  std::error_code error;
  if (fs::is_directory(dir + "/actors", error)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(dir + "/actors", error)) {
      const std::string path = entry.path().string() + "/metrics.jsonl";
      if (!entry.is_directory() || !fs::is_regular_file(path, error)) continue;
      ActorLog actor{entry.path().filename().string(), {}};
      STRIDER_ASSIGN_OR_RETURN(actor.lines, report_html::ReadJsonLines(path));
      run.actors.push_back(std::move(actor));
    }
    std::sort(run.actors.begin(), run.actors.end(),
              [](const ActorLog& a, const ActorLog& b) { return a.name < b.name; });
  }
  return run;
}

// Labels are the estimators; where two runs would share one (or have none), the directory's
// name says which is which.
void AssignLabels(std::vector<RlRun>& runs) {
  std::map<std::string, int> uses;
  for (const RlRun& run : runs) ++uses[run.estimator];
  for (RlRun& run : runs) {
    if (run.estimator.empty()) {
      run.label = run.name;
    } else if (uses[run.estimator] > 1) {
      run.label = run.estimator + " (" + run.name + ")";
    } else {
      run.label = run.estimator;
    }
  }
  // Two directories of the same name under different parents: the path as given decides.
  std::map<std::string, int> labels;
  for (const RlRun& run : runs) ++labels[run.label];
  for (RlRun& run : runs) {
    if (labels[run.label] > 1) run.label += " [" + run.dir + "]";
  }
}

// Samples trained on up to each step: the running sum of the steps' "trajectories", the count
// the launcher's `stop.samples` and eval.jsonl's samples_seen use.
std::map<int64_t, double> SamplesByStep(const RlRun& run) {
  std::map<int64_t, double> samples;
  double total = 0;
  for (const auto& [step, line] : run.steps) {
    const double n = NumberField(line, "trajectories");
    if (std::isfinite(n)) total += n;
    samples[step] = total;
  }
  return samples;
}

// One series per run of the learner field `key` against the step; `any` says whether any run
// recorded a value.
std::vector<PlotSeries> LearnerSeries(const std::vector<RlRun>& runs, const char* key, bool* any) {
  std::vector<PlotSeries> series;
  *any = false;
  for (const RlRun& run : runs) {
    PlotSeries s{run.label, {}, {}};
    for (const auto& [step, line] : run.steps) {
      const double value = NumberField(line, key);
      if (!std::isfinite(value)) continue;
      s.points.emplace_back(static_cast<double>(step), value);
      *any = true;
    }
    series.push_back(std::move(s));
  }
  return series;
}

// Evaluation success against samples seen (`by_wall` false) or wall time, the Wilson interval
// as the band, in order of x.
std::vector<PlotSeries> EvalSeries(const std::vector<RlRun>& runs, bool by_wall) {
  std::vector<PlotSeries> series;
  for (const RlRun& run : runs) {
    std::vector<std::pair<double, const json*>> rows;
    for (size_t i = 0; i < run.evals.size(); ++i) {
      rows.emplace_back(by_wall ? run.eval_wall[i] : NumberField(run.evals[i], "samples_seen"),
                        &run.evals[i]);
    }
    std::stable_sort(rows.begin(), rows.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    PlotSeries s{run.label, {}, {}};
    for (const auto& [x, e] : rows) {
      s.points.emplace_back(x, NumberField(*e, "success_rate"));
      s.band.push_back({x, NumberField(*e, "ci_low"), NumberField(*e, "ci_high")});
    }
    series.push_back(std::move(s));
  }
  return series;
}

std::string Plot(const std::vector<PlotSeries>& series, const std::string& title,
                 const std::string& x_label, const std::string& y_label, bool unit_y = false) {
  PlotOptions options;
  options.title = title;
  options.x_label = x_label;
  options.y_label = y_label;
  if (unit_y) options.y_min = 0, options.y_max = 1;
  return SvgLinePlot(series, options);
}

// The last finite value of `key` over `lines`, NAN when none.
double Last(const std::vector<json>& lines, const char* key) {
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    const double value = NumberField(*it, key);
    if (std::isfinite(value)) return value;
  }
  return NAN;
}

std::string RunTable(const std::vector<RlRun>& runs) {
  std::ostringstream html;
  html << "<table class=\"runs\">\n<tr><th>run</th><th>directory</th><th>estimator</th>"
          "<th>final eval success</th><th>95% interval</th><th>eval episodes</th>"
          "<th>evaluations</th><th>samples</th><th>wall time (s)</th><th>learner steps</th>"
          "<th>policy version</th><th>restarts</th><th>weights wait (s)</th></tr>\n";
  for (const RlRun& run : runs) {
    const json* final_eval = run.evals.empty() ? nullptr : &run.evals.back();
    const std::map<int64_t, double> samples_by_step = SamplesByStep(run);
    // Samples and wall time from the launcher's last tick; from the learner's own lines when
    // there are no ticks.
    double samples = Last(run.ticks, "samples");
    if (!std::isfinite(samples) && !samples_by_step.empty()) {
      samples = samples_by_step.rbegin()->second;
    }
    double wall = run.tick_wall.empty() ? NAN : run.tick_wall.back();
    if (!std::isfinite(wall) && run.steps.size() > 1) {
      wall = NumberField(run.steps.rbegin()->second, "time") -
             NumberField(run.steps.begin()->second, "time");
    }
    const double steps = run.steps.empty() ? Last(run.ticks, "learner_step")
                                           : static_cast<double>(run.steps.rbegin()->first);
    double version = NAN;
    if (!run.steps.empty()) version = NumberField(run.steps.rbegin()->second, "policy_version");
    if (!std::isfinite(version)) version = Last(run.ticks, "policy_version");
    // Restarts per role from the last tick that has them.
    std::string restarts = "-";
    for (auto it = run.ticks.rbegin(); it != run.ticks.rend(); ++it) {
      auto found = it->find("restarts");
      if (found == it->end() || !found->is_object()) continue;
      int64_t total = 0;
      std::string roles;
      for (const auto& [role, n] : found->items()) {
        if (!n.is_number() || n.get<double>() == 0) continue;
        total += n.get<int64_t>();
        roles += (roles.empty() ? "" : ", ") + role + " " + std::to_string(n.get<int64_t>());
      }
      restarts = total == 0 ? "0" : std::to_string(total) + " (" + roles + ")";
      break;
    }
    double wait = NAN;
    for (const ActorLog& actor : run.actors) {
      const double w = Last(actor.lines, "weights_wait_s");
      if (std::isfinite(w)) wait = (std::isfinite(wait) ? wait : 0) + w;
    }
    html << "<tr><td>" << Escape(run.label) << "</td><td><code>" << Escape(run.dir)
         << "</code></td><td>" << Escape(run.estimator.empty() ? "-" : run.estimator) << "</td><td>"
         << (final_eval ? Number(NumberField(*final_eval, "success_rate")) : "-") << "</td><td>"
         << (final_eval ? "[" + Number(NumberField(*final_eval, "ci_low")) + ", " +
                              Number(NumberField(*final_eval, "ci_high")) + "]"
                        : "-")
         << "</td><td>" << (final_eval ? Number(NumberField(*final_eval, "episodes"), 10) : "-")
         << "</td><td>" << run.evals.size() << "</td><td>" << Number(samples, 12) << "</td><td>"
         << Number(wall, 5) << "</td><td>" << Number(steps, 12) << "</td><td>"
         << Number(version, 12) << "</td><td>" << Escape(restarts) << "</td><td>" << Number(wait, 4)
         << "</td></tr>\n";
  }
  html << "</table>\n";
  return html.str();
}

}  // namespace

RunKind DetectRunKind(const std::string& run_dir) {
  std::error_code error;
  if (fs::is_regular_file(run_dir + "/fleet.yaml", error) ||
      fs::is_regular_file(run_dir + "/learner/metrics.jsonl", error)) {
    return RunKind::kRl;
  }
  return RunKind::kPretraining;
}

Result<std::string> WriteRlReport(const std::vector<std::string>& run_dirs,
                                  const std::string& out_path) {
  if (run_dirs.empty()) return Status::InvalidArgument("no run directory to report");
  std::vector<RlRun> runs;
  for (const std::string& dir : run_dirs) {
    STRIDER_ASSIGN_OR_RETURN(RlRun run, LoadRun(dir));
    runs.push_back(std::move(run));
  }
  AssignLabels(runs);

  std::ostringstream html;
  // Run directories can be long paths: they wrap rather than push the table off the page.
  html << report_html::PageHead("RL report", "td code{word-break:break-all}th{font-size:90%}")
       << "<h1>RL report</h1>\n";
  html << "<p>" << runs.size() << " run(s). Every plot draws one line per run in this order and "
       << "colour.</p>\n";
  for (const RlRun& run : runs) {
    std::vector<std::string> missing;
    if (!run.have_ticks) missing.push_back("metrics.jsonl");
    if (!run.have_eval) missing.push_back("eval.jsonl");
    if (!run.have_learner) missing.push_back("learner/metrics.jsonl");
    if (run.actors.empty()) missing.push_back("actors/*/metrics.jsonl");
    if (missing.empty()) continue;
    html << "<p class=\"missing\"><b>" << Escape(run.label) << "</b> (<code>" << Escape(run.dir)
         << "</code>) has no ";
    for (size_t i = 0; i < missing.size(); ++i) {
      html << (i ? ", " : "") << "<code>" << Escape(missing[i]) << "</code>";
    }
    html << " yet.</p>\n";
  }
  html << "<h2>Runs</h2>\n" << RunTable(runs);

  html << "<h2>Evaluation</h2>\n";
  bool any_eval = false;
  for (const RlRun& run : runs) any_eval = any_eval || !run.evals.empty();
  if (any_eval) {
    html << Plot(EvalSeries(runs, /*by_wall=*/false), "Evaluation success (band: 95% interval)",
                 "samples trained on", "success rate", true);
    html << Plot(EvalSeries(runs, /*by_wall=*/true), "Evaluation success against wall time",
                 "wall time (s)", "success rate", true);
  } else {
    html << "<p>No evaluation yet (no run has <code>eval.jsonl</code> rows).</p>\n";
  }

  html << "<h2>Training</h2>\n";
  std::vector<PlotSeries> reward, success;
  for (const RlRun& run : runs) {
    const std::map<int64_t, double> samples = SamplesByStep(run);
    PlotSeries r{run.label, {}, {}}, s{run.label, {}, {}};
    for (const auto& [step, line] : run.steps) {
      r.points.emplace_back(samples.at(step), NumberField(line, "reward_mean"));
      s.points.emplace_back(samples.at(step), NumberField(line, "success_rate"));
    }
    reward.push_back(std::move(r));
    success.push_back(std::move(s));
  }
  html << Plot(reward, "Training reward (batch mean)", "samples trained on", "reward_mean");
  html << Plot(success, "Training success (batch)", "samples trained on", "success_rate", true);

  html << "<h2>Learner</h2>\n";
  struct LearnerPlot {
    const char* key;
    const char* title;
    const char* y_label;
  };
  for (const LearnerPlot& p : {
           LearnerPlot{"kl", "KL to the reference policy", "kl"},
           LearnerPlot{"clip_fraction", "Clipped fraction of action tokens", "clip_fraction"},
           LearnerPlot{"logprob_mismatch_max", "Log-prob mismatch, learner against actor (max)",
                       "max |difference|"},
           LearnerPlot{"staleness_mean", "Staleness of trained trajectories (mean)",
                       "policy versions"},
           LearnerPlot{"max_violation", "Routing MaxVio", "MaxVio"},
       }) {
    bool any = false;
    std::vector<PlotSeries> series = LearnerSeries(runs, p.key, &any);
    // MaxVio exists only with sparse layers and balancing; the rest are plotted even when
    // empty, so a missing metric is visible rather than a plot silently absent.
    if (!any && std::string(p.key) == "max_violation") continue;
    html << Plot(series, p.title, "learner step", p.y_label);
  }

  html << "<h2>Throughput</h2>\n";
  std::vector<PlotSeries> throughput;
  for (const RlRun& run : runs) {
    PlotSeries learner{run.label + ": learner", {}, {}}, actors{run.label + ": actors", {}, {}};
    for (size_t i = 0; i < run.ticks.size(); ++i) {
      const json& tick = run.ticks[i];
      const double t = run.tick_wall[i];
      learner.points.emplace_back(t, NumberField(tick, "learner_tokens_per_s"));
      actors.points.emplace_back(t, NumberField(tick, "actor_tokens_per_s"));
    }
    throughput.push_back(std::move(learner));
    throughput.push_back(std::move(actors));
  }
  html << Plot(throughput,
               "Tokens per second by role (learner: trained; actors: generated, summed)",
               "wall time (s)", "tokens/s");

  // Sync-mode actors record the time they spent waiting for the learner's next version.
  std::vector<PlotSeries> waits;
  bool any_wait = false;
  for (const RlRun& run : runs) {
    for (const ActorLog& actor : run.actors) {
      PlotSeries s{run.label + ": " + actor.name, {}, {}};
      for (const json& line : actor.lines) {
        const double wait = NumberField(line, "weights_wait_s");
        if (!std::isfinite(wait)) continue;
        s.points.emplace_back(NumberField(line, "elapsed_s"), wait);
        any_wait = true;
      }
      if (!s.points.empty()) waits.push_back(std::move(s));
    }
  }
  if (any_wait) {
    html << "<h2>Actors waiting for weights</h2>\n"
         << Plot(waits, "Actor time waiting for weights (cumulative)", "actor time (s)",
                 "seconds waited");
  }
  html << "</body>\n</html>\n";

  STRIDER_RETURN_IF_ERROR(report_html::WriteAtomically(out_path, html.str()));
  return out_path;
}

}  // namespace strider
