// libFuzzer target for the sequence snapshot format (rollout_engine/snapshot.h): a snapshot file
// handed to `Engine::Restore` may be anything. No input may crash, hang, read out of bounds or
// allocate beyond what the model config allows; a refusal is Corruption or FailedPrecondition
// (or InvalidArgument for sampling parameters), and a state that decodes has the config's shapes.
//
// The whole-snapshot checksum stops almost every mutated input at the door, so the first byte
// picks a mode:
//   0: the rest as a snapshot, as is (magic and checksum checks);
//   1: magic + the rest + a correct checksum, so the field-by-field reader runs;
//   2: the rest as a state section (DecodeState), for the tiny hybrid config in float32;
//   3: a valid snapshot of the rest as a state section and its digest, then the state decoded,
//      as Engine::Restore does.
// Model config: configs/model/tiny.yaml under $STRIDER_SOURCE_DIR (ctest sets it) or ".".
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/model/config.h"
#include "rollout_engine/snapshot.h"

namespace {

using namespace strider;
using namespace strider::rollout;

struct Fixture {
  ModelConfig config;
  uint64_t fingerprint = 0;
};

const Fixture& TheFixture() {
  static const Fixture fixture = [] {
    const char* source = std::getenv("STRIDER_SOURCE_DIR");
    Result<ModelConfig> config =
        LoadModelConfig(std::string(source ? source : ".") + "/configs/model/tiny.yaml");
    if (!config.ok()) {
      std::fprintf(stderr, "snapshot_fuzzer: %s\n", config.status().ToString().c_str());
      std::abort();
    }
    at::set_num_threads(1);
    return Fixture{*config, ConfigFingerprint(*config)};
  }();
  return fixture;
}

void Require(bool condition) {
  if (!condition) std::abort();
}

void CheckRefusal(const Status& status) {
  Require(status.IsCorruption() || status.code() == StatusCode::kFailedPrecondition ||
          status.IsInvalidArgument());
}

void DecodeStateChecked(const std::string& bytes, const Fixture& f) {
  Result<SequenceState> state = [&]() -> Result<SequenceState> {
    try {
      return DecodeState(bytes, f.config, at::kFloat, at::kFloat);
    } catch (const std::exception& e) {
      // LibTorch may throw only on allocation; anything else is a bug in the decoder.
      std::fprintf(stderr, "snapshot_fuzzer: DecodeState threw: %s\n", e.what());
      std::abort();
    }
  }();
  if (!state.ok()) {
    Require(state.status().IsCorruption());
    return;
  }
  Require(state->length >= 0 && state->length <= f.config.context);
  Require(static_cast<int64_t>(state->incremental.size()) == f.config.CountLayers('I'));
  Require(static_cast<int64_t>(state->latent_rows.size()) == f.config.CountLayers('G'));
  for (const at::Tensor& rows : state->latent_rows) Require(rows.size(0) == state->length);
  // A decoded state encodes back to the same bytes.
  Require(EncodeState(*state) == bytes);
}

std::string Sealed(std::string body) {
  Hasher whole;
  whole.Update(body.data(), body.size());
  const uint64_t digest = whole.Digest();
  body.append(reinterpret_cast<const char*>(&digest), sizeof(digest));
  return body;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& f = TheFixture();
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      Result<SnapshotRecord> record = DecodeSnapshot(rest, f.config, f.fingerprint);
      if (!record.ok()) CheckRefusal(record.status());
      break;
    }
    case 1: {
      Result<SnapshotRecord> record =
          DecodeSnapshot(Sealed("STRDSNAP" + rest), f.config, f.fingerprint);
      if (!record.ok()) {
        CheckRefusal(record.status());
      } else {
        Require(record->next_logits.empty() ||
                static_cast<int64_t>(record->next_logits.size()) == f.config.vocabulary);
        Require(!record->generating || record->turn.has_value());
      }
      break;
    }
    case 2:
      DecodeStateChecked(rest, f);
      break;
    case 3: {
      SnapshotRecord record;
      record.config_name = f.config.name;
      record.fingerprint = f.fingerprint;
      record.state = rest;
      Result<SnapshotRecord> read = DecodeSnapshot(EncodeSnapshot(record), f.config, f.fingerprint);
      Require(read.ok() && read->state == rest);
      DecodeStateChecked(read->state, f);
      break;
    }
  }
  return 0;
}
