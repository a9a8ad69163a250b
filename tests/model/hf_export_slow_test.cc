// Streaming export, import and export from Strider's weights of a generated multi-GB Kimi
// Linear checkpoint (about 2.3 GB in 4 shards): peak resident memory stays within one shard plus
// a constant each time, and every shard comes back byte for byte. Labelled slow: it writes and
// reads about 15 GB under the temporary directory (at most about 9 GB at once), which it deletes
// afterwards.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/model/config.h"
#include "common/model/hf_checkpoint.h"
#include "common/process_memory.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

namespace fs = std::filesystem;

// Six layers (KDA 1, 2, 3, 5; MLA 4, 6; 1-based), one dense layer, 64 experts of width 1024 on
// a 1024-wide model: the routed experts are most of the 1.13e9 parameters, as in the real one.
constexpr const char* kConfig = R"({
  "model_type": "kimi_linear", "vocab_size": 32768, "hidden_size": 1024,
  "num_hidden_layers": 6, "intermediate_size": 4096, "moe_intermediate_size": 1024,
  "num_experts": 64, "num_experts_per_token": 4, "num_shared_experts": 1,
  "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_attention_heads": 8,
  "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "kv_lora_rank": 256,
  "q_lora_rank": null, "tie_word_embeddings": false, "rms_norm_eps": 1e-05,
  "dtype": "bfloat16",
  "linear_attn_config": {"kda_layers": [1, 2, 3, 5], "full_attn_layers": [4, 6],
                         "num_heads": 8, "head_dim": 128, "short_conv_kernel_size": 4}})";
constexpr int kShards = 4;

bool SameFiles(const std::string& a, const std::string& b) {
  std::ifstream x(a, std::ios::binary), y(b, std::ios::binary);
  std::vector<char> p(1 << 20), q(1 << 20);
  while (x && y) {
    x.read(p.data(), static_cast<std::streamsize>(p.size()));
    y.read(q.data(), static_cast<std::streamsize>(q.size()));
    if (x.gcount() != y.gcount() || !std::equal(p.begin(), p.begin() + x.gcount(), q.begin())) {
      return false;
    }
  }
  return x.eof() && y.eof();
}

TEST(HfExportSlowTest, PeakResidentMemoryStaysWithinOneShard) {
  testing::TempDir dir;
  const std::string source = dir.Sub("source"), out = dir.Sub("out");
  fs::create_directories(source);
  std::ofstream(source + "/config.json") << kConfig;
  Result<KimiLinearConfig> config = ParseKimiLinearConfig(kConfig, "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();

  // Generate the shards one at a time from one reused buffer of the largest tensor's size, so
  // the generator holds 64 MiB, not the checkpoint.
  const std::vector<KimiTensor> tensors = KimiLinearTensors(*config);
  uint64_t total = 0, largest = 0;
  for (const KimiTensor& t : tensors) {
    total += 2 * static_cast<uint64_t>(t.Count());
    largest = std::max<uint64_t>(largest, 2 * static_cast<uint64_t>(t.Count()));
  }
  ASSERT_GT(total, 2'000'000'000u);
  std::vector<uint8_t> fill(largest);
  for (size_t i = 0; i < fill.size(); ++i) fill[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
  SafetensorsIndex index;
  index.total_size = total;
  std::vector<TensorView> shard;
  uint64_t in_shard = 0, largest_shard = 0;
  int written = 0;
  auto flush = [&] {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", ++written, kShards);
    ASSERT_TRUE(WriteSafetensors(source + "/" + name, shard).ok());
    for (const TensorView& view : shard) index.weight_map[view.name] = name;
    largest_shard = std::max(largest_shard, in_shard);
    shard.clear();
    in_shard = 0;
  };
  for (const KimiTensor& t : tensors) {
    TensorView view{t.hf_name, DType::kBF16, t.shape, fill.data(),
                    2 * static_cast<size_t>(t.Count())};
    if (in_shard + view.byte_size > total / kShards + 1 && written < kShards - 1) flush();
    in_shard += view.byte_size;
    shard.push_back(std::move(view));
  }
  flush();
  ASSERT_EQ(written, kShards);
  ASSERT_TRUE(WriteSafetensorsIndex(source + "/" + kSafetensorsIndexName, index).ok());
  std::vector<uint8_t>().swap(fill);

  ResetPeakResident();
  const int64_t before = ResidentBytes();
  Result<HfCheckpoint> checkpoint = OpenHfCheckpoint(source);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  ASSERT_TRUE(CheckKimiLinearTensors(*checkpoint).ok());
  Result<HfExportReport> report = ExportHfCheckpoint(*checkpoint, out);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const int64_t peak = PeakResidentBytes();
  ASSERT_GT(peak, 0) << "the kernel reports no VmHWM";
  const int64_t growth = peak - before;
  std::printf(
      "checkpoint %.2f GB in %d shards (largest %.0f MiB, largest tensor %.0f MiB): "
      "resident before %.0f MiB, peak %.0f MiB, growth %.1f MiB\n",
      total / 1e9, kShards, largest_shard / 1048576.0, largest / 1048576.0, before / 1048576.0,
      peak / 1048576.0, growth / 1048576.0);
  EXPECT_EQ(report->tensor_bytes, total);
  // The bound the streaming promises: one shard plus a constant. Mapped pages are released
  // tensor by tensor, so in practice the growth is about one tensor.
  EXPECT_LT(growth, static_cast<int64_t>(largest_shard) + (64 << 20));

  for (const std::string& name : checkpoint->shards) {
    EXPECT_TRUE(SameFiles(source + "/" + name, out + "/" + name)) << name;
  }
  EXPECT_TRUE(SameFiles(source + "/config.json", out + "/config.json"));
  fs::remove_all(out);

  // Import into Strider's fp32 weights: the same bound, though the weights file it writes is
  // twice the checkpoint.
  ResetPeakResident();
  const int64_t before_import = ResidentBytes();
  Result<HfImportReport> imported = ImportHfCheckpoint(source, dir.Sub("imported"));
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  const int64_t import_growth = PeakResidentBytes() - before_import;
  std::printf("import: %.2f GB of fp32 weights, peak growth %.1f MiB\n",
              imported->weight_bytes / 1e9, import_growth / 1048576.0);
  EXPECT_EQ(imported->weight_bytes, 2 * total + 1024 * 4 + 4);  // and the value head, zeros
  EXPECT_LT(import_growth, static_cast<int64_t>(largest_shard) + (64 << 20));

  // And back from those weights to the published shards, byte for byte (the generated bytes
  // hold NaN and infinity patterns too).
  Result<ModelConfig> model = LoadModelConfig(imported->config_path);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ResetPeakResident();
  const int64_t before_export = ResidentBytes();
  Result<HfExportReport> back = ExportStriderWeightsToHf(
      *model, {imported->weights_path}, imported->layout_directory, dir.Sub("back"));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const int64_t export_growth = PeakResidentBytes() - before_export;
  std::printf("export from Strider weights: peak growth %.1f MiB\n", export_growth / 1048576.0);
  EXPECT_LT(export_growth, static_cast<int64_t>(largest_shard) + (64 << 20));
  for (const std::string& name : checkpoint->shards) {
    EXPECT_TRUE(SameFiles(source + "/" + name, dir.Sub("back/") + name)) << name;
  }
}

}  // namespace
}  // namespace strider
