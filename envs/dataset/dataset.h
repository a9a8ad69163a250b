// `dataset`: prompts with reference answers from a JSONL file, scored by a rule verifier or an
// out-of-process one. The way to train on a fixed set of questions instead of a generator.
//
// One JSON object per line (blank lines are skipped):
//   {"prompt": "What is 17 + 25?", "answer": 42, "system": "...", "id": "q1", "metadata": {...}}
// `prompt` (string) and `answer` (string or number) are required; `system` (string), `id`
// (string) and `metadata` (object) are optional; any other key is an error. The whole file is
// read once when the environment is made; a malformed line is an error naming file and line.
//
// An episode is one line: Reset(seed) plays line seed % N (shuffle: false, the default), or the
// line a 64-bit mix of the seed picks (shuffle: true), so neighbouring seeds land far apart.
// The first observation is the system text and a blank line (when set), then the prompt.
// A turn that starts with `answer_prefix` is the answer; without tools every turn is (the
// prefix stripped when present). The answer ends the episode with the verifier's reward as the
// outcome. With tools (`calc`), a turn with a tool call gets the tool's result back.
//
// Options (strings, as every environment's): path (required), verifier (exact | numeric |
// regex | command, default exact), tolerance (numeric: |a - r| <= tol or <= tol * |r|, default
// 1e-6), normalize (exact: trim, collapse whitespace, case-fold; default true), command (a
// shell command line for `command`, run with /bin/sh -c), verifier_timeout_ms (default 10000),
// tools ("" or "calc"), answer_prefix (default "Answer: "), max_turns (default 1, 4 with
// tools), shuffle (default false). The protocol of `command` is in docs/environments.md.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "envs/environment.h"

namespace strider::envs {

struct DatasetRecord {
  std::string prompt;
  std::string answer;  // a number answer as written in the file (its JSON text)
  std::string system;
  std::string id;
  std::string metadata_json = "{}";  // the `metadata` object, serialised
};

// Reads a dataset file. Errors: the file cannot be read, it has no records, or a line is not
// a JSON object of the shape above ("PATH:LINE: why").
Result<std::vector<DatasetRecord>> LoadDataset(const std::string& path);

Result<std::unique_ptr<Environment>> MakeDatasetEnvironment(const Options& options);
// Answers each prompt with its reference (looked up by the prompt text in `path`); a regex
// dataset's reference is a pattern, so the scripted policy scores only where it matches itself.
Result<std::unique_ptr<ScriptedPolicy>> MakeDatasetPolicy(const Options& options);

}  // namespace strider::envs
