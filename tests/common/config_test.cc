#include "common/config.h"

#include <gtest/gtest.h>

namespace strider {
namespace {

struct Example {
  int64_t width = 64;
  int heads = 4;
  double rate = 0.5;
  bool gated = false;
  std::string name = "tiny";
  std::vector<int64_t> sizes;
};

Status Load(const std::string& text, Example* out) {
  STRIDER_ASSIGN_OR_RETURN(ConfigReader root, ConfigReader::FromString(text, "example.yaml"));
  ConfigReader model = root.Section("model");
  model.Required("width", &out->width);
  model.Optional("heads", &out->heads);
  model.Optional("rate", &out->rate);
  model.Optional("gated", &out->gated);
  model.Optional("name", &out->name);
  model.Optional("sizes", &out->sizes);
  model.Check(out->width % out->heads == 0, "heads", "must divide model.width");
  return root.Finish();
}

TEST(ConfigReader, ReadsTypedValuesAndKeepsDefaults) {
  Example example;
  ASSERT_TRUE(Load("model:\n  width: 128\n  gated: true\n  sizes: [1, 2, 3]\n", &example).ok());
  EXPECT_EQ(example.width, 128);
  EXPECT_EQ(example.heads, 4);
  EXPECT_TRUE(example.gated);
  EXPECT_EQ(example.sizes, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(example.name, "tiny");
}

TEST(ConfigReader, UnknownKeyIsAnErrorNamingFileLineAndKey) {
  Example example;
  Status status = Load("model:\n  width: 128\n  hedas: 8\n", &example);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("example.yaml:3"), std::string::npos) << status.ToString();
  EXPECT_NE(status.message().find("model.hedas"), std::string::npos) << status.ToString();
  EXPECT_NE(status.message().find("unknown key"), std::string::npos) << status.ToString();
}

TEST(ConfigReader, UnknownKeyNamesTheClosestKnownKey) {
  Example example;
  Status status = Load("model:\n  width: 128\n  hedas: 8\n", &example);
  EXPECT_NE(status.message().find("model.hedas: unknown key (did you mean heads?)"),
            std::string::npos)
      << status.ToString();
  status = Load("model:\n  width: 128\n  gatd: true\n", &example);
  EXPECT_NE(status.message().find("model.gatd: unknown key (did you mean gated?)"),
            std::string::npos)
      << status.ToString();
  // Nothing close: no guess.
  status = Load("model:\n  width: 128\n  layers: 8\n", &example);
  EXPECT_NE(status.message().find("model.layers: unknown key (check its spelling and section)"),
            std::string::npos)
      << status.ToString();
  // A misspelt section is named beside the required key it hid.
  status = Load("modle:\n  width: 128\n", &example);
  EXPECT_NE(status.message().find("model.width: is required but missing; example.yaml:1: modle: "
                                  "unknown key (did you mean model?)"),
            std::string::npos)
      << status.ToString();
}

TEST(ConfigReader, MisspeltRequiredKeyIsNamedBesideTheMissingOne) {
  Example example;
  const Status status = Load("model:\n  heads: 2\n  widht: 128\n", &example);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("example.yaml: model.width: is required but missing"),
            std::string::npos)
      << status.ToString();
  EXPECT_NE(status.message().find("example.yaml:3: model.widht: unknown key (did you mean width?)"),
            std::string::npos)
      << status.ToString();
}

TEST(ConfigReader, AfterAnotherErrorOnlyTheMissingKeysMisspellingIsAdded) {
  // The first error is not a missing key: readers may have stopped early, so unread keys are
  // not called unknown.
  Example example;
  Status status = Load("model:\n  width: wide\n  layers: 8\n", &example);
  EXPECT_EQ(status.message().find("unknown key"), std::string::npos) << status.ToString();
  // A missing key and an unrelated unknown one: only the missing key is reported.
  status = Load("model:\n  heads: 2\n  layers: 8\n", &example);
  EXPECT_NE(status.message().find("model.width: is required but missing"), std::string::npos);
  EXPECT_EQ(status.message().find("unknown key"), std::string::npos) << status.ToString();
}

TEST(ConfigReader, WrongTypeIsAnError) {
  Example example;
  Status status = Load("model:\n  width: wide\n", &example);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("model.width: expected an integer, got 'wide'"),
            std::string::npos)
      << status.ToString();
  EXPECT_FALSE(Load("model:\n  width: 3.5\n", &example).ok());
  EXPECT_FALSE(Load("model:\n  width: 8\n  gated: maybe\n", &example).ok());
  EXPECT_FALSE(Load("model:\n  width: 8\n  sizes: 3\n", &example).ok());
}

TEST(ConfigReader, MissingRequiredAndInconsistentValues) {
  Example example;
  Status missing = Load("model:\n  heads: 2\n", &example);
  EXPECT_NE(missing.message().find("model.width: is required"), std::string::npos)
      << missing.ToString();
  Status inconsistent = Load("model:\n  width: 10\n  heads: 4\n", &example);
  EXPECT_NE(inconsistent.message().find("model.heads: must divide"), std::string::npos)
      << inconsistent.ToString();
}

TEST(ConfigReader, MalformedYamlAndMissingFile) {
  EXPECT_FALSE(ConfigReader::FromString("model: [unclosed\n", "bad.yaml").ok());
  EXPECT_FALSE(ConfigReader::FromString("- a\n- b\n", "list.yaml").ok());
  Result<ConfigReader> missing = ConfigReader::FromFile("/nonexistent/strider.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(missing.status().IsNotFound());
}

// Found by config_fuzz: YAML allows a list or a mapping as a key, and Finish threw on it.
TEST(ConfigReader, AKeyThatIsNotTextIsAnErrorNamingItsLine) {
  auto root = ConfigReader::FromString("server:\n  bind: x\n? [a, b]\n: 1\n", "odd.yaml");
  ASSERT_TRUE(root.ok());
  std::string bind;
  root->Section("server").Optional("bind", &bind);
  const Status status = root->Finish();
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(status.IsInvalidArgument());
  EXPECT_NE(status.message().find("odd.yaml:3"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("a key must be plain text"), std::string::npos);
}

TEST(ConfigReader, ListsOfSections) {
  auto root = ConfigReader::FromString("stages:\n  - {length: 8}\n  - {length: 64, extra: 1}\n",
                                       "stages.yaml");
  ASSERT_TRUE(root.ok());
  std::vector<int64_t> lengths;
  for (ConfigReader stage : root->List("stages")) {
    int64_t length = 0;
    stage.Required("length", &length);
    lengths.push_back(length);
  }
  EXPECT_EQ(lengths, (std::vector<int64_t>{8, 64}));
  Status status = root->Finish();
  EXPECT_NE(status.message().find("stages[1].extra"), std::string::npos) << status.ToString();
}

}  // namespace
}  // namespace strider
