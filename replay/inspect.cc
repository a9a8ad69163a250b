#include "replay/inspect.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>

#include "common/tokenizer.h"
#include "replay/storage.h"

namespace strider::replay {
namespace {

std::string Base64(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t chunk = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) chunk |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) chunk |= static_cast<uint8_t>(bytes[i + 2]);
    out.push_back(kAlphabet[(chunk >> 18) & 63]);
    out.push_back(kAlphabet[(chunk >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? kAlphabet[(chunk >> 6) & 63] : '=');
    out.push_back(i + 2 < bytes.size() ? kAlphabet[chunk & 63] : '=');
  }
  return out;
}

// A stored segment value: 8-byte sequence, then the envelope.
Result<StoredSegment> DecodeStored(std::string_view value) {
  if (value.size() < 8) return Status::Corruption("segment value shorter than its sequence");
  StoredSegment stored;
  stored.sequence = DecodeU64(value.substr(0, 8));
  STRIDER_ASSIGN_OR_RETURN(schema::Message message, schema::Decode(value.substr(8)));
  if (message.kind != schema::MessageKind::kSegment) {
    return Status::Corruption("stored value holds a " +
                              std::string(schema::MessageKindName(message.kind)));
  }
  stored.table = message.segment.table;
  stored.segment = std::move(message.segment);
  return stored;
}

std::string_view View(const rocksdb::Slice& slice) { return {slice.data(), slice.size()}; }

}  // namespace

Inspector::Inspector(std::unique_ptr<Store> store) : store_(std::move(store)) {}
Inspector::~Inspector() = default;

Result<std::unique_ptr<Inspector>> Inspector::Open(const std::string& path) {
  StoreOptions options;
  options.read_only = true;
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(path, options));
  return std::unique_ptr<Inspector>(new Inspector(std::move(store)));
}

Result<std::string> Inspector::StatsJson() {
  nlohmann::json j;
  STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> version,
                           store_->Get(store_->meta(), meta::kSchema));
  j["path"] = store_->path();
  j["schema_version"] = version.value_or("");
  STRIDER_ASSIGN_OR_RETURN(uint64_t next_sequence, store_->NextSequence());
  j["next_sequence"] = next_sequence;
  STRIDER_ASSIGN_OR_RETURN(LossReport loss, store_->CheckLoss());
  STRIDER_ASSIGN_OR_RETURN(uint64_t accepted_loss, store_->GetCounter(meta::kAcceptedLoss));
  j["lost_acknowledged_segments"] = loss.lost;        // detected now (verify fails)
  j["accepted_lost_segments"] = accepted_loss;         // accepted at a start (--accept-loss)
  uint64_t segments = 0;
  uint64_t oldest_ms = 0;
  uint64_t newest_ms = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> per_table;  // segments, bytes
  std::map<std::string, uint64_t> tokens_per_table;
  auto it = store_->Scan(store_->sequence());
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    Result<IndexRecord> record = DecodeIndexRecord(View(it->value()));
    if (!record.ok()) continue;
    ++segments;
    per_table[record->table].first += 1;
    per_table[record->table].second += record->bytes;
    tokens_per_table[record->table] += record->tokens;
    if (oldest_ms == 0 || record->insert_unix_ms < oldest_ms) oldest_ms = record->insert_unix_ms;
    newest_ms = std::max(newest_ms, record->insert_unix_ms);
  }
  uint64_t trajectories = 0;
  uint64_t complete = 0;
  uint64_t abandoned = 0;
  std::map<std::string, uint64_t> envs;
  auto t = store_->Scan(store_->trajectories());
  for (t->SeekToFirst(); t->Valid(); t->Next()) {
    Result<schema::TrajectorySummary> summary = schema::DecodeTrajectorySummary(View(t->value()));
    if (!summary.ok()) continue;
    ++trajectories;
    complete += summary->complete ? 1 : 0;
    abandoned += summary->abandoned ? 1 : 0;
    envs[summary->env] += 1;
  }
  j["segments"] = segments;
  j["trajectories"] = trajectories;
  j["complete_trajectories"] = complete;
  j["abandoned_trajectories"] = abandoned;  // closed by the server after their actor went silent
  j["oldest_insert_unix_ms"] = oldest_ms;
  j["newest_insert_unix_ms"] = newest_ms;
  j["trajectories_by_env"] = envs;
  nlohmann::json tables = nlohmann::json::array();
  std::set<std::string> names;
  for (const auto& [name, unused] : per_table) names.insert(name);
  auto m = store_->Scan(store_->meta());
  for (m->Seek("table/"); m->Valid() && m->key().starts_with("table/"); m->Next()) {
    std::string key(View(m->key()));
    const size_t slash = key.rfind('/');
    if (key.substr(slash) == "/definition") names.insert(key.substr(6, slash - 6));
  }
  for (const std::string& name : names) {
    nlohmann::json table;
    table["name"] = name;
    table["segments"] = per_table[name].first;
    table["bytes"] = per_table[name].second;
    table["tokens"] = tokens_per_table[name];
    STRIDER_ASSIGN_OR_RETURN(table["inserts"], store_->TableInserts(name));
    STRIDER_ASSIGN_OR_RETURN(table["samples"],
                             store_->GetSamplingCounter(meta::TableSamples(name)));
    STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> definition,
                             store_->Get(store_->meta(), meta::TableDefinition(name)));
    if (definition) {
      table["definition"] = nlohmann::json::parse(*definition, nullptr, false);
    }
    tables.push_back(table);
  }
  j["tables"] = tables;
  return j.dump();
}

Result<std::vector<schema::TrajectorySummary>> Inspector::List(const ListFilter& filter) {
  std::vector<schema::TrajectorySummary> out;
  auto it = store_->Scan(store_->trajectories());
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    STRIDER_ASSIGN_OR_RETURN(schema::TrajectorySummary s,
                             schema::DecodeTrajectorySummary(View(it->value())));
    if (!filter.env.empty() && s.env != filter.env) continue;
    if (filter.policy_version && (*filter.policy_version < s.min_policy_version ||
                                  *filter.policy_version > s.max_policy_version)) {
      continue;
    }
    if (filter.min_reward && !(s.complete && s.outcome_reward >= *filter.min_reward)) continue;
    if (filter.max_reward && !(s.complete && s.outcome_reward <= *filter.max_reward)) continue;
    if (!filter.trajectory_id.empty() && s.trajectory_id.Hex().rfind(filter.trajectory_id, 0) != 0) {
      continue;
    }
    out.push_back(std::move(s));
  }
  return out;
}

Result<std::vector<StoredSegment>> Inspector::Trajectory(const schema::TrajectoryId& id) {
  std::vector<StoredSegment> out;
  auto it = store_->Scan(store_->segments());
  const std::string prefix(id.View());
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    STRIDER_ASSIGN_OR_RETURN(StoredSegment stored, DecodeStored(View(it->value())));
    out.push_back(std::move(stored));
  }
  if (out.empty()) return Status::NotFound("no stored segments of trajectory " + id.Hex());
  return out;
}

Result<StoredSegment> Inspector::Segment(const schema::SegmentKey& key) {
  STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> value,
                           store_->Get(store_->segments(), SegmentStoreKey(key)));
  if (!value) return Status::NotFound("no stored segment " + key.ToString());
  return DecodeStored(*value);
}

Result<uint64_t> Inspector::ExportJsonl(std::ostream& out) {
  uint64_t written = 0;
  auto it = store_->Scan(store_->sequence());
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    STRIDER_ASSIGN_OR_RETURN(IndexRecord record, DecodeIndexRecord(View(it->value())));
    STRIDER_ASSIGN_OR_RETURN(StoredSegment stored, Segment(record.key));
    out << StoredSegmentJson(stored) << '\n';
    ++written;
  }
  if (!out) return Status::IoError("writing the export failed");
  return written;
}

Result<VerifyReport> Inspector::Verify() {
  VerifyReport report;
  auto problem = [&](std::string text) {
    if (report.problems.size() < 100) report.problems.push_back(std::move(text));
  };
  // sequence -> segment store key, from the index.
  std::map<uint64_t, std::string> index;
  uint64_t max_sequence = 0;
  auto seq = store_->Scan(store_->sequence());
  for (seq->SeekToFirst(); seq->Valid(); seq->Next()) {
    ++report.index_entries;
    if (seq->key().size() != 8) {
      problem("index entry with a key of " + std::to_string(seq->key().size()) + " bytes");
      continue;
    }
    const uint64_t sequence = ParseSequenceKey(View(seq->key()));
    max_sequence = std::max(max_sequence, sequence);
    Result<IndexRecord> record = DecodeIndexRecord(View(seq->value()));
    if (!record.ok()) {
      problem("index entry " + std::to_string(sequence) + ": " + record.status().message());
      continue;
    }
    index[sequence] = SegmentStoreKey(record->key);
  }
  // Acknowledged segments the log lost (see Store::CheckLoss).
  STRIDER_ASSIGN_OR_RETURN(LossReport loss, store_->CheckLoss());
  if (loss.lost > 0) {
    problem(std::to_string(loss.lost) + " acknowledged segments are missing (" + loss.detail +
            "): the write-ahead log was damaged, truncated or removed");
  }
  std::map<std::string, uint32_t> segments_per_trajectory;
  std::set<uint64_t> pointed_back;
  auto it = store_->Scan(store_->segments());
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    ++report.segments;
    const std::string key(View(it->key()));
    Result<schema::SegmentKey> parsed = ParseSegmentStoreKey(key);
    if (!parsed.ok()) {
      problem("segment with a malformed key: " + parsed.status().message());
      continue;
    }
    const std::string name = "segment " + parsed->ToString();
    Result<StoredSegment> stored = DecodeStored(View(it->value()));
    if (!stored.ok()) {
      problem(name + ": " + stored.status().message());
      continue;
    }
    if (stored->segment.key() != *parsed) {
      problem(name + ": holds segment " + stored->segment.key().ToString());
    }
    auto entry = index.find(stored->sequence);
    if (entry == index.end()) {
      problem(name + ": its index entry " + std::to_string(stored->sequence) + " is missing");
    } else if (entry->second != key) {
      problem(name + ": index entry " + std::to_string(stored->sequence) +
              " points to another segment");
    } else {
      pointed_back.insert(stored->sequence);
    }
    segments_per_trajectory[key.substr(0, 16)] += 1;
  }
  for (const auto& [sequence, key] : index) {
    if (!pointed_back.count(sequence)) {
      Result<schema::SegmentKey> parsed = ParseSegmentStoreKey(key);
      problem("index entry " + std::to_string(sequence) + " points to segment " +
              (parsed.ok() ? parsed->ToString() : "?") + ", which does not point back to it");
    }
  }
  auto t = store_->Scan(store_->trajectories());
  std::set<std::string> summarised;
  for (t->SeekToFirst(); t->Valid(); t->Next()) {
    ++report.trajectories;
    const std::string id(View(t->key()));
    Result<schema::TrajectorySummary> summary = schema::DecodeTrajectorySummary(View(t->value()));
    if (!summary.ok()) {
      problem("trajectory summary: " + summary.status().message());
      continue;
    }
    summarised.insert(id);
    const uint32_t actual = segments_per_trajectory.count(id) ? segments_per_trajectory[id] : 0;
    if (summary->segments_stored != actual) {
      problem("trajectory " + summary->trajectory_id.Hex() + ": summary counts " +
              std::to_string(summary->segments_stored) + " segments, " + std::to_string(actual) +
              " are stored");
    }
  }
  for (const auto& [id, count] : segments_per_trajectory) {
    if (!summarised.count(id)) {
      schema::TrajectoryId trajectory;
      std::memcpy(trajectory.bytes.data(), id.data(), 16);
      problem("trajectory " + trajectory.Hex() + " has " + std::to_string(count) +
              " segments but no summary");
    }
  }
  STRIDER_ASSIGN_OR_RETURN(uint64_t next_sequence, store_->NextSequence());
  if (!index.empty() && next_sequence <= max_sequence) {
    problem("next_sequence " + std::to_string(next_sequence) + " is not past the largest entry " +
            std::to_string(max_sequence));
  }
  return report;
}

std::string RenderSegmentText(const schema::SegmentData& s) {
  std::string out;
  size_t begin = 0;
  while (begin < s.tokens.size()) {
    size_t end = begin;
    while (end < s.tokens.size() && s.roles[end] == s.roles[begin]) ++end;
    out += "[" + std::string(schema::RoleName(s.roles[begin])) + "] ";
    out += Tokenizer::Decode(std::span<const int32_t>(s.tokens.data() + begin, end - begin));
    out += "\n";
    begin = end;
  }
  return out;
}

std::string RenderSegmentFields(const schema::SegmentData& s) {
  if (s.schema_minor < 2) return "";
  char line[256];
  std::string out;
  if (s.group_size > 0) {
    std::snprintf(line, sizeof(line), "   group %s member %u of %u", s.group_id.Hex().c_str(),
                  s.group_index, s.group_size);
    out += line;
  } else {
    out += "   no group";
  }
  std::snprintf(line, sizeof(line), ", sampling temperature %g top-p %g top-k %u",
                static_cast<double>(s.temperature), static_cast<double>(s.top_p), s.top_k);
  out += line;
  if (s.is_last) out += ", ended " + std::string(schema::EndReasonName(s.end_reason));
  out += ", routing of " + std::string(schema::RoutingCoverageName(s.routing.coverage)) +
         " positions\n";
  for (const schema::Step& step : s.steps) {
    std::snprintf(line, sizeof(line), "   step %u [%llu, %llu) %s", step.index,
                  static_cast<unsigned long long>(step.begin),
                  static_cast<unsigned long long>(s.token_begin + step.end),
                  std::string(schema::StepLabelName(step.label)).c_str());
    out += line;
    if (step.has_reward) {
      std::snprintf(line, sizeof(line), " reward %.4f\n", static_cast<double>(step.process_reward));
      out += line;
    } else {
      out += " no reward\n";
    }
  }
  return out;
}

std::string StoredSegmentJson(const StoredSegment& stored) {
  const schema::SegmentData& s = stored.segment;
  nlohmann::json j;
  j["trajectory_id"] = s.trajectory_id.Hex();
  j["segment_index"] = s.segment_index;
  j["sequence"] = stored.sequence;
  j["table"] = s.table;
  j["env"] = s.env;
  j["is_last"] = s.is_last;
  j["token_begin"] = s.token_begin;
  j["tokens"] = s.tokens;
  std::vector<std::string> roles;
  roles.reserve(s.roles.size());
  for (schema::Role role : s.roles) roles.emplace_back(schema::RoleName(role));
  j["roles"] = roles;
  // Role runs with their decoded text, the readable view of the same tokens.
  nlohmann::json turns = nlohmann::json::array();
  for (size_t begin = 0; begin < s.tokens.size();) {
    size_t end = begin;
    while (end < s.tokens.size() && s.roles[end] == s.roles[begin]) ++end;
    turns.push_back({{"role", schema::RoleName(s.roles[begin])},
                     {"begin", begin},
                     {"text", Tokenizer::Decode(std::span<const int32_t>(s.tokens.data() + begin,
                                                                          end - begin))}});
    begin = end;
  }
  j["turns"] = turns;
  j["behaviour_logprobs"] = s.behaviour_logprobs;
  nlohmann::json runs = nlohmann::json::array();
  for (const schema::PolicyRun& run : s.policy_runs) {
    runs.push_back({{"begin", run.begin}, {"version", run.version}});
  }
  j["policy_runs"] = runs;
  j["routing"] = {{"layers", s.routing.layers},
                  {"top_k", s.routing.top_k},
                  {"experts", s.routing.experts},
                  {"coverage", schema::RoutingCoverageName(s.routing.coverage)},
                  {"context_experts", s.routing.context_experts}};
  if (s.routing.coverage == schema::RoutingCoverage::kMasked) {
    std::vector<bool> has_record;
    (void)schema::ExpertsByPosition(s, &has_record);
    std::string mask(has_record.size(), '0');
    for (size_t i = 0; i < has_record.size(); ++i) mask[i] = has_record[i] ? '1' : '0';
    j["routing"]["mask"] = mask;
  }
  nlohmann::json steps = nlohmann::json::array();
  for (const schema::Step& step : s.steps) {
    nlohmann::json out = {{"end", step.end}, {"process_reward", step.process_reward}};
    if (s.schema_minor >= 2) {
      out["index"] = step.index;
      out["begin"] = step.begin;
      out["label"] = schema::StepLabelName(step.label);
      out["has_reward"] = step.has_reward;
    }
    steps.push_back(std::move(out));
  }
  j["steps"] = steps;
  j["outcome_reward"] = s.outcome_reward;
  nlohmann::json images = nlohmann::json::array();
  for (const schema::Image& image : s.images) {
    images.push_back({{"token_offset", image.token_offset},
                      {"width", image.width},
                      {"height", image.height},
                      {"channels", image.channels},
                      {"pixels_base64", Base64(image.pixels)}});
  }
  j["images"] = images;
  nlohmann::json metadata = nlohmann::json::object();
  for (const auto& [key, value] : s.metadata) metadata[key] = value;
  j["metadata"] = metadata;
  j["state_digest_base64"] = Base64(s.state_digest);
  j["schema"] = "1." + std::to_string(s.schema_minor);
  // Fields since 1.2; a 1.1 segment has none of them to show.
  if (s.schema_minor >= 2) {
    j["end_reason"] = schema::EndReasonName(s.end_reason);
    j["group"] = {{"id", s.group_size > 0 ? s.group_id.Hex() : ""},
                  {"index", s.group_index},
                  {"size", s.group_size}};
    j["sampling"] = {{"temperature", s.temperature}, {"top_p", s.top_p}, {"top_k", s.top_k}};
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string TrajectorySummaryJson(const schema::TrajectorySummary& s) {
  nlohmann::json j = {{"trajectory_id", s.trajectory_id.Hex()},
                      {"env", s.env},
                      {"table", s.table},
                      {"status", s.abandoned ? "abandoned" : s.complete ? "complete" : "open"},
                      {"end_reason", schema::EndReasonName(s.end_reason)},
                      {"conflicts", s.conflicts},
                      {"segments", s.segments_stored},
                      {"tokens", s.tokens},
                      {"steps", s.steps},
                      {"outcome_reward", s.outcome_reward},
                      {"process_reward_sum", s.process_reward_sum},
                      {"min_policy_version", s.min_policy_version},
                      {"max_policy_version", s.max_policy_version},
                      {"first_insert_unix_ms", s.first_insert_unix_ms}};
  return j.dump();
}

}  // namespace strider::replay
