#include "canvas.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "font.hpp"

namespace fa_bench {

Canvas::Canvas(int width, int height, Rgb background)
    : width_(width), height_(height), rgb_(static_cast<size_t>(width) * height * 3) {
  fill_rect(0, 0, width - 1, height - 1, background);
}

Rgb Canvas::pixel(int x, int y) const {
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  return {rgb_[i], rgb_[i + 1], rgb_[i + 2]};
}

void Canvas::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  rgb_[i] = c.r;
  rgb_[i + 1] = c.g;
  rgb_[i + 2] = c.b;
}

void Canvas::fill_rect(int x0, int y0, int x1, int y1, Rgb c) {
  for (int y = std::max(y0, 0); y <= std::min(y1, height_ - 1); ++y)
    for (int x = std::max(x0, 0); x <= std::min(x1, width_ - 1); ++x) set(x, y, c);
}

void Canvas::line(double x0, double y0, double x1, double y1, Rgb c, int thickness, int dash) {
  // Step along the line in sub-pixel increments and stamp a thickness x thickness square.
  const double len = std::hypot(x1 - x0, y1 - y0);
  const int steps = std::max(1, static_cast<int>(std::ceil(len * 2.0)));
  const int lo = -(thickness - 1) / 2, hi = thickness / 2;
  for (int s = 0; s <= steps; ++s) {
    const double t = static_cast<double>(s) / steps;
    if (dash > 0 && static_cast<int>(t * len / dash) % 2 == 1) continue;
    const int x = static_cast<int>(std::lround(x0 + t * (x1 - x0)));
    const int y = static_cast<int>(std::lround(y0 + t * (y1 - y0)));
    for (int dy = lo; dy <= hi; ++dy)
      for (int dx = lo; dx <= hi; ++dx) set(x + dx, y + dy, c);
  }
}

void Canvas::text(int x, int y, std::string_view s, Rgb c, int scale) {
  for (size_t k = 0; k < s.size(); ++k) {
    const Glyph& g = glyph(s[k]);
    const int gx = x + static_cast<int>(k) * kCellWidth * scale;
    for (int row = 0; row < kGlyphHeight; ++row)
      for (int col = 0; col < kGlyphWidth; ++col)
        if (g[row] & (0x10 >> col)) fill_rect(gx + col * scale, y + row * scale, gx + (col + 1) * scale - 1, y + (row + 1) * scale - 1, c);
  }
}

void Canvas::text_vertical(int x, int y, std::string_view s, Rgb c, int scale) {
  // Glyph pixel (col, row) of character k lands at (x + row, y - (k * cell + col)).
  for (size_t k = 0; k < s.size(); ++k) {
    const Glyph& g = glyph(s[k]);
    const int gy = y - static_cast<int>(k) * kCellWidth * scale;
    for (int row = 0; row < kGlyphHeight; ++row)
      for (int col = 0; col < kGlyphWidth; ++col)
        if (g[row] & (0x10 >> col))
          fill_rect(x + row * scale, gy - (col + 1) * scale + 1, x + (row + 1) * scale - 1, gy - col * scale, c);
  }
}

namespace {

void put_u32(std::vector<uint8_t>* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<uint8_t>(v >> shift));
}

// Length, type, data, CRC-32 of type and data (PNG spec, section 5.3).
void put_chunk(std::vector<uint8_t>* out, const char type[4], const std::vector<uint8_t>& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t type_at = out->size();
  out->insert(out->end(), type, type + 4);
  out->insert(out->end(), data.begin(), data.end());
  const uLong crc = crc32(0L, out->data() + type_at, static_cast<uInt>(4 + data.size()));
  put_u32(out, static_cast<uint32_t>(crc));
}

}  // namespace

bool Canvas::write_png(const std::string& path, std::string* error) const {
  // Each scanline is a filter-type byte (0: none) followed by its RGB bytes.
  const size_t row_bytes = static_cast<size_t>(width_) * 3;
  std::vector<uint8_t> raw;
  raw.reserve((row_bytes + 1) * height_);
  for (int y = 0; y < height_; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), rgb_.begin() + y * row_bytes, rgb_.begin() + (y + 1) * row_bytes);
  }
  uLongf packed_size = compressBound(static_cast<uLong>(raw.size()));
  std::vector<uint8_t> packed(packed_size);
  if (compress2(packed.data(), &packed_size, raw.data(), static_cast<uLong>(raw.size()), 9) != Z_OK) {
    *error = "zlib compress2 failed";
    return false;
  }
  packed.resize(packed_size);

  std::vector<uint8_t> ihdr;
  put_u32(&ihdr, static_cast<uint32_t>(width_));
  put_u32(&ihdr, static_cast<uint32_t>(height_));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // bit depth 8, colour type 2 (RGB), deflate, no filter, no interlace

  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  put_chunk(&png, "IHDR", ihdr);
  put_chunk(&png, "IDAT", packed);
  put_chunk(&png, "IEND", {});

  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  if (!f) {
    *error = "cannot write " + path;
    return false;
  }
  return true;
}

}  // namespace fa_bench
