// A PNG reader for the browser tests' screenshots: enough of the format for what headless
// Chromium writes (8-bit RGB or RGBA, not interlaced), with zlib for the image data.
#pragma once

#include <zlib.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace strider::testing {

// The pixels of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes), as RGB.
struct Image {
  uint32_t width = 0, height = 0;
  std::vector<std::array<uint8_t, 3>> pixels;
};

inline uint32_t BigEndian(const std::string& data, size_t at) {
  return static_cast<uint32_t>(static_cast<uint8_t>(data[at])) << 24 |
         static_cast<uint32_t>(static_cast<uint8_t>(data[at + 1])) << 16 |
         static_cast<uint32_t>(static_cast<uint8_t>(data[at + 2])) << 8 |
         static_cast<uint32_t>(static_cast<uint8_t>(data[at + 3]));
}

// Decodes the file; an error message when it is not such a PNG.
inline std::string DecodePng(const std::string& data, Image* image) {
  if (data.size() < 8 || data.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return "not a PNG";
  std::string compressed;
  int channels = 0;
  for (size_t at = 8; at + 12 <= data.size();) {
    const uint32_t length = BigEndian(data, at);
    const std::string type = data.substr(at + 4, 4);
    if (at + 12 + length > data.size()) return "truncated chunk";
    if (type == "IHDR") {
      image->width = BigEndian(data, at + 8);
      image->height = BigEndian(data, at + 12);
      const int depth = static_cast<uint8_t>(data[at + 16]);
      const int color = static_cast<uint8_t>(data[at + 17]);
      const int interlace = static_cast<uint8_t>(data[at + 20]);
      if (depth != 8 || (color != 2 && color != 6) || interlace != 0) return "unexpected format";
      channels = color == 2 ? 3 : 4;
    } else if (type == "IDAT") {
      compressed += data.substr(at + 8, length);
    }
    at += 12 + length;
  }
  if (channels == 0) return "no IHDR";
  const size_t stride = static_cast<size_t>(image->width) * channels;
  std::vector<uint8_t> raw((stride + 1) * image->height);
  uLongf size = raw.size();
  if (uncompress(raw.data(), &size, reinterpret_cast<const Bytef*>(compressed.data()),
                 compressed.size()) != Z_OK ||
      size != raw.size()) {
    return "IDAT does not inflate to the image size";
  }
  // Undo each row's filter (PNG spec section 9).
  std::vector<uint8_t> previous(stride, 0), row(stride);
  image->pixels.clear();
  for (uint32_t y = 0; y < image->height; ++y) {
    const uint8_t* in = &raw[y * (stride + 1)];
    const int filter = in[0];
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= static_cast<size_t>(channels) ? row[x - channels] : 0;
      const int b = previous[x];
      const int c = x >= static_cast<size_t>(channels) ? previous[x - channels] : 0;
      int predictor = 0;
      switch (filter) {
        case 0:
          predictor = 0;
          break;
        case 1:
          predictor = a;
          break;
        case 2:
          predictor = b;
          break;
        case 3:
          predictor = (a + b) / 2;
          break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          predictor = pa <= pb && pa <= pc ? a : (pb <= pc ? b : c);
          break;
        }
        default:
          return "bad filter " + std::to_string(filter);
      }
      row[x] = static_cast<uint8_t>(in[1 + x] + predictor);
    }
    for (uint32_t x = 0; x < image->width; ++x) {
      image->pixels.push_back({row[x * channels], row[x * channels + 1], row[x * channels + 2]});
    }
    previous = row;
  }
  return "";
}

inline size_t CountColor(const Image& image, std::array<uint8_t, 3> color) {
  size_t n = 0;
  for (const auto& p : image.pixels) n += p == color;
  return n;
}

}  // namespace strider::testing
