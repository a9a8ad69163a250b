// The subset of Jinja2 that Hugging Face chat templates use, rendered the way transformers'
// `apply_chat_template` renders them: an ImmutableSandboxedEnvironment with trim_blocks and
// lstrip_blocks, the loop controls, transformers' own `tojson` (json.dumps with
// ensure_ascii=False), `raise_exception`, `strftime_now` and `namespace`. Values behave as their
// Python counterparts do there (str() of None is "None", a list prints as its repr, `x.y` on a
// dict reads the item, a loop body's assignments stay in the loop), because a prompt that differs
// by one byte from the reference is a different prompt.
//
// Supported: text with {{ }}, {% %} and {# #} and their whitespace control (- and +); for (with
// else, an inline if, unpacking, loop.*), if/elif/else, set (names, namespace attributes, tuples,
// blocks), macro with defaults, break/continue, transformers' generation block; literals, the
// arithmetic, comparison, logic, ~, in and conditional operators, attribute and item access,
// slices, calls, the filters and tests that published templates use, and the str/dict methods
// they call. Anything else (include, extends, import, call blocks, filter blocks, raw) is
// rejected at parse time with its line and column, never rendered approximately.
//
// No LibTorch, no Python.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strider::tokenizer::jinja {

struct Program;

class Template {
 public:
  // Parses `source` (the template text as written in tokenizer_config.json or a .jinja file).
  // Errors name `origin`, the line and the column.
  static Result<Template> Parse(std::string_view source, std::string_view origin = "template");

  // Renders with `variables` (a JSON object: messages, tools, add_generation_prompt, bos_token,
  // ...) as the template's context. Errors raised by the template (raise_exception), undefined
  // values used in ways Python rejects, and type errors come back as InvalidArgument with the
  // line and column of the expression.
  Result<std::string> Render(const nlohmann::ordered_json& variables) const;

  // What strftime_now(format) returns; the default is the local time, as in transformers. Tests
  // set a fixed clock so that templates that print today's date render reproducibly.
  using Strftime = std::function<std::string(const std::string& format)>;
  void set_strftime(Strftime strftime) { strftime_ = std::move(strftime); }

 private:
  std::shared_ptr<const Program> program_;
  Strftime strftime_;
};

}  // namespace strider::tokenizer::jinja
