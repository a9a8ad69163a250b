// `strider keys generate --out DIR [--name NAME ...] [--force]`: CURVE key pairs for the
// services' endpoints (docs/fleet.md, "Authentication (CURVE)").
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/transport/curve.h"

namespace strider::cli {
namespace {

struct KeysFlags {
  std::string out;
  std::vector<std::string> names;
  bool force = false;
};

Status Generate(const KeysFlags& flags) {
  const std::vector<std::string> names =
      flags.names.empty() ? std::vector<std::string>{"strider"} : flags.names;
  // Every name is checked before anything is written: a half-made set is worse than none.
  std::vector<transport::CurveKeyPair> pairs;
  for (const std::string& name : names) {
    STRIDER_ASSIGN_OR_RETURN(transport::CurveKeyPair pair, transport::GenerateCurveKeyPair());
    pairs.push_back(std::move(pair));
    if (std::count(names.begin(), names.end(), name) > 1) {
      return Status::InvalidArgument("--name " + name + " is given twice");
    }
    if (!flags.force) {
      for (const char* suffix : {".key", ".key_secret"}) {
        const std::string path = flags.out + "/" + name + suffix;
        if (std::FILE* file = std::fopen(path.c_str(), "r")) {
          std::fclose(file);
          return Status::AlreadyExists(path + " exists; pass --force to replace the pair");
        }
      }
    }
  }
  for (size_t i = 0; i < names.size(); ++i) {
    STRIDER_RETURN_IF_ERROR(
        transport::WriteCurveKeyFiles(flags.out, names[i], pairs[i], flags.force));
    std::printf("%s/%s.key  %s\n%s/%s.key_secret  (secret, mode 0600)\n", flags.out.c_str(),
                names[i].c_str(), pairs[i].public_key.c_str(), flags.out.c_str(),
                names[i].c_str());
  }
  return Status::Ok();
}

}  // namespace

void AddKeysCommands(CLI::App& app, int& exit_code) {
  CLI::App* keys = app.add_subcommand(
      "keys", "CURVE keys that authenticate and encrypt the services' ZeroMQ endpoints");
  keys->require_subcommand(1);
  auto flags = std::make_shared<KeysFlags>();
  CLI::App* generate = keys->add_subcommand(
      "generate",
      "Write a key pair per name: DIR/NAME.key (the public key, for the peers that trust NAME) "
      "and DIR/NAME.key_secret (the pair, mode 0600, for NAME alone)");
  generate->add_option("--out", flags->out, "directory for the key files (created)")->required();
  generate->add_option("--name", flags->names,
                       "a name per pair (repeatable; letters, digits, '-', '_', '.'); default: "
                       "strider");
  generate->add_flag("--force", flags->force, "replace existing key files of these names");
  generate->callback([flags, &exit_code] {
    Status status = Generate(*flags);
    if (!status.ok()) exit_code = ReportError(status);
  });
}

}  // namespace strider::cli
