// Tokenizer encode throughput against the reference libraries, measured in the same run on the
// same text (docs/tokenizers.md):
// The text is cut at line ends into ~4 KiB pieces (prompt-sized), the same pieces on both sides.
//   - one thread: common/tokenizer on tokenizer.json files against Hugging Face `tokenizers`, on
//     a tiktoken rank file against `tiktoken`: the pieces encoded in turn (bytes/s and
//     tokens/s, best of several passes after a warm-up pass);
//   - all cores: one thread per core taking pieces from a shared counter (best pass), against
//     `tokenizers`' encode_batch (Rayon, all cores) on the same pieces.
// The references run in a Python that has the libraries (--reference-python, default
// /tmp/tokvenv/bin/python); without one, the lines carry our figure and a null baseline.
// Usage: tokenizer_bench [--quick] [--text FILE] [--reference-python PATH] [--threads N]
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_json.h"
#include "common/clock.h"
#include "common/tokenizer/tokenizer.h"

namespace strider::bench {
namespace {

// The reference side: prints one JSON object with the best single-call time, the batch time
// and token counts, so both sides are timed the same way.
constexpr const char* kReferenceScript = R"PY(
import json, sys, time
kind, path, text_path, repeats, meta = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
raw = open(text_path, "rb").read()
chunks, pos = [], 0
while pos < len(raw):
    end = raw.find(b"\n", pos + 4096)
    end = len(raw) if end < 0 else end + 1
    chunks.append(raw[pos:end].decode("utf-8", "replace"))
    pos = end
if kind == "tokenizers":
    import tokenizers
    tok = tokenizers.Tokenizer.from_file(path)
    version = "tokenizers " + tokenizers.__version__
    one = lambda: sum(len(tok.encode(c, add_special_tokens=False).ids) for c in chunks)
    batch = lambda: sum(len(e.ids) for e in tok.encode_batch(chunks, add_special_tokens=False))
else:
    import tiktoken, tiktoken.load
    m = json.load(open(meta))
    tok = tiktoken.Encoding("bench", pat_str=m["pattern"],
                            mergeable_ranks=tiktoken.load.load_tiktoken_bpe(path),
                            special_tokens=m["special_tokens"])
    version = "tiktoken " + tiktoken.__version__
    one = lambda: sum(len(tok.encode(c, allowed_special="all")) for c in chunks)
    batch = None
tokens = one()
best = min((lambda t: (one(), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(repeats))
out = {"version": version, "seconds": best, "tokens": tokens}
if batch is not None:
    out["batch_tokens"] = batch()
    out["batch_seconds"] = min((lambda t: (batch(), time.perf_counter() - t)[1])(time.perf_counter())
                               for _ in range(repeats))
print(json.dumps(out))
)PY";

std::string ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

std::string Quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Runs the reference script; nullopt (and a note on stderr) when the Python or its libraries
// are missing.
std::optional<nlohmann::json> RunReference(const std::string& python, const std::string& kind,
                                           const std::string& path, const std::string& text,
                                           int repeats, const std::string& meta) {
  if (python.empty() || !std::filesystem::exists(python)) return std::nullopt;
  char script[] = "/tmp/tokenizer_bench_XXXXXX";
  const int fd = mkstemp(script);
  if (fd < 0) return std::nullopt;
  const size_t length = std::strlen(kReferenceScript);
  const bool written = write(fd, kReferenceScript, length) == static_cast<ssize_t>(length);
  close(fd);
  std::optional<nlohmann::json> result;
  if (written) {
    // One Rayon thread for the single-call figure is what encode of one text uses anyway;
    // encode_batch gets every core.
    const std::string command = Quoted(python) + " " + Quoted(script) + " " + kind + " " +
                                Quoted(path) + " " + Quoted(text) + " " + std::to_string(repeats) +
                                " " + Quoted(meta);
    if (FILE* pipe = popen(command.c_str(), "r")) {
      std::string output;
      char buffer[4096];
      size_t n;
      while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
      if (pclose(pipe) == 0) {
        nlohmann::json parsed = nlohmann::json::parse(output, nullptr, false);
        if (!parsed.is_discarded()) result = std::move(parsed);
      }
    }
  }
  std::remove(script);
  if (!result) std::fprintf(stderr, "tokenizer_bench: reference %s did not run\n", kind.c_str());
  return result;
}

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Cut at line ends after every ~4 KiB, exactly as the reference script cuts.
std::vector<std::string_view> Chunks(std::string_view text) {
  std::vector<std::string_view> chunks;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos + 4096);
    end = end == std::string_view::npos ? text.size() : end + 1;
    chunks.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return chunks;
}

struct Side {
  std::string name;       // file under tests/tokenizer/data
  std::string reference;  // "tokenizers" or "tiktoken"
};

void Run(const Side& side, const std::string& data, const std::string& text_path,
         const std::string& python, int repeats, int threads) {
  tokenizer::TokenizerOptions options;
  const std::string meta_path = data + "/ranks_meta.json";
  if (side.reference == "tiktoken") {
    const nlohmann::json meta = nlohmann::json::parse(ReadFile(meta_path));
    options.tiktoken_pattern = meta.at("pattern").get<std::string>();
    for (const auto& [text, id] : meta.at("special_tokens").items()) {
      options.tiktoken_special_tokens.emplace_back(text, id.get<int32_t>());
    }
  }
  const std::string path = data + "/" + side.name;
  Result<std::unique_ptr<tokenizer::Tokenizer>> loaded = tokenizer::LoadTokenizer(path, options);
  if (!loaded.ok()) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", loaded.status().ToString().c_str());
    std::exit(1);
  }
  const tokenizer::Tokenizer& tok = **loaded;
  const std::string text = ReadFile(text_path);

  // One thread encodes the pieces in turn, as the reference does; the first pass warms the
  // word cache as the reference's first call warms its own.
  const std::vector<std::string_view> chunks = Chunks(text);
  const auto encode_all = [&] {
    size_t n = 0;
    for (std::string_view chunk : chunks) n += tok.Encode(chunk).size();
    return n;
  };
  const size_t tokens = encode_all();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    const size_t n = encode_all();
    best = std::min(best, Seconds(start));
    if (n != tokens) std::exit(1);
  }
  const std::optional<nlohmann::json> ref =
      RunReference(python, side.reference, path, text_path, repeats, meta_path);
  std::optional<double> ref_bytes, ref_tokens;
  std::string version = "none";
  if (ref) {
    ref_bytes = static_cast<double>(text.size()) / ref->at("seconds").get<double>();
    ref_tokens = ref->at("tokens").get<double>() / ref->at("seconds").get<double>();
    version = ref->at("version").get<std::string>();
    if (ref->at("tokens").get<size_t>() != tokens) {
      std::fprintf(stderr, "tokenizer_bench: %s gives %zu tokens, %s %zu\n", side.name.c_str(),
                   tokens, version.c_str(), ref->at("tokens").get<size_t>());
    }
  }
  const JsonFields fields = {{"tokenizer", JsonString(side.name)},
                             {"reference", JsonString(version)},
                             {"threads", "1"},
                             {"text_bytes", JsonNumber(static_cast<double>(text.size()))},
                             {"tokens", JsonNumber(static_cast<double>(tokens))},
                             {"pieces", JsonNumber(static_cast<double>(chunks.size()))}};
  PrintResult("tokenizer", "encode_bytes_per_second", static_cast<double>(text.size()) / best,
              "bytes/s", ref_bytes, fields);
  PrintResult("tokenizer", "encode_tokens_per_second", static_cast<double>(tokens) / best,
              "tokens/s", ref_tokens, fields);
  if (side.reference != "tokenizers") return;

  // All cores: threads take the next piece from a shared counter; best of the passes.
  std::atomic<size_t> total{0};
  double seconds = 1e30;
  for (int r = 0; r < repeats; ++r) {
    std::atomic<size_t> next{0};
    total = 0;
    const auto start = Clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        size_t mine = 0;
        for (size_t i = next++; i < chunks.size(); i = next++) mine += tok.Encode(chunks[i]).size();
        total += mine;
      });
    }
    for (std::thread& worker : workers) worker.join();
    seconds = std::min(seconds, Seconds(start));
  }
  std::optional<double> ref_batch;
  if (ref && ref->contains("batch_seconds")) {
    ref_batch = ref->at("batch_tokens").get<double>() / ref->at("batch_seconds").get<double>();
  }
  JsonFields batch_fields = fields;
  batch_fields[2] = {"threads", std::to_string(threads)};
  batch_fields[4] = {"tokens", JsonNumber(static_cast<double>(total.load()))};
  PrintResult("tokenizer", "encode_tokens_per_second_all_cores",
              static_cast<double>(total.load()) / seconds, "tokens/s", ref_batch, batch_fields);
}

}  // namespace
}  // namespace strider::bench

int main(int argc, char** argv) {
  const std::string data = std::string(STRIDER_SOURCE_DIR) + "/tests/tokenizer/data";
  std::string text = data + "/mixed.txt";
  std::string python = "/tmp/tokvenv/bin/python";
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--quick") {
      repeats = 1;
    } else if (arg == "--text" && has_value) {
      text = argv[++i];
    } else if (arg == "--reference-python" && has_value) {
      python = argv[++i];
    } else if (arg == "--threads" && has_value) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: tokenizer_bench [--quick] [--text FILE] [--reference-python PATH] "
                   "[--threads N]\n");
      return 2;
    }
  }
  // Llama-3's layout (whole words that are tokens skip merging) and GPT-2's (every word merges,
  // through the word cache).
  strider::bench::Run({"bpe_llama3.json", "tokenizers"}, data, text, python, repeats, threads);
  strider::bench::Run({"bpe_gpt2.json", "tokenizers"}, data, text, python, repeats, threads);
  strider::bench::Run({"ranks.tiktoken", "tiktoken"}, data, text, python, repeats, threads);
  return 0;
}
