// Chat templates against transformers' apply_chat_template (tests/tokenizer/
// make_chat_fixtures.py, transformers 5.25.0 and jinja2 3.1.6): every committed conversation
// through every committed model template, byte for byte; the Jinja semantics the templates rely
// on; errors for malformed templates and constructs outside the subset; and the role of every
// token of rendered episodes read back by ChatRoleReader.
#include "common/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/tokenizer/jinja.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/file_contents.h"
#include "tests/scratch_dir.h"

namespace strider::tokenizer {
namespace {

using strider::testing::ReadFileBytes;

using Json = nlohmann::ordered_json;
using transcript::Role;

std::string DataPath(const std::string& name) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  return std::string(source ? source : ".") + "/tests/tokenizer/data/" + name;
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream file(path, std::ios::binary);
  file << contents;
  ASSERT_TRUE(file.good()) << path;
}

const Json& Cases() {
  static const Json cases = Json::parse(ReadFileBytes(DataPath("chat/cases.json")));
  return cases;
}

ChatTemplate Load(const std::string& name) {
  const Json& entry = Cases()["templates"][name];
  Result<ChatTemplate> chat =
      ChatTemplate::FromSource(ReadFileBytes(DataPath("chat/" + entry["file"].get<std::string>())),
                               entry["special_tokens"], name);
  EXPECT_TRUE(chat.ok()) << chat.status().ToString();
  return std::move(chat).value();
}

ChatRenderOptions OptionsOf(const Json& c) {
  ChatRenderOptions options;
  options.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  options.tools = c["tools"];
  options.variables = c["variables"];
  return options;
}

TEST(ChatTemplateTest, EveryFixtureIsByteIdenticalToTransformers) {
  ASSERT_GE(Cases()["templates"].size(), 6u);
  int rendered = 0, failures = 0;
  for (const auto& [name, entry] : Cases()["templates"].items()) {
    const ChatTemplate chat = Load(name);
    for (const Json& c : entry["cases"]) {
      SCOPED_TRACE(name + " / " + c["name"].get<std::string>());
      Result<std::string> out = chat.Render(c["messages"], OptionsOf(c));
      if (c.contains("expected")) {
        ASSERT_TRUE(out.ok()) << out.status().ToString();
        EXPECT_EQ(*out, c["expected"].get<std::string>());
        ++rendered;
        continue;
      }
      // transformers raised: so must we, with the template's own message where it wrote one.
      ++failures;
      ASSERT_FALSE(out.ok()) << *out;
      const std::string error = c["error"].get<std::string>();
      const std::string prefix = "TemplateError: ";
      if (error.rfind(prefix, 0) == 0) {
        EXPECT_NE(out.status().message().find(error.substr(prefix.size())), std::string::npos)
            << out.status().ToString();
      }
    }
  }
  EXPECT_GE(rendered, 50);
  EXPECT_GE(failures, 3);
}

TEST(ChatTemplateTest, LoadsEveryConfigLayout) {
  testing::TempDir dir;
  const std::string source = ReadFileBytes(DataPath("chat/qwen3.jinja"));
  const Json messages = Json::array({{{"role", "user"}, {"content", "Hi"}}});
  ChatRenderOptions prompt;
  prompt.add_generation_prompt = true;
  const std::string want = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";

  // "chat_template" as a string.
  const std::string one = dir.path() + "/one.json";
  WriteFile(one, Json{{"chat_template", source}, {"eos_token", "<|im_end|>"}}.dump());
  Result<ChatTemplate> a = ChatTemplate::Load(one);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a->Render(messages, prompt), want);
  EXPECT_EQ(a->special_tokens()["eos_token"], "<|im_end|>");

  // A list of named templates; "default" unless a name is given.
  const std::string named = dir.path() + "/named.json";
  WriteFile(named,
            Json{{"chat_template",
                  Json::array({{{"name", "default"}, {"template", source}},
                               {{"name", "tool_use"}, {"template", "T{{ tools|length }}"}}})},
                 {"bos_token", {{"content", "<s>"}, {"special", true}}}}
                .dump());
  Result<ChatTemplate> b = ChatTemplate::Load(named);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(*b->Render(messages, prompt), want);
  EXPECT_EQ(b->special_tokens()["bos_token"], "<s>");
  Result<ChatTemplate> tool_use = ChatTemplate::Load(named, "tool_use");
  ASSERT_TRUE(tool_use.ok());
  ChatRenderOptions with_tools;
  with_tools.tools = Json::array({Json::object(), Json::object()});
  EXPECT_EQ(*tool_use->Render(messages, with_tools), "T2");
  Result<ChatTemplate> missing = ChatTemplate::Load(named, "rag");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("default, tool_use"), std::string::npos);

  // chat_template.jinja beside a config without the key, read through either file.
  std::filesystem::create_directories(dir.path() + "/model");
  WriteFile(dir.path() + "/model/tokenizer_config.json", Json{{"eos_token", "<|im_end|>"}}.dump());
  WriteFile(dir.path() + "/model/chat_template.jinja", source);
  for (const char* file : {"/model/tokenizer_config.json", "/model/chat_template.jinja"}) {
    Result<ChatTemplate> c = ChatTemplate::Load(dir.path() + file);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(*c->Render(messages, prompt), want);
    EXPECT_EQ(c->special_tokens()["eos_token"], "<|im_end|>");
  }
  EXPECT_FALSE(ChatTemplate::Load(dir.path() + "/absent.json").ok());
  EXPECT_FALSE(a->Render(Json::array(), prompt).ok());  // as transformers: no empty conversation
}

std::string RenderJinja(const std::string& source, const Json& variables = Json::object()) {
  Result<jinja::Template> t = jinja::Template::Parse(source);
  if (!t.ok()) return "PARSE ERROR: " + t.status().message();
  Result<std::string> out = t->Render(variables);
  if (!out.ok()) return "ERROR: " + out.status().message();
  return *out;
}

// Outputs jinja2 3.1.6 gives in transformers' environment (trim_blocks, lstrip_blocks).
TEST(JinjaTest, MatchesJinjaSemantics) {
  // A loop body's assignments stay in its iteration; a macro reads top-level names at call time.
  EXPECT_EQ(RenderJinja(
                "{% set c = 0 %}{% for i in range(3) %}{% set c = c + 1 %}{{c}}{% endfor %}|{{c}}"),
            "111|0");
  EXPECT_EQ(RenderJinja("{% for i in range(3) %}{% if i == 0 %}{% set c = 5 %}{% endif %}{{c}},{% "
                        "endfor %}|{{c}}"),
            "5,,,|");
  EXPECT_EQ(RenderJinja("{% set x = 1 %}{% macro m() %}{{x}}{% endmacro %}{% set x = 2 %}{{m()}}"),
            "2");
  EXPECT_EQ(
      RenderJinja("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}"
                  "{% endfor %}{{ ns.n }}"),
      "6");
  // Python's str() and repr().
  EXPECT_EQ(RenderJinja("{{ [1,'a',None,True,1.5,{'k':'v'}] }}|{{ 1e20 }}|{{ 0.1+0.2 }}|{{ 3/2 }}|"
                        "{{ 7//2 }}|{{ -7 % 3 }}"),
            "[1, 'a', None, True, 1.5, {'k': 'v'}]|1e+20|0.30000000000000004|1.5|3|2");
  EXPECT_EQ(RenderJinja("{{ 'abc'[1:] }}|{{ 'a,b'.split(',') }}|{{ x.y is defined }}",
                        Json{{"x", Json::object()}}),
            "bc|['a', 'b']|False");
  EXPECT_EQ(RenderJinja("{{ none }}|{{ (1,2) }}|{{ 'it\\'s' }}|{{ ['it\\'s', \"q\\\"\"] }}"),
            "None|(1, 2)|it's|[\"it's\", 'q\"']");
  EXPECT_EQ(RenderJinja(
                "{{ 2 ** 10 }}|{{ 10 / 5 }}|{{ 1 == 1.0 }}|{{ 'a' ~ 1 ~ none }}|{{ [1,2] + [3] }}|"
                "{{ 'ab' * 2 }}"),
            "1024|2.0|True|a1None|[1, 2, 3]|abab");
  // Whitespace: lstrip_blocks before block and comment tags, trim_blocks after them.
  EXPECT_EQ(RenderJinja("  {% if true %}\n  x\n  {% endif %}\n  {{ 'y' }}  \n{# c #}\n  z"),
            "  x\n  y  \n  z");
  EXPECT_EQ(RenderJinja("a  {%- if true -%}  \n b {%+ if true %}c{% endif %}\n{% endif %}\nd\n"),
            "ab cd");
  // transformers' tojson: json.dumps(ensure_ascii=False), with indent where asked.
  EXPECT_EQ(RenderJinja("{{ x | tojson }}",
                        Json{{"x", {{"b", Json::array({1, 2.0, "é\n\"", nullptr, true})}}}}),
            "{\"b\": [1, 2.0, \"é\\n\\\"\", null, true]}");
  EXPECT_EQ(RenderJinja("{{ x | tojson(indent=2) }}",
                        Json{{"x", {{"a", Json::array({1})}, {"b", Json::object()}}}}),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
  // Slices, loop variables, filters and tests the templates use.
  EXPECT_EQ(RenderJinja(
                "{% for m in xs[::-1] %}{{ loop.index0 }}{{ m }}{% if not loop.last %},{% endif %}"
                "{% endfor %}",
                Json{{"xs", Json::array({"a", "b", "c"})}}),
            "0c,1b,2a");
  EXPECT_EQ(RenderJinja("{% for i in range(5, -1, -2) %}{{ i }}{% endfor %}|{% for k, v in d | "
                        "items %}{{ k }}={{ v }};"
                        "{% endfor %}|{{ d.get('z', 'none') }}",
                        Json{{"d", {{"a", 1}, {"b", 2}}}}),
            "531|a=1;b=2;|none");
  EXPECT_EQ(
      RenderJinja(
          "{{ '  x\n' | trim }}|{{ 'a\n\n'.rstrip('\n') }}|{{ 'ABC'.lower() }}|{{ ['b','a'] | "
          "join('-') }}|"
          "{{ 5 is divisibleby 5 }}|{{ 'x' is string }}|{{ none is none }}|{{ [] is iterable }}"),
      "x|a|abc|b-a|True|True|True|True");
  EXPECT_EQ(RenderJinja("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{% else %}none{% endfor %}"
                        "{% for x in [] %}{% else %}empty{% endfor %}{% for x in [1,2,3] %}{% if x "
                        "== 2 %}{% break %}"
                        "{% endif %}{{ x }}{% endfor %}"),
            "24empty1");
  EXPECT_EQ(RenderJinja("{{ 'a' if false }}|{{ 'b' if false else 'c' }}|{{ x | default('d') }}|"
                        "{{ [3,1,2] | sort | list }}|{{ ['a','b'] | map('upper') | list }}"),
            "|c|d|[1, 2, 3]|['A', 'B']");
}

// More of jinja2 3.1.6's answers: Python's rounding, number and string formatting, code-point
// slicing and case mapping, block assignments, tojson's options.
TEST(JinjaTest, MatchesPythonFormatting) {
  const Json xs = Json{{"xs", Json::array({1, 2, 3})}};
  EXPECT_EQ(RenderJinja("{{ 0.5 | round }}{{ 1.5 | round }}{{ 2.675 | round(2) }}{{ 7 | round }}"),
            "0.02.02.677");
  EXPECT_EQ(
      RenderJinja("{% for m in xs %}{{ loop.cycle('a', 'b') }}{{ loop.revindex }}{{ loop.first }}"
                  "{% endfor %}",
                  xs),
      "a3Trueb2Falsea1False");
  EXPECT_EQ(
      RenderJinja("{{ '%s-%d' % ('x', 3) }}|{{ 1.5e-7 }}|{{ 123456789012345678.0 }}|{{ 1e16 }}|"
                  "{{ 0.0001 }}|{{ -10 // 3 }}|{{ 10 % -3 }}"),
      "x-3|1.5e-07|1.2345678901234568e+17|1e+16|0.0001|-4|-2");
  EXPECT_EQ(
      RenderJinja("{{ 'héllo'[1:3] }}|{{ 'héllo'[::-1] }}|{{ [1,2,3,4][::2] }}|{{ 'ß'.upper() }}|"
                  "{{ 'a b  c'.split() }}|{{ 'a,b,c'.rsplit(',', 1) }}"),
      "él|olléh|[1, 3]|SS|['a', 'b', 'c']|['a,b', 'c']");
  EXPECT_EQ(
      RenderJinja("{% set blk %}  inner {{ 1 }}  {% endset %}[{{ blk }}]{% set t | trim %}  x  "
                  "{% endset %}[{{ t }}]"),
      "[  inner 1  ][x]");
  EXPECT_EQ(
      RenderJinja(
          "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}{{ 'é' | tojson(ensure_ascii=true) }}"
          "{{ [1, {'a': 'b'}] | tojson(separators=(',', ':')) }}"),
      "{\"a\": 2, \"b\": 1}\"\\u00e9\"[1,{\"a\":\"b\"}]");
}

TEST(JinjaTest, MalformedTemplatesNameLineAndColumn) {
  const auto error = [](const std::string& source) {
    Result<jinja::Template> t = jinja::Template::Parse(source, "bad.jinja");
    return t.ok() ? std::string("parsed") : t.status().message();
  };
  EXPECT_EQ(error("ok\n  {% if x %}\nabc"),
            "bad.jinja: line 2, column 6: 'if' is never closed: the template ends before 'endif'");
  EXPECT_EQ(error("{{ x + }}"), "bad.jinja: line 1, column 8: unexpected end of tag");
  EXPECT_EQ(error("a\n{{ x | frobnicate }}"),
            "bad.jinja: line 2, column 6: unsupported filter 'frobnicate'");
  EXPECT_EQ(error("{{ x is frobnicated }}"),
            "bad.jinja: line 1, column 6: unsupported test 'frobnicated'");
  EXPECT_EQ(error("{% endfor %}"),
            "bad.jinja: line 1, column 4: unexpected 'endfor': no block is open here");
  EXPECT_EQ(error("{{ 'abc }}"), "bad.jinja: line 1, column 4: unterminated string literal");
  EXPECT_EQ(error("{{ a }"),
            "bad.jinja: line 1, column 7: unexpected end of template, expected '}}'");
  EXPECT_EQ(error("{# never closed"), "bad.jinja: line 1, column 1: unterminated comment");
  EXPECT_EQ(error("{% for x in y %}{% endif %}"),
            "bad.jinja: line 1, column 20: unexpected 'endif': no block is open here");
  EXPECT_EQ(error("{{ a ; b }}"), "bad.jinja: line 1, column 6: unexpected character ';'");
  // Constructs outside the subset are refused, never approximated.
  EXPECT_EQ(error("{% include 'other.jinja' %}"),
            "bad.jinja: line 1, column 4: unsupported construct 'include'");
  EXPECT_EQ(error("x\n{% extends 'base' %}"),
            "bad.jinja: line 2, column 4: unsupported construct 'extends'");
  EXPECT_EQ(error("{% call m() %}{% endcall %}"),
            "bad.jinja: line 1, column 4: unsupported construct 'call'");
  EXPECT_EQ(error("{% raw %}{{ x }}{% endraw %}"),
            "bad.jinja: line 1, column 4: unsupported construct 'raw'");
  EXPECT_EQ(error("{% for x in y recursive %}{% endfor %}"),
            "bad.jinja: line 1, column 15: unsupported construct 'recursive' loop");
}

TEST(JinjaTest, RuntimeErrorsNameTheExpression) {
  EXPECT_EQ(RenderJinja("{{ raise_exception('no system role') }}"),
            "ERROR: line 1, column 19: raise_exception: no system role");
  EXPECT_EQ(RenderJinja("\n {{ x.y.z }}", Json{{"x", Json::object()}}),
            "ERROR: line 2, column 8: 'dict object' has no attribute 'y'");
  EXPECT_EQ(RenderJinja("{{ 1 + 'a' }}"),
            "ERROR: line 1, column 6: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(RenderJinja("{{ '</think>' in m.content }}", Json{{"m", Json::object()}}),
            "ERROR: line 1, column 4: 'dict object' has no attribute 'content'");
  EXPECT_EQ(RenderJinja("{{ xs.append(1) }}", Json{{"xs", Json::array()}}),
            "ERROR: line 1, column 6: access to attribute 'append' of 'list' object is unsafe");
}

// The section-1 byte-level BPE with a template's markers added (special, or added only as
// Qwen's <tool_call> is), so rendered prompts tokenise as the model's would.
std::unique_ptr<Tokenizer> TokenizerWith(const std::vector<std::string>& special,
                                         const std::vector<std::string>& added = {}) {
  Json spec = Json::parse(ReadFileBytes(DataPath("bpe_llama3.json")));
  int32_t next = static_cast<int32_t>(spec["model"]["vocab"].size()) + 16;
  for (const auto* list : {&special, &added}) {
    for (const std::string& text : *list) {
      bool present = false;
      for (const Json& token : spec["added_tokens"]) present = present || token["content"] == text;
      if (present) continue;
      spec["added_tokens"].push_back({{"id", next++},
                                      {"content", text},
                                      {"single_word", false},
                                      {"lstrip", false},
                                      {"rstrip", false},
                                      {"normalized", false},
                                      {"special", list == &special}});
    }
  }
  Result<std::unique_ptr<Tokenizer>> tok = ParseTokenizer(spec.dump(), {}, "test tokenizer");
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return std::move(tok).value();
}

// Checks every token's role: `segments` (role, text) concatenate to the rendering, and each token
// has the role of the segment holding its first byte.
void ExpectRoles(const std::string& name, const Tokenizer& tok, const Json& messages,
                 const Json& tools, const std::vector<std::pair<Role, std::string>>& segments) {
  SCOPED_TRACE(name);
  const ChatTemplate chat = Load(name);
  ChatRenderOptions options;
  options.tools = tools;
  Result<std::string> text = chat.Render(messages, options);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  std::string joined;
  for (const auto& [role, piece] : segments) joined += piece;
  ASSERT_EQ(joined, *text);
  Result<ChatRoleReader> reader = ChatRoleReader::Create(chat, tok);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const std::vector<int32_t> ids = tok.Encode(*text);
  const std::vector<Role> roles = reader->ReadRoles(ids);
  ASSERT_EQ(roles.size(), ids.size());
  size_t offset = 0, segment = 0, segment_end = segments[0].second.size();
  for (size_t i = 0; i < ids.size(); ++i) {
    while (offset >= segment_end) segment_end += segments[++segment].second.size();
    const std::string piece = tok.DecodeBytes(std::span<const int32_t>(&ids[i], 1));
    EXPECT_EQ(transcript::RoleName(roles[i]), transcript::RoleName(segments[segment].first))
        << "token " << i << " \"" << piece << "\" at byte " << offset;
    offset += piece.size();
  }
}

Json Episode() {
  return Json::array(
      {{{"role", "system"}, {"content", "Be brief."}},
       {{"role", "user"}, {"content", "Weather in Paris?"}},
       {{"role", "assistant"},
        {"content", "Checking."},
        {"tool_calls",
         Json::array(
             {{{"id", "functions.get_weather:0"},
               {"type", "function"},
               {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}})}},
       {{"role", "tool"},
        {"tool_call_id", "functions.get_weather:0"},
        {"name", "get_weather"},
        {"content", "18C"}},
       {{"role", "assistant"}, {"content", "It is 18C."}},
       {{"role", "user"}, {"content", "Thanks."}}});
}

Json Tools() {
  return Json::array(
      {{{"type", "function"},
        {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
}

TEST(ChatRoleReaderTest, KimiK2ThinkingEpisode) {
  const auto tok =
      TokenizerWith({"<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>",
                     "<|im_end|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                     "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"});
  const std::string tools = Json(Tools()).dump(-1, ' ', false);
  ExpectRoles(
      "kimi_k2_thinking", *tok, Episode(), Tools(),
      {{Role::kSystem,
        "<|im_system|>tool_declare<|im_middle|>[{\"type\": \"function\", \"function\": "
        "{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}}]<|im_end|>"},
       {Role::kSystem, "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"},
       {Role::kUser,
        "<|im_user|>user<|im_middle|>Weather in "
        "Paris?<|im_end|><|im_assistant|>assistant<|im_middle|>"},
       {Role::kModel, "<think></think>Checking."},
       {Role::kToolCall,
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        "<|tool_call_argument_begin|>{\"city\": "
        "\"Paris\"}<|tool_call_end|><|tool_calls_section_end|>"},
       {Role::kModel, "<|im_end|>"},
       {Role::kToolResult,
        "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n18C<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>"},
       {Role::kModel, "<think></think>It is 18C.<|im_end|>"},
       {Role::kUser, "<|im_user|>user<|im_middle|>Thanks.<|im_end|>"}});
}

TEST(ChatRoleReaderTest, Qwen3Episode) {
  const auto tok = TokenizerWith({"<|im_start|>", "<|im_end|>"},
                                 {"<tool_call>", "</tool_call>", "<tool_response>",
                                  "</tool_response>", "<think>", "</think>"});
  const Result<std::string> head =
      Load("qwen3").Render(Json::array({{{"role", "system"}, {"content", "Be brief."}}}),
                           ChatRenderOptions{false, Tools(), Json::object()});
  ASSERT_TRUE(head.ok());
  ExpectRoles(
      "qwen3", *tok, Episode(), Tools(),
      {{Role::kSystem, *head},
       {Role::kUser, "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"},
       {Role::kModel, "Checking.\n"},
       {Role::kToolCall,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
        "\"Paris\"}}\n</tool_call>"},
       {Role::kModel, "<|im_end|>"},
       {Role::kUser, "\n"},
       {Role::kToolResult,
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"},
       {Role::kModel, "It is 18C.<|im_end|>"},
       {Role::kToolResult, "\n"},
       {Role::kUser, "<|im_start|>user\nThanks.<|im_end|>\n"}});
}

TEST(ChatRoleReaderTest, Llama33Episode) {
  const auto tok = TokenizerWith({"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                  "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"});
  Json messages = Episode();
  ChatTemplate chat = Load("llama3_3");
  ChatRenderOptions options;
  options.tools = Tools();
  const Result<std::string> text = chat.Render(messages, options);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  // Up to the first user turn's end the prompt is system scaffolding and the tool list (Llama 3
  // puts the tools in the first user message).
  const std::string first_user_end = "Weather in Paris?<|eot_id|>";
  const size_t cut = text->find(first_user_end) + first_user_end.size();
  const size_t user_header = text->find("<|start_header_id|>user");
  ExpectRoles(
      "llama3_3", *tok, messages, Tools(),
      {{Role::kSystem, text->substr(0, user_header)},
       {Role::kUser, text->substr(user_header, cut - user_header)},
       {Role::kUser, "<|start_header_id|>assistant<|end_header_id|>\n\n"},
       {Role::kToolCall, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"},
       {Role::kModel, "<|eot_id|>"},
       {Role::kToolResult,
        "<|start_header_id|>ipython<|end_header_id|>\n\n\"18C\"<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"},
       {Role::kModel, "It is 18C.<|eot_id|>"},
       {Role::kUser, "<|start_header_id|>user<|end_header_id|>\n\nThanks.<|eot_id|>"}});
}

TEST(ChatRoleReaderTest, ModelTurnCutShortEndsAtTheNextHeader) {
  const auto tok = TokenizerWith({"<|im_start|>", "<|im_end|>"});
  const ChatTemplate chat = Load("qwen2_5");
  Result<ChatRoleReader> reader = ChatRoleReader::Create(chat, *tok);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(reader->assistant_header(), "<|im_start|>assistant\n");
  EXPECT_EQ(reader->end_of_turn(), "<|im_end|>");
  const std::string text =
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello "
      "and<|im_start|>user\nGo<|im_end|>";
  const std::vector<int32_t> ids = tok->Encode(text);
  const std::vector<Role> roles = reader->ReadRoles(ids);
  std::string model_text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (roles[i] == Role::kModel)
      model_text += tok->DecodeBytes(std::span<const int32_t>(&ids[i], 1));
  }
  EXPECT_EQ(model_text, "Hello and");
  EXPECT_EQ(roles.back(), Role::kUser);
  // Text that spells a header is not one: a user message writing "<|im_start|>assistant\n" as
  // plain text (split_special_tokens) stays user.
  EncodeOptions split;
  split.split_special_tokens = true;
  std::vector<int32_t> spelled = tok->Encode("<|im_start|>user\n");
  const std::vector<int32_t> body = tok->Encode("<|im_start|>assistant\nno", split);
  spelled.insert(spelled.end(), body.begin(), body.end());
  for (Role role : reader->ReadRoles(spelled)) EXPECT_EQ(role, Role::kUser);
}

// Every template and every fixture conversation: the text of each user, system and tool message
// is read as context, and each assistant message's text as the model's own.
TEST(ChatRoleReaderTest, EveryFormatSeparatesTheModelsTokens) {
  for (const auto& [name, entry] : Cases()["templates"].items()) {
    SCOPED_TRACE(name);
    const ChatTemplate chat = Load(name);
    // The template's markers, as its model's vocabulary holds them: <|...|> and DeepSeek's
    // <｜...｜> are special.
    std::vector<std::string> special;
    const std::string& source = chat.source();
    for (const char* open : {"<|", "<\xef\xbd\x9c"}) {
      const std::string o = open;
      const std::string close = o == "<|" ? "|>" : "\xef\xbd\x9c>";
      for (size_t at = source.find(o); at != std::string::npos; at = source.find(o, at + 1)) {
        const size_t end = source.find(close, at + o.size());
        if (end == std::string::npos || end - at > 40) continue;
        const std::string marker = source.substr(at, end + close.size() - at);
        if (marker.find_first_of(" '\"{}") != std::string::npos) continue;
        if (std::find(special.begin(), special.end(), marker) == special.end()) {
          special.push_back(marker);
        }
      }
    }
    const auto tok = TokenizerWith(special);
    Result<ChatRoleReader> reader = ChatRoleReader::Create(chat, *tok);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    int checked = 0;
    for (const Json& c : entry["cases"]) {
      if (!c.contains("expected")) continue;
      SCOPED_TRACE(c["name"].get<std::string>());
      const std::string text = c["expected"].get<std::string>();
      const std::vector<int32_t> ids = tok->Encode(text);
      const std::vector<Role> roles = reader->ReadRoles(ids);
      std::vector<size_t> offsets{0};
      for (int32_t id : ids) {
        offsets.push_back(offsets.back() +
                          tok->DecodeBytes(std::span<const int32_t>(&id, 1)).size());
      }
      size_t from = 0;
      for (const Json& m : c["messages"]) {
        if (!m.contains("content") || !m["content"].is_string()) continue;
        // Templates may trim a message; its inner text is what must keep its role.
        std::string content = m["content"].get<std::string>();
        const size_t first = content.find_first_not_of(" \n\t");
        if (first == std::string::npos) continue;
        content = content.substr(first, content.find_last_not_of(" \n\t") - first + 1);
        const size_t at = text.find(content, from);
        if (at == std::string::npos)
          continue;  // a template that rewrites the text (Llama's system)
        from = at + content.size();
        const bool action = m["role"] == "assistant";
        for (size_t i = 0; i < ids.size(); ++i) {
          if (offsets[i] < at || offsets[i + 1] > at + content.size()) continue;
          EXPECT_EQ(transcript::IsAction(roles[i]), action)
              << m["role"] << " token " << i << " of \"" << content << "\"";
          ++checked;
        }
      }
    }
    EXPECT_GT(checked, 100);
  }
}

}  // namespace
}  // namespace strider::tokenizer
