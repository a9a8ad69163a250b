#include "common/schema/crc32c.h"

#include <array>
#include <cstring>

namespace strider::schema {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = MakeTable();

uint32_t SoftwareCrc(const uint8_t* bytes, size_t size, uint32_t crc) {
  for (size_t i = 0; i < size; ++i) crc = kTable[(crc ^ bytes[i]) & 0xFFu] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// Multiplication of two polynomials modulo the CRC polynomial, in the reflected bit order CRCs
// use (bit 31 is x^0). Shifting a CRC state over n zero bytes is multiplying it by x^(8n).
uint32_t MultiplyModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ kPolynomial : b >> 1;
  }
  return product;
}

// x^(8 * bytes) modulo the polynomial, reflected.
uint32_t ShiftOperator(size_t bytes) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t power = 1u << 23;   // x^8: one byte
  for (size_t n = bytes; n != 0; n >>= 1) {
    if (n & 1) result = MultiplyModP(power, result);
    power = MultiplyModP(power, power);
  }
  return result;
}

__attribute__((target("sse4.2"))) uint32_t HardwareCrcOneStream(const uint8_t* bytes,
                                                                size_t size, uint32_t crc) {
  uint64_t wide = crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, bytes, 8);
    wide = __builtin_ia32_crc32di(wide, word);
    bytes += 8;
    size -= 8;
  }
  uint32_t narrow = static_cast<uint32_t>(wide);
  while (size > 0) {
    narrow = __builtin_ia32_crc32qi(narrow, *bytes);
    ++bytes;
    --size;
  }
  return narrow;
}

// The crc32 instruction has a latency of 3 cycles but issues one per cycle: three independent
// streams over consecutive blocks run about three times faster than one. Their states are
// joined by shifting (a CRC is linear: crc(A B) = shift(crc(A), |B|) ^ crc_from_zero(B)).
constexpr size_t kLaneBytes = 4096;

__attribute__((target("sse4.2"))) uint32_t HardwareCrc(const uint8_t* bytes, size_t size,
                                                       uint32_t crc) {
  static const uint32_t kShiftLane = ShiftOperator(kLaneBytes);
  while (size >= 3 * kLaneBytes) {
    uint64_t a = crc;
    uint64_t b = 0;
    uint64_t c = 0;
    const uint8_t* pa = bytes;
    const uint8_t* pb = bytes + kLaneBytes;
    const uint8_t* pc = bytes + 2 * kLaneBytes;
    for (size_t i = 0; i < kLaneBytes; i += 8) {
      uint64_t wa, wb, wc;
      std::memcpy(&wa, pa + i, 8);
      std::memcpy(&wb, pb + i, 8);
      std::memcpy(&wc, pc + i, 8);
      a = __builtin_ia32_crc32di(a, wa);
      b = __builtin_ia32_crc32di(b, wb);
      c = __builtin_ia32_crc32di(c, wc);
    }
    const uint32_t ab = MultiplyModP(kShiftLane, static_cast<uint32_t>(a)) ^
                        static_cast<uint32_t>(b);
    crc = MultiplyModP(kShiftLane, ab) ^ static_cast<uint32_t>(c);
    bytes += 3 * kLaneBytes;
    size -= 3 * kLaneBytes;
  }
  return HardwareCrcOneStream(bytes, size, crc);
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  if (HasSse42()) return ~HardwareCrc(bytes, size, crc);
#endif
  return ~SoftwareCrc(bytes, size, crc);
}

}  // namespace strider::schema
