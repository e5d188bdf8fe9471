// An RGB raster with the few drawing primitives the plots need, text from a built-in 5x7 bitmap
// font, and a PNG writer (zlib).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fa_bench {

struct Rgb {
  uint8_t r, g, b;
};

class Canvas {
 public:
  Canvas(int width, int height, Rgb background);

  int width() const { return width_; }
  int height() const { return height_; }
  Rgb pixel(int x, int y) const;

  void set(int x, int y, Rgb c);  // clipped
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c);  // [x0, x1] x [y0, y1], clipped
  // A line `thickness` pixels wide; dash > 0 draws dash pixels on, dash pixels off.
  void line(double x0, double y0, double x1, double y1, Rgb c, int thickness = 1, int dash = 0);
  // Text with its top-left corner at (x, y); each font pixel becomes scale x scale pixels.
  void text(int x, int y, std::string_view s, Rgb c, int scale = 1);
  // The same, rotated 90 degrees counter-clockwise (reads bottom to top), its bottom-left at (x, y).
  void text_vertical(int x, int y, std::string_view s, Rgb c, int scale = 1);

  // Writes an 8-bit RGB PNG; false (with *error) when the file cannot be written.
  bool write_png(const std::string& path, std::string* error) const;

 private:
  int width_, height_;
  std::vector<uint8_t> rgb_;
};

// Font metrics: every glyph is 5x7 pixels in a 6x9 cell (one column and two rows of spacing).
inline constexpr int kGlyphWidth = 5, kGlyphHeight = 7, kCellWidth = 6, kCellHeight = 9;
inline int text_width(std::string_view s, int scale = 1) {
  return s.empty() ? 0 : (static_cast<int>(s.size()) * kCellWidth - 1) * scale;
}
inline int text_height(int scale = 1) { return kGlyphHeight * scale; }

}  // namespace fa_bench
