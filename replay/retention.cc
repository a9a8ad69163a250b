// The replay server's retention: segments leave the tables' samplers first, then the store,
// with their index entries and their trajectories' summaries (replay/storage.h).
#include <spdlog/spdlog.h>

#include <algorithm>

#include "replay/server_impl.h"

namespace strider::replay::internal {

void ServerImpl::ApplyRetention() {
  std::vector<std::pair<uint64_t, IndexRecord>> victims;
  {
    MutexLock lock(&state_mutex_);
    const uint64_t now_ms = NowUnixMs();
    for (auto& table : tables_) {
      for (uint64_t item : table->SelectForDeletion(now_ms)) {
        victims.push_back({item, IndexRecord()});
        // Out of the sampler now, so no draw can choose it while it is being deleted.
        table->Erase(item);
      }
    }
  }
  if (victims.empty()) return;
  Status status = DeleteItems(victims);
  if (!status.ok()) spdlog::error("replay server: retention failed: {}", status.ToString());
}

Status ServerImpl::DeleteItems(const std::vector<std::pair<uint64_t, IndexRecord>>& victims) {
  // Index records first: they name the trajectories whose summaries change.
  std::vector<std::pair<uint64_t, IndexRecord>> records;
  std::unordered_set<std::string> wanted;
  for (const auto& [sequence, unused] : victims) {
    STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> raw,
                             store_->Get(store_->sequence(), SequenceKey(sequence)));
    if (!raw) continue;
    STRIDER_ASSIGN_OR_RETURN(IndexRecord record, DecodeIndexRecord(*raw));
    wanted.insert(std::string(record.key.trajectory.View()));
    records.push_back({sequence, std::move(record)});
  }
  // Hold those trajectories like a writer does, so no insert batch rewrites their summaries
  // at the same time. Whoever holds them now is writing and never waits for retention.
  std::vector<std::string> trajectories(wanted.begin(), wanted.end());
  {
    MutexLock lock(&queue_mutex_);
    auto any_busy = [&] {
      queue_mutex_.AssertHeld();  // called below, under the lock
      for (const std::string& t : trajectories) {
        if (busy_trajectories_.count(t) > 0) return true;
      }
      return false;
    };
    while (any_busy()) queue_ready_.Wait(&queue_mutex_);
    for (const std::string& t : trajectories) busy_trajectories_.insert(t);
  }
  Status status = [&]() -> Status {
    store_mutex_.AssertReaderHeld();  // run here, in DeleteItems
    STRIDER_RETURN_IF_ERROR(store_->DeleteSegments(records));
    std::vector<uint64_t> sequences;
    {
      MutexLock lock(&commit_mutex_);
      for (const auto& [sequence, record] : records) {
        stored_keys_.erase(SegmentStoreKey(record.key));
        sequences.push_back(sequence);
      }
    }
    deleted_segments_ += records.size();
    // Sampling state of deleted segments is dead weight, never wrong: sequence numbers are not
    // reused, and recovery only looks it up for stored segments. A crash before this write
    // leaves it behind harmlessly.
    return store_->ForgetSampling(sequences);
  }();
  ReleaseTrajectories(trajectories);
  return status;
}

}  // namespace strider::replay::internal
