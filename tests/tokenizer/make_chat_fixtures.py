#!/usr/bin/env python3
"""Writes tests/tokenizer/data/chat/cases.json: conversations rendered by transformers'
apply_chat_template through each model's chat template (run once; the test suite reads the
committed file and needs no Python packages).

    python3 -m venv /tmp/chatvenv && /tmp/chatvenv/bin/pip install transformers==5.25.0 jinja2==3.1.6
    /tmp/chatvenv/bin/python tests/tokenizer/make_chat_fixtures.py

Pinned: transformers==5.25.0 jinja2==3.1.6 tokenizers==0.23.3 (Python 3.11).

The templates are the models' published chat templates, committed under data/chat/ as copied
from public GitHub mirrors of the Hugging Face files (llama.cpp keeps them for its own tests,
fetched with its scripts/get_chat_template.py):
  kimi_k2_thinking.jinja  moonshotai/Kimi-K2-Thinking: github.com/ggml-org/llama.cpp,
                          models/templates/moonshotai-Kimi-K2-Thinking.jinja @ 0c3c896e
  kimi_k2.jinja           moonshotai/Kimi-K2-Instruct (the K2 format Kimi Linear shares):
                          github.com/ye-NX/llama.cpp (a llama.cpp fork),
                          models/templates/moonshotai-Kimi-K2.jinja @ 1eeb523c
  qwen3.jinja             Qwen/Qwen3-0.6B: the same fork, models/templates/Qwen-Qwen3-0.6B.jinja
  qwen2_5.jinja           Qwen/Qwen2.5-7B-Instruct: models/templates/Qwen-Qwen2.5-7B-Instruct.jinja
  llama3_3.jinja          meta-llama/Llama-3.3-70B-Instruct:
                          models/templates/meta-llama-Llama-3.3-70B-Instruct.jinja
  deepseek_v3_1.jinja     deepseek-ai/DeepSeek-V3.1: models/templates/deepseek-ai-DeepSeek-V3.1.jinja

The tokenizer object apply_chat_template needs is the section-1 fixture bpe_llama3.json with each
template's bos/eos tokens; with tokenize=False only those tokens' text reaches the template.

cases.json: {"templates": {NAME: {"file", "special_tokens", "cases": [{"name", "messages",
"tools", "add_generation_prompt", "variables", "expected" | "error"}]}}}. "error" is the message
of the exception the template raised (raise_exception, or a TypeError such as DeepSeek's
string concatenation of arguments given as an object).
"""
import copy
import json
import os

import jinja2
import transformers
from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
CHAT = os.path.join(DATA, "chat")

TEMPLATES = {
    "kimi_k2_thinking": {"bos_token": "[BOS]", "eos_token": "[EOS]"},
    "kimi_k2": {"bos_token": "[BOS]", "eos_token": "[EOS]"},
    "qwen3": {"eos_token": "<|im_end|>"},
    "qwen2_5": {"eos_token": "<|im_end|>"},
    "llama3_3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "deepseek_v3_1": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "calc", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}},
                       "required": ["expr"]}}},
]

SYSTEM = {"role": "system", "content": "You are a careful assistant. Answer briefly."}


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


CASES = [
    ("system_user_prompt", [SYSTEM, {"role": "user", "content": "What is 12+7?"}], None, True, {}),
    ("system_user_no_prompt", [SYSTEM, {"role": "user", "content": "What is 12+7?"}], None, False, {}),
    ("user_only_prompt", [{"role": "user", "content": "Hello!"}], None, True, {}),
    ("multi_turn", [SYSTEM, {"role": "user", "content": "Name a prime."},
                    {"role": "assistant", "content": "7 is prime."},
                    {"role": "user", "content": "  And another?\n"}], None, True, {}),
    ("tool_episode", [SYSTEM, {"role": "user", "content": "Weather in Paris?"},
                      {"role": "assistant", "content": "",
                       "tool_calls": [call("functions.get_weather:0", "get_weather", {"city": "Paris"})]},
                      {"role": "tool", "tool_call_id": "functions.get_weather:0", "name": "get_weather",
                       "content": "{\"temp\": 18, \"sky\": \"clear\"}"},
                      {"role": "assistant", "content": "It is 18 °C and clear in Paris."}],
     TOOLS, False, {}),
    ("multi_tool_results", [{"role": "user", "content": "Compute 3*4 and the weather in 東京."},
                            {"role": "assistant", "content": "Let me check both.",
                             "tool_calls": [call("functions.calc:0", "calc", {"expr": "3*4"}),
                                            call("functions.get_weather:1", "get_weather",
                                                 {"city": "東京", "unit": "c"})]},
                            {"role": "tool", "tool_call_id": "functions.calc:0", "name": "calc", "content": "12"},
                            {"role": "tool", "tool_call_id": "functions.get_weather:1", "name": "get_weather",
                             "content": "rain, 21"},
                            {"role": "assistant", "content": None,
                             "tool_calls": [call("functions.calc:2", "calc", "{\"expr\": \"12+21\"}")]},
                            {"role": "tool", "tool_call_id": "functions.calc:2", "name": "calc", "content": "33"},
                            {"role": "assistant", "content": "3*4 = 12; Tokyo: rain, 21 °C. 🌧"},
                            {"role": "user", "content": "Thanks! 👍"}], TOOLS, True, {}),
    ("single_tool_call", [SYSTEM, {"role": "user", "content": "What is 2**10?"},
                          {"role": "assistant", "content": "",
                           "tool_calls": [call("functions.calc:0", "calc", {"expr": "2**10"})]},
                          {"role": "tool", "tool_call_id": "functions.calc:0", "name": "calc", "content": "1024"}],
     TOOLS, True, {}),
    ("reasoning", [{"role": "user", "content": "Is 91 prime?"},
                   {"role": "assistant", "content": "No: 91 = 7 × 13.",
                    "reasoning_content": "Try 7: 7*13 = 91."},
                   {"role": "user", "content": "And 97?"}], None, True, {}),
    ("unicode_whitespace", [{"role": "system", "content": "\n  Système: réponds en français.  \n"},
                            {"role": "user", "content": "日本語のテキスト\tand  tabs\n\n"},
                            {"role": "assistant", "content": "d'accord — \"quoted\" \\ backslash"},
                            {"role": "user", "content": "emoji 👩‍💻 done"}], None, False, {}),
    ("content_parts", [{"role": "system", "content": "Describe briefly."},
                       {"role": "user", "content": [{"type": "text", "text": "First part. "},
                                                    {"type": "text", "text": "Second part."}]}],
     None, True, {}),
    ("string_arguments", [{"role": "user", "content": "Add 2 and 3."},
                          {"role": "assistant", "content": "",
                           "tool_calls": [call("functions.calc:0", "calc", "{\"expr\": \"2+3\"}")]},
                          {"role": "tool", "tool_call_id": "functions.calc:0", "name": "calc", "content": "5"},
                          {"role": "assistant", "content": "5"}], TOOLS, False, {}),
    ("thinking_off", [{"role": "user", "content": "Quick answer: 2+2?"}], None, True,
     {"enable_thinking": False, "thinking": False}),
]


def main():
    out = {"transformers": transformers.__version__, "jinja2": jinja2.__version__, "templates": {}}
    for name, special in TEMPLATES.items():
        with open(os.path.join(CHAT, name + ".jinja"), encoding="utf-8") as f:
            template = f.read()
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(DATA, "bpe_llama3.json"), **special)
        cases = []
        for case_name, messages, tools, prompt, variables in CASES:
            case = {"name": case_name, "messages": messages, "tools": tools,
                    "add_generation_prompt": prompt, "variables": variables}
            try:
                case["expected"] = tok.apply_chat_template(
                    copy.deepcopy(messages), tools=copy.deepcopy(tools), add_generation_prompt=prompt,
                    tokenize=False, chat_template=template, **variables)
            except (jinja2.exceptions.TemplateError, TypeError) as e:
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
        out["templates"][name] = {"file": name + ".jinja", "special_tokens": special, "cases": cases}
    with open(os.path.join(CHAT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
