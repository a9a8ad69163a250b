// `retrieval`: long-context search over synthetic records revealed across turns.
//
// An episode's documents are fixed-width records (64 bytes each, one line; with the byte
// tokenizer 64 tokens) generated from the seed: couriers, weather, agents and their badges,
// badges and the vaults they open. Two of them answer the question: "Agent N carries badge B"
// sits in the first part, "Badge B opens vault V" in the last, so the answer needs facts from
// far apart. The question comes first; the documents follow in `parts` parts, one per model turn
// that asks for more (a turn without a tool call). The `search` tool returns up to three records
// of the parts shown so far that contain the query.
//
// Documents are never held whole: a part is generated when it is revealed and a search
// regenerates the records it scans, so a 1M-token episode costs a part's text at a time.
//
// Step labels: a search is correct when its results include one of the two answering records,
// incorrect otherwise; the answer "Answer: V" is the outcome (1 or 0).
//
// Options: total_tokens (document length, 128..1048576, default 16384), parts (1..1024,
// default 4).
#pragma once

#include <memory>

#include "common/status.h"
#include "envs/environment.h"

namespace strider::envs {

inline constexpr int64_t kRetrievalRecordBytes = 64;

Result<std::unique_ptr<Environment>> MakeRetrievalEnvironment(const Options& options);
std::unique_ptr<ScriptedPolicy> MakeRetrievalPolicy();

}  // namespace strider::envs
