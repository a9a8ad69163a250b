// UTF-8 validation and the one rule for bytes that are not UTF-8.
#include <cstring>

#include "common/tokenizer/bpe.h"
#include "common/tokenizer/tokenizer.h"

namespace strider::tokenizer {
namespace internal {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the character a lead byte starts (Unicode Table 3-7), 0 for bytes that cannot
// start one.
int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

// The allowed range of the byte after `lead`; the later ones are always 0x80..0xBF.
void SecondByteRange(unsigned char lead, unsigned char& low, unsigned char& high) {
  low = 0x80;
  high = 0xBF;
  if (lead == 0xE0)
    low = 0xA0;  // overlong
  else if (lead == 0xED)
    high = 0x9F;  // surrogates
  else if (lead == 0xF0)
    low = 0x90;  // overlong
  else if (lead == 0xF4)
    high = 0x8F;  // past U+10FFFF
}

}  // namespace

size_t AppendUtf8Replacing(std::string_view bytes, bool final, std::string& out) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();
  size_t i = 0;
  size_t run_start = 0;  // start of valid bytes not yet copied
  while (i < size) {
    if (data[i] < 0x80) {
      ++i;
      continue;
    }
    const int length = SequenceLength(data[i]);
    if (length == 0) {
      out.append(bytes.data() + run_start, i - run_start);
      out += kReplacement;
      run_start = ++i;
      continue;
    }
    unsigned char low, high;
    SecondByteRange(data[i], low, high);
    int good = 1;  // bytes of this sequence that are valid so far
    while (good < length && i + good < size) {
      const unsigned char b = data[i + good];
      const bool ok = good == 1 ? (b >= low && b <= high) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
      ++good;
    }
    if (good == length) {
      i += length;
      continue;
    }
    if (i + good == size && !final) {
      // A prefix of a character whose remaining bytes have not arrived yet.
      out.append(bytes.data() + run_start, i - run_start);
      return i;
    }
    out.append(bytes.data() + run_start, i - run_start);
    out += kReplacement;
    i += good;
    run_start = i;
  }
  out.append(bytes.data() + run_start, size - run_start);
  return size;
}

bool IsWhiteSpace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

}  // namespace internal

bool IsValidUtf8(std::string_view bytes) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();
  size_t i = 0;
  while (i < size) {
    // ASCII eight bytes at a time: most text is mostly ASCII.
    while (i + 8 <= size) {
      uint64_t word;
      std::memcpy(&word, data + i, 8);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= size) break;
    if (data[i] < 0x80) {
      ++i;
      continue;
    }
    const int length = internal::SequenceLength(data[i]);
    if (length == 0 || i + length > size) return false;
    unsigned char low, high;
    internal::SecondByteRange(data[i], low, high);
    if (data[i + 1] < low || data[i + 1] > high) return false;
    for (int k = 2; k < length; ++k) {
      if (data[i + k] < 0x80 || data[i + k] > 0xBF) return false;
    }
    i += length;
  }
  return true;
}

std::string ReplaceInvalidUtf8(std::string_view bytes) {
  if (IsValidUtf8(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 16);
  internal::AppendUtf8Replacing(bytes, /*final=*/true, out);
  return out;
}

}  // namespace strider::tokenizer
