// Text from a stream of sampled ids: whole characters only, and markers found however the
// text was cut.
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/tokenizer.h"

namespace strider::tokenizer {

std::string StreamDecoder::Push(int32_t id) {
  pending_ += tokenizer_.DecodeBytes(std::span<const int32_t>(&id, 1));
  std::string text;
  // Decisions about a byte depend only on the bytes after it, so decoding in pieces gives the
  // same text as decoding everything at once.
  const size_t used = internal::AppendUtf8Replacing(pending_, /*final=*/false, text);
  pending_.erase(0, used);
  return text;
}

std::string StreamDecoder::Finish() {
  std::string text;
  internal::AppendUtf8Replacing(pending_, /*final=*/true, text);
  pending_.clear();
  return text;
}

MarkerMatcher::MarkerMatcher(std::vector<std::string> markers) : markers_(std::move(markers)) {
  for (const std::string& marker : markers_) {
    if (!marker.empty()) first_byte_[static_cast<unsigned char>(marker[0])] = true;
  }
}

namespace {

// Moves the decided part of `pending` to `out`. Unless `final`, stops where a marker may still
// complete (or a longer one may, where a shorter one already has).
void Scan(const std::vector<std::string>& markers, const bool (&first_byte)[256], bool final,
          std::string& pending, std::vector<MarkerMatcher::Piece>& out) {
  size_t emitted = 0;
  size_t i = 0;
  while (i < pending.size()) {
    if (!first_byte[static_cast<unsigned char>(pending[i])]) {
      ++i;
      continue;
    }
    const size_t available = pending.size() - i;
    int best = -1;
    size_t best_size = 0;
    bool undecided = false;
    for (size_t k = 0; k < markers.size(); ++k) {
      const std::string& marker = markers[k];
      if (marker.empty()) continue;
      if (available >= marker.size()) {
        if (marker.size() > best_size && pending.compare(i, marker.size(), marker) == 0) {
          best = static_cast<int>(k);
          best_size = marker.size();
        }
      } else if (!final && marker.compare(0, available, pending, i, available) == 0) {
        undecided = true;
      }
    }
    if (undecided) break;
    if (best < 0) {
      ++i;
      continue;
    }
    if (i > emitted) out.push_back({pending.substr(emitted, i - emitted), -1});
    out.push_back({markers[static_cast<size_t>(best)], best});
    i += best_size;
    emitted = i;
  }
  if (i > emitted) out.push_back({pending.substr(emitted, i - emitted), -1});
  pending.erase(0, i);
}

}  // namespace

std::vector<MarkerMatcher::Piece> MarkerMatcher::Feed(std::string_view text) {
  pending_ += text;
  std::vector<Piece> out;
  Scan(markers_, first_byte_, /*final=*/false, pending_, out);
  return out;
}

std::vector<MarkerMatcher::Piece> MarkerMatcher::Finish() {
  std::vector<Piece> out;
  Scan(markers_, first_byte_, /*final=*/true, pending_, out);
  pending_.clear();
  return out;
}

}  // namespace strider::tokenizer
