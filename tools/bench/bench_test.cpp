// Tests of the bench's own parts: flag parsing, the FLOP conventions, the PNG writer, the plot
// labels, JSON output (CPU and GPU objects) and the error metrics. (The kernels are tested in tests/.)
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "canvas.hpp"
#include "check.hpp"
#include "flags.hpp"
#include "font.hpp"
#include "json.hpp"
#include "plot.hpp"
#include "report.hpp"
#include "runner.hpp"
#include "timing.hpp"
#include "workload.hpp"

namespace fa_bench {
namespace {

ParseResult parse(std::vector<std::string> args, Options* o) {
  args.insert(args.begin(), "flashattn-bench");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return parse_options(static_cast<int>(argv.size()), argv.data(), o);
}

TEST(BenchFlags, DefaultsAreTheHeadlineShape) {
  Options o;
  ASSERT_EQ(parse({}, &o).outcome, ParseOutcome::kRun);
  EXPECT_EQ(o.batch, 1);
  EXPECT_EQ(o.heads_q, 8);
  EXPECT_EQ(o.seqlen_q, 4096);
  EXPECT_EQ(o.seqlen_k, 4096);
  EXPECT_EQ(o.head_dim, 128);
  EXPECT_EQ(o.dtype, flashattn::DType::kFloat32);
  EXPECT_FALSE(o.causal);
  EXPECT_FALSE(o.sweep);
}

TEST(BenchFlags, ValuesInBothSpellings) {
  Options o;
  ASSERT_EQ(parse({"--seqlen", "100", "--seqlen-k=77", "--window=3,-1", "--dtype", "bf16", "--causal-top-left",
                   "--heads", "6", "--heads-kv", "2", "--threads=1", "--json"},
                  &o).outcome,
            ParseOutcome::kRun);
  EXPECT_EQ(o.seqlen_q, 100);
  EXPECT_EQ(o.seqlen_k, 77);
  EXPECT_EQ(o.window_left, 3);
  EXPECT_EQ(o.window_right, -1);
  EXPECT_EQ(o.dtype, flashattn::DType::kBFloat16);
  EXPECT_TRUE(o.causal);
  EXPECT_EQ(o.alignment, flashattn::Alignment::kTopLeft);
  EXPECT_EQ(o.heads_kv, 2);
  EXPECT_EQ(o.threads, 1);
  EXPECT_TRUE(o.json);
}

TEST(BenchFlags, BadFlagsNameTheFlag) {
  const std::vector<std::vector<std::string>> bad = {
      {"--seqlen", "abc"}, {"--seqlen", "0"},   {"--batch"},          {"--window", "3"},
      {"--dtype", "fp8"},  {"--frobnicate"},    {"--causal=yes"},     {"--sweep", "512,x"},
      {"--softcap", "-1"}, {"--repeats", "0"},  {"--sweep", "--backward"}};
  for (const auto& args : bad) {
    Options o;
    const ParseResult r = parse(args, &o);
    EXPECT_EQ(r.outcome, ParseOutcome::kError) << args[0];
    EXPECT_NE(r.error.find("--"), std::string::npos) << r.error;
  }
  Options o;
  EXPECT_NE(parse({"--seqlen", "abc"}, &o).error.find("--seqlen"), std::string::npos);
}

TEST(BenchFlags, SweepLists) {
  Options o;
  ASSERT_EQ(parse({"--sweep", "--json"}, &o).outcome, ParseOutcome::kRun);
  EXPECT_EQ(o.sweep_n, default_sweep());
  EXPECT_EQ(o.sweep_n.front(), 256);
  EXPECT_EQ(o.sweep_n.back(), 16384);
  EXPECT_TRUE(o.json);
  Options p;
  ASSERT_EQ(parse({"--sweep", "512,1024"}, &p).outcome, ParseOutcome::kRun);
  EXPECT_EQ(p.sweep_n, (std::vector<int64_t>{512, 1024}));
  Options h;
  EXPECT_EQ(parse({"--help"}, &h).outcome, ParseOutcome::kHelp);
}

TEST(BenchFlags, DeviceAndKernel) {
  Options o;
  ASSERT_EQ(parse({}, &o).outcome, ParseOutcome::kRun);
  EXPECT_EQ(o.device, Device::kCpu);
  EXPECT_EQ(o.kernel, flashattn::Backend::kAuto);
  for (const KernelChoice& k : kGpuKernels) EXPECT_STREQ(kernel_name(k.backend), k.name);

  // --kernel picks a GPU kernel, so it needs --device cuda; unknown values list the known ones.
  Options c;
  ParseResult r = parse({"--kernel", "sm80"}, &c);
  EXPECT_EQ(r.outcome, ParseOutcome::kError);
  EXPECT_NE(r.error.find("--device cuda"), std::string::npos) << r.error;
  r = parse({"--device", "cuda", "--kernel", "sm70"}, &c);
  EXPECT_EQ(r.outcome, ParseOutcome::kError);
  EXPECT_NE(r.error.find("auto|sm80"), std::string::npos) << r.error;
  r = parse({"--device", "tpu"}, &c);
  EXPECT_EQ(r.outcome, ParseOutcome::kError);
  EXPECT_NE(r.error.find("--device"), std::string::npos) << r.error;

  Options g;
  r = parse({"--device", "cuda", "--kernel=sm80", "--seqlen", "100"}, &g);
  if (built_with_cuda()) {
    ASSERT_EQ(r.outcome, ParseOutcome::kRun) << r.error;
    EXPECT_EQ(g.device, Device::kCuda);
    EXPECT_EQ(g.kernel, flashattn::Backend::kCudaSm80);
    EXPECT_EQ(g.dtype, flashattn::DType::kBFloat16);  // the GPU default: no fp32 kernels
    EXPECT_EQ(g.repeats, kGpuDefaultRepeats);
    Options h;
    ASSERT_EQ(parse({"--dtype", "fp16", "--repeats", "3", "--device", "cuda"}, &h).outcome, ParseOutcome::kRun);
    EXPECT_EQ(h.dtype, flashattn::DType::kFloat16);
    EXPECT_EQ(h.repeats, 3);
    Options s;
    r = parse({"--device", "cuda", "--sweep"}, &s);
    EXPECT_EQ(r.outcome, ParseOutcome::kError);
    EXPECT_NE(r.error.find("--sweep"), std::string::npos) << r.error;
  } else {
    // A CPU-only build says so by name instead of failing later.
    EXPECT_EQ(r.outcome, ParseOutcome::kError);
    EXPECT_NE(r.error.find("--device cuda"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("without CUDA"), std::string::npos) << r.error;
  }
}

flashattn::AttentionParams params(int64_t sq, int64_t sk, bool causal, flashattn::Alignment a, int64_t wl = -1,
                                  int64_t wr = -1) {
  flashattn::AttentionParams p;
  p.batch = 2;
  p.heads_q = p.heads_kv = 3;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = 64;
  p.head_dim_v = 32;
  p.causal = causal;
  p.alignment = a;
  p.window_left = wl;
  p.window_right = wr;
  return p;
}

TEST(BenchFlops, VisiblePairsAreExact) {
  using flashattn::Alignment;
  EXPECT_EQ(visible_pairs(params(7, 5, false, Alignment::kBottomRight)), 2 * 7 * 5);
  EXPECT_EQ(visible_pairs(params(100, 100, true, Alignment::kBottomRight)), 2 * 100 * 101 / 2);
  EXPECT_EQ(visible_pairs(params(3, 5, true, Alignment::kTopLeft)), 2 * (1 + 2 + 3));
  EXPECT_EQ(visible_pairs(params(3, 5, true, Alignment::kBottomRight)), 2 * (3 + 4 + 5));
  EXPECT_EQ(visible_pairs(params(5, 2, true, Alignment::kBottomRight)), 2 * (1 + 2));  // rows 0..2 see nothing
  EXPECT_EQ(visible_pairs(params(5, 5, false, Alignment::kBottomRight, 1, 0)), 2 * (1 + 2 + 2 + 2 + 2));
  const auto p = params(100, 100, true, Alignment::kBottomRight);
  EXPECT_DOUBLE_EQ(forward_flops(p), 2.0 * (64 + 32) * 3 * visible_pairs(p));
  EXPECT_DOUBLE_EQ(backward_flops(p), 2.5 * forward_flops(p));
}

TEST(BenchFlops, PapersCountForTheGpu) {
  using flashattn::Alignment;
  bool papers = false;
  auto p = params(100, 100, false, Alignment::kBottomRight);  // batch 2, 3 heads, d 64, dv 32
  EXPECT_DOUBLE_EQ(paper_forward_flops(p, &papers), 2.0 * 2 * 3 * 100 * 100 * (64 + 32));
  EXPECT_TRUE(papers);
  p.head_dim_v = 64;
  EXPECT_DOUBLE_EQ(paper_forward_flops(p), 4.0 * 2 * 3 * 100 * 100 * 64);  // 4·b·h·Sq·Sk·d
  p.causal = true;
  EXPECT_DOUBLE_EQ(paper_forward_flops(p), 2.0 * 2 * 3 * 100 * 100 * 64);  // halved, not n(n+1)/2
  EXPECT_LT(paper_forward_flops(p), forward_flops(p));
  const auto w = params(50, 50, false, Alignment::kBottomRight, 7, 0);
  EXPECT_DOUBLE_EQ(paper_forward_flops(w, &papers), forward_flops(w));  // no window in the papers
  EXPECT_FALSE(papers);
}

TEST(BenchJson, GpuFields) {
  GpuResult r;
  r.shape.dtype = flashattn::DType::kBFloat16;
  r.gpu.name = "Test GPU";
  r.gpu.cc_major = 9;
  r.kernel = flashattn::Backend::kCudaSm80;
  r.forward_flops = 2e12;
  r.copies = 7;
  r.flash_fwd.ran = true;
  r.flash_fwd.timing = summarize({4.0, 5.0, 6.0});
  r.flash_fwd.gflops = gflops(r.forward_flops, r.flash_fwd.timing.median_ms);
  r.backward = true;
  r.flash_bwd.skipped = "sm80 does not take this backward: softcap";
  Options o;
  const std::string j = gpu_to_json(r, o);
  EXPECT_NE(j.find(R"("device": "cuda")"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("device_name": "Test GPU")"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("kernel": "sm80")"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("compute_capability": "9.0")"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("flash_ms": 5,)"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("flash_tflops": 400,)"), std::string::npos) << j;  // 2e12 FLOP in 5 ms
  EXPECT_NE(j.find(R"("copies": 7,)"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("flash_bwd_tflops": null)"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("flash_bwd_skipped_reason": "sm80 does not take this backward: softcap")"), std::string::npos) << j;
}

TEST(BenchTiming, Summarize) {
  const Timing t = summarize({3.0, 1.0, 2.0, 10.0});
  EXPECT_EQ(t.ms.size(), 4u);
  EXPECT_DOUBLE_EQ(t.median_ms, 2.5);
  EXPECT_DOUBLE_EQ(t.min_ms, 1.0);
}

TEST(BenchTiming, RepeatsAndTimeBudget) {
  int calls = 0;
  Timing t;
  ASSERT_TRUE(measure([&] { return ++calls > 0; }, 4, 100.0, &t));
  EXPECT_EQ(calls, 5);  // warm-up + 4
  EXPECT_EQ(t.ms.size(), 4u);
  EXPECT_LE(t.min_ms, t.median_ms);

  calls = 0;
  ASSERT_TRUE(measure([&] {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return true;
  }, 50, 0.1, &t));
  EXPECT_GE(t.ms.size(), 1u);
  EXPECT_LT(t.ms.size(), 5u);
  EXPECT_GE(t.median_ms, 29.0);
  EXPECT_FALSE(measure([] { return false; }, 3, 1.0, &t));
}

// Parses a PNG: checks the signature and every chunk's CRC, returns the RGB scanlines.
std::vector<uint8_t> decode_png(const std::string& path, uint32_t* w, uint32_t* h) {
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> d((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  EXPECT_TRUE(d.size() > 8 && std::equal(sig, sig + 8, d.begin()));
  const auto be32 = [&d](size_t at) {
    return (uint32_t{d[at]} << 24) | (uint32_t{d[at + 1]} << 16) | (uint32_t{d[at + 2]} << 8) | d[at + 3];
  };
  std::vector<uint8_t> idat;
  for (size_t at = 8; at + 12 <= d.size();) {
    const uint32_t len = be32(at);
    const std::string type(d.begin() + at + 4, d.begin() + at + 8);
    EXPECT_EQ(crc32(0L, d.data() + at + 4, len + 4), be32(at + 8 + len)) << type;
    if (type == "IHDR") {
      *w = be32(at + 8);
      *h = be32(at + 12);
      EXPECT_EQ(d[at + 16], 8);  // bit depth
      EXPECT_EQ(d[at + 17], 2);  // RGB
    }
    if (type == "IDAT") idat.insert(idat.end(), d.begin() + at + 8, d.begin() + at + 8 + len);
    at += 12 + len;
  }
  std::vector<uint8_t> raw(static_cast<size_t>(*h) * (*w * 3 + 1));
  uLongf raw_len = raw.size();
  EXPECT_EQ(uncompress(raw.data(), &raw_len, idat.data(), idat.size()), Z_OK);
  EXPECT_EQ(raw_len, raw.size());
  return raw;
}

TEST(BenchPng, RoundTripsPixels) {
  Canvas c(7, 5, {10, 20, 30});
  c.set(0, 0, {255, 0, 0});
  c.set(6, 4, {0, 255, 0});
  c.set(100, 100, {1, 2, 3});  // clipped, no effect
  const std::string path = (std::filesystem::temp_directory_path() / "flashattn_bench_test.png").string();
  std::string error;
  ASSERT_TRUE(c.write_png(path, &error)) << error;
  uint32_t w = 0, h = 0;
  const std::vector<uint8_t> raw = decode_png(path, &w, &h);
  std::filesystem::remove(path);
  ASSERT_EQ(w, 7u);
  ASSERT_EQ(h, 5u);
  for (uint32_t y = 0; y < h; ++y) {
    EXPECT_EQ(raw[y * (w * 3 + 1)], 0);  // filter byte
    for (uint32_t x = 0; x < w; ++x) {
      const Rgb want = c.pixel(static_cast<int>(x), static_cast<int>(y));
      const uint8_t* got = &raw[y * (w * 3 + 1) + 1 + x * 3];
      EXPECT_EQ(got[0], want.r);
      EXPECT_EQ(got[1], want.g);
      EXPECT_EQ(got[2], want.b);
    }
  }
  EXPECT_EQ(c.pixel(0, 0).r, 255);
  EXPECT_EQ(c.pixel(6, 4).g, 255);
  EXPECT_EQ(c.pixel(3, 2).b, 30);
}

TEST(BenchPng, TextStaysInItsBox) {
  EXPECT_NE(glyph('A'), glyph('B'));
  EXPECT_EQ(glyph('\x01'), glyph('?'));
  Canvas c(60, 20, {255, 255, 255});
  c.text(2, 3, "n=16", {0, 0, 0}, 2);
  int inside = 0, outside = 0;
  for (int y = 0; y < 20; ++y)
    for (int x = 0; x < 60; ++x) {
      const bool ink = c.pixel(x, y).r == 0;
      const bool in_box = x >= 2 && x < 2 + text_width("n=16", 2) && y >= 3 && y < 3 + text_height(2);
      (in_box ? inside : outside) += ink;
    }
  EXPECT_GT(inside, 20);
  EXPECT_EQ(outside, 0);
}

TEST(BenchPlot, TickLabelsAndAFile) {
  EXPECT_EQ(tick_label(AxisKind::kCount, 4096), "4096");
  EXPECT_EQ(tick_label(AxisKind::kMilliseconds, 0.1), "0.1");
  EXPECT_EQ(tick_label(AxisKind::kMilliseconds, 100), "100");
  EXPECT_EQ(tick_label(AxisKind::kBytes, 1024.0 * 1024), "1 MiB");
  EXPECT_EQ(tick_label(AxisKind::kBytes, 512.0 * 1024, true), "512 KiB");

  Panel p{"t", "n", "ms", AxisKind::kCount, AxisKind::kMilliseconds, {}};
  p.series.push_back({"a", {200, 0, 0}, false, true, {{256, 1.0}, {512, 4.0}, {1024, 0.0}}});
  const std::string path = (std::filesystem::temp_directory_path() / "flashattn_bench_plot.png").string();
  std::string error;
  ASSERT_TRUE(write_plot(path, "title", {"note"}, {p, p}, &error)) << error;
  uint32_t w = 0, h = 0;
  decode_png(path, &w, &h);
  std::filesystem::remove(path);
  EXPECT_GT(w, 1000u);
  EXPECT_GT(h, 500u);
}

TEST(BenchJson, QuotesAndNulls) {
  JsonObject j;
  j.string("s", "a\"b\\c\n").number("nan", std::nan("")).number("inf", INFINITY).integer("i", -3).boolean("b", true);
  EXPECT_EQ(j.str(), R"({"s": "a\"b\\c\u000a", "nan": null, "inf": null, "i": -3, "b": true})");
}

TEST(BenchErrors, NaNCountsAsInfinite) {
  Storage a(flashattn::DType::kFloat32, 4), b(flashattn::DType::kFloat32, 4);
  a.fill_random(1);
  b = a;
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  b.fill_nan();
  EXPECT_TRUE(std::isinf(max_abs_diff(a, b)));
  a.fill_nan();
  EXPECT_EQ(max_abs_diff(a, b), 0.0);  // NaN where NaN is expected is no error
}

TEST(BenchErrors, ForwardRowCheckFindsAWrongOutput) {
  Shape s;
  s.batch = 2;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.seqlen_q = 9;
  s.seqlen_k = 13;
  s.head_dim = 16;
  s.head_dim_v = 8;
  s.causal = true;
  Workload w(s, 7, false);
  flashattn::Launch ref;
  ref.backend = flashattn::Backend::kReference;
  const flashattn::ForwardParams p = w.forward_params(Path::kFlash);
  ASSERT_TRUE(flashattn::forward(p, ref).ok());
  const ForwardError good = check_forward_rows(p, 200, 3);
  EXPECT_GT(good.rows, 0);
  EXPECT_LT(good.o, 1e-6);
  EXPECT_LT(good.lse, 1e-5);
  static_cast<float*>(p.o.data)[0] += 0.5f;  // row 0 of batch 0, head 0 is always sampled
  EXPECT_GT(check_forward_rows(p, 200, 3).o, 0.4);
}

TEST(BenchSizes, OverflowAndReducedShape) {
  Shape s;
  s.batch = int64_t{1} << 40;
  s.seqlen_q = s.seqlen_k = int64_t{1} << 30;
  uint64_t bytes = 0;
  std::string error;
  EXPECT_FALSE(workload_bytes(s, true, &bytes, &error));
  EXPECT_FALSE(error.empty());

  Shape full;
  full.batch = 3;
  full.heads_q = 12;
  full.heads_kv = 4;
  full.seqlen_q = 4096;
  full.seqlen_k = 1024;
  const Shape r = reduced_shape(full);
  EXPECT_EQ(r.batch, 1);
  EXPECT_EQ(r.heads_kv, 2);
  EXPECT_EQ(r.heads_q, 6);  // the GQA ratio stays 3
  EXPECT_EQ(r.seqlen_q, kBackwardCheckLen);
  EXPECT_EQ(r.seqlen_k, kBackwardCheckLen / 4);
}

}  // namespace
}  // namespace fa_bench
