#include "common/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

namespace strider {

struct ConfigReader::Document {
  std::string origin;
  Status first_error;
  // Dotted paths of required keys found missing, so Finish can name a misspelt key beside them.
  std::set<std::string> missing;
};

struct ConfigReader::Node {
  YAML::Node yaml;       // a mapping, or null for an absent section
  std::string path;      // "model.moe"
  std::set<std::string> consumed;
  std::vector<std::shared_ptr<Node>> children;  // sections read from here, checked by Finish
};

namespace {

std::string Join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string LineOf(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.line < 0) return "";
  return std::to_string(mark.line + 1);
}

// Edit distance with adjacent transpositions counted as one edit ("modle" is one from "model").
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitution = d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, substitution});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The known key closest to `key`, or "" when none is close enough to be a plausible typo: at
// most two edits, and fewer than a third of the longer word, so short keys are not matched to
// unrelated short keys.
std::string ClosestKey(const std::string& key, const std::set<std::string>& known) {
  std::string best;
  size_t best_distance = 0;
  for (const std::string& candidate : known) {
    const size_t distance = EditDistance(key, candidate);
    const size_t longer = std::max(key.size(), candidate.size());
    if (distance > 2 || 3 * distance > longer) continue;
    if (best.empty() || distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace

ConfigReader::ConfigReader(std::shared_ptr<Document> document, std::shared_ptr<Node> node)
    : document_(std::move(document)), node_(std::move(node)) {}

Result<ConfigReader> ConfigReader::FromString(const std::string& text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& error) {
    return Status::InvalidArgument(origin + ":" + std::to_string(error.mark.line + 1) +
                                   ": not valid YAML: " + error.msg);
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    return Status::InvalidArgument(origin + ": the top level must be a mapping of keys to values");
  }
  auto document = std::make_shared<Document>();
  document->origin = origin;
  auto node = std::make_shared<Node>();
  node->yaml = root;
  return ConfigReader(document, node);
}

Result<ConfigReader> ConfigReader::FromFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Status::NotFound(path + ": cannot open config file");
  std::stringstream text;
  text << file.rdbuf();
  return FromString(text.str(), path);
}

const std::string& ConfigReader::origin() const { return document_->origin; }
std::string ConfigReader::path() const { return node_->path; }

bool ConfigReader::Has(const std::string& key) const {
  return node_->yaml.IsMap() && node_->yaml[key].IsDefined() && !node_->yaml[key].IsNull();
}

void ConfigReader::Fail(const std::string& key, const std::string& problem) {
  if (!document_->first_error.ok()) return;
  std::string where = document_->origin;
  if (node_->yaml.IsMap() && node_->yaml[key].IsDefined()) {
    const std::string line = LineOf(node_->yaml[key]);
    if (!line.empty()) where += ":" + line;
  }
  document_->first_error = Status::InvalidArgument(where + ": " + Join(node_->path, key) + ": " +
                                                   problem);
}

void ConfigReader::FailMissing(const std::string& key) {
  node_->consumed.insert(key);
  document_->missing.insert(Join(node_->path, key));
  Fail(key, "is required but missing");
}

ConfigReader ConfigReader::Section(const std::string& key) {
  auto child = std::make_shared<Node>();
  child->path = Join(node_->path, key);
  node_->consumed.insert(key);
  if (Has(key)) {
    YAML::Node value = node_->yaml[key];
    if (value.IsMap()) {
      child->yaml = value;
    } else {
      Fail(key, "expected a mapping of keys to values");
    }
  }
  node_->children.push_back(child);
  return ConfigReader(document_, child);
}

std::vector<ConfigReader> ConfigReader::List(const std::string& key) {
  std::vector<ConfigReader> items;
  node_->consumed.insert(key);
  if (!Has(key)) return items;
  YAML::Node value = node_->yaml[key];
  if (!value.IsSequence()) {
    Fail(key, "expected a list");
    return items;
  }
  for (size_t i = 0; i < value.size(); ++i) {
    auto child = std::make_shared<Node>();
    child->path = Join(node_->path, key) + "[" + std::to_string(i) + "]";
    if (!value[i].IsMap()) {
      Fail(key, "element " + std::to_string(i) + " must be a mapping of keys to values");
      return items;
    }
    child->yaml = value[i];
    node_->children.push_back(child);
    items.push_back(ConfigReader(document_, child));
  }
  return items;
}

namespace {

// Scalar conversions that refuse what yaml-cpp would silently coerce (3.5 into an int, "yes"
// into a string where a number was meant is fine, but a mapping never is).
bool ParseInt(const YAML::Node& node, int64_t* out) {
  if (!node.IsScalar()) return false;
  const std::string& text = node.Scalar();
  if (text.empty()) return false;
  size_t used = 0;
  try {
    // Accept 1_000_000 as YAML 1.1 does, and plain 1000000.
    std::string digits;
    for (char c : text) {
      if (c != '_') digits.push_back(c);
    }
    const long long value = std::stoll(digits, &used, 0);
    if (used != digits.size()) return false;
    *out = value;
    return true;
  } catch (...) {
    return false;
  }
}

bool ParseDouble(const YAML::Node& node, double* out) {
  if (!node.IsScalar()) return false;
  try {
    size_t used = 0;
    const std::string& text = node.Scalar();
    const double value = std::stod(text, &used);
    if (used != text.size()) return false;
    *out = value;
    return true;
  } catch (...) {
    return false;
  }
}

bool ParseBool(const YAML::Node& node, bool* out) {
  if (!node.IsScalar()) return false;
  const std::string& text = node.Scalar();
  if (text == "true" || text == "True" || text == "yes") {
    *out = true;
    return true;
  }
  if (text == "false" || text == "False" || text == "no") {
    *out = false;
    return true;
  }
  return false;
}

std::string Shown(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

}  // namespace

#define STRIDER_CONFIG_SCALAR(Type, Parse, what)                         \
  void ConfigReader::Optional(const std::string& key, Type* out) {       \
    node_->consumed.insert(key);                                         \
    if (!Has(key)) return;                                               \
    const YAML::Node value = node_->yaml[key];                           \
    if (!Parse(value, out)) Fail(key, std::string("expected ") + what + \
                                          ", got " + Shown(value));      \
  }                                                                      \
  void ConfigReader::Required(const std::string& key, Type* out) {       \
    if (!Has(key)) {                                                     \
      FailMissing(key);                                                  \
      return;                                                            \
    }                                                                    \
    Optional(key, out);                                                  \
  }

STRIDER_CONFIG_SCALAR(int64_t, ParseInt, "an integer")
STRIDER_CONFIG_SCALAR(double, ParseDouble, "a number")
STRIDER_CONFIG_SCALAR(bool, ParseBool, "true or false")
#undef STRIDER_CONFIG_SCALAR

void ConfigReader::Optional(const std::string& key, int* out) {
  int64_t wide = *out;
  Optional(key, &wide);
  if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max()) {
    Fail(key, "value " + std::to_string(wide) + " does not fit in 32 bits");
    return;
  }
  *out = static_cast<int>(wide);
}

void ConfigReader::Required(const std::string& key, int* out) {
  if (!Has(key)) {
    FailMissing(key);
    return;
  }
  Optional(key, out);
}

void ConfigReader::Optional(const std::string& key, std::string* out) {
  node_->consumed.insert(key);
  if (!Has(key)) return;
  const YAML::Node value = node_->yaml[key];
  if (!value.IsScalar()) {
    Fail(key, "expected a string, got " + Shown(value));
    return;
  }
  *out = value.Scalar();
}

void ConfigReader::Required(const std::string& key, std::string* out) {
  if (!Has(key)) {
    FailMissing(key);
    return;
  }
  Optional(key, out);
}

void ConfigReader::Optional(const std::string& key, std::vector<int64_t>* out) {
  node_->consumed.insert(key);
  if (!Has(key)) return;
  const YAML::Node value = node_->yaml[key];
  if (!value.IsSequence()) {
    Fail(key, "expected a list of integers, got " + Shown(value));
    return;
  }
  std::vector<int64_t> items(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    if (!ParseInt(value[i], &items[i])) {
      Fail(key, "element " + std::to_string(i) + " is not an integer: " + Shown(value[i]));
      return;
    }
  }
  *out = std::move(items);
}

void ConfigReader::Optional(const std::string& key, std::vector<std::string>* out) {
  node_->consumed.insert(key);
  if (!Has(key)) return;
  const YAML::Node value = node_->yaml[key];
  if (!value.IsSequence()) {
    Fail(key, "expected a list of strings, got " + Shown(value));
    return;
  }
  std::vector<std::string> items(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].IsScalar()) {
      Fail(key, "element " + std::to_string(i) + " is not a string: " + Shown(value[i]));
      return;
    }
    items[i] = value[i].Scalar();
  }
  *out = std::move(items);
}

Status ConfigReader::status() const { return document_->first_error; }

bool ConfigReader::MisspeltMissing(const std::string& known_path) const {
  for (const std::string& missing : document_->missing) {
    if (missing == known_path) return true;
    // A missing key inside the section: "model.width" for "model", "stages[0].length" for
    // "stages".
    if (missing.size() > known_path.size() &&
        missing.compare(0, known_path.size(), known_path) == 0 &&
        (missing[known_path.size()] == '.' || missing[known_path.size()] == '[')) {
      return true;
    }
  }
  return false;
}

Status ConfigReader::Finish() {
  // Depth-first over this mapping and every section read from it. The keys a mapping's readers
  // asked for are its known keys, so an unknown one is named with the closest of them.
  std::vector<std::shared_ptr<Node>> pending{node_};
  while (!pending.empty()) {
    std::shared_ptr<Node> node = pending.back();
    pending.pop_back();
    if (node->yaml.IsMap()) {
      for (const auto& entry : node->yaml) {
        std::string where = document_->origin;
        const std::string line = LineOf(entry.first);
        if (!line.empty()) where += ":" + line;
        if (!entry.first.IsScalar()) {
          // YAML allows a mapping or a list as a key ("? [a, b]: 1"); no config has one.
          if (document_->first_error.ok()) {
            return Status::InvalidArgument(where + ": " + Join(node->path, "?") +
                                           ": a key must be plain text");
          }
          continue;
        }
        const std::string key = entry.first.Scalar();
        if (node->consumed.count(key) != 0) continue;
        const std::string closest = ClosestKey(key, node->consumed);
        const std::string unknown = where + ": " + Join(node->path, key) + ": unknown key " +
                                    (closest.empty() ? "(check its spelling and section)"
                                                     : "(did you mean " + closest + "?)");
        if (document_->first_error.ok()) return Status::InvalidArgument(unknown);
        // After another error, readers may have stopped early, so only the misspelling of a
        // missing required key, or of the section that held one, is certain enough to add.
        if (!closest.empty() && MisspeltMissing(Join(node->path, closest))) {
          return Status(document_->first_error.code(),
                        document_->first_error.message() + "; " + unknown);
        }
      }
    }
    for (const auto& child : node->children) pending.push_back(child);
  }
  return document_->first_error;
}

std::string ResolveConfigPath(const std::string& path, const std::string& origin) {
  namespace fs = std::filesystem;
  if (path.empty() || fs::path(path).is_absolute() || fs::exists(path)) return path;
  for (fs::path dir = fs::absolute(origin).parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir / path)) return (dir / path).string();
    if (dir == dir.parent_path()) break;
  }
  return path;
}

}  // namespace strider
