#include "plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace fa_bench {
namespace {

constexpr Rgb kBlack{0, 0, 0};
constexpr Rgb kGrid{225, 225, 225};
constexpr Rgb kWhite{255, 255, 255};
constexpr Rgb kGrey{90, 90, 90};

// Figure geometry, in pixels.
constexpr int kPanelWidth = 720, kPanelHeight = 600;
constexpr int kTitleHeight = 50, kNoteLineHeight = 22;
constexpr int kMarginLeft = 140, kMarginRight = 30, kMarginTop = 50, kMarginBottom = 80;
constexpr int kTextScale = 2;

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = 0.0;
  bool valid() const { return lo <= hi; }
};

// A log-scale axis mapping [lo, hi] onto pixels [p0, p1].
struct LogAxis {
  double lo, hi;
  int p0, p1;
  double map(double v) const {
    return p0 + (std::log(v) - std::log(lo)) / (std::log(hi) - std::log(lo)) * (p1 - p0);
  }
};

Range data_range(const Panel& panel, bool y) {
  Range r;
  for (const Series& s : panel.series)
    for (const auto& [px, py] : s.points) {
      if (px <= 0 || py <= 0) continue;
      const double v = y ? py : px;
      r.lo = std::min(r.lo, v);
      r.hi = std::max(r.hi, v);
    }
  return r;
}

// Widens [lo, hi] by a few percent in log space so points do not sit on the frame.
Range padded(Range r) {
  if (!r.valid()) return {1.0, 10.0};
  if (r.hi / r.lo < 1.5) {
    r.lo /= 2;
    r.hi *= 2;
  }
  const double pad = std::pow(r.hi / r.lo, 0.05);
  return {r.lo / pad, r.hi * pad};
}

// Tick values: powers of the axis' base inside [lo, hi], thinned to at most max_ticks.
std::vector<double> ticks(AxisKind kind, Range r, int max_ticks) {
  const double base = kind == AxisKind::kMilliseconds ? 10.0 : 2.0;
  const int e0 = static_cast<int>(std::ceil(std::log(r.lo) / std::log(base) - 1e-9));
  const int e1 = static_cast<int>(std::floor(std::log(r.hi) / std::log(base) + 1e-9));
  int stride = 1;
  while ((e1 - e0) / stride + 1 > max_ticks) ++stride;
  // Byte axes read best at whole KiB/MiB/GiB when thinned: align the stride to multiples of 10.
  if (kind == AxisKind::kBytes && stride > 5) stride = 10;
  else if (kind == AxisKind::kBytes && stride > 2) stride = 5;
  std::vector<double> t;
  for (int e = e0; e <= e1; ++e)
    if (((e % stride) + stride) % stride == 0) t.push_back(std::pow(base, e));
  if (t.size() < 3 && kind == AxisKind::kMilliseconds) {  // a narrow range: add 2x and 5x ticks
    t.clear();
    for (int e = e0 - 1; e <= e1; ++e)
      for (double m : {1.0, 2.0, 5.0}) {
        const double v = m * std::pow(10.0, e);
        if (v >= r.lo && v <= r.hi) t.push_back(v);
      }
  }
  return t;
}

void draw_panel(Canvas* c, const Panel& panel, int x_origin, int y_origin) {
  const int left = x_origin + kMarginLeft, right = x_origin + kPanelWidth - kMarginRight;
  const int top = y_origin + kMarginTop, bottom = y_origin + kPanelHeight - kMarginBottom;
  const Range xr = padded(data_range(panel, false)), yr = padded(data_range(panel, true));
  const LogAxis xa{xr.lo, xr.hi, left, right}, ya{yr.lo, yr.hi, bottom, top};

  c->text(x_origin + (kPanelWidth - text_width(panel.title, kTextScale)) / 2, y_origin + 15, panel.title, kBlack,
          kTextScale);

  for (double t : ticks(panel.x_kind, xr, 8)) {
    const int x = static_cast<int>(std::lround(xa.map(t)));
    c->line(x, top, x, bottom, kGrid);
    c->line(x, bottom, x, bottom + 6, kBlack);
    const std::string label = tick_label(panel.x_kind, t);
    c->text(x - text_width(label, kTextScale) / 2, bottom + 12, label, kBlack, kTextScale);
  }
  for (double t : ticks(panel.y_kind, yr, 9)) {
    const int y = static_cast<int>(std::lround(ya.map(t)));
    c->line(left, y, right, y, kGrid);
    c->line(left - 6, y, left, y, kBlack);
    const std::string label = tick_label(panel.y_kind, t);
    c->text(left - 10 - text_width(label, kTextScale), y - text_height(kTextScale) / 2, label, kBlack, kTextScale);
  }
  // Frame over the grid.
  c->line(left, top, right, top, kBlack);
  c->line(left, bottom, right, bottom, kBlack);
  c->line(left, top, left, bottom, kBlack);
  c->line(right, top, right, bottom, kBlack);

  c->text((left + right - text_width(panel.x_label, kTextScale)) / 2, bottom + 45, panel.x_label, kBlack, kTextScale);
  c->text_vertical(x_origin + 8, (top + bottom + text_width(panel.y_label, kTextScale)) / 2, panel.y_label, kBlack,
                   kTextScale);

  for (const Series& s : panel.series) {
    bool have_prev = false;
    double px = 0, py = 0;
    for (const auto& [vx, vy] : s.points) {
      if (vx <= 0 || vy <= 0) {
        have_prev = false;
        continue;
      }
      const double x = xa.map(vx), y = ya.map(vy);
      if (have_prev) c->line(px, py, x, y, s.color, 3, s.dashed ? 8 : 0);
      const int ix = static_cast<int>(std::lround(x)), iy = static_cast<int>(std::lround(y));
      c->fill_rect(ix - 4, iy - 4, ix + 4, iy + 4, s.color);
      px = x;
      py = y;
      have_prev = true;
    }
    // The last value, written just above-left (or below-left) of its point: reads off the end of each curve.
    if (s.label_last && have_prev) {
      const std::string label = tick_label(panel.y_kind, s.points.back().second, /*precise=*/true);
      int label_y = static_cast<int>(py) - 10 - text_height(kTextScale);
      if (label_y < top + 4) label_y = static_cast<int>(py) + 10;  // no room above: below the point
      c->text(static_cast<int>(px) - 10 - text_width(label, kTextScale), label_y, label, s.color, kTextScale);
    }
  }

  // Legend: top-left inside the frame, on white.
  int legend_w = 0;
  for (const Series& s : panel.series) legend_w = std::max(legend_w, text_width(s.name, kTextScale));
  const int row_h = 26, lx = left + 12, ly = top + 12;
  const int box_w = 60 + legend_w, box_h = static_cast<int>(panel.series.size()) * row_h + 10;
  c->fill_rect(lx, ly, lx + box_w, ly + box_h, kWhite);
  c->line(lx, ly, lx + box_w, ly, kGrey);
  c->line(lx, ly + box_h, lx + box_w, ly + box_h, kGrey);
  c->line(lx, ly, lx, ly + box_h, kGrey);
  c->line(lx + box_w, ly, lx + box_w, ly + box_h, kGrey);
  for (size_t k = 0; k < panel.series.size(); ++k) {
    const Series& s = panel.series[k];
    const int y = ly + 10 + static_cast<int>(k) * row_h + text_height(kTextScale) / 2;
    c->line(lx + 8, y, lx + 44, y, s.color, 3, s.dashed ? 8 : 0);
    c->fill_rect(lx + 22, y - 4, lx + 30, y + 4, s.color);
    c->text(lx + 52, y - text_height(kTextScale) / 2, s.name, kBlack, kTextScale);
  }
}

std::string format(const char* fmt, double v, const char* unit) {
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, v, unit);
  return buf;
}

}  // namespace

std::string tick_label(AxisKind kind, double v, bool precise) {
  switch (kind) {
    case AxisKind::kCount: return format("%.0f%s", v, "");
    case AxisKind::kMilliseconds: return format(precise ? "%.3g%s" : v < 1.0 ? "%g%s" : "%.0f%s", v, precise ? " ms" : "");
    case AxisKind::kBytes: {
      static const char* const kUnits[] = {" B", " KiB", " MiB", " GiB", " TiB"};
      int u = 0;
      while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        ++u;
      }
      return format(precise ? "%.3g%s" : "%.0f%s", v, kUnits[u]);
    }
  }
  return {};
}

bool write_plot(const std::string& path, const std::string& title, const std::vector<std::string>& notes,
                const std::vector<Panel>& panels, std::string* error) {
  const int width = kPanelWidth * static_cast<int>(std::max<size_t>(panels.size(), 1));
  const int header = kTitleHeight + kNoteLineHeight * static_cast<int>(notes.size());
  Canvas c(width, header + kPanelHeight, kWhite);
  c.text((width - text_width(title, kTextScale)) / 2, 12, title, kBlack, kTextScale);
  for (size_t k = 0; k < notes.size(); ++k) {
    const int scale = text_width(notes[k], kTextScale) + 20 <= width ? kTextScale : 1;
    c.text((width - text_width(notes[k], scale)) / 2, 40 + kNoteLineHeight * static_cast<int>(k), notes[k], kGrey, scale);
  }
  for (size_t k = 0; k < panels.size(); ++k) draw_panel(&c, panels[k], static_cast<int>(k) * kPanelWidth, header);
  return c.write_png(path, error);
}

}  // namespace fa_bench
