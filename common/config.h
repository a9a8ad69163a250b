// Strict reading of YAML configuration files into typed structs.
//
// The config file is the user's contract, so reading is strict: every key must be known, every
// value must have the right type, and every error names the file, the line and the dotted key
// path ("configs/model/tiny.yaml:7: model.heads: expected an integer, got 'four'"). Defaults live
// in the structs being filled (in-class initialisers), never in the reader.
//
// Usage:
//   STRIDER_ASSIGN_OR_RETURN(ConfigReader root, ConfigReader::FromFile(path));
//   ConfigReader model = root.Section("model");
//   model.Required("width", &config.width);
//   model.Optional("heads", &config.heads);
//   STRIDER_RETURN_IF_ERROR(root.Finish());   // first error, or an unknown key
//
// Readers share one error slot per document: the first problem wins and later calls are no-ops,
// so a loader can read every field and check once at the end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace strider {

class ConfigReader {
 public:
  static Result<ConfigReader> FromFile(const std::string& path);
  // `origin` names the text in messages (a file path, "<inline>").
  static Result<ConfigReader> FromString(const std::string& text, const std::string& origin);

  // A mapping below this one. A missing section reads as empty (all Optional fields keep their
  // defaults, Required ones fail); a present section that is not a mapping is an error.
  ConfigReader Section(const std::string& key);
  bool Has(const std::string& key) const;

  void Required(const std::string& key, int64_t* out);
  void Required(const std::string& key, double* out);
  void Required(const std::string& key, bool* out);
  void Required(const std::string& key, std::string* out);
  void Optional(const std::string& key, int64_t* out);
  void Optional(const std::string& key, int* out);
  void Optional(const std::string& key, double* out);
  void Optional(const std::string& key, bool* out);
  void Optional(const std::string& key, std::string* out);
  void Optional(const std::string& key, std::vector<int64_t>* out);
  void Optional(const std::string& key, std::vector<std::string>* out);
  void Required(const std::string& key, int* out);

  // Elements of a sequence of mappings ("stages: [{...}, {...}]"); empty when absent.
  std::vector<ConfigReader> List(const std::string& key);

  // Records a validation failure for `key` (relative to this mapping) unless one is recorded.
  void Fail(const std::string& key, const std::string& problem);
  // Same as Fail when `condition` is false.
  void Check(bool condition, const std::string& key, const std::string& problem) {
    if (!condition) Fail(key, problem);
  }

  // First error recorded anywhere in the document, else the first key that no reader consumed
  // in this mapping or any section read from it, named with the closest key its mapping knows
  // ("actor.modle: unknown key (did you mean model?)"). When the first error is a missing
  // required key and an unknown key beside it is that key misspelt, both are reported.
  Status Finish();
  // Status so far, without the unknown-key check.
  Status status() const;

  const std::string& origin() const;
  std::string path() const;  // dotted key path of this mapping, "" at the root

 private:
  struct Document;
  struct Node;
  ConfigReader(std::shared_ptr<Document> document, std::shared_ptr<Node> node);
  // Marks `key` read and fails it as a missing required key.
  void FailMissing(const std::string& key);
  // Whether a required key found missing is `known_path` or lies in the section it names.
  bool MisspeltMissing(const std::string& known_path) const;

  std::shared_ptr<Document> document_;
  std::shared_ptr<Node> node_;
};

// `path` as given when it is empty, absolute or exists from the working directory; otherwise the
// first of the config file's directory and its parents that holds it (configs name each other
// relative to the repository root, and are run from anywhere inside it).
std::string ResolveConfigPath(const std::string& path, const std::string& origin);

}  // namespace strider
