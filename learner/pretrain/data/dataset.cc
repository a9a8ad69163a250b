#include "learner/pretrain/data/dataset.h"

#include <algorithm>

#include "common/random.h"
#include "common/tokenizer.h"

namespace strider::data {

Result<std::unique_ptr<Packer>> Packer::Create(std::vector<DataSource> sources, int64_t length,
                                               uint64_t seed, int32_t pad) {
  if (sources.empty()) return Status::InvalidArgument("a data mixture needs at least one source");
  if (length < 2) return Status::InvalidArgument("sequence length must be at least 2");
  std::unique_ptr<Packer> packer(new Packer());
  packer->length_ = length;
  packer->seed_ = seed;
  packer->pad_ = pad;
  for (DataSource& data : sources) {
    if (!(data.weight > 0)) {
      return Status::InvalidArgument("data source " + data.name + ": weight must be positive");
    }
    Source source;
    source.first.push_back(0);
    for (const auto& shard : data.shards) {
      source.first.push_back(source.first.back() + shard->documents());
    }
    if (source.first.back() == 0) {
      return Status::InvalidArgument("data source " + data.name + " has no documents");
    }
    packer->total_weight_ += data.weight;
    source.data = std::move(data);
    packer->sources_.push_back(std::move(source));
  }
  packer->Reset();
  return packer;
}

void Packer::Shuffle(Source& source) {
  const int64_t n = source.first.back();
  source.order.resize(n);
  for (int64_t i = 0; i < n; ++i) source.order[i] = i;
  uint64_t state = seed_ ^ (0xA0761D6478BD642Full * (source.epoch + 1)) ^
                   (0xE7037ED1A0B428DBull * (&source - sources_.data() + 1));
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(source.order[i], source.order[SplitMix64Next(&state) % static_cast<uint64_t>(i + 1)]);
  }
  source.next = 0;
}

void Packer::Reset() {
  rng_ = seed_ * 0x2545F4914F6CDD1Dull + 1;
  position_ = 0;
  pending_ = false;
  drawn_.assign(sources_.size(), 0);
  for (Source& source : sources_) {
    source.epoch = 0;
    Shuffle(source);
  }
}

void Packer::Draw() {
  int32_t chosen = 0;
  if (sources_.size() > 1) {
    const double u = static_cast<double>(SplitMix64Next(&rng_) >> 11) * 0x1.0p-53 * total_weight_;
    double cumulative = 0;
    chosen = static_cast<int32_t>(sources_.size()) - 1;
    for (size_t i = 0; i < sources_.size(); ++i) {
      cumulative += sources_[i].data.weight;
      if (u < cumulative) {
        chosen = static_cast<int32_t>(i);
        break;
      }
    }
  }
  Source& source = sources_[chosen];
  if (source.next == static_cast<int64_t>(source.order.size())) {
    ++source.epoch;
    Shuffle(source);
  }
  const int64_t global = source.order[source.next++];
  const size_t shard =
      std::upper_bound(source.first.begin(), source.first.end(), global) - source.first.begin() - 1;
  pending_ = true;
  pending_source_ = chosen;
  pending_shard_ = source.data.shards[shard].get();
  pending_document_ = global - source.first[shard];
  pending_begin_ = 0;
  ++drawn_[chosen];
}

void Packer::Fill(int32_t* out) {
  int64_t filled = 0;
  while (filled < length_) {
    if (!pending_) Draw();
    const int64_t document_length = pending_shard_->DocumentLength(pending_document_);
    const int64_t remaining = document_length - pending_begin_;
    const int64_t space = length_ - filled;
    if (remaining <= space) {
      if (out != nullptr) {
        pending_shard_->CopyTokens(pending_document_, pending_begin_, document_length,
                                   out + filled);
      }
      filled += remaining;
      pending_ = false;
    } else if (pending_begin_ == 0 && document_length <= length_ && filled > 0) {
      break;  // fits whole in the next sequence: keep it for then
    } else {
      if (out != nullptr) {
        pending_shard_->CopyTokens(pending_document_, pending_begin_, pending_begin_ + space,
                                   out + filled);
      }
      pending_begin_ += space;
      filled = length_;
    }
  }
  if (out != nullptr) std::fill(out + filled, out + length_, pad_);
  filled_ = filled;
  ++position_;
}

std::vector<int32_t> Packer::Next() {
  std::vector<int32_t> tokens(length_);
  Fill(tokens.data());
  return tokens;
}

void Packer::SkipTo(int64_t position) {
  Reset();
  while (position_ < position) Fill(nullptr);
}

}  // namespace strider::data
