#include "envs/tools.h"

#include <gtest/gtest.h>

namespace strider::envs {
namespace {

TEST(ParseToolCall, NoMarkerMeansNoCall) {
  Result<std::optional<ToolCall>> call = ParseToolCall("The answer is 4.");
  ASSERT_TRUE(call.ok());
  EXPECT_FALSE(call->has_value());
}

TEST(ParseToolCall, ReadsNameAndRawArguments) {
  Result<std::optional<ToolCall>> call =
      ParseToolCall("Let me see.<|tool_call|> calc( (12*7)+3 ) <|tool_call_end|><|end_of_turn|>");
  ASSERT_TRUE(call.ok()) << call.status().ToString();
  ASSERT_TRUE(call->has_value());
  EXPECT_EQ((*call)->name, "calc");
  EXPECT_EQ((*call)->arguments, " (12*7)+3 ");
}

TEST(ParseToolCall, MalformedCallsNameTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"<|tool_call|>calc(1+2)", "never closed"},
      {"<|tool_call|>calc 1+2<|tool_call_end|>", "expected '('"},
      {"<|tool_call|>calc(1+2<|tool_call_end|>", "do not end with ')'"},
      {"<|tool_call|>(1+2)<|tool_call_end|>", "expected a tool name"},
      {"<|tool_call|>9calc(1)<|tool_call_end|>", "expected a tool name"},
      {"<|tool_call|>a(1)<|tool_call_end|><|tool_call|>b(2)<|tool_call_end|>", "more than one"},
      {"<|tool_call|>a(<|tool_call|>b(2)<|tool_call_end|>", "second <|tool_call|>"},
      {"calc(1)<|tool_call_end|>", "without <|tool_call|>"},
      {"<|tool_call|>" + std::string(70000, 'x') + "<|tool_call_end|>", "longer than"},
  };
  for (const auto& [text, problem] : cases) {
    Result<std::optional<ToolCall>> call = ParseToolCall(text);
    ASSERT_FALSE(call.ok()) << text.substr(0, 80);
    EXPECT_NE(call.status().message().find(problem), std::string::npos) << call.status().message();
    const Action action = MakeAction(text);
    EXPECT_FALSE(action.tool_call.has_value());
    EXPECT_EQ(action.tool_call_error, call.status().message());
    EXPECT_EQ(action.text, text);
  }
}

TEST(ParseToolCall, FormatRoundTrips) {
  const std::string text = "x" + FormatToolCall("search", "agent \"Quill\"");
  const Action action = MakeAction(text);
  ASSERT_TRUE(action.tool_call.has_value()) << action.tool_call_error;
  EXPECT_EQ(action.tool_call->name, "search");
  EXPECT_EQ(action.tool_call->arguments, "agent \"Quill\"");
}

TEST(RenderToolList, ListsEveryToolWithArguments) {
  EXPECT_EQ(RenderToolList({}), "");
  const std::string list =
      RenderToolList({{"calc", R"({"expression": "string"})", "evaluates arithmetic"},
                      {"zoom", R"({"row": "int", "col": "int"})", "a crop"},
                      {"odd", "free text", "schema kept verbatim"}});
  EXPECT_NE(list.find("- calc(expression: string): evaluates arithmetic\n"), std::string::npos)
      << list;
  EXPECT_NE(list.find("- zoom(row: int, col: int): a crop\n"), std::string::npos) << list;
  EXPECT_NE(list.find("- odd(free text): schema kept verbatim\n"), std::string::npos) << list;
}

}  // namespace
}  // namespace strider::envs
