// `calculator`: multi-step arithmetic word problems with a `calc` tool (and optionally `python`).
//
// A problem is a chain of operations on one quantity ("Mia has 12 marbles. She gets 7 more. ...");
// its true intermediate values are known, so every tool call gets a step label: correct when the
// tool's result is one of the problem's intermediate values (or the answer), incorrect otherwise
// (and for malformed calls, unknown tools and evaluation errors). The outcome reward is 1 for a
// correct "Answer: N" and 0 otherwise.
//
// Options: difficulty (1..5, default 2: steps = difficulty + 1), steps (overrides, 1..12),
// python (true/false, default false: also offer `python`, which runs the model's code with
// `python3 -I` in the sandbox), python_binary (default /usr/bin/python3), tool_timeout_ms
// (the python tool's wall-clock limit, 100..60000, default 5000; CPU limit 2 s, memory 512 MiB).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "envs/environment.h"

namespace strider::envs {

Result<std::unique_ptr<Environment>> MakeCalculatorEnvironment(const Options& options);
std::unique_ptr<ScriptedPolicy> MakeCalculatorPolicy();

// The calculator's expression language: numbers, + - * /, unary minus, parentheses; at most
// 256 bytes. Division by zero, overflow to infinity and syntax errors are errors.
// The `calc` tool as the calculator offers it (evaluated by EvaluateArithmetic); other
// environments that offer the same tool list it with the same text, so a model sees one tool.
ToolSpec CalculatorTool();
Result<double> EvaluateArithmetic(std::string_view expression);
// A value as the tools print it: integers without a decimal point, others with up to 10
// significant digits.
std::string FormatNumber(double value);

}  // namespace strider::envs
