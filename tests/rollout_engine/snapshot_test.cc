// The snapshot format on its own (rollout_engine/snapshot.h): every field survives a round trip,
// and bytes that are cut, altered, of another version or of another model are refused with an
// error that says which. The engine's own snapshot tests (engine_test.cc) cover continuing a
// restored sequence exactly.
#include "rollout_engine/snapshot.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "common/model/config.h"
#include "tests/shipped_config.h"

namespace strider::rollout {
namespace {

ModelConfig Tiny() { return testing::ShippedModelConfig("tiny"); }

SequenceState RandomState(const ModelConfig& config, int64_t length) {
  const auto& inc = config.incremental;
  SequenceState state;
  state.length = length;
  for (int64_t i = 0; i < config.CountLayers('I'); ++i) {
    model::IncrementalAttentionState layer;
    layer.recurrent = at::randn({1, inc.heads, inc.key_dim, inc.value_dim});
    layer.conv_tail =
        at::randn({1, inc.conv_width - 1, inc.heads * (2 * inc.key_dim + inc.value_dim)});
    state.incremental.push_back(layer);
  }
  for (int64_t i = 0; i < config.CountLayers('G'); ++i) {
    state.latent_rows.push_back(
        at::randn({length, config.latent.kv_rank + config.latent.rope_dim}));
  }
  return state;
}

SnapshotRecord FullRecord(const ModelConfig& config) {
  SnapshotRecord record;
  record.config_name = config.name;
  record.fingerprint = ConfigFingerprint(config);
  record.generating = true;
  record.logits_version = 7;
  SamplingParams turn;
  turn.temperature = 0.7;
  turn.top_k = 40;
  turn.top_p = 0.9;
  turn.max_new_tokens = 33;
  turn.stop_tokens = {3, 257};
  turn.stop_strings = {"\n\n", "Answer:"};
  turn.seed = 0x1234567890abcdefull;
  record.turn = turn;
  record.release_on_finish = true;
  record.counter = 12;
  record.generated = 11;
  record.turn_text = "Answ";
  for (int64_t i = 0; i < config.vocabulary; ++i) {
    record.next_logits.push_back(0.25f * static_cast<float>(i % 17) - 2.0f);
  }
  record.state = EncodeState(RandomState(config, 21));
  return record;
}

// The bytes with their trailing checksum recomputed, so a change reaches the checks behind it.
std::string Resealed(std::string bytes) {
  Hasher whole;
  whole.Update(bytes.data(), bytes.size() - 8);
  const uint64_t digest = whole.Digest();
  std::memcpy(bytes.data() + bytes.size() - 8, &digest, 8);
  return bytes;
}

// Where the format version sits: after the 8-byte magic.
constexpr size_t kVersionOffset = 8;

TEST(SnapshotFormat, RecordRoundTripsEveryField) {
  const ModelConfig config = Tiny();
  const SnapshotRecord record = FullRecord(config);
  Result<SnapshotRecord> read =
      DecodeSnapshot(EncodeSnapshot(record), config, ConfigFingerprint(config));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->config_name, record.config_name);
  EXPECT_EQ(read->fingerprint, record.fingerprint);
  EXPECT_EQ(read->generating, record.generating);
  EXPECT_EQ(read->logits_version, record.logits_version);
  ASSERT_TRUE(read->turn.has_value());
  EXPECT_EQ(read->turn->temperature, record.turn->temperature);
  EXPECT_EQ(read->turn->top_k, record.turn->top_k);
  EXPECT_EQ(read->turn->top_p, record.turn->top_p);
  EXPECT_EQ(read->turn->max_new_tokens, record.turn->max_new_tokens);
  EXPECT_EQ(read->turn->stop_tokens, record.turn->stop_tokens);
  EXPECT_EQ(read->turn->stop_strings, record.turn->stop_strings);
  EXPECT_EQ(read->turn->seed, record.turn->seed);
  EXPECT_EQ(read->release_on_finish, record.release_on_finish);
  EXPECT_EQ(read->counter, record.counter);
  EXPECT_EQ(read->generated, record.generated);
  EXPECT_EQ(read->turn_text, record.turn_text);
  EXPECT_EQ(read->next_logits, record.next_logits);
  EXPECT_EQ(read->state, record.state);

  // An idle sequence without a turn or logits (a prompt waiting for a fork).
  SnapshotRecord idle;
  idle.config_name = config.name;
  idle.fingerprint = ConfigFingerprint(config);
  idle.state = EncodeState(RandomState(config, 0));
  read = DecodeSnapshot(EncodeSnapshot(idle), config, idle.fingerprint);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_FALSE(read->generating);
  EXPECT_FALSE(read->turn.has_value());
  EXPECT_TRUE(read->next_logits.empty());
  EXPECT_EQ(read->state, idle.state);
}

TEST(SnapshotFormat, StateRoundTripsEveryTensor) {
  const ModelConfig config = Tiny();
  const SequenceState state = RandomState(config, 37);
  const std::string bytes = EncodeState(state);
  Result<SequenceState> read = DecodeState(bytes, config, at::kFloat, at::kFloat);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->length, 37);
  ASSERT_EQ(read->incremental.size(), state.incremental.size());
  for (size_t i = 0; i < state.incremental.size(); ++i) {
    EXPECT_TRUE(at::equal(read->incremental[i].recurrent, state.incremental[i].recurrent));
    EXPECT_TRUE(at::equal(read->incremental[i].conv_tail, state.incremental[i].conv_tail));
  }
  ASSERT_EQ(read->latent_rows.size(), state.latent_rows.size());
  for (size_t i = 0; i < state.latent_rows.size(); ++i) {
    EXPECT_TRUE(at::equal(read->latent_rows[i], state.latent_rows[i]));
  }
  // The digest covers these bytes: the same state encodes to the same bytes.
  EXPECT_EQ(EncodeState(*read), bytes);
}

TEST(SnapshotFormat, PiecesStreamTheSameBytesAndDigestAsTheWholeEncoding) {
  // Hasher takes words from the start of each call; the streaming one must not depend on where
  // the pieces split.
  std::mt19937 random(5);
  std::string bytes(1001, '\0');
  for (char& byte : bytes) byte = static_cast<char>(random());
  Hasher whole;
  whole.Update(bytes.data(), bytes.size());
  for (int trial = 0; trial < 20; ++trial) {
    StreamingHasher streamed;
    for (size_t at = 0; at < bytes.size();) {
      const size_t n = std::min<size_t>(random() % 19, bytes.size() - at);  // 0 included
      streamed.Update(bytes.data() + at, n);
      at += n;
    }
    EXPECT_EQ(streamed.Digest(), whole.Digest()) << "trial " << trial;
  }

  // Latent rows given as blocks encode as the one tensor they make up.
  const ModelConfig config = Tiny();
  const SequenceState state = RandomState(config, 37);
  std::vector<std::vector<at::Tensor>> pieces;
  for (const at::Tensor& rows : state.latent_rows) {
    pieces.push_back({rows.narrow(0, 0, 16), rows.narrow(0, 16, 0), rows.narrow(0, 16, 21)});
  }
  std::string written;
  StreamingHasher digest;
  WriteState(state.length, state.incremental, pieces, [&](const void* data, size_t n) {
    written.append(static_cast<const char*>(data), n);
    digest.Update(data, n);
  });
  const std::string encoded = EncodeState(state);
  EXPECT_EQ(written, encoded);
  Hasher encoded_hash;
  encoded_hash.Update(encoded.data(), encoded.size());
  EXPECT_EQ(digest.Digest(), encoded_hash.Digest());
}

TEST(SnapshotFormat, EveryTruncationIsCorruption) {
  const ModelConfig config = Tiny();
  const std::string bytes = EncodeSnapshot(FullRecord(config));
  const uint64_t fingerprint = ConfigFingerprint(config);
  for (size_t size = 0; size < bytes.size(); ++size) {
    Result<SnapshotRecord> read = DecodeSnapshot(bytes.substr(0, size), config, fingerprint);
    ASSERT_FALSE(read.ok()) << "accepted the first " << size << " bytes";
    ASSERT_EQ(read.status().code(), StatusCode::kCorruption) << read.status().ToString();
  }
  // Cut inside the fields but with a valid checksum: the reader itself finds the end.
  const std::string cut = Resealed(bytes.substr(0, 60) + std::string(8, '\0'));
  Result<SnapshotRecord> read = DecodeSnapshot(cut, config, fingerprint);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
  EXPECT_NE(read.status().message().find("truncated"), std::string::npos)
      << read.status().ToString();
}

TEST(SnapshotFormat, AlteredBytesFailTheChecksumOrTheStateDigest) {
  const ModelConfig config = Tiny();
  const std::string bytes = EncodeSnapshot(FullRecord(config));
  const uint64_t fingerprint = ConfigFingerprint(config);
  for (size_t at : {size_t{20}, bytes.size() / 2, bytes.size() - 9}) {
    std::string altered = bytes;
    altered[at] ^= 0x40;
    Result<SnapshotRecord> read = DecodeSnapshot(altered, config, fingerprint);
    ASSERT_FALSE(read.ok()) << "byte " << at;
    EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
    EXPECT_NE(read.status().message().find("checksum mismatch"), std::string::npos)
        << read.status().ToString();
  }
  // An altered state with a recomputed checksum is caught by the state's own digest.
  std::string altered = bytes;
  altered[bytes.size() - 20] ^= 0x40;  // inside the last latent rows
  Result<SnapshotRecord> read = DecodeSnapshot(Resealed(altered), config, fingerprint);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
  EXPECT_NE(read.status().message().find("state digest mismatch"), std::string::npos)
      << read.status().ToString();

  read = DecodeSnapshot("not a snapshot, but long enough", config, fingerprint);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
  EXPECT_NE(read.status().message().find("bad magic"), std::string::npos);
}

TEST(SnapshotFormat, AnotherVersionIsRefusedNamingBoth) {
  const ModelConfig config = Tiny();
  std::string bytes = EncodeSnapshot(FullRecord(config));
  const uint32_t future = kSnapshotVersion + 1;
  std::memcpy(bytes.data() + kVersionOffset, &future, sizeof(future));
  Result<SnapshotRecord> read = DecodeSnapshot(Resealed(bytes), config, ConfigFingerprint(config));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
  EXPECT_NE(read.status().message().find("format version " + std::to_string(future) +
                                         ", this engine reads version " +
                                         std::to_string(kSnapshotVersion)),
            std::string::npos)
      << read.status().ToString();
}

TEST(SnapshotFormat, AnotherModelConfigIsAFailedPreconditionNamingBoth) {
  const ModelConfig config = Tiny();
  const std::string bytes = EncodeSnapshot(FullRecord(config));
  ModelConfig wider = config;
  wider.name = "wider";
  wider.width = 96;
  EXPECT_NE(ConfigFingerprint(wider), ConfigFingerprint(config));
  Result<SnapshotRecord> read = DecodeSnapshot(bytes, wider, ConfigFingerprint(wider));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(read.status().message().find("'tiny'"), std::string::npos);
  EXPECT_NE(read.status().message().find("'wider'"), std::string::npos);
  // Same name, other shapes: the fingerprint tells them apart.
  wider.name = config.name;
  read = DecodeSnapshot(bytes, wider, ConfigFingerprint(wider));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kFailedPrecondition);
}

TEST(SnapshotFormat, InconsistentFieldsAreRefused) {
  const ModelConfig config = Tiny();
  const uint64_t fingerprint = ConfigFingerprint(config);
  SnapshotRecord record = FullRecord(config);
  record.next_logits.pop_back();
  Result<SnapshotRecord> read = DecodeSnapshot(EncodeSnapshot(record), config, fingerprint);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
  EXPECT_NE(read.status().message().find("logits"), std::string::npos);

  record = FullRecord(config);
  record.turn.reset();
  read = DecodeSnapshot(EncodeSnapshot(record), config, fingerprint);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
  EXPECT_NE(read.status().message().find("generating snapshot without a turn"), std::string::npos);

  record = FullRecord(config);
  record.turn->top_p = 1.5;
  read = DecodeSnapshot(EncodeSnapshot(record), config, fingerprint);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("sampling parameters"), std::string::npos);
}

TEST(SnapshotFormat, StateOfOtherShapesOrDtypesIsCorruptionNamingTheProblem) {
  const ModelConfig config = Tiny();
  const std::string bytes = EncodeState(RandomState(config, 9));
  auto message = [&](const std::string& state, const ModelConfig& as, at::ScalarType cache) {
    Result<SequenceState> read = DecodeState(state, as, at::kFloat, cache);
    EXPECT_FALSE(read.ok());
    EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
    return read.status().message();
  };
  EXPECT_NE(message(bytes, config, at::kBFloat16).find("unexpected dtype"), std::string::npos);
  ModelConfig other = config;
  other.latent.kv_rank = 24;
  EXPECT_NE(message(bytes, other, at::kFloat).find("unexpected shape"), std::string::npos);
  EXPECT_NE(message(bytes + "x", config, at::kFloat).find("trailing bytes"), std::string::npos);
  EXPECT_NE(message(bytes.substr(0, bytes.size() - 1), config, at::kFloat).find("truncated"),
            std::string::npos);
  std::string long_state = bytes;
  const int64_t too_long = config.context + 1;
  std::memcpy(long_state.data(), &too_long, sizeof(too_long));
  EXPECT_NE(message(long_state, config, at::kFloat).find("bad length"), std::string::npos);
}

}  // namespace
}  // namespace strider::rollout
