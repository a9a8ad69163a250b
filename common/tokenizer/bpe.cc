// Byte-level BPE: added tokens, normalisation, split patterns, then merges per pre-token word,
// in the order and with the tie-breaking of Hugging Face tokenizers and tiktoken.
#include "common/tokenizer/bpe.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <unordered_map>

#include "common/mutex.h"
#include "common/tokenizer/regex.h"

namespace strider::tokenizer::internal {
namespace {

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();
// Words up to this many symbols merge by scanning for the lowest rank (as tiktoken does);
// longer ones through a heap, so a 10,000-byte run costs n log n rather than n^2.
constexpr size_t kLinearMergeLimit = 64;

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// (left id, right id) -> (rank, merged id), open addressing: the merge loop's one lookup.
class PairMap {
 public:
  void Build(const std::vector<BpeSpec::Merge>& merges) {
    size_t capacity = 16;
    while (capacity < merges.size() * 2) capacity <<= 1;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    // A pair listed twice keeps its last rank, as tokenizers' merge map does.
    for (const BpeSpec::Merge& m : merges) {
      Slot& slot = Probe(Key(m.left, m.right));
      slot = Slot{Key(m.left, m.right), m.rank, m.merged};
    }
  }

  uint32_t Find(int32_t left, int32_t right, int32_t& merged) const {
    if (slots_.empty()) return kNoRank;
    const uint64_t key = Key(left, right);
    for (size_t i = Mix(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.key == key) {
        merged = slot.merged;
        return slot.rank;
      }
      if (slot.key == kEmpty) return kNoRank;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    uint32_t rank = kNoRank;
    int32_t merged = -1;
  };
  static uint64_t Key(int32_t left, int32_t right) {
    return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
  }
  Slot& Probe(uint64_t key) {
    for (size_t i = Mix(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key || slots_[i].key == kEmpty) return slots_[i];
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Pre-token word -> its ids. Sharded so that threads encoding at once rarely meet on a lock;
// a full shard stops taking words (as tokenizers' cache does) rather than evicting.
class WordCache {
 public:
  explicit WordCache(size_t capacity) : per_shard_(capacity / kShards) {}

  bool Lookup(std::string_view word, size_t hash, std::vector<int32_t>& out) {
    Shard& shard = shards_[hash % kShards];
    MutexLock lock(&shard.mu);
    auto it = shard.words.find(word);
    if (it == shard.words.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

  void Insert(std::string_view word, size_t hash, std::span<const int32_t> ids) {
    if (per_shard_ == 0) return;
    Shard& shard = shards_[hash % kShards];
    MutexLock lock(&shard.mu);
    if (shard.words.size() >= per_shard_) return;
    shard.words.emplace(std::string(word), std::vector<int32_t>(ids.begin(), ids.end()));
  }

 private:
  static constexpr size_t kShards = 64;
  struct alignas(64) Shard {
    Mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words
        GUARDED_BY(mu);
  };
  size_t per_shard_;
  std::array<Shard, kShards> shards_;
};

// Decodes the character at text[i] (valid UTF-8) and advances i.
char32_t NextChar(std::string_view text, size_t& i) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char b = s[i];
  if (b < 0x80) {
    ++i;
    return b;
  }
  int length = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  char32_t c = b & (0x3F >> (length - 1));
  for (int k = 1; k < length; ++k) c = (c << 6) | (s[i + k] & 0x3F);
  i += length;
  return c;
}

// The character that ends text[0, end) (valid UTF-8), and where it starts.
char32_t PreviousChar(std::string_view text, size_t end, size_t& start) {
  start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  size_t i = start;
  return NextChar(text, i);
}

// Rust regex's \w (UTS #18 word characters), which tokenizers tests single_word tokens with.
bool IsWordChar(char32_t c) {
  if (c < 0x80)
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  const auto u = static_cast<UChar32>(c);
  const int8_t type = u_charType(u);
  return u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL) ||
         type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK ||
         type == U_COMBINING_SPACING_MARK || type == U_DECIMAL_DIGIT_NUMBER ||
         type == U_CONNECTOR_PUNCTUATION;
}

bool IsAscii(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// NFC through ICU; ASCII is already NFC and skips the round trip through UTF-16.
void NormalizeNfc(std::string_view text, std::string& out) {
  out.clear();
  if (IsAscii(text)) {
    out.assign(text);
    return;
  }
  UErrorCode error = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&error);
  std::u16string wide(text.size() + 1, u'\0');
  int32_t wide_length = 0;
  u_strFromUTF8(wide.data(), static_cast<int32_t>(wide.size()), &wide_length, text.data(),
                static_cast<int32_t>(text.size()), &error);
  std::u16string normal(static_cast<size_t>(wide_length) * 3 + 16, u'\0');
  int32_t normal_length = U_SUCCESS(error)
                              ? unorm2_normalize(nfc, wide.data(), wide_length, normal.data(),
                                                 static_cast<int32_t>(normal.size()), &error)
                              : 0;
  out.resize(static_cast<size_t>(normal_length) * 3 + 16);
  int32_t out_length = 0;
  if (U_SUCCESS(error)) {
    u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &out_length, normal.data(),
                normal_length, &error);
  }
  if (U_FAILURE(error)) {
    // ICU fails only on allocation; the text unnormalised beats dropping it.
    out.assign(text);
    return;
  }
  out.resize(static_cast<size_t>(out_length));
}

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(size_t cache_words) : cache_(cache_words) {}

  Status Init(BpeSpec spec) {
    int32_t size = static_cast<int32_t>(spec.tokens.size());
    for (const AddedToken& token : spec.added) size = std::max(size, token.id + 1);
    bytes_.assign(static_cast<size_t>(size), std::string());
    kind_.assign(static_cast<size_t>(size), Kind::kUnused);
    byte_id_.fill(-1);
    vocabulary_bytes_.resize(spec.tokens.size());
    for (size_t id = 0; id < spec.tokens.size(); ++id) {
      if (!spec.tokens[id]) continue;
      vocabulary_bytes_[id] = std::move(*spec.tokens[id]);
      bytes_[id] = vocabulary_bytes_[id];
      kind_[id] = Kind::kVocabulary;
    }
    // Views into vocabulary_bytes_, which does not change from here on.
    for (size_t id = 0; id < vocabulary_bytes_.size(); ++id) {
      if (kind_[id] != Kind::kVocabulary) continue;
      const std::string& bytes = vocabulary_bytes_[id];
      vocabulary_.emplace(bytes, static_cast<int32_t>(id));
      if (bytes.size() == 1)
        byte_id_[static_cast<unsigned char>(bytes[0])] = static_cast<int32_t>(id);
    }
    for (const AddedToken& token : spec.added) {
      if (token.id < 0) return Status::InvalidArgument("added token with a negative id");
      if (token.content.empty()) return Status::InvalidArgument("added token with no text");
      bytes_[static_cast<size_t>(token.id)] = token.content;
      kind_[static_cast<size_t>(token.id)] = token.special ? Kind::kSpecial : Kind::kAdded;
      added_ids_[token.content] = token.id;
      (token.normalized && spec.nfc ? normalized_added_ : raw_added_).tokens.push_back(token);
    }
    for (AddedSet* set : {&raw_added_, &normalized_added_}) {
      // Longest first: at one position the longest token wins, as tokenizers' leftmost-longest
      // automaton decides.
      std::stable_sort(set->tokens.begin(), set->tokens.end(),
                       [](const AddedToken& a, const AddedToken& b) {
                         return a.content.size() > b.content.size();
                       });
      for (const AddedToken& token : set->tokens) {
        set->first[static_cast<unsigned char>(token.content[0])] = true;
      }
    }
    for (const BpeSpec::Merge& merge : spec.merges) {
      for (int32_t id : {merge.left, merge.right, merge.merged}) {
        if (id < 0 || static_cast<size_t>(id) >= vocabulary_bytes_.size() ||
            vocabulary_bytes_[static_cast<size_t>(id)].empty()) {
          return Status::InvalidArgument("a merge names id " + std::to_string(id) +
                                         ", which is not in the vocabulary");
        }
      }
    }
    pairs_.Build(spec.merges);
    for (const SplitStep& split : spec.splits) {
      STRIDER_ASSIGN_OR_RETURN(std::string pattern, TranslatePattern(split.pattern));
      STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Regex> regex, Regex::Compile(pattern));
      steps_.push_back(Step{std::move(regex), split.behavior, split.invert});
    }
    nfc_ = spec.nfc;
    add_prefix_space_ = spec.add_prefix_space;
    whole_word_lookup_ = spec.whole_word_lookup;
    unk_ = spec.unk.value_or(-1);
    if (unk_ >= size) return Status::InvalidArgument("the unknown token is not in the vocabulary");
    return Status::Ok();
  }

  std::vector<int32_t> Encode(std::string_view text, const EncodeOptions& options) const override {
    std::string valid;
    if (!IsValidUtf8(text)) {
      valid = ReplaceInvalidUtf8(text);
      text = valid;
    }
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 8);
    Scratch scratch(*this, options, out);
    SplitAdded(text, raw_added_, scratch, [&](std::string_view gap) { Normalized(gap, scratch); });
    return out;
  }

  std::string DecodeBytes(std::span<const int32_t> ids) const override {
    std::string text;
    text.reserve(ids.size() * 4);
    for (int32_t id : ids) {
      if (id >= 0 && static_cast<size_t>(id) < kind_.size() &&
          kind_[static_cast<size_t>(id)] != Kind::kUnused) {
        text += bytes_[static_cast<size_t>(id)];
      } else {
        text += "<|id:" + std::to_string(id) + "|>";
      }
    }
    return text;
  }

  int32_t VocabSize() const override { return static_cast<int32_t>(kind_.size()); }

  std::optional<int32_t> SpecialTokenId(std::string_view text) const override {
    auto it = added_ids_.find(text);
    if (it == added_ids_.end()) return std::nullopt;
    return it->second;
  }

  bool IsSpecial(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < kind_.size() &&
           kind_[static_cast<size_t>(id)] == Kind::kSpecial;
  }

 private:
  enum class Kind : uint8_t { kUnused, kVocabulary, kAdded, kSpecial };
  struct AddedSet {
    std::vector<AddedToken> tokens;
    std::array<bool, 256> first{};
  };
  struct Step {
    std::unique_ptr<Regex> regex;
    SplitBehavior behavior;
    bool invert;
  };
  struct Segment {
    size_t start;
    size_t end;
    bool match;
  };
  struct HeapEntry {
    uint32_t rank;
    int32_t pos;
    int32_t left;
    int32_t right;
    int32_t merged;
    bool operator>(const HeapEntry& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  struct Node {
    int32_t id;
    int32_t prev;
    int32_t next;
  };

  // State of one Encode call, reused across its words: no allocation per byte or per word.
  struct Scratch {
    Scratch(const BpeTokenizer& tokenizer, const EncodeOptions& options, std::vector<int32_t>& out)
        : options(options), out(out), segments(tokenizer.steps_.size()) {
      for (const Step& step : tokenizer.steps_) {
        matchers.push_back(std::make_unique<Regex::Matcher>(*step.regex));
      }
    }
    const EncodeOptions& options;
    std::vector<int32_t>& out;
    std::vector<std::unique_ptr<Regex::Matcher>> matchers;
    std::vector<std::vector<Segment>> segments;  // per split step
    std::vector<int32_t> symbols;
    std::vector<uint32_t> ranks;
    std::vector<int32_t> merged;
    std::vector<Node> nodes;
    std::vector<HeapEntry> heap;
    std::string normalized;
    std::string prefixed;
  };

  // Calls `gap` for the text between added tokens and appends the tokens' ids.
  template <typename GapFn>
  void SplitAdded(std::string_view text, const AddedSet& set, Scratch& scratch, GapFn&& gap) const {
    if (set.tokens.empty()) {
      if (!text.empty()) gap(text);
      return;
    }
    size_t gap_start = 0;
    size_t i = 0;
    while (i < text.size()) {
      if (!set.first[static_cast<unsigned char>(text[i])]) {
        ++i;
        continue;
      }
      const AddedToken* hit = nullptr;
      for (const AddedToken& token : set.tokens) {
        if (token.content[0] != text[i] ||
            (token.special && scratch.options.split_special_tokens)) {
          continue;
        }
        if (text.compare(i, token.content.size(), token.content) == 0) {
          hit = &token;
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      size_t start = i;
      size_t stop = i + hit->content.size();
      i = stop;
      if (hit->single_word) {
        size_t before;
        size_t after = stop;
        const bool word_before = start > 0 && IsWordChar(PreviousChar(text, start, before));
        const bool word_after = stop < text.size() && IsWordChar(NextChar(text, after));
        if (word_before || word_after) continue;
      }
      if (hit->lstrip) {
        while (start > gap_start) {
          size_t previous;
          if (!IsWhiteSpace(PreviousChar(text, start, previous))) break;
          start = previous;
        }
      }
      if (hit->rstrip) {
        while (stop < text.size()) {
          size_t next = stop;
          if (!IsWhiteSpace(NextChar(text, next))) break;
          stop = next;
        }
        i = stop;
      }
      if (start > gap_start) gap(text.substr(gap_start, start - gap_start));
      scratch.out.push_back(hit->id);
      gap_start = stop;
    }
    if (gap_start < text.size()) gap(text.substr(gap_start));
  }

  void Normalized(std::string_view text, Scratch& scratch) const {
    if (nfc_) {
      std::string normalized;  // its own: a nested call would overwrite a shared buffer
      NormalizeNfc(text, normalized);
      SplitAdded(normalized, normalized_added_, scratch,
                 [&](std::string_view gap) { PreTokenize(gap, scratch); });
      return;
    }
    PreTokenize(text, scratch);
  }

  void PreTokenize(std::string_view text, Scratch& scratch) const {
    if (add_prefix_space_ && text[0] != ' ') {
      scratch.prefixed.assign(1, ' ');
      scratch.prefixed.append(text);
      Split(0, scratch.prefixed, scratch);
      return;
    }
    Split(0, text, scratch);
  }

  void Split(size_t step_index, std::string_view piece, Scratch& scratch) const {
    if (step_index == steps_.size()) {
      Word(piece, scratch);
      return;
    }
    const Step& step = steps_[step_index];
    Regex::Matcher& matcher = *scratch.matchers[step_index];
    size_t pos = 0;
    size_t start;
    size_t end;
    if (step.behavior == SplitBehavior::kIsolated) {
      // Every match and every stretch between matches is a piece: no list needed.
      while (matcher.Next(piece, pos, start, end)) {
        if (start > pos) Split(step_index + 1, piece.substr(pos, start - pos), scratch);
        Split(step_index + 1, piece.substr(start, end - start), scratch);
        pos = end;
      }
      if (pos < piece.size()) Split(step_index + 1, piece.substr(pos), scratch);
      return;
    }
    std::vector<Segment>& segments = scratch.segments[step_index];
    segments.clear();
    while (matcher.Next(piece, pos, start, end)) {
      if (start > pos) segments.push_back({pos, start, step.invert});
      segments.push_back({start, end, !step.invert});
      pos = end;
    }
    if (pos < piece.size()) segments.push_back({pos, piece.size(), step.invert});
    // tokenizers' SplitDelimiterBehavior, over (offsets, is_match) pairs.
    std::vector<Segment> merged;
    bool previous_match = false;
    switch (step.behavior) {
      case SplitBehavior::kIsolated:
        break;
      case SplitBehavior::kRemoved:
        for (const Segment& s : segments) {
          if (!s.match) merged.push_back(s);
        }
        break;
      case SplitBehavior::kMergedWithPrevious:
        for (const Segment& s : segments) {
          if (s.match && !previous_match && !merged.empty()) {
            merged.back().end = s.end;
          } else {
            merged.push_back(s);
          }
          previous_match = s.match;
        }
        break;
      case SplitBehavior::kMergedWithNext:
        for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
          if (it->match && !previous_match && !merged.empty()) {
            merged.back().start = it->start;
          } else {
            merged.push_back(*it);
          }
          previous_match = it->match;
        }
        std::reverse(merged.begin(), merged.end());
        break;
      case SplitBehavior::kContiguous:
        for (const Segment& s : segments) {
          if (s.match == previous_match && !merged.empty()) {
            merged.back().end = s.end;
          } else {
            merged.push_back(s);
          }
          previous_match = s.match;
        }
        break;
    }
    for (const Segment& s : merged) {
      if (s.end > s.start) Split(step_index + 1, piece.substr(s.start, s.end - s.start), scratch);
    }
  }

  void Word(std::string_view word, Scratch& scratch) const {
    if (word.empty()) return;
    if (word.size() == 1) {
      const int32_t id = byte_id_[static_cast<unsigned char>(word[0])];
      if (id >= 0) {
        scratch.out.push_back(id);
      } else if (unk_ >= 0) {
        scratch.out.push_back(unk_);
      }
      return;
    }
    if (whole_word_lookup_) {
      auto it = vocabulary_.find(word);
      if (it != vocabulary_.end()) {
        scratch.out.push_back(it->second);
        return;
      }
    }
    const size_t hash = StringHash{}(word);
    if (cache_.Lookup(word, hash, scratch.out)) return;
    const size_t first = scratch.out.size();
    Merge(word, scratch);
    cache_.Insert(word, hash,
                  std::span<const int32_t>(scratch.out.data() + first, scratch.out.size() - first));
  }

  void Merge(std::string_view word, Scratch& scratch) const {
    std::vector<int32_t>& symbols = scratch.symbols;
    symbols.clear();
    for (char c : word) {
      const int32_t id = byte_id_[static_cast<unsigned char>(c)];
      if (id >= 0) {
        symbols.push_back(id);
      } else if (unk_ >= 0) {
        symbols.push_back(unk_);
      }
    }
    if (symbols.size() > kLinearMergeLimit) {
      MergeWithHeap(scratch);
      return;
    }
    // Lowest rank first, leftmost among equals: tiktoken's loop, and the order tokenizers'
    // (rank, position) heap pops merges in.
    std::vector<uint32_t>& ranks = scratch.ranks;
    std::vector<int32_t>& merged = scratch.merged;
    const size_t n = symbols.size();
    ranks.resize(n);
    merged.resize(n);
    for (size_t i = 0; i + 1 < n; ++i)
      ranks[i] = pairs_.Find(symbols[i], symbols[i + 1], merged[i]);
    size_t count = n;
    while (count > 1) {
      size_t best = 0;
      uint32_t best_rank = kNoRank;
      for (size_t i = 0; i + 1 < count; ++i) {
        if (ranks[i] < best_rank) {
          best_rank = ranks[i];
          best = i;
        }
      }
      if (best_rank == kNoRank) break;
      symbols[best] = merged[best];
      symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      ranks.erase(ranks.begin() + static_cast<std::ptrdiff_t>(best));
      merged.erase(merged.begin() + static_cast<std::ptrdiff_t>(best));
      --count;
      if (best > 0)
        ranks[best - 1] = pairs_.Find(symbols[best - 1], symbols[best], merged[best - 1]);
      if (best + 1 < count)
        ranks[best] = pairs_.Find(symbols[best], symbols[best + 1], merged[best]);
    }
    scratch.out.insert(scratch.out.end(), symbols.begin(),
                       symbols.begin() + static_cast<std::ptrdiff_t>(count));
  }

  void MergeWithHeap(Scratch& scratch) const {
    const std::vector<int32_t>& symbols = scratch.symbols;
    std::vector<Node>& nodes = scratch.nodes;
    std::vector<HeapEntry>& heap = scratch.heap;
    const int32_t n = static_cast<int32_t>(symbols.size());
    nodes.resize(static_cast<size_t>(n));
    heap.clear();
    auto push = [&](int32_t pos) {
      const int32_t next = nodes[static_cast<size_t>(pos)].next;
      if (next < 0) return;
      int32_t merged = -1;
      const int32_t left = nodes[static_cast<size_t>(pos)].id;
      const int32_t right = nodes[static_cast<size_t>(next)].id;
      const uint32_t rank = pairs_.Find(left, right, merged);
      if (rank == kNoRank) return;
      heap.push_back({rank, pos, left, right, merged});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    };
    for (int32_t i = 0; i < n; ++i)
      nodes[static_cast<size_t>(i)] = {symbols[static_cast<size_t>(i)], i - 1,
                                       i + 1 < n ? i + 1 : -1};
    for (int32_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      const HeapEntry top = heap.back();
      heap.pop_back();
      Node& node = nodes[static_cast<size_t>(top.pos)];
      // Entries go stale when a neighbour merged first; the ids say whether the pair is still
      // there.
      if (node.id != top.left || node.next < 0) continue;
      Node& right = nodes[static_cast<size_t>(node.next)];
      if (right.id != top.right) continue;
      node.id = top.merged;
      right.id = -1;
      node.next = right.next;
      if (node.next >= 0) nodes[static_cast<size_t>(node.next)].prev = top.pos;
      if (node.prev >= 0) push(node.prev);
      push(top.pos);
    }
    for (int32_t i = 0; i >= 0; i = nodes[static_cast<size_t>(i)].next) {
      scratch.out.push_back(nodes[static_cast<size_t>(i)].id);
    }
  }

  std::vector<std::string> bytes_;  // id -> what it decodes to (an added token's text)
  std::vector<Kind> kind_;
  std::vector<std::string> vocabulary_bytes_;                 // id -> the model's token
  std::unordered_map<std::string_view, int32_t> vocabulary_;  // views into vocabulary_bytes_
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> added_ids_;
  std::array<int32_t, 256> byte_id_;
  PairMap pairs_;
  AddedSet raw_added_;
  AddedSet normalized_added_;
  std::vector<Step> steps_;
  bool nfc_ = false;
  bool add_prefix_space_ = false;
  bool whole_word_lookup_ = false;
  int32_t unk_ = -1;
  mutable WordCache cache_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(BpeSpec spec, size_t cache_words,
                                                    std::string_view origin) {
  auto tokenizer = std::make_unique<BpeTokenizer>(cache_words);
  Status status = tokenizer->Init(std::move(spec));
  if (!status.ok()) return status.WithContext(origin);
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace strider::tokenizer::internal
