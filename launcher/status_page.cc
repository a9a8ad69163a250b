#include "launcher/status_page.h"

#include <algorithm>
#include <utility>

namespace strider::launcher {
namespace {

using nlohmann::json;

// A number, or null for anything else (a missing key, a null the learner wrote).
json NumberOr(const json& row, const char* key) {
  if (!row.is_object() || !row.contains(key) || !row[key].is_number()) return nullptr;
  return row[key];
}

// Indices of at most `max_points` of `size` items, evenly spaced, the last one always in: a
// day-long run polled every few seconds must not send every point of every tick.
std::vector<size_t> Spread(size_t size, size_t max_points) {
  std::vector<size_t> picked;
  if (size == 0 || max_points == 0) return picked;
  if (size <= max_points) {
    for (size_t i = 0; i < size; ++i) picked.push_back(i);
    return picked;
  }
  for (size_t k = 0; k < max_points; ++k) picked.push_back(k * (size - 1) / (max_points - 1));
  return picked;
}

// Minimal HTML, CSS and script; the page must work from a loopback port with nothing else
// reachable, so nothing is loaded from elsewhere. Colours are Okabe-Ito, as in report.html.
constexpr const char* kPageHead = R"HTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>strider fleet</title>
<style>
body{font-family:system-ui,sans-serif;margin:16px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:18px 0 6px}h3{font-size:14px;margin:0 0 4px}
.muted{color:#666;font-size:12px}
.tiles{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0}
.tile{border:1px solid #ddd;border-radius:4px;padding:6px 10px;min-width:90px}
.tile b{display:block;font-size:18px}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #eee;padding:3px 8px;text-align:left}
.up{color:#009E73;font-weight:bold}.down{color:#D55E00;font-weight:bold}.idle{color:#666}
.grid{display:flex;flex-wrap:wrap;gap:12px}
.card{border:1px solid #ddd;border-radius:4px;padding:8px}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:14px;height:4px;margin-right:4px;vertical-align:middle}
svg text{font-size:10px;fill:#444}
</style></head><body>
<h1>strider fleet</h1>
<div class="muted" id="state">loading</div>
<div id="app"></div>
<script>
)HTML";

constexpr const char* kPageScript = R"JS(
const COLORS = ['#0072B2', '#D55E00', '#009E73', '#CC79A7', '#E69F00', '#56B4E9'];
function esc(s) {
  return String(s).replace(/[&<>"]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c]));
}
function num(v, digits) {
  return typeof v === 'number' && isFinite(v) ? v.toFixed(digits) : '-';
}
function seconds(v) {
  if (typeof v !== 'number') return '-';
  if (v < 120) return v.toFixed(0) + ' s';
  if (v < 7200) return (v / 60).toFixed(1) + ' min';
  return (v / 3600).toFixed(1) + ' h';
}
// A line plot as SVG: series [{name, xs, ys}]; non-numbers are skipped. data-points counts the
// points drawn, so a reader of the DOM can tell an empty plot from a drawn one.
function plot(title, xlabel, series, fixed) {
  const W = 520, H = 200, L = 48, R = 12, T = 10, B = 28;
  const lines = series.map(s => {
    const pts = [];
    for (let i = 0; i < Math.min(s.xs.length, s.ys.length); ++i) {
      if (typeof s.xs[i] === 'number' && typeof s.ys[i] === 'number' && isFinite(s.ys[i])) {
        pts.push([s.xs[i], s.ys[i]]);
      }
    }
    return pts;
  });
  const all = lines.flat();
  let x0 = Math.min(...all.map(p => p[0])), x1 = Math.max(...all.map(p => p[0]));
  let y0 = Math.min(...all.map(p => p[1])), y1 = Math.max(...all.map(p => p[1]));
  if (fixed) { y0 = Math.min(y0, fixed[0]); y1 = Math.max(y1, fixed[1]); }
  if (!all.length) { x0 = 0; x1 = 1; y0 = fixed ? fixed[0] : 0; y1 = fixed ? fixed[1] : 1; }
  if (x1 === x0) { x1 = x0 + 1; }
  if (y1 === y0) { y1 = y0 + (y0 === 0 ? 1 : Math.abs(y0) * 0.1); }
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  let svg = `<svg class="plot" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" data-points="${all.length}">`;
  svg += `<line x1="${L}" y1="${T}" x2="${L}" y2="${H - B}" stroke="#999"></line>`;
  svg += `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" stroke="#999"></line>`;
  const label = v => Math.abs(v) >= 1000 ? v.toFixed(0) : Number(v.toPrecision(3)).toString();
  svg += `<text x="${L - 4}" y="${T + 8}" text-anchor="end">${label(y1)}</text>`;
  svg += `<text x="${L - 4}" y="${H - B}" text-anchor="end">${label(y0)}</text>`;
  svg += `<text x="${L}" y="${H - B + 12}">${label(x0)}</text>`;
  svg += `<text x="${W - R}" y="${H - B + 12}" text-anchor="end">${label(x1)}</text>`;
  svg += `<text x="${(L + W - R) / 2}" y="${H - 4}" text-anchor="middle">${esc(xlabel)}</text>`;
  if (!all.length) {
    svg += `<text x="${(L + W - R) / 2}" y="${(T + H - B) / 2}" text-anchor="middle">no data yet</text>`;
  }
  lines.forEach((pts, i) => {
    if (!pts.length) return;
    const color = COLORS[i % COLORS.length];
    const text = pts.map(p => sx(p[0]).toFixed(1) + ',' + sy(p[1]).toFixed(1)).join(' ');
    svg += `<polyline fill="none" stroke="${color}" stroke-width="2" points="${text}"></polyline>`;
    if (pts.length <= 60) {
      for (const p of pts) {
        svg += `<circle cx="${sx(p[0]).toFixed(1)}" cy="${sy(p[1]).toFixed(1)}" r="2.5" fill="${color}"></circle>`;
      }
    }
  });
  svg += '</svg>';
  const legend = series.map((s, i) =>
    `<span><i style="background:${COLORS[i % COLORS.length]}"></i>${esc(s.name)}</span>`).join('');
  return `<div class="card"><h3>${esc(title)}</h3>${svg}<div class="legend">${legend}</div></div>`;
}
// Tokens routed to each expert of each sparse layer, one row a layer, each row shaded against
// its busiest expert; max/mean is the layer's imbalance (1 is perfect balance).
function heatmap(load) {
  if (!load || !load.layers || !load.layers.length) {
    return '<div class="card"><h3>Expert load</h3><p class="muted">no routing recorded yet ' +
           '(a model without sparse layers, or the learner config\'s balance off)</p></div>';
  }
  const experts = Math.max(...load.layers.map(r => r.length));
  const cell = Math.max(4, Math.min(22, Math.floor(480 / experts)));
  const L = 64, R = 110, T = 4;
  const W = L + experts * cell + R, H = T + load.layers.length * cell + 4;
  let cells = 0;
  let svg = `<svg class="heatmap" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" data-layers="${load.layers.length}">`;
  load.layers.forEach((row, layer) => {
    const max = Math.max(1, ...row);
    const mean = row.reduce((a, b) => a + b, 0) / Math.max(1, row.length);
    const y = T + layer * cell;
    svg += `<text x="${L - 4}" y="${y + cell * 0.75}" text-anchor="end">sparse ${layer}</text>`;
    row.forEach((count, e) => {
      const t = count / max;
      const rgb = [244 + (0 - 244) * t, 244 + (114 - 244) * t, 244 + (178 - 244) * t].map(Math.round);
      svg += `<rect class="cell" x="${L + e * cell}" y="${y}" width="${cell - 1}" height="${cell - 1}" ` +
             `fill="rgb(${rgb.join(',')})"><title>layer ${layer} expert ${e}: ${count} tokens</title></rect>`;
      ++cells;
    });
    svg += `<text x="${L + experts * cell + 6}" y="${y + cell * 0.75}">max/mean ${num(mean > 0 ? max / mean : null, 2)}</text>`;
  });
  svg = svg.replace('<svg class="heatmap"', `<svg class="heatmap" data-cells="${cells}"`) + '</svg>';
  return `<div class="card"><h3>Expert load (learner step ${esc(load.step)})</h3>${svg}` +
         '<div class="muted">tokens per routed expert in the step\'s first epoch; darker = more</div></div>';
}
function figures(child) {
  const m = child.status && child.status.metrics;
  if (!m) return '';
  if (child.role === 'learner') return `step ${num(m.step, 0)}, ${num(m.tokens_per_second, 0)} tok/s`;
  if (child.role === 'actor') {
    return `${num(m.generated_tokens_per_s, 0)} generated tok/s, ${num(m.episodes, 0)} episodes, v${num(m.policy_version, 0)}`;
  }
  if (child.role === 'replay') {
    const tables = (m.tables || []).map(t => `${esc(t.name)} ${num(100 * t.fill, 2)}% full`).join(', ');
    return `${num(m.ingest && m.ingest.segments_per_s, 1)} segments/s in; ${tables}`;
  }
  return '';
}
function render(d) {
  const m = d.latest || {};
  const c = d.curves || {};
  const learner = c.learner || {step: []};
  const ticks = c.ticks || {elapsed_s: [], replay_fill: {}};
  const ev = c.eval || {learner_step: [], success_rate: []};
  let restarts = 0;
  for (const child of d.children || []) restarts += child.restarts || 0;
  const tile = (name, value) => `<div class="tile">${esc(name)}<b>${value}</b></div>`;
  let html = '<div class="tiles">' + tile('learner step', num(m.learner_step, 0)) +
    tile('policy version', num(m.policy_version, 0)) + tile('reward', num(m.reward_mean, 3)) +
    tile('success (train)', num(m.success_rate, 2)) + tile('success (eval)', num(m.eval_success_rate, 2)) +
    tile('samples', num(m.samples, 0)) + tile('staleness', num(m.staleness_mean, 2)) +
    tile('restarts', restarts) + '</div>';
  html += '<h2>Fleet health</h2><table><tr><th>child</th><th>state</th><th>pid</th><th>restarts</th>' +
          '<th>uptime</th><th>pages</th><th>now</th></tr>';
  for (const child of d.children || []) {
    const state = child.up ? '<span class="up">up</span>' :
      child.running ? '<span class="idle">starting</span>' :
      child.role === 'eval' ? '<span class="idle">idle</span>' : '<span class="down">down</span>';
    const page = child.http ? `<a href="http://${esc(child.http)}/status">${esc(child.http)}</a>` : '';
    const error = child.scrape_error ? ` <span class="down" title="${esc(child.scrape_error)}">(no answer)</span>` : '';
    html += `<tr><td>${esc(child.name)}</td><td>${state}</td><td>${child.pid > 0 ? child.pid : ''}</td>` +
            `<td>${child.restarts}</td><td>${seconds(child.uptime_s)}</td><td>${page}</td>` +
            `<td>${figures(child)}${error}</td></tr>`;
  }
  html += '</table>';
  html += '<h2>Learning</h2><div class="grid">';
  html += plot('Reward and success', 'learner step', [
    {name: 'reward mean', xs: learner.step, ys: learner.reward_mean || []},
    {name: 'success rate (train)', xs: learner.step, ys: learner.success_rate || []},
    {name: 'success rate (eval)', xs: ev.learner_step, ys: ev.success_rate || []}]);
  html += plot('Staleness', 'learner step', [
    {name: 'staleness mean (versions)', xs: learner.step, ys: learner.staleness_mean || []}]);
  html += '</div><h2>Throughput and replay</h2><div class="grid">';
  html += plot('Throughput (tokens/s)', 'seconds since launch', [
    {name: 'learner', xs: ticks.elapsed_s, ys: ticks.learner_tokens_per_s || []},
    {name: 'actors (generated)', xs: ticks.elapsed_s, ys: ticks.actor_tokens_per_s || []}]);
  const fill = Object.keys(ticks.replay_fill || {}).map(name =>
    ({name: name, xs: ticks.elapsed_s, ys: ticks.replay_fill[name]}));
  html += plot('Replay fill per table', 'seconds since launch', fill, [0, 0]);
  html += '</div><h2>Experts</h2>' + heatmap(c.expert_load);
  document.getElementById('app').innerHTML = html;
  document.getElementById('state').textContent =
    `${d.run_dir || ''} | ${d.phase || ''} | ${seconds(d.elapsed_s)} since launch`;
}
async function poll() {
  try {
    const answer = await fetch('fleet.json', {cache: 'no-store'});
    if (answer.ok) render(await answer.json());
  } catch (e) {
    document.getElementById('state').textContent = 'the launcher does not answer (' + e + ')';
  }
}
render(INITIAL);
setInterval(poll, POLL_MS);
</script></body></html>
)JS";

}  // namespace

void FleetCurves::AddLearnerRow(const json& row) {
  if (!row.is_object() || !row.contains("step") || !row["step"].is_number_integer()) return;
  json point = json::object();
  for (const char* key : kLearnerKeys) point[key] = NumberOr(row, key);
  learner_[row["step"].get<int64_t>()] = std::move(point);
  if (row.contains("expert_load") && row["expert_load"].is_array()) {
    expert_load_ = {{"step", row["step"]}, {"layers", row["expert_load"]}};
  }
}

void FleetCurves::AddTick(const json& line) {
  json point = {{"elapsed_s", NumberOr(line, "elapsed_s")},
                {"learner_tokens_per_s", NumberOr(line, "learner_tokens_per_s")},
                {"actor_tokens_per_s", NumberOr(line, "actor_tokens_per_s")},
                {"replay_fill", line.contains("replay_fill") && line["replay_fill"].is_object()
                                    ? line["replay_fill"]
                                    : json::object()}};
  if (point["elapsed_s"].is_null()) return;
  ticks_.push_back(std::move(point));
}

void FleetCurves::AddEvalRow(const json& row) {
  if (!row.is_object() || !row.contains("success_rate")) return;
  json point = {{"learner_step", NumberOr(row, "learner_step")}};
  for (const char* key : kEvalKeys) point[key] = NumberOr(row, key);
  evals_.push_back(std::move(point));
}

json FleetCurves::ToJson(size_t max_points) const {
  json learner = {{"step", json::array()}};
  for (const char* key : kLearnerKeys) learner[key] = json::array();
  std::vector<std::pair<int64_t, const json*>> steps;
  for (const auto& [step, point] : learner_) steps.emplace_back(step, &point);
  for (size_t i : Spread(steps.size(), max_points)) {
    learner["step"].push_back(steps[i].first);
    for (const char* key : kLearnerKeys) learner[key].push_back((*steps[i].second)[key]);
  }

  // Tables seen in any tick; a tick before a table's first fill is null there.
  std::vector<std::string> tables;
  for (const json& tick : ticks_) {
    for (const auto& [name, value] : tick["replay_fill"].items()) {
      if (std::find(tables.begin(), tables.end(), name) == tables.end()) tables.push_back(name);
    }
  }
  json ticks = {{"elapsed_s", json::array()},
                {"learner_tokens_per_s", json::array()},
                {"actor_tokens_per_s", json::array()},
                {"replay_fill", json::object()}};
  for (const std::string& name : tables) ticks["replay_fill"][name] = json::array();
  for (size_t i : Spread(ticks_.size(), max_points)) {
    const json& tick = ticks_[i];
    for (const char* key : {"elapsed_s", "learner_tokens_per_s", "actor_tokens_per_s"}) {
      ticks[key].push_back(tick[key]);
    }
    for (const std::string& name : tables) {
      ticks["replay_fill"][name].push_back(NumberOr(tick["replay_fill"], name.c_str()));
    }
  }

  json evals = {{"learner_step", json::array()}};
  for (const char* key : kEvalKeys) evals[key] = json::array();
  for (size_t i : Spread(evals_.size(), max_points)) {
    evals["learner_step"].push_back(evals_[i]["learner_step"]);
    for (const char* key : kEvalKeys) evals[key].push_back(evals_[i][key]);
  }
  return {{"learner", std::move(learner)},
          {"ticks", std::move(ticks)},
          {"eval", std::move(evals)},
          {"expert_load", expert_load_}};
}

void StatusBoard::Publish(std::string fleet_json, std::string metrics_text) {
  MutexLock lock(&mutex_);
  fleet_json_ = std::move(fleet_json);
  metrics_text_ = std::move(metrics_text);
}

http::Pages StatusBoard::Pages(std::shared_ptr<StatusBoard> board, int poll_ms) {
  http::Pages pages;
  pages["/"] = [board, poll_ms] {
    std::string fleet;
    {
      MutexLock lock(&board->mutex_);
      fleet = board->fleet_json_;
    }
    return http::Page{200, "text/html; charset=utf-8", StatusPageHtml(fleet, poll_ms)};
  };
  pages["/fleet.json"] = [board] {
    MutexLock lock(&board->mutex_);
    return http::Page{200, http::kJsonContentType, board->fleet_json_};
  };
  pages["/metrics"] = [board] {
    MutexLock lock(&board->mutex_);
    return http::Page{200, http::kPrometheusContentType, board->metrics_text_};
  };
  return pages;
}

std::string StatusPageHtml(const std::string& fleet_json, int poll_ms) {
  // Inside <script>, a "</" in a string (a path, a log message) would end the element early.
  std::string inline_json;
  inline_json.reserve(fleet_json.size());
  for (size_t i = 0; i < fleet_json.size(); ++i) {
    if (fleet_json[i] == '<' && i + 1 < fleet_json.size() && fleet_json[i + 1] == '/') {
      inline_json += "<\\/";
      ++i;
    } else {
      inline_json += fleet_json[i];
    }
  }
  return std::string(kPageHead) + "const INITIAL = " + inline_json +
         ";\nconst POLL_MS = " + std::to_string(poll_ms) + ";\n" + kPageScript;
}

}  // namespace strider::launcher
