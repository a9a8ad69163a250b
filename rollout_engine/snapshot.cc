// The snapshot format of rollout_engine/snapshot.h: little-endian fields in the order of the
// table in docs/rollout_engine.md, written and read by the two small cursors below.
#include "rollout_engine/snapshot.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "common/model/parameters.h"
#include "common/random.h"

namespace strider::rollout {
namespace {

constexpr char kSnapshotMagic[8] = {'S', 'T', 'R', 'D', 'S', 'N', 'A', 'P'};

class Writer {
 public:
  template <typename T>
  void Put(T value) {
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void PutBytes(const void* data, size_t size) {
    out_.append(static_cast<const char*>(data), size);
  }
  void PutString(const std::string& text) {
    Put<uint32_t>(static_cast<uint32_t>(text.size()));
    out_ += text;
  }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

// Every read checks the bytes left first, so truncated input fails instead of reading past it.
class Reader {
 public:
  Reader(const char* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  bool Get(T* value) {
    if (size_ - offset_ < sizeof(T)) return false;
    std::memcpy(value, data_ + offset_, sizeof(T));
    offset_ += sizeof(T);
    return true;
  }
  bool GetBytes(void* out, size_t size) {
    if (size_ - offset_ < size) return false;
    if (size == 0) return true;  // `out` may be null then (an empty vector's data())
    std::memcpy(out, data_ + offset_, size);
    offset_ += size;
    return true;
  }
  bool GetString(std::string* text, size_t limit = 1 << 20) {
    uint32_t size;
    if (!Get(&size) || size > limit || size_ - offset_ < size) return false;
    text->assign(data_ + offset_, size);
    offset_ += size;
    return true;
  }
  size_t remaining() const { return size_ - offset_; }

 private:
  const char* data_;
  size_t size_;
  size_t offset_ = 0;
};

uint8_t DtypeCode(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return 0;
    case at::kDouble:
      return 1;
    case at::kBFloat16:
      return 2;
    default:
      return 255;
  }
}

}  // namespace

void Hasher::Update(const void* data, size_t size) {
  const unsigned char* bytes = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    state_ = (state_ ^ word) * 0x100000001b3ull;
    state_ ^= state_ >> 29;
  }
  for (; i < size; ++i) state_ = (state_ ^ bytes[i]) * 0x100000001b3ull;
  total_ += size;
}

uint64_t Hasher::Digest() const {
  return SplitMix64Finalize(state_ ^ total_);
}

void StreamingHasher::Update(const void* data, size_t size) {
  if (size == 0) return;  // `data` may be null then (an empty tensor's)
  const unsigned char* bytes = static_cast<const unsigned char*>(data);
  if (carried_ > 0) {
    const size_t take = std::min(size, 8 - carried_);
    std::memcpy(carry_ + carried_, bytes, take);
    carried_ += take;
    bytes += take;
    size -= take;
    if (carried_ < 8) return;
    words_.Update(carry_, 8);
    carried_ = 0;
  }
  const size_t whole = size & ~size_t{7};
  if (whole > 0) words_.Update(bytes, whole);
  if (size > whole) std::memcpy(carry_, bytes + whole, size - whole);
  carried_ = size - whole;
}

uint64_t StreamingHasher::Digest() const {
  Hasher last = words_;
  last.Update(carry_, carried_);
  return last.Digest();
}

uint64_t ConfigFingerprint(const ModelConfig& config) {
  Hasher hasher;
  for (const ParameterSpec& spec : ModelParameterSpecs(config)) {
    hasher.Update(spec.name.data(), spec.name.size());
    hasher.Update(spec.shape.data(), spec.shape.size() * sizeof(int64_t));
  }
  hasher.Update(config.cache_dtype.data(), config.cache_dtype.size());
  return hasher.Digest();
}

void WriteState(int64_t length, const std::vector<model::IncrementalAttentionState>& incremental,
                const std::vector<std::vector<at::Tensor>>& latent_pieces, const ByteSink& sink) {
  auto put = [&](auto value) { sink(&value, sizeof(value)); };
  auto put_header = [&](at::ScalarType type, at::IntArrayRef sizes) {
    put(DtypeCode(type));
    put(static_cast<uint32_t>(sizes.size()));
    for (int64_t size : sizes) put(size);
  };
  put(length);
  for (const model::IncrementalAttentionState& layer : incremental) {
    for (const at::Tensor& tensor : {layer.recurrent, layer.conv_tail}) {
      at::Tensor contiguous = tensor.cpu().contiguous();  // states may live on a GPU
      put_header(contiguous.scalar_type(), contiguous.sizes());
      sink(contiguous.data_ptr(), contiguous.nbytes());
    }
  }
  for (const std::vector<at::Tensor>& pieces : latent_pieces) {
    // Laid out as the one (length, W) tensor the pieces make up in order.
    int64_t rows = 0;
    for (const at::Tensor& piece : pieces) rows += piece.size(0);
    const at::Tensor& first = pieces.front();
    put_header(first.scalar_type(), {rows, first.size(1)});
    for (const at::Tensor& piece : pieces) {
      at::Tensor contiguous = piece.cpu().contiguous();
      if (contiguous.nbytes() > 0) sink(contiguous.data_ptr(), contiguous.nbytes());
    }
  }
}

std::string CollectBytes(const std::function<void(const ByteSink&)>& write) {
  size_t size = 0;
  write([&](const void*, size_t n) { size += n; });
  std::string bytes;
  bytes.reserve(size);
  write([&](const void* data, size_t n) { bytes.append(static_cast<const char*>(data), n); });
  return bytes;
}

std::string EncodeState(const SequenceState& state) {
  std::vector<std::vector<at::Tensor>> pieces;
  for (const at::Tensor& rows : state.latent_rows) pieces.push_back({rows});
  return CollectBytes([&](const ByteSink& sink) {
    WriteState(state.length, state.incremental, pieces, sink);
  });
}

Result<SequenceState> DecodeState(const std::string& bytes, const ModelConfig& config,
                                  at::ScalarType model_dtype, at::ScalarType cache_dtype) {
  Reader reader(bytes.data(), bytes.size());
  auto bad = [](const std::string& what) {
    return Status::Corruption("restore: snapshot state: " + what);
  };
  SequenceState state;
  if (!reader.Get(&state.length) || state.length < 0 || state.length > config.context) {
    return bad("bad length");
  }
  auto get_tensor = [&](const std::vector<int64_t>& shape, at::ScalarType type,
                        at::Tensor* out) -> Status {
    uint8_t code;
    uint32_t dims;
    if (!reader.Get(&code) || !reader.Get(&dims)) return bad("truncated");
    if (code != DtypeCode(type)) return bad("unexpected dtype");
    if (dims != shape.size()) return bad("unexpected rank");
    for (int64_t expected : shape) {
      int64_t size;
      if (!reader.Get(&size)) return bad("truncated");
      if (size != expected) return bad("unexpected shape");
    }
    *out = at::empty(shape, at::TensorOptions().dtype(type));
    if (!reader.GetBytes(out->data_ptr(), out->nbytes())) return bad("truncated tensor");
    return Status::Ok();
  };
  const at::ScalarType state_dtype = model_dtype == at::kDouble ? at::kDouble : at::kFloat;
  const auto& inc = config.incremental;
  for (int64_t i = 0; i < config.CountLayers('I'); ++i) {
    model::IncrementalAttentionState& layer = state.incremental.emplace_back();
    STRIDER_RETURN_IF_ERROR(
        get_tensor({1, inc.heads, inc.key_dim, inc.value_dim}, state_dtype, &layer.recurrent));
    STRIDER_RETURN_IF_ERROR(
        get_tensor({1, inc.conv_width - 1, inc.heads * (2 * inc.key_dim + inc.value_dim)},
                   model_dtype, &layer.conv_tail));
  }
  const int64_t width = config.latent.kv_rank + config.latent.rope_dim;
  for (int64_t layer = 0; layer < config.CountLayers('G'); ++layer) {
    STRIDER_RETURN_IF_ERROR(
        get_tensor({state.length, width}, cache_dtype, &state.latent_rows.emplace_back()));
  }
  if (reader.remaining() != 0) return bad("trailing bytes");
  return state;
}

std::string EncodeSnapshot(const SnapshotRecord& record) {
  Writer writer;
  writer.PutBytes(kSnapshotMagic, sizeof(kSnapshotMagic));
  writer.Put<uint32_t>(kSnapshotVersion);
  writer.PutString(record.config_name);
  writer.Put<uint64_t>(record.fingerprint);
  writer.Put<uint8_t>(record.generating ? 1 : 0);
  writer.Put<uint64_t>(record.logits_version);
  writer.Put<uint8_t>(record.turn.has_value() ? 1 : 0);
  const SamplingParams params = record.turn.value_or(SamplingParams{});
  writer.Put<double>(params.temperature);
  writer.Put<int64_t>(params.top_k);
  writer.Put<double>(params.top_p);
  writer.Put<int64_t>(params.max_new_tokens);
  writer.Put<uint32_t>(static_cast<uint32_t>(params.stop_tokens.size()));
  for (int64_t token : params.stop_tokens) writer.Put<int64_t>(token);
  writer.Put<uint32_t>(static_cast<uint32_t>(params.stop_strings.size()));
  for (const std::string& stop : params.stop_strings) writer.PutString(stop);
  writer.Put<uint64_t>(params.seed);
  writer.Put<uint8_t>(record.release_on_finish ? 1 : 0);
  writer.Put<uint64_t>(record.counter);
  writer.Put<int64_t>(record.generated);
  writer.PutString(record.turn_text);
  writer.Put<uint32_t>(static_cast<uint32_t>(record.next_logits.size()));
  writer.PutBytes(record.next_logits.data(), record.next_logits.size() * sizeof(float));
  Hasher state_hash;
  state_hash.Update(record.state.data(), record.state.size());
  writer.Put<uint64_t>(state_hash.Digest());
  writer.Put<uint64_t>(record.state.size());
  writer.PutBytes(record.state.data(), record.state.size());
  Hasher whole;
  whole.Update(writer.bytes().data(), writer.bytes().size());
  writer.Put<uint64_t>(whole.Digest());
  return std::move(writer.bytes());
}

Result<SnapshotRecord> DecodeSnapshot(const std::string& bytes, const ModelConfig& config,
                                      uint64_t fingerprint) {
  if (bytes.size() < sizeof(kSnapshotMagic) + 12 ||
      std::memcmp(bytes.data(), kSnapshotMagic, sizeof(kSnapshotMagic)) != 0) {
    return Status::Corruption("restore: not a Strider sequence snapshot (bad magic)");
  }
  {
    Hasher whole;
    whole.Update(bytes.data(), bytes.size() - 8);
    uint64_t stored;
    std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
    if (stored != whole.Digest()) {
      return Status::Corruption("restore: snapshot checksum mismatch (corrupt or truncated)");
    }
  }
  Reader reader(bytes.data() + sizeof(kSnapshotMagic), bytes.size() - sizeof(kSnapshotMagic) - 8);
  auto truncated = [] { return Status::Corruption("restore: snapshot is truncated"); };
  uint32_t version;
  if (!reader.Get(&version)) return truncated();
  if (version != kSnapshotVersion) {
    return Status::Corruption("restore: snapshot format version " + std::to_string(version) +
                              ", this engine reads version " + std::to_string(kSnapshotVersion));
  }
  SnapshotRecord record;
  if (!reader.GetString(&record.config_name) || !reader.Get(&record.fingerprint)) {
    return truncated();
  }
  if (record.config_name != config.name || record.fingerprint != fingerprint) {
    return Status::FailedPrecondition("restore: snapshot of model config '" + record.config_name +
                                      "' does not match this engine's config '" + config.name +
                                      "' (names or shapes differ)");
  }
  uint8_t generating, has_turn, release;
  SamplingParams params;
  uint32_t stops;
  if (!reader.Get(&generating) || !reader.Get(&record.logits_version) || !reader.Get(&has_turn) ||
      !reader.Get(&params.temperature) || !reader.Get(&params.top_k) ||
      !reader.Get(&params.top_p) || !reader.Get(&params.max_new_tokens) || !reader.Get(&stops) ||
      stops > reader.remaining() / 8) {
    return truncated();
  }
  params.stop_tokens.resize(stops);
  for (int64_t& token : params.stop_tokens) {
    if (!reader.Get(&token)) return truncated();
  }
  if (!reader.Get(&stops) || stops > reader.remaining() / 4) return truncated();
  params.stop_strings.resize(stops);
  for (std::string& stop : params.stop_strings) {
    if (!reader.GetString(&stop)) return truncated();
  }
  uint32_t vocabulary;
  if (!reader.Get(&params.seed) || !reader.Get(&release) || !reader.Get(&record.counter) ||
      !reader.Get(&record.generated) || !reader.GetString(&record.turn_text) ||
      !reader.Get(&vocabulary)) {
    return truncated();
  }
  if (vocabulary != 0 && vocabulary != config.vocabulary) {
    return Status::Corruption("restore: snapshot holds " + std::to_string(vocabulary) +
                              " logits, the vocabulary has " + std::to_string(config.vocabulary));
  }
  record.next_logits.resize(vocabulary);
  if (!reader.GetBytes(record.next_logits.data(), vocabulary * sizeof(float))) {
    return truncated();
  }
  if (has_turn) {
    STRIDER_RETURN_IF_ERROR(ValidateSamplingParams(params, config.vocabulary)
                                .WithContext("restore: snapshot's sampling parameters"));
    record.turn = params;
  }
  record.release_on_finish = release != 0;
  record.generating = generating != 0;
  if (generating && (!has_turn || vocabulary == 0)) {
    return Status::Corruption("restore: a generating snapshot without a turn or logits");
  }
  uint64_t state_digest, state_size;
  if (!reader.Get(&state_digest) || !reader.Get(&state_size) || state_size != reader.remaining()) {
    return truncated();
  }
  record.state.resize(state_size);
  reader.GetBytes(record.state.data(), state_size);
  Hasher state_hash;
  state_hash.Update(record.state.data(), record.state.size());
  if (state_hash.Digest() != state_digest) {
    return Status::Corruption("restore: state digest mismatch");
  }
  return record;
}

}  // namespace strider::rollout
