// Split patterns through PCRE2, and the rewriting that makes PCRE2 read them as the reference
// libraries do.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/tokenizer/regex.h"

#include <pcre2.h>

#include <string>

#include "common/tokenizer/bpe.h"

namespace strider::tokenizer::internal {
namespace {

// Unicode White_Space, the \s of Oniguruma and of Rust's regex. PCRE2's \s with UCP adds
// U+180E (Mongolian vowel separator, a format character since Unicode 6.3).
constexpr std::string_view kWhiteSpaceItems =
    "\\t-\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// Copies the escape at pattern[i] ('\\') to `out`, rewriting \s (and \S outside a class);
// returns the index after it.
Result<size_t> CopyEscape(std::string_view pattern, size_t i, bool in_class, std::string& out) {
  if (i + 1 >= pattern.size()) return Status::InvalidArgument("pattern ends with a backslash");
  const char d = pattern[i + 1];
  if (d == 's') {
    if (in_class) {
      out += kWhiteSpaceItems;
    } else {
      out += '[';
      out += kWhiteSpaceItems;
      out += ']';
    }
    return i + 2;
  }
  if (d == 'S' && !in_class) {
    out += "[^";
    out += kWhiteSpaceItems;
    out += ']';
    return i + 2;
  }
  if ((d == 'p' || d == 'P' || d == 'x') && i + 2 < pattern.size() && pattern[i + 2] == '{') {
    const size_t close = pattern.find('}', i + 2);
    if (close == std::string_view::npos) return Status::InvalidArgument("unclosed \\p{ or \\x{");
    out.append(pattern.substr(i, close + 1 - i));
    return close + 1;
  }
  if (d == 'Q') {
    const size_t close = pattern.find("\\E", i + 2);
    const size_t end = close == std::string_view::npos ? pattern.size() : close + 2;
    out.append(pattern.substr(i, end - i));
    return end;
  }
  out.append(pattern.substr(i, 2));
  return i + 2;
}

}  // namespace

Result<std::string> TranslatePattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  size_t class_open = 0;  // where the current class's '[' is in `out`
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\') {
      STRIDER_ASSIGN_OR_RETURN(i, CopyEscape(pattern, i, in_class, out));
      continue;
    }
    if (!in_class) {
      if (c == '[') {
        in_class = true;
        class_open = out.size();
        out += '[';
        ++i;
        if (i < pattern.size() && pattern[i] == '^') out += pattern[i++];
        if (i < pattern.size() && pattern[i] == ']') out += pattern[i++];  // a literal ']'
        continue;
      }
      out += c;
      ++i;
      continue;
    }
    if (c == ']') {
      in_class = false;
      out += c;
      ++i;
      continue;
    }
    if (c == '[' && pattern.substr(i, 2) == "[:") {
      const size_t close = pattern.find(":]", i + 2);
      if (close == std::string_view::npos) return Status::InvalidArgument("unclosed [: class");
      out.append(pattern.substr(i, close + 2 - i));
      i = close + 2;
      continue;
    }
    if (c == '&' && pattern.substr(i, 4) == "&&[^") {
      // [A&&[^B]]: A without B, which PCRE2 10.42 cannot write as a class.
      const std::string a = out.substr(class_open + 1);
      if (!a.empty() && a[0] == '^') {
        return Status::Unimplemented("class intersection of a negated class");
      }
      std::string b;
      size_t j = i + 4;
      while (j < pattern.size() && pattern[j] != ']') {
        if (pattern[j] == '\\') {
          STRIDER_ASSIGN_OR_RETURN(j, CopyEscape(pattern, j, /*in_class=*/true, b));
        } else {
          b += pattern[j++];
        }
      }
      if (pattern.substr(j, 2) != "]]") {
        return Status::Unimplemented("class intersection other than [A&&[^B]]");
      }
      out.resize(class_open);
      out += "(?:(?![" + b + "])[" + a + "])";
      in_class = false;
      i = j + 2;
      continue;
    }
    if (c == '[') return Status::Unimplemented("nested character class");
    out += c;
    ++i;
  }
  if (in_class) return Status::InvalidArgument("unclosed character class");
  return out;
}

Result<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::InvalidArgument("split pattern at offset " + std::to_string(error_offset) +
                                   ": " + reinterpret_cast<const char*>(message));
  }
  std::unique_ptr<Regex> regex(new Regex());
  regex->code_ = code;
  // Without JIT (a platform PCRE2 lacks it for) the interpreter gives the same matches.
  regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return regex;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

Regex::Matcher::Matcher(const Regex& regex) : regex_(regex) {
  match_data_ =
      pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(regex.code_), nullptr);
}

Regex::Matcher::~Matcher() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(match_context_));
  pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
}

bool Regex::Matcher::Next(std::string_view subject, size_t offset, size_t& start, size_t& end) {
  auto* code = static_cast<const pcre2_code*>(regex_.code_);
  auto* data = static_cast<pcre2_match_data*>(match_data_);
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  while (offset < subject.size()) {
    auto* context = static_cast<pcre2_match_context*>(match_context_);
    // The subject was validated (or made valid) before splitting: no UTF check per match.
    const int rc =
        regex_.jit_
            ? pcre2_jit_match(code, text, subject.size(), offset, 0, data, context)
            : pcre2_match(code, text, subject.size(), offset, PCRE2_NO_UTF_CHECK, data, context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack_ == nullptr) {
      // Long runs (a megabyte of spaces against \s+(?!\S)) outgrow the default 32 KiB stack.
      jit_stack_ = pcre2_jit_stack_create(1 << 15, 1 << 28, nullptr);
      match_context_ = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_assign(static_cast<pcre2_match_context*>(match_context_), nullptr,
                             jit_stack_);
      continue;
    }
    if (rc < 0) return false;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    if (ovector[1] > ovector[0]) {
      start = ovector[0];
      end = ovector[1];
      return true;
    }
    // An empty match splits nothing: look again from the next character.
    offset = ovector[0] + 1;
    while (offset < subject.size() &&
           (static_cast<unsigned char>(subject[offset]) & 0xC0) == 0x80) {
      ++offset;
    }
  }
  return false;
}

}  // namespace strider::tokenizer::internal
