#!/usr/bin/env python3
"""Writes the tokenizer fixtures under tests/tokenizer/data/ (run once; the test suite reads the
committed files and needs no Python packages).

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers==0.23.3 tiktoken==0.14.0
    /tmp/tokvenv/bin/python tests/tokenizer/make_fixtures.py [--corpus /usr/include/sqlite3.h]

Pinned: tokenizers==0.23.3 tiktoken==0.14.0 (Python 3.11).

Training text: /usr/include/sqlite3.h from Debian's libsqlite3-dev package. SQLite is in the
public domain ("The author disclaims copyright to this source code", see the file's header and
/usr/share/doc/libsqlite3-dev/copyright); its first 32 KiB are committed as corpus_sample.txt.

Outputs:
  bpe_llama3.json   byte-level BPE, Llama-3 layout: Sequence[Split(pattern), ByteLevel], pair
                    merges, ignore_merges
  bpe_gpt2.json     the same vocabulary, GPT-2 layout: ByteLevel(use_regex) pre-tokenizer and
                    merges as "a b" strings
  bpe_nfc.json      the same vocabulary, Qwen-2 layout: NFC normaliser, Sequence[Split, ByteLevel]
  ranks.tiktoken    a second vocabulary (o200k-style pattern) as a tiktoken rank file
  ranks_meta.json   its split pattern and special tokens, and Kimi K2's pattern (tiktoken_kimi:
                    the same ranks split by it, over the cases in the first 128 KiB)
  mixed.txt         >= 1 MiB of test text in cases (English, code, CJK, emoji, numbers,
                    whitespace runs, long words, special tokens inline, decomposed accents)
  mixed.index       one line per case: byte offset, byte length, then the id count per reference
                    in the order of the header line
  mixed.<name>.ids.gz  expected ids, gzipped little-endian uint16, cases back to back; the
                    layouts other than bpe_llama3 and tiktoken cover the cases in the first
                    256 KiB ("-" in the index past them)
  invalid.bin/.index/.<name>.ids.gz  byte strings that are not valid UTF-8; their expected ids
                    are the reference's on bytes.decode("utf-8", "replace")
  exotic.txt/.index/.<name>.ids.gz  1,000 short strings of unusual characters
"""
import argparse
import base64
import gzip
import json
import os
import random
import struct

import tiktoken
import tiktoken.load
import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                 r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
# Kimi K2's tiktoken pattern: Han runs apart, and Rust-regex class intersections (&&).
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TIKTOKEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|tool_call|>"]
MIB = 1 << 20
SUBSET = 256 << 10
KIMI_SUBSET = 128 << 10


def train(corpus, pattern, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([corpus], trainer)
    return tok


def byte_decoder():
    # GPT-2's printable stand-ins for bytes, inverted.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def rand_text(rng, alphabet, n):
    return "".join(rng.choice(alphabet) for _ in range(n))


def make_cases(rng, corpus):
    cjk = [chr(c) for c in range(0x4E00, 0x9FA6)]
    kana = [chr(c) for c in range(0x3041, 0x3097)] + [chr(c) for c in range(0x30A1, 0x30FB)]
    hangul = [chr(c) for c in range(0xAC00, 0xD7A4)]
    cjk_punct = list("。，、「」！？：；（）《》…")
    emoji = [chr(c) for c in range(0x1F600, 0x1F650)] + [chr(c) for c in range(0x1F300, 0x1F3FF)] + [
        "👨\u200d👩\u200d👧\u200d👦", "👍🏽", "🇯🇵", "🇫🇷", "1️⃣", "❤️", "🧑\u200d💻", "🏳️\u200d🌈", "✌🏿"]
    other = ["Привет, мир", "Γειά σου Κόσμε", "مرحبا بالعالم", "नमस्ते दुनिया", "שלום עולם",
             "ไปโรงเรียน", "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ", "ﬁnancial ﬂow", "Straße", "İstanbul",
             "e\u0301te\u0301", "n\u0303o", "A\u030a", "\u1100\u1161\u11a8", "ǅemal", "ſtraße"]
    spaces = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "\u00a0", "\u3000", "\u2003", "\u180e",
              "\u0085", "\u2028", "\x0b", "\x0c"]
    words = corpus.split()
    code = [
        "def encode(self, text: str) -> list[int]:\n    return [self.vocab[t] for t in text]\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
        "if (x != nullptr && x->next) { return x->next->value; }  // TODO(later)\n",
        "SELECT name, COUNT(*) FROM users WHERE id >= 42 GROUP BY name;\n",
        "const re = /^[a-z0-9_-]{3,16}$/i;\nconsole.log(`value=${v}`);\n",
        "    \n        \n    x = {'a': 1, \"b\": [2, 3.5e-7], 'c': None}\n",
        "#include <vector>\n#define MAX(a,b) ((a)>(b)?(a):(b))\n",
        "I'm sure it's fine; they've said we'll see. DON'T PANIC. You'D THINK SHE'S RIGHT.\n",
    ]

    def chunk(kind):
        if kind == "english":
            start = rng.randrange(0, len(corpus) - 4000)
            return corpus[start:start + rng.randrange(200, 4000)]
        if kind == "words":
            return " ".join(rng.choice(words) for _ in range(rng.randrange(20, 400)))
        if kind == "code":
            return "".join(rng.choice(code) for _ in range(rng.randrange(1, 20)))
        if kind == "cjk":
            parts = []
            for _ in range(rng.randrange(5, 60)):
                alphabet = rng.choice([cjk, kana, hangul])
                parts.append(rand_text(rng, alphabet, rng.randrange(1, 30)))
                parts.append(rng.choice(cjk_punct + [" ", "", "\n", "abc", "123"]))
            return "".join(parts)
        if kind == "emoji":
            return "".join(rng.choice(emoji + [" ", "ok", "!", "\n", "好", "12"])
                           for _ in range(rng.randrange(5, 300)))
        if kind == "numbers":
            parts = []
            for _ in range(rng.randrange(10, 200)):
                r = rng.random()
                if r < 0.3:
                    parts.append(str(rng.randrange(0, 10 ** rng.randrange(1, 25))))
                elif r < 0.5:
                    parts.append(f"{rng.uniform(-1e6, 1e6):.{rng.randrange(0, 9)}f}")
                elif r < 0.6:
                    parts.append(f"{rng.randrange(10**6):,}")
                elif r < 0.7:
                    parts.append(f"0x{rng.randrange(1 << 32):08X}")
                elif r < 0.8:
                    parts.append(f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}")
                else:
                    parts.append("٣٤٥" if r < 0.85 else "১২৩" if r < 0.9 else "½²³" if r < 0.95 else "Ⅻ")
                parts.append(rng.choice([" ", ", ", "\n", "+", "x", "%", ""]))
            return "".join(parts)
        if kind == "whitespace":
            parts = []
            for _ in range(rng.randrange(5, 80)):
                parts.append("".join(rng.choice(spaces) for _ in range(rng.randrange(1, 40))))
                parts.append(rng.choice(words + ["x", "!", "好", "😀", "42"]))
            return "".join(parts)
        if kind == "long":
            r = rng.random()
            n = rng.randrange(100, 6000)
            if r < 0.2:
                return "a" * n
            if r < 0.4:
                return rand_text(rng, "abcdefghijklmnopqrstuvwxyz", n)
            if r < 0.5:
                return "=" * n + "\n"
            if r < 0.6:
                return " " * n + "x"
            if r < 0.7:
                return rand_text(rng, cjk, n // 3)
            if r < 0.8:
                return "9" * n
            if r < 0.9:
                return rand_text(rng, "ab", n)
            return rng.choice(words) * (n // 8 + 1)
        if kind == "other":
            return " ".join(rng.choice(other) for _ in range(rng.randrange(3, 60)))
        if kind == "special":
            parts = []
            for _ in range(rng.randrange(2, 30)):
                parts.append(rng.choice(SPECIALS + ["<|tool_call|>", "<|im_start", "<|endoftext|",
                                                    "<|", "|>", "<<|im_end|>>"]))
                parts.append(rng.choice(["user\n", " hello", "你好", "😀", "", " ", "\n\n", "x"]))
            return "".join(parts)
        raise ValueError(kind)

    kinds = ["english", "words", "code", "cjk", "emoji", "numbers", "whitespace", "long", "other",
             "special"]
    cases, total = [], 0
    while total < MIB + 16384:
        pieces = [chunk(rng.choice(kinds)) for _ in range(rng.randrange(1, 4))]
        text = "".join(pieces)
        cases.append(text)
        total += len(text.encode("utf-8"))
    return cases


def invalid_cases(rng):
    bad = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc3", b"\xe4\xb8", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
           b"\xf0\x9f\x98", b"\xff", b"\xfe\xfe", b"\xf8\x88\x80\x80\x80", b"\xe0\x80\xaf",
           b"\xc2\x41", b"\xf0\x9f"]
    good = ["hello", " world", "好", "😀", "<|im_end|>", "  ", "\n", "x1"]
    cases = [b"" + b for b in bad]
    for _ in range(200):
        parts = []
        for _ in range(rng.randrange(1, 12)):
            parts.append(rng.choice(bad) if rng.random() < 0.4 else rng.choice(good).encode())
        cases.append(b"".join(parts))
    return cases


def exotic_cases(rng):
    # Short strings over the characters where regex dialects and Unicode versions could part:
    # every kind of white space, marks, digits of other scripts, case folding (İ, ſ, K), tags,
    # private use, unassigned code points, specials and their halves. Not characters assigned
    # after Unicode 14 (Debian's PCRE2 10.42): tiktoken's regex knows CJK Extension H (Unicode
    # 15) as letters, PCRE2 as unassigned (docs/tokenizers.md).
    alphabet = list("aAbBzZ 0123456789'\"!?.,;:-_/\\\t\n\r") + [
        "'S", "'ll", "'RE", "\r\n", " \n", "  ", "\u00a0", "\u180e", "\u0085", "\u2028", "\u3000",
        "\u200b", "\u200d", "\ufeff", "e\u0301", "\u0301", "\u0915\u094d", "\u0663", "\u00bd",
        "\u2167", "好", "世界", "ｶ", "カ", "한", "😀", "👍🏽", "🇯🇵", "\U0001F9D1\u200d\U0001F4BB",
        "\u0130", "\u017f", "\u212a", "ǅ", "ß", "Σ", "ς", "<|im_end|>", "<|endoftext|>",
        "<|im_start|>", "<|tool_call|>", "<|", "|>", "𝔘", "𐍈", "\U000E0001", "\uE000",
        "\U0010FFFD", "\u0378", "\u1E9E", "ꓐ"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
            for _ in range(1000)]


def write_ids(path, seqs):
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        for ids in seqs:
            assert all(0 <= i < 65536 for i in ids)
            f.write(struct.pack(f"<{len(ids)}H", *ids))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", default="/usr/include/sqlite3.h")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "data"))
    args = parser.parse_args()
    assert tokenizers.__version__ == "0.23.3", tokenizers.__version__
    assert tiktoken.__version__ == "0.14.0", tiktoken.__version__
    with open(args.corpus, encoding="utf-8") as f:
        corpus = f.read()
    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name)
    with open(out("corpus_sample.txt"), "w", encoding="utf-8") as f:
        f.write(corpus[:32768])

    # Tokenizer 1: tokenizer.json in three layouts of one trained vocabulary.
    base = json.loads(train(corpus, LLAMA3_PATTERN, 3000).to_str())
    llama3 = json.loads(json.dumps(base))
    llama3["model"]["ignore_merges"] = True
    gpt2 = json.loads(json.dumps(base))
    gpt2["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                             "use_regex": True}
    gpt2["model"]["ignore_merges"] = False
    gpt2["model"]["merges"] = [" ".join(m) for m in gpt2["model"]["merges"]]
    nfc = json.loads(json.dumps(base))
    nfc["normalizer"] = {"type": "NFC"}
    nfc["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": QWEN2_PATTERN}
    hf = {}
    for name, doc in [("bpe_llama3", llama3), ("bpe_gpt2", gpt2), ("bpe_nfc", nfc)]:
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
        with open(out(name + ".json"), "w", encoding="utf-8") as f:
            f.write(text)
        hf[name] = Tokenizer.from_str(text)

    # Tokenizer 2: a tiktoken Encoding from a rank file, trained with another pattern and size.
    second = json.loads(train(corpus, O200K_PATTERN, 4000).to_str())
    decode_byte = byte_decoder()
    vocab = sorted(((i, t) for t, i in second["model"]["vocab"].items() if t not in SPECIALS))
    ranks = {bytes(decode_byte[c] for c in t): rank for rank, (_, t) in enumerate(vocab)}
    with open(out("ranks.tiktoken"), "w") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    specials = {s: len(ranks) + i for i, s in enumerate(TIKTOKEN_SPECIALS)}
    with open(out("ranks_meta.json"), "w") as f:
        json.dump({"pattern": O200K_PATTERN, "kimi_pattern": KIMI_PATTERN,
                   "special_tokens": specials}, f, indent=1, ensure_ascii=False)
    loaded_ranks = tiktoken.load.load_tiktoken_bpe(out("ranks.tiktoken"))
    enc = tiktoken.Encoding("strider_test", pat_str=O200K_PATTERN, mergeable_ranks=loaded_ranks,
                            special_tokens=specials)
    kimi = tiktoken.Encoding("strider_test_kimi", pat_str=KIMI_PATTERN,
                             mergeable_ranks=loaded_ranks, special_tokens=specials)

    def references(text, names):
        ids = {name: hf[name].encode(text, add_special_tokens=False).ids
               for name in names if name in hf}
        ids["tiktoken"] = enc.encode(text, allowed_special="all")
        if "tiktoken_kimi" in names:
            ids["tiktoken_kimi"] = kimi.encode(text, allowed_special="all")
            assert kimi.decode(ids["tiktoken_kimi"]) == text
        for name in hf:
            if name not in ids:
                continue
            assert hf[name].decode(ids[name], skip_special_tokens=False) == text or name == "bpe_nfc"
        assert enc.decode(ids["tiktoken"]) == text
        return ids

    names = ["bpe_llama3", "bpe_gpt2", "bpe_nfc", "tiktoken", "tiktoken_kimi"]
    rng = random.Random(44)
    for prefix, cases in [("mixed", make_cases(rng, corpus)), ("invalid", invalid_cases(rng)),
                          ("exotic", exotic_cases(rng))]:
        raw = [c.encode("utf-8") if isinstance(c, str) else c for c in cases]
        # The layouts that share bpe_llama3's vocabulary are checked on the first 256 KiB.
        expected, offset = [], 0
        for r in raw:
            covered = (names if offset < KIMI_SUBSET else names[:4] if offset < SUBSET else
                       ["bpe_llama3", "tiktoken"])
            expected.append(references(r.decode("utf-8", "replace"), covered))
            offset += len(r)
        with open(out(prefix + (".bin" if prefix == "invalid" else ".txt")), "wb") as f:
            f.write(b"".join(raw))
        with open(out(prefix + ".index"), "w") as f:
            f.write("# offset length " + " ".join(names) + "\n")
            offset = 0
            for r, ids in zip(raw, expected):
                f.write(f"{offset} {len(r)} " +
                        " ".join(str(len(ids[n])) if n in ids else "-" for n in names) + "\n")
                offset += len(r)
        for n in names:
            write_ids(out(f"{prefix}.{n}.ids.gz"), [ids[n] for ids in expected if n in ids])
        print(prefix, len(raw), "cases", sum(len(r) for r in raw), "bytes",
              {n: sum(len(ids.get(n, [])) for ids in expected) for n in names})


if __name__ == "__main__":
    main()
