// Kimi Linear checkpoints in the Hugging Face layout (common/model/hf_checkpoint.h): figures of
// the published Kimi-Linear-48B-A3B config, export of a generated sharded checkpoint, and the
// refusals.
#include "common/model/hf_checkpoint.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/model/config.h"
#include "common/model/parameters.h"
#include "tests/file_contents.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using strider::testing::ReadFileBytes;
using strider::testing::WriteFileBytes;

namespace fs = std::filesystem;
using testing::TempDir;

std::string FixtureDir() {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  return std::string(source ? source : ".") + "/tests/model/fixtures/kimi_linear_48b_a3b";
}

// Expected figures from scripts/kimi_linear_figures.py on the fixture, run once:
//   scripts/kimi_linear_figures.py tests/model/fixtures/kimi_linear_48b_a3b/config.json
// (a tensor list written from vLLM's kimi_linear model, sharing nothing with the C++ table).
TEST(HfCheckpointTest, PublishedKimiLinear48bFigures) {
  Result<KimiLinearConfig> config =
      ParseKimiLinearConfig(ReadFileBytes(FixtureDir() + "/config.json"), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->num_hidden_layers, 27);
  EXPECT_EQ(config->CountKdaLayers(), 20);
  EXPECT_EQ(config->CountMoeLayers(), 26);
  EXPECT_FALSE(config->kda[3]);  // layer 4 (1-based) is MLA
  EXPECT_TRUE(config->kda[0]);

  const HfParameterFigures f = KimiLinearFigures(*config);
  EXPECT_EQ(f.tensors, 20493);
  EXPECT_EQ(f.total, 49122681728.0);
  EXPECT_EQ(f.active, 3484459904.0);
  EXPECT_EQ(f.active_without_embeddings, 3484459904.0 - 377487360.0);
  const std::map<std::string, double> expected = {
      {"embeddings", 377487360},     {"norms", 126720},
      {"kda_attention", 790285440},  {"dense_mlp", 63700992},
      {"router", 15342080},          {"routed_experts", 47110422528},
      {"shared_experts", 184025088}, {"mla_attention", 203804160},
      {"lm_head", 377487360}};
  EXPECT_EQ(f.total_by_component, expected);
  EXPECT_EQ(f.active_by_component.at("routed_experts"), 47110422528.0 * 8 / 256);
  EXPECT_NE(f.active_formula.find("49122681728 - 47110422528 * (1 - 8/256)"), std::string::npos)
      << f.active_formula;

  Result<HfExpertParallelFootprint> ep = KimiLinearFootprint(*config, 32);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  EXPECT_EQ(ep->experts_per_rank, 8);
  EXPECT_EQ(ep->replicated_parameters, 49122681728.0 - 47110422528.0);
  EXPECT_EQ(ep->parameters_per_rank, 2012259200.0 + 47110422528.0 / 32);
  EXPECT_EQ(ep->weight_bytes_per_rank, 2 * ep->parameters_per_rank);
  EXPECT_EQ(ep->training_bytes_per_rank, 16 * ep->parameters_per_rank);
  EXPECT_FALSE(KimiLinearFootprint(*config, 3).ok());

  // config.json and the index alone (no shards) are enough for the figures.
  TempDir dir;
  fs::copy_file(FixtureDir() + "/config.json", dir.Sub("config.json"));
  SafetensorsIndex index;
  index.total_parameters = 49122681728;
  for (const KimiTensor& tensor : KimiLinearTensors(*config)) {
    index.weight_map[tensor.hf_name] = "model-00001-of-00002.safetensors";
  }
  ASSERT_TRUE(WriteSafetensorsIndex(dir.Sub(kSafetensorsIndexName), index).ok());
  Result<HfCheckpoint> checkpoint = OpenHfCheckpoint(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  EXPECT_EQ(checkpoint->missing_shards.size(), 1u);
  EXPECT_TRUE(CheckKimiLinearTensors(*checkpoint).ok());
  EXPECT_TRUE(RequireShards(*checkpoint).IsNotFound());

  // Every published name the table lists for a KDA layer, as vLLM loads them.
  std::set<std::string> layer0;
  for (const KimiTensor& tensor : KimiLinearTensors(*config)) {
    if (tensor.hf_name.rfind("model.layers.0.self_attn.", 0) == 0) layer0.insert(tensor.hf_name);
  }
  EXPECT_EQ(layer0.size(), 15u);
  EXPECT_TRUE(layer0.count("model.layers.0.self_attn.A_log"));
  EXPECT_TRUE(layer0.count("model.layers.0.self_attn.dt_bias"));
  EXPECT_TRUE(layer0.count("model.layers.0.self_attn.g_b_proj.weight"));
}

// A small kimi_linear config: layers 1-3 KDA and 4 MLA (1-based), one dense layer first.
constexpr const char* kTinyConfig = R"({
  "model_type": "kimi_linear", "vocab_size": 320, "hidden_size": 16, "num_hidden_layers": 4,
  "intermediate_size": 24, "moe_intermediate_size": 8, "num_experts": 4,
  "num_experts_per_token": 2, "num_shared_experts": 1, "first_k_dense_replace": 1,
  "moe_layer_freq": 1, "num_attention_heads": 2, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2,
  "v_head_dim": 4, "kv_lora_rank": 8, "q_lora_rank": null, "tie_word_embeddings": false,
  "rms_norm_eps": 1e-05, "dtype": "bfloat16",
  "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 2,
                         "head_dim": 4, "short_conv_kernel_size": 3}})";

struct Generated {
  std::vector<std::vector<uint8_t>> buffers;  // keeps the views' bytes alive
  std::vector<TensorView> views;
};

// The tensors of kTinyConfig, bf16 except A_log and dt_bias in fp32 (as published), filled
// with distinct bytes; `edit` may rename, reshape or drop a tensor before it is written.
Generated Tensors(const std::function<bool(TensorView&)>& edit = nullptr) {
  Result<KimiLinearConfig> config = ParseKimiLinearConfig(kTinyConfig, "tiny");
  EXPECT_TRUE(config.ok());
  Generated g;
  const auto tensors = KimiLinearTensors(*config);
  g.buffers.reserve(tensors.size());
  for (const KimiTensor& tensor : tensors) {
    const bool fp32 = tensor.hf_name.find(".A_log") != std::string::npos ||
                      tensor.hf_name.find(".dt_bias") != std::string::npos;
    TensorView view;
    view.name = tensor.hf_name;
    view.dtype = fp32 ? DType::kF32 : DType::kBF16;
    view.shape = tensor.shape;
    if (edit && !edit(view)) continue;
    int64_t count = 1;
    for (int64_t dim : view.shape) count *= dim;
    auto& bytes = g.buffers.emplace_back(static_cast<size_t>(count) * DTypeSize(view.dtype));
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<uint8_t>(i * 31 + g.buffers.size() * 7);
    }
    view.data = bytes.data();
    view.byte_size = bytes.size();
    g.views.push_back(std::move(view));
  }
  return g;
}

void WriteCheckpoint(const std::string& dir, const Generated& g, uint64_t shard_bytes = 2000) {
  fs::create_directories(dir);
  WriteFileBytes(dir + "/config.json", kTinyConfig);
  ASSERT_TRUE(WriteShardedSafetensors(dir, g.views, shard_bytes, {{"format", "pt"}}).ok());
}

TEST(HfCheckpointTest, ExportRewritesEveryTensorAndCopiesThePublishedFiles) {
  TempDir dir;
  const std::string source = dir.Sub("source"), out = dir.Sub("out");
  const Generated g = Tensors();
  WriteCheckpoint(source, g);
  WriteFileBytes(source + "/generation_config.json", R"({"eos_token_id": 163586})");
  WriteFileBytes(source + "/tokenizer_config.json", R"({"model_max_length": 1048576})");
  WriteFileBytes(source + "/tiktoken.model", std::string(3000, 'x'));

  Result<HfCheckpoint> checkpoint = OpenHfCheckpoint(source);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  ASSERT_GT(checkpoint->shards.size(), 2u);
  ASSERT_TRUE(CheckKimiLinearTensors(*checkpoint).ok())
      << CheckKimiLinearTensors(*checkpoint).ToString();
  Result<HfExportReport> report = ExportHfCheckpoint(*checkpoint, out);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->tensors, static_cast<int64_t>(g.views.size()));
  EXPECT_EQ(report->copied_files,
            (std::vector<std::string>{"config.json", "generation_config.json", "tiktoken.model",
                                      "tokenizer_config.json"}));
  for (const std::string& name : report->copied_files) {
    EXPECT_EQ(ReadFileBytes(out + "/" + name), ReadFileBytes(source + "/" + name)) << name;
  }
  Result<SafetensorsIndex> index = ReadSafetensorsIndex(out + "/" + kSafetensorsIndexName);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->weight_map, checkpoint->index->weight_map);
  EXPECT_EQ(index->total_size, checkpoint->index->total_size);
  EXPECT_EQ(index->total_parameters, checkpoint->index->total_parameters);
  for (const std::string& shard : checkpoint->shards) {
    // Same names, dtypes, shapes and bytes; our writer's layout is the reference's, so the
    // files themselves come back identical.
    Result<SafetensorsContents> a = ReadSafetensors(source + "/" + shard);
    Result<SafetensorsContents> b = ReadSafetensors(out + "/" + shard);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->tensors.size(), b->tensors.size());
    for (const auto& [name, tensor] : a->tensors) {
      const LoadedTensor& copy = b->tensors.at(name);
      EXPECT_EQ(copy.dtype, tensor.dtype) << name;
      EXPECT_EQ(copy.shape, tensor.shape) << name;
      EXPECT_EQ(copy.bytes, tensor.bytes) << name;
    }
    EXPECT_EQ(b->metadata, a->metadata);
    EXPECT_EQ(ReadFileBytes(out + "/" + shard), ReadFileBytes(source + "/" + shard)) << shard;
  }
  // The export reads as a checkpoint of the same config.
  Result<HfCheckpoint> exported = OpenHfCheckpoint(out);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_TRUE(CheckKimiLinearTensors(*exported).ok());
  EXPECT_FALSE(ExportHfCheckpoint(*checkpoint, source).ok());  // never over its own source
}

TEST(HfCheckpointTest, CountsParametersThreeWaysAndReadsASingleFile) {
  TempDir dir;
  const Generated g = Tensors();
  uint64_t expected = 0, bytes = 0;
  for (const TensorView& view : g.views) {
    uint64_t count = 1;
    for (int64_t dim : view.shape) count *= static_cast<uint64_t>(dim);
    expected += count;
    bytes += view.byte_size;
  }
  WriteCheckpoint(dir.Sub("sharded"), g);
  Result<HfCheckpoint> sharded = OpenHfCheckpoint(dir.Sub("sharded"));
  ASSERT_TRUE(sharded.ok()) << sharded.status().ToString();
  Result<HfParameterCounts> counts = CountHfParameters(*sharded);
  ASSERT_TRUE(counts.ok()) << counts.status().ToString();
  EXPECT_EQ(counts->from_config, expected);
  EXPECT_EQ(counts->from_index, expected);
  EXPECT_EQ(counts->from_headers, expected);
  EXPECT_EQ(counts->header_bytes, bytes);

  // An index whose total_parameters disagrees with the config is refused with both numbers.
  SafetensorsIndex index = *sharded->index;
  index.total_parameters = expected + 1;
  ASSERT_TRUE(WriteSafetensorsIndex(dir.Sub("sharded/") + kSafetensorsIndexName, index).ok());
  Result<HfCheckpoint> wrong = OpenHfCheckpoint(dir.Sub("sharded"));
  ASSERT_TRUE(wrong.ok());
  Status refused = CountHfParameters(*wrong).status();
  EXPECT_NE(refused.message().find(fmt::format("total_parameters {}", expected + 1)),
            std::string::npos)
      << refused.ToString();
  EXPECT_NE(refused.message().find(fmt::format("hold {}", expected)), std::string::npos);

  // One model.safetensors and no index: its header is the list of tensors.
  WriteCheckpoint(dir.Sub("single"), g, 1 << 30);
  ASSERT_TRUE(fs::exists(dir.Sub("single/model.safetensors")));
  Result<HfCheckpoint> single = OpenHfCheckpoint(dir.Sub("single"));
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  EXPECT_FALSE(single->index.has_value());
  EXPECT_TRUE(CheckKimiLinearTensors(*single).ok());
  Result<HfParameterCounts> single_counts = CountHfParameters(*single);
  ASSERT_TRUE(single_counts.ok());
  EXPECT_EQ(single_counts->from_headers, expected);
  EXPECT_FALSE(single_counts->from_index.has_value());
  Result<HfExportReport> report = ExportHfCheckpoint(*single, dir.Sub("single_out"));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(ReadFileBytes(dir.Sub("single_out/model.safetensors")),
            ReadFileBytes(dir.Sub("single/model.safetensors")));
  EXPECT_FALSE(fs::exists(dir.Sub("single_out/") + kSafetensorsIndexName));
}

TEST(HfCheckpointTest, ConvertsMappedTensorsToStriderNamesAndShapes) {
  TempDir dir;
  const Generated g = Tensors();
  WriteCheckpoint(dir.Sub("a"), g);
  Result<HfCheckpoint> checkpoint = OpenHfCheckpoint(dir.Sub("a"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  const std::vector<HfImportTensor> plan = {
      {{"model.embed_tokens.weight"}, "embedding", {320, 16}},
      {{"model.layers.0.self_attn.q_conv1d.weight"}, "layers.0.incremental.query_conv", {8, 3}},
      {{"model.layers.0.self_attn.A_log"}, "layers.0.incremental.decay_log_scale", {2}}};
  ASSERT_TRUE(
      ConvertHfTensors(*checkpoint, plan, DType::kF32, dir.Sub("strider.safetensors")).ok());
  Result<SafetensorsContents> written = ReadSafetensors(dir.Sub("strider.safetensors"));
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  ASSERT_EQ(written->tensors.size(), 3u);
  for (const HfImportTensor& tensor : plan) {
    const LoadedTensor& out = written->tensors.at(tensor.strider_name);
    EXPECT_EQ(out.dtype, DType::kF32);
    EXPECT_EQ(out.shape, tensor.shape);
    const TensorView* source = nullptr;
    for (const TensorView& view : g.views) {
      if (view.name == tensor.hf_names.front()) source = &view;
    }
    ASSERT_NE(source, nullptr);
    const auto* in = static_cast<const uint8_t*>(source->data);
    for (size_t i = 0; i < out.bytes.size() / 4; ++i) {
      // bf16 is the top half of an fp32; an fp32 source is copied as it is. Bits, not values,
      // so NaN patterns among the generated bytes compare too.
      uint32_t expected = 0, got = 0;
      if (source->dtype == DType::kBF16) {
        uint16_t half;
        std::memcpy(&half, in + 2 * i, 2);
        expected = static_cast<uint32_t>(half) << 16;
      } else {
        std::memcpy(&expected, in + 4 * i, 4);
      }
      std::memcpy(&got, out.bytes.data() + 4 * i, 4);
      ASSERT_EQ(got, expected) << tensor.strider_name << " element " << i;
    }
  }

  Status shape = ConvertHfTensors(
      *checkpoint,
      {{{"model.layers.0.self_attn.q_conv1d.weight"}, "layers.0.incremental.query_conv", {8, 4}}},
      DType::kF32, dir.Sub("x.safetensors"));
  EXPECT_NE(shape.message().find("is [8, 1, 3], which does not hold the elements of "
                                 "layers.0.incremental.query_conv [8, 4]"),
            std::string::npos)
      << shape.ToString();
  EXPECT_TRUE(ConvertHfTensors(*checkpoint, {{{"model.absent"}, "x", {1}}}, DType::kF32,
                               dir.Sub("x.safetensors"))
                  .IsNotFound());
  EXPECT_FALSE(ConvertHfTensors(*checkpoint, plan, DType::kBF16, dir.Sub("x.safetensors")).ok());
  EXPECT_FALSE(fs::exists(dir.Sub("x.safetensors")));
}

TEST(HfCheckpointTest, RefusesAnUnsupportedModelTypeAndBadLayerLists) {
  Status other = ParseKimiLinearConfig(R"({"model_type": "llama"})", "config.json").status();
  EXPECT_EQ(other.code(), StatusCode::kUnimplemented);
  EXPECT_NE(other.message().find("model_type 'llama' is not supported"), std::string::npos)
      << other.ToString();
  std::string twice = kTinyConfig;
  twice.replace(twice.find("[4]"), 3, "[3, 4]");
  Status overlap = ParseKimiLinearConfig(twice, "config.json").status();
  EXPECT_NE(overlap.message().find("layer 3 (1-based) appears 2 times"), std::string::npos)
      << overlap.ToString();
  std::string missing = kTinyConfig;
  missing.replace(missing.find("\"kv_lora_rank\": 8,"), 18, "");
  EXPECT_NE(ParseKimiLinearConfig(missing, "c").status().message().find("'kv_lora_rank'"),
            std::string::npos);

  TempDir dir;
  WriteFileBytes(dir.Sub("config.json"), R"({"model_type": "qwen3_moe"})");
  Status refused = OpenHfCheckpoint(dir.path()).status();
  EXPECT_NE(refused.message().find("qwen3_moe"), std::string::npos) << refused.ToString();
  EXPECT_TRUE(OpenHfCheckpoint(dir.Sub("absent")).status().IsNotFound());
}

TEST(HfCheckpointTest, RefusesMissingUnexpectedAndMisshapenTensorsByName) {
  TempDir dir;
  WriteCheckpoint(dir.Sub("a"), Tensors([](TensorView& view) {
                    if (view.name == "model.layers.2.self_attn.A_log") return false;  // missing
                    if (view.name == "model.layers.3.self_attn.kv_b_proj.weight")
                      view.shape = {16, 7};
                    return true;
                  }));
  // An unexpected tensor, in its own shard listed by the index.
  std::vector<uint8_t> extra(16);
  TensorView view{
      "model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {4}, extra.data(), extra.size()};
  ASSERT_TRUE(WriteSafetensors(dir.Sub("a/extra.safetensors"), {view}).ok());
  Result<SafetensorsIndex> index = ReadSafetensorsIndex(dir.Sub("a/") + kSafetensorsIndexName);
  ASSERT_TRUE(index.ok());
  index->weight_map[view.name] = "extra.safetensors";
  ASSERT_TRUE(WriteSafetensorsIndex(dir.Sub("a/") + kSafetensorsIndexName, *index).ok());

  Result<HfCheckpoint> checkpoint = OpenHfCheckpoint(dir.Sub("a"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  Status status = CheckKimiLinearTensors(*checkpoint);
  ASSERT_FALSE(status.ok());
  const std::string& m = status.message();
  EXPECT_NE(m.find("1 missing tensor(s): model.layers.2.self_attn.A_log"), std::string::npos) << m;
  EXPECT_NE(m.find("1 unexpected tensor(s)"), std::string::npos) << m;
  EXPECT_NE(m.find("model.layers.0.self_attn.rotary_emb.inv_freq"), std::string::npos) << m;
  EXPECT_NE(m.find("model.layers.3.self_attn.kv_b_proj.weight is [16, 7]"), std::string::npos) << m;
  EXPECT_NE(m.find("the config gives [16, 8]"), std::string::npos) << m;
}

TEST(HfCheckpointTest, RefusesUnreadableDtypesTruncatedShardsAndDisagreeingIndexes) {
  TempDir dir;
  WriteCheckpoint(dir.Sub("a"), Tensors());
  Result<SafetensorsIndex> index = ReadSafetensorsIndex(dir.Sub("a/") + kSafetensorsIndexName);
  ASSERT_TRUE(index.ok());
  const std::string shard = index->Shards().front();
  const std::string path = dir.Sub("a/") + shard;
  const std::string original = ReadFileBytes(path);

  // A dtype the reader does not know (fp8), spelled in place of BF16 in the header.
  std::string fp8 = original;
  const size_t at = fp8.find("\"BF16\"");
  ASSERT_NE(at, std::string::npos);
  fp8.replace(at, 6, "\"F8E4\"");
  WriteFileBytes(path, fp8);
  Status dtype = OpenHfCheckpoint(dir.Sub("a")).status();
  EXPECT_NE(dtype.message().find("unknown dtype 'F8E4'"), std::string::npos) << dtype.ToString();
  EXPECT_NE(dtype.message().find(shard), std::string::npos) << dtype.ToString();

  WriteFileBytes(path, original.substr(0, original.size() - 5));
  Status truncated = OpenHfCheckpoint(dir.Sub("a")).status();
  EXPECT_TRUE(truncated.IsCorruption()) << truncated.ToString();
  EXPECT_NE(truncated.message().find(shard), std::string::npos) << truncated.ToString();

  std::string malformed = original;
  malformed[8] = 'x';
  WriteFileBytes(path, malformed);
  EXPECT_NE(OpenHfCheckpoint(dir.Sub("a")).status().message().find("not valid JSON"),
            std::string::npos);

  WriteFileBytes(path, original);
  const std::string moved = index->weight_map.begin()->first;
  const std::string other_shard = index->Shards().back();
  index->weight_map[moved] =
      other_shard == index->weight_map.begin()->second ? index->Shards().front() : other_shard;
  ASSERT_TRUE(WriteSafetensorsIndex(dir.Sub("a/") + kSafetensorsIndexName, *index).ok());
  Status disagree = OpenHfCheckpoint(dir.Sub("a")).status();
  EXPECT_TRUE(disagree.IsCorruption()) << disagree.ToString();
  EXPECT_NE(disagree.message().find(moved), std::string::npos) << disagree.ToString();
}

// Kimi Linear's config.json onto Strider's options, as the serving engines compute.
TEST(HfCheckpointTest, MapsTheConfigOntoStriderOptions) {
  Result<KimiLinearConfig> published =
      ParseKimiLinearConfig(ReadFileBytes(FixtureDir() + "/config.json"), "config.json");
  ASSERT_TRUE(published.ok());
  Result<ModelConfig> m = KimiLinearModelConfig(*published);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->vocabulary, 163840);
  EXPECT_EQ(m->width, 2304);
  EXPECT_EQ(m->layer_pattern, "IIIGIIIGIIIGIIIGIIIGIIIGIIG");  // full_attn_layers 4, 8, ..., 27
  EXPECT_FALSE(m->attention_residuals);
  EXPECT_FALSE(m->tie_embeddings);
  EXPECT_FALSE(m->vision.enabled);
  EXPECT_EQ(m->norm_epsilon, 1e-5);
  EXPECT_EQ(m->context, 1048576);
  EXPECT_EQ(m->incremental.heads, 32);
  EXPECT_EQ(m->incremental.key_dim, 128);
  EXPECT_EQ(m->incremental.decay_gate, "softplus");
  EXPECT_EQ(m->incremental.gate_rank, 128);
  EXPECT_EQ(m->latent.query_rank, 0);  // q_lora_rank null
  EXPECT_FALSE(m->latent.output_gate);
  EXPECT_EQ(m->feed_forward.dense_layers, 1);
  EXPECT_EQ(m->feed_forward.activation, "silu");
  EXPECT_FALSE(m->feed_forward.latent_experts);
  EXPECT_EQ(m->feed_forward.routed_experts, 256);
  EXPECT_EQ(m->feed_forward.experts_per_token, 8);
  EXPECT_EQ(m->feed_forward.shared_hidden, 1024);
  EXPECT_EQ(m->feed_forward.routed_scaling_factor, 2.446);
  EXPECT_FALSE(m->feed_forward.quantile_balancing);
  // Strider's parameter count of the imported config is the published one, less nothing but
  // the learner's value head.
  EXPECT_EQ(CountParameters(*m).total - CountParameters(*m).total_by_component.at("value_head"),
            49122681728.0);

  // The YAML an import writes reads back to the same config.
  TempDir dir;
  WriteFileBytes(dir.Sub("model.yaml"), ModelConfigYaml(*m));
  Result<ModelConfig> again = LoadModelConfig(dir.Sub("model.yaml"));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ModelConfigYaml(*again), ModelConfigYaml(*m));
  Result<ModelConfig> tiny = LoadModelConfig(
      std::string(std::getenv("STRIDER_SOURCE_DIR") ? std::getenv("STRIDER_SOURCE_DIR") : ".") +
      "/configs/model/tiny.yaml");
  ASSERT_TRUE(tiny.ok());
  WriteFileBytes(dir.Sub("tiny.yaml"), ModelConfigYaml(*tiny));
  Result<ModelConfig> tiny_again = LoadModelConfig(dir.Sub("tiny.yaml"));
  ASSERT_TRUE(tiny_again.ok()) << tiny_again.status().ToString();
  EXPECT_EQ(ModelConfigYaml(*tiny_again), ModelConfigYaml(*tiny));
  EXPECT_EQ(CountParameters(*tiny_again).total, CountParameters(*tiny).total);
}

TEST(HfCheckpointTest, RefusesConfigsTheModelDoesNotExpressByField) {
  auto refused = [](const std::string& from, const std::string& to) {
    std::string text = kTinyConfig;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    Result<KimiLinearConfig> config = ParseKimiLinearConfig(text, "config.json");
    if (!config.ok()) return config.status();
    return PlanKimiLinearImport(*config).status();
  };
  EXPECT_NE(
      refused("\"moe_layer_freq\": 1", "\"moe_layer_freq\": 2").message().find("moe_layer_freq 2"),
      std::string::npos);
  EXPECT_NE(refused("\"dtype\"", "\"hidden_act\": \"gelu\", \"dtype\"")
                .message()
                .find("hidden_act 'gelu'"),
            std::string::npos);
  EXPECT_NE(
      refused("\"dtype\"", "\"mla_use_nope\": false, \"dtype\"").message().find("mla_use_nope"),
      std::string::npos);
  EXPECT_NE(refused("\"dtype\"", "\"num_key_value_heads\": 1, \"dtype\"")
                .message()
                .find("num_key_value_heads 1"),
            std::string::npos);
  EXPECT_NE(refused("\"dtype\"", "\"use_grouped_topk\": 3, \"dtype\"")
                .message()
                .find("'use_grouped_topk' is 3"),
            std::string::npos);
  // Kimi K3's attention residuals are the seed's own; with no published tensor for their
  // queries the import names the parameter it cannot fill.
  Status k3 = refused("\"dtype\"", "\"attn_res_block_size\": 2, \"dtype\"");
  EXPECT_EQ(k3.code(), StatusCode::kUnimplemented) << k3.ToString();
  EXPECT_NE(k3.message().find("residual_queries"), std::string::npos) << k3.ToString();
  EXPECT_TRUE(refused("\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 1e-05").ok());

  // Every row of the table that maps names a Strider parameter; every row that does not says why.
  for (const KimiTensorRule& rule : KimiLinearTensorTable()) {
    if (rule.maps) {
      EXPECT_FALSE(rule.strider.empty()) << rule.hf;
    } else {
      EXPECT_FALSE(rule.note.empty()) << rule.hf;
    }
  }
}

// Splits a Strider weights file into the files of an expert-parallel learner's ranks: each
// holds everything but the routed experts whole, and rows [r n/R, (r+1) n/R) of those.
void SplitExperts(const std::string& path, int ranks, const std::string& prefix) {
  Result<SafetensorsContents> whole = ReadSafetensors(path);
  ASSERT_TRUE(whole.ok());
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::vector<uint8_t>> keep;
    std::vector<TensorView> views;
    int64_t first = 0, count = 0;
    for (const auto& [name, tensor] : whole->tensors) {
      TensorView view{name, tensor.dtype, tensor.shape, tensor.bytes.data(), tensor.bytes.size()};
      if (name.find(".routed_") != std::string::npos) {
        count = tensor.shape[0] / ranks;
        first = r * count;
        const size_t row = tensor.bytes.size() / static_cast<size_t>(tensor.shape[0]);
        keep.emplace_back(tensor.bytes.begin() + first * row,
                          tensor.bytes.begin() + (first + count) * row);
        view.shape[0] = count;
        view.data = keep.back().data();
        view.byte_size = keep.back().size();
      }
      views.push_back(view);
    }
    std::map<std::string, std::string> metadata = whole->metadata;
    metadata["expert_shard"] = fmt::format("{}:{}", first, count);
    keep.reserve(keep.size());
    ASSERT_TRUE(WriteSafetensors(fmt::format("{}{}.safetensors", prefix, r), views, metadata).ok());
  }
}

// Import then export gives the published shards back byte for byte: the same names, dtypes
// (bf16, with A_log and dt_bias in fp32), shapes, header metadata and bytes, NaN patterns among
// the generated bytes included; from one weights file and from an expert-parallel learner's.
TEST(HfCheckpointTest, ImportThenExportGivesThePublishedShardsBackByteForByte) {
  TempDir dir;
  const std::string source = dir.Sub("source"), imported = dir.Sub("imported");
  const Generated g = Tensors();
  WriteCheckpoint(source, g);
  WriteFileBytes(source + "/generation_config.json", R"({"eos_token_id": 163586})");
  WriteFileBytes(source + "/tiktoken.model", std::string(3000, 'x'));
  Result<HfImportReport> report = ImportHfCheckpoint(source, imported);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->published_tensors, static_cast<int64_t>(g.views.size()));

  Result<ModelConfig> config = LoadModelConfig(report->config_path);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->name, "source");
  Result<SafetensorsContents> weights = ReadSafetensors(report->weights_path);
  ASSERT_TRUE(weights.ok());
  std::set<std::string> expected;
  for (const ParameterSpec& spec : ModelParameterSpecs(*config)) {
    expected.insert(spec.name);
    ASSERT_TRUE(weights->tensors.count(spec.name)) << spec.name;
    EXPECT_EQ(weights->tensors.at(spec.name).shape, spec.shape) << spec.name;
    EXPECT_EQ(weights->tensors.at(spec.name).dtype, DType::kF32) << spec.name;
  }
  EXPECT_EQ(weights->tensors.size(), expected.size());
  // Expert 3 of layer 2's w2 is the fourth row block of routed_down, widened from bf16.
  {
    const TensorView* w2 = nullptr;
    for (const TensorView& view : g.views) {
      if (view.name == "model.layers.2.block_sparse_moe.experts.3.w2.weight") w2 = &view;
    }
    ASSERT_NE(w2, nullptr);
    const LoadedTensor& down = weights->tensors.at("layers.2.experts.routed_down");
    ASSERT_EQ(down.shape, (std::vector<int64_t>{4, 16, 8}));
    const size_t per_expert = 16 * 8;
    for (size_t i = 0; i < per_expert; ++i) {
      uint16_t half;
      std::memcpy(&half, static_cast<const uint8_t*>(w2->data) + 2 * i, 2);
      uint32_t got;
      std::memcpy(&got, down.bytes.data() + 4 * (3 * per_expert + i), 4);
      ASSERT_EQ(got, static_cast<uint32_t>(half) << 16) << i;
    }
  }
  // The value head starts at zero.
  for (uint8_t byte : weights->tensors.at("value_head.weight").bytes) ASSERT_EQ(byte, 0);

  auto same_as_source = [&](const std::string& out, const std::vector<std::string>& files) {
    Result<HfExportReport> exported =
        ExportStriderWeightsToHf(*config, files, report->layout_directory, out);
    ASSERT_TRUE(exported.ok()) << exported.status().ToString();
    Result<HfCheckpoint> original = OpenHfCheckpoint(source);
    ASSERT_TRUE(original.ok());
    EXPECT_EQ(exported->shards, static_cast<int64_t>(original->shards.size()));
    for (const std::string& shard : original->shards) {
      EXPECT_EQ(ReadFileBytes(out + "/" + shard), ReadFileBytes(source + "/" + shard)) << shard;
    }
    for (const char* file : {"config.json", "generation_config.json", "tiktoken.model"}) {
      EXPECT_EQ(ReadFileBytes(out + "/" + file), ReadFileBytes(source + "/" + file)) << file;
    }
    EXPECT_FALSE(fs::exists(out + "/" + kHfLayoutFile));
    Result<SafetensorsIndex> a = ReadSafetensorsIndex(source + "/" + kSafetensorsIndexName);
    Result<SafetensorsIndex> b = ReadSafetensorsIndex(out + "/" + kSafetensorsIndexName);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(b->weight_map, a->weight_map);
    EXPECT_EQ(b->total_size, a->total_size);
    EXPECT_EQ(b->total_parameters, a->total_parameters);
    Result<HfCheckpoint> reopened = OpenHfCheckpoint(out);
    ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
    EXPECT_TRUE(CheckKimiLinearTensors(*reopened).ok());
  };
  same_as_source(dir.Sub("exported"), {report->weights_path});

  // An expert-parallel learner's checkpoint: two ranks, each with half of every routed tensor.
  SplitExperts(report->weights_path, 2, dir.Sub("rank"));
  same_as_source(dir.Sub("exported_ep"),
                 {dir.Sub("rank1.safetensors"), dir.Sub("rank0.safetensors")});
  Status half = ExportStriderWeightsToHf(*config, {dir.Sub("rank1.safetensors")},
                                         report->layout_directory, dir.Sub("half"))
                    .status();
  EXPECT_TRUE(half.IsNotFound()) << half.ToString();
  EXPECT_NE(half.message().find("layers.1.experts.routed_"), std::string::npos) << half.ToString();

  // A model config that is not the checkpoint's is refused with both shapes.
  ModelConfig other = *config;
  other.feed_forward.expert_hidden = 6;
  Status mismatch = ExportStriderWeightsToHf(other, {report->weights_path},
                                             report->layout_directory, dir.Sub("x"))
                        .status();
  EXPECT_NE(mismatch.message().find("layers.1.experts.routed_gate is [4, 6, 16], the published "
                                    "layout needs [4, 8, 16]"),
            std::string::npos)
      << mismatch.ToString();

  // The in-memory conversion gives the bytes of the imported file's tensors.
  Result<HfModelWeights> loaded = LoadHfCheckpoint(source);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  Result<SafetensorsContents> decoded = DecodeSafetensors(loaded->weights);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->tensors.size(), weights->tensors.size());
  for (const auto& [name, tensor] : weights->tensors) {
    EXPECT_EQ(decoded->tensors.at(name).bytes, tensor.bytes) << name;
  }
  EXPECT_EQ(ModelConfigYaml(loaded->config).substr(ModelConfigYaml(loaded->config).find("vocab")),
            ModelConfigYaml(*config).substr(ModelConfigYaml(*config).find("vocab")));
}

// The other published dtypes come back too: fp16 (its subnormals, infinities and NaN payloads
// among the generated bytes) through fp32, and fp64 through an fp64 import.
TEST(HfCheckpointTest, ImportThenExportKeepsFp16AndFp64Bytes) {
  for (DType stored : {DType::kF16, DType::kF64}) {
    SCOPED_TRACE(std::string(DTypeName(stored)));
    TempDir dir;
    const std::string source = dir.Sub("source");
    WriteCheckpoint(source, Tensors([&](TensorView& view) {
                      if (view.dtype == DType::kBF16) view.dtype = stored;
                      return true;
                    }));
    Result<HfImportReport> report = ImportHfCheckpoint(source, dir.Sub("imported"));
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    Result<SafetensorsHeader> header = ReadSafetensorsHeader(report->weights_path);
    ASSERT_TRUE(header.ok());
    EXPECT_EQ(header->entries.front().dtype, stored == DType::kF64 ? DType::kF64 : DType::kF32);
    Result<ModelConfig> config = LoadModelConfig(report->config_path);
    ASSERT_TRUE(config.ok());
    Result<HfExportReport> exported = ExportStriderWeightsToHf(
        *config, {report->weights_path}, report->layout_directory, dir.Sub("out"));
    ASSERT_TRUE(exported.ok()) << exported.status().ToString();
    Result<HfCheckpoint> original = OpenHfCheckpoint(source);
    ASSERT_TRUE(original.ok());
    for (const std::string& shard : original->shards) {
      EXPECT_EQ(ReadFileBytes(dir.Sub("out/") + shard), ReadFileBytes(source + "/" + shard))
          << shard;
    }
  }
}

// The refusals of an import: missing and unexpected tensors (named) and misshapen ones (both
// shapes) stop it before anything is written.
TEST(HfCheckpointTest, ImportRefusesBeforeWritingAnything) {
  TempDir dir;
  WriteCheckpoint(dir.Sub("a"), Tensors([](TensorView& view) {
                    if (view.name == "model.layers.1.self_attn.dt_bias") return false;
                    if (view.name == "model.layers.3.self_attn.kv_b_proj.weight")
                      view.shape = {16, 7};
                    return true;
                  }));
  Status status = ImportHfCheckpoint(dir.Sub("a"), dir.Sub("out")).status();
  EXPECT_NE(status.message().find("missing tensor(s): model.layers.1.self_attn.dt_bias"),
            std::string::npos)
      << status.ToString();
  EXPECT_NE(status.message().find("model.layers.3.self_attn.kv_b_proj.weight is [16, 7]"),
            std::string::npos)
      << status.ToString();
  EXPECT_FALSE(fs::exists(dir.Sub("out/weights.safetensors")));
  EXPECT_FALSE(LoadHfCheckpoint(dir.Sub("a")).ok());
}

}  // namespace
}  // namespace strider
