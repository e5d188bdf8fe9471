// Log-log line plots rendered into a PNG: panels side by side, each with axes, ticks, grid,
// labels and a legend. Enough for the sweep's "time and memory against n" figure.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "canvas.hpp"

namespace fa_bench {

// How tick values are chosen and labelled: powers of two as plain counts (sequence lengths),
// powers of ten in milliseconds, powers of two in B/KiB/MiB/GiB.
enum class AxisKind { kCount, kMilliseconds, kBytes };

struct Series {
  std::string name;
  Rgb color;
  bool dashed = false;
  bool label_last = false;  // write the last point's value next to it
  std::vector<std::pair<double, double>> points;  // (x, y); points with x or y <= 0 are not drawn
};

struct Panel {
  std::string title;
  std::string x_label, y_label;
  AxisKind x_kind = AxisKind::kCount, y_kind = AxisKind::kMilliseconds;
  std::vector<Series> series;
};

// Draws the panels left to right under a figure title and note lines, and writes a PNG.
bool write_plot(const std::string& path, const std::string& title, const std::vector<std::string>& notes,
                const std::vector<Panel>& panels, std::string* error);

// The label of value v on an axis of this kind: ticks "4096", "0.1", "64 MiB"; with precise,
// three significant digits and units, "559 KiB", "3.23e+03 ms".
std::string tick_label(AxisKind kind, double v, bool precise = false);

}  // namespace fa_bench
