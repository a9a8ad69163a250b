// Internal to common/tokenizer: a split pattern compiled by PCRE2 (UTF, Unicode properties,
// JIT where the platform has it).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "common/status.h"

namespace strider::tokenizer::internal {

class Regex {
 public:
  // `pattern` in PCRE2 syntax (TranslatePattern's output).
  static Result<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Per-call match state: PCRE2's match data may not be shared between threads.
  class Matcher {
   public:
    explicit Matcher(const Regex& regex);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;

    // The next non-empty match in `subject` (valid UTF-8) at or after `offset`: false when
    // there is none. The whole subject is visible to look-arounds.
    bool Next(std::string_view subject, size_t offset, size_t& start, size_t& end);

   private:
    const Regex& regex_;
    void* match_data_ = nullptr;     // pcre2_match_data_8*
    void* match_context_ = nullptr;  // with a larger JIT stack, made on first need
    void* jit_stack_ = nullptr;
  };

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace strider::tokenizer::internal
