// The C ABI gives the C++ API's results bit for bit and its errors code for code, with safe
// message buffers and struct_size versioning.
#include "flashattn/flashattn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/backends.hpp"
#include "flashattn/flashattn.hpp"
#include "support/test_util.hpp"

namespace fa_test {
namespace {

using flashattn::AttentionParams;
using flashattn::BackwardParams;
using flashattn::ForwardParams;
using flashattn::Launch;
using flashattn::Status;

fa_const_tensor to_c(const flashattn::ConstTensor& t) { return {t.data, t.batch_stride, t.row_stride, t.head_stride}; }
fa_tensor to_c(const flashattn::Tensor& t) { return {t.data, t.batch_stride, t.row_stride, t.head_stride}; }

// The C params a C caller would write for the same call, field by field.
template <class C>
void fill_attention(C& c, const AttentionParams& a) {
  c.dtype = static_cast<int32_t>(a.dtype);
  c.batch = a.batch;
  c.seqlen_q = a.seqlen_q;
  c.seqlen_k = a.seqlen_k;
  c.heads_q = a.heads_q;
  c.heads_kv = a.heads_kv;
  c.head_dim = a.head_dim;
  c.head_dim_v = a.head_dim_v;
  c.q = to_c(a.q);
  c.k = to_c(a.k);
  c.v = to_c(a.v);
  c.maybe_cu_seqlens_q = a.maybe_cu_seqlens_q;
  c.maybe_cu_seqlens_k = a.maybe_cu_seqlens_k;
  c.softmax_scale = a.softmax_scale;
  c.causal = a.causal ? 1 : 0;
  c.alignment = static_cast<int32_t>(a.alignment);
  c.window_left = a.window_left;
  c.window_right = a.window_right;
  c.softcap = a.softcap;
  c.maybe_alibi_slopes = a.maybe_alibi_slopes;
  c.alibi_batch_stride = a.alibi_batch_stride;
  c.maybe_bias.data = a.maybe_bias.data;
  c.maybe_bias.dtype = static_cast<int32_t>(a.maybe_bias.dtype);
  c.maybe_bias.batch_stride = a.maybe_bias.batch_stride;
  c.maybe_bias.head_stride = a.maybe_bias.head_stride;
  c.maybe_bias.row_stride = a.maybe_bias.row_stride;
  c.maybe_mask.data = a.maybe_mask.data;
  c.maybe_mask.batch_stride = a.maybe_mask.batch_stride;
  c.maybe_mask.head_stride = a.maybe_mask.head_stride;
  c.maybe_mask.row_stride = a.maybe_mask.row_stride;
}

fa_forward_params to_c(const ForwardParams& f) {
  fa_forward_params c;
  fa_forward_params_init(&c);
  fill_attention(c, f);
  c.o = to_c(f.o);
  c.maybe_lse = f.maybe_lse;
  c.lse_batch_stride = f.lse_batch_stride;
  c.lse_head_stride = f.lse_head_stride;
  return c;
}

fa_backward_params to_c(const BackwardParams& g) {
  fa_backward_params c;
  fa_backward_params_init(&c);
  fill_attention(c, g);
  c.o = to_c(g.o);
  c.d_o = to_c(g.d_o);
  c.lse = g.lse;
  c.lse_batch_stride = g.lse_batch_stride;
  c.lse_head_stride = g.lse_head_stride;
  c.dq = to_c(g.dq);
  c.dk = to_c(g.dk);
  c.dv = to_c(g.dv);
  c.deterministic = g.deterministic ? 1 : 0;
  return c;
}

fa_launch to_c(const Launch& l) {
  fa_launch c;
  fa_launch_init(&c);
  c.backend = static_cast<int32_t>(l.backend);
  c.num_threads = l.num_threads;
  c.stream = l.stream;
  c.workspace = l.workspace;
  c.workspace_bytes = l.workspace_bytes;
  return c;
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  const auto* b = reinterpret_cast<const uint8_t*>(v.data());
  return {b, b + v.size() * sizeof(T)};
}

std::vector<std::vector<uint8_t>> outputs_of(const Problem& p) {
  return {bytes_of(p.o.storage), bytes_of(p.lse), bytes_of(p.dq.storage), bytes_of(p.dk.storage),
          bytes_of(p.dv.storage)};
}

// A problem where every C field matters: dropping or misplacing any option changes the result.
Case all_options_case() {
  Case c;
  c.dtype = DType::kFloat16;
  c.batch = 2;
  c.seqlen_q = 37;
  c.seqlen_k = 29;
  c.heads_q = 6;
  c.heads_kv = 2;
  c.head_dim = 40;
  c.head_dim_v = 24;
  c.scale = 0.3f;
  c.causal = true;
  c.alignment = Alignment::kTopLeft;
  c.window_left = 11;
  c.softcap = 5.0f;
  c.alibi = AlibiKind::kPerBatchHead;
  c.bias = true;
  c.bias_dtype = DType::kBFloat16;
  c.bias_broadcast = true;
  c.mask = MaskKind::kRandom;
  c.strided = true;
  return c;
}

Case varlen_case() {
  Case c;
  c.varlen_q = {9, 0, 33, 4};
  c.varlen_k = {12, 5, 17, 4};
  c.heads_q = 4;
  c.heads_kv = 1;
  c.head_dim = 64;
  c.window_right = 2;
  c.window_left = 20;
  c.alibi = AlibiKind::kPerHead;
  c.mask = MaskKind::kKeyPadding;
  return c;
}

TEST(CApi, InitSetsTheCppDefaults) {
  fa_forward_params f;
  std::memset(static_cast<void*>(&f), 0xff, sizeof f);
  fa_forward_params_init(&f);
  const ForwardParams df;
  EXPECT_EQ(f.struct_size, sizeof(fa_forward_params));
  EXPECT_EQ(f.dtype, static_cast<int32_t>(df.dtype));
  EXPECT_EQ(f.batch, df.batch);
  EXPECT_EQ(f.head_dim_v, df.head_dim_v);
  EXPECT_EQ(f.q.data, df.q.data);
  EXPECT_EQ(f.maybe_cu_seqlens_q, df.maybe_cu_seqlens_q);
  EXPECT_EQ(f.softmax_scale, df.softmax_scale);
  EXPECT_EQ(f.causal != 0, df.causal);
  EXPECT_EQ(f.alignment, static_cast<int32_t>(df.alignment));
  EXPECT_EQ(f.window_left, df.window_left);
  EXPECT_EQ(f.window_right, df.window_right);
  EXPECT_EQ(f.softcap, df.softcap);
  EXPECT_EQ(f.maybe_alibi_slopes, df.maybe_alibi_slopes);
  EXPECT_EQ(f.alibi_batch_stride, df.alibi_batch_stride);
  EXPECT_EQ(f.maybe_bias.data, df.maybe_bias.data);
  EXPECT_EQ(f.maybe_bias.dtype, static_cast<int32_t>(df.maybe_bias.dtype));
  EXPECT_EQ(f.maybe_mask.data, df.maybe_mask.data);
  EXPECT_EQ(f.o.data, df.o.data);
  EXPECT_EQ(f.maybe_lse, df.maybe_lse);
  EXPECT_EQ(f.lse_head_stride, df.lse_head_stride);

  fa_backward_params g;
  std::memset(static_cast<void*>(&g), 0xff, sizeof g);
  fa_backward_params_init(&g);
  const BackwardParams dg;
  EXPECT_EQ(g.struct_size, sizeof(fa_backward_params));
  EXPECT_EQ(g.window_left, dg.window_left);
  EXPECT_EQ(g.window_right, dg.window_right);
  EXPECT_EQ(g.alignment, static_cast<int32_t>(dg.alignment));
  EXPECT_EQ(g.lse, dg.lse);
  EXPECT_EQ(g.d_o.data, dg.d_o.data);
  EXPECT_EQ(g.dv.data, dg.dv.data);
  EXPECT_EQ(g.deterministic != 0, dg.deterministic);

  fa_launch l;
  std::memset(static_cast<void*>(&l), 0xff, sizeof l);
  fa_launch_init(&l);
  const Launch dl;
  EXPECT_EQ(l.struct_size, sizeof(fa_launch));
  EXPECT_EQ(l.backend, static_cast<int32_t>(dl.backend));
  EXPECT_EQ(l.num_threads, dl.num_threads);
  EXPECT_EQ(l.stream, dl.stream);
  EXPECT_EQ(l.workspace, dl.workspace);
  EXPECT_EQ(l.workspace_bytes, dl.workspace_bytes);

  // The init functions take NULL.
  fa_forward_params_init(nullptr);
  fa_backward_params_init(nullptr);
  fa_launch_init(nullptr);
}

class CApiSameBits : public ::testing::TestWithParam<Backend> {};

// The C path (with a caller workspace sized by the C query) and the C++ path (library-allocated
// workspace) give the same bits, forward and backward.
TEST_P(CApiSameBits, ForwardAndBackward) {
  for (const Case& c : {all_options_case(), varlen_case()}) {
    SCOPED_TRACE(c.name());
    const uint64_t seed = fresh_seed("capi " + c.name());
    Problem cpp = make_problem(c, seed), capi = make_problem(c, seed);
    Launch launch;
    launch.backend = GetParam();
    launch.num_threads = 2;

    ASSERT_TRUE(flashattn::forward(cpp.forward_params(), launch).ok());
    const fa_forward_params f = to_c(capi.forward_params());
    fa_launch cl = to_c(launch);
    size_t bytes = 0, cpp_bytes = 0;
    char err[256];
    ASSERT_EQ(fa_forward_workspace_size(&f, &cl, &bytes, err, sizeof err), FA_STATUS_OK) << err;
    ASSERT_TRUE(flashattn::forward_workspace_size(cpp.forward_params(), launch, &cpp_bytes).ok());
    EXPECT_EQ(bytes, cpp_bytes);
    std::vector<uint8_t> workspace(bytes + 64);
    cl.workspace = workspace.data();
    cl.workspace_bytes = workspace.size();
    ASSERT_EQ(fa_forward_supported(&f, &cl, err, sizeof err), FA_STATUS_OK) << err;
    ASSERT_EQ(fa_forward(&f, &cl, err, sizeof err), FA_STATUS_OK) << err;
    EXPECT_TRUE(bytes_of(cpp.o.storage) == bytes_of(capi.o.storage)) << "o differs between the C and C++ APIs";
    EXPECT_TRUE(bytes_of(cpp.lse) == bytes_of(capi.lse)) << "lse differs between the C and C++ APIs";

    ASSERT_TRUE(flashattn::backward(cpp.backward_params(), launch).ok());
    const fa_backward_params g = to_c(capi.backward_params());
    fa_launch_init(&cl);
    cl.backend = static_cast<int32_t>(launch.backend);
    cl.num_threads = launch.num_threads;
    ASSERT_EQ(fa_backward_workspace_size(&g, &cl, &bytes, err, sizeof err), FA_STATUS_OK) << err;
    ASSERT_TRUE(flashattn::backward_workspace_size(cpp.backward_params(), launch, &cpp_bytes).ok());
    EXPECT_EQ(bytes, cpp_bytes);
    workspace.assign(bytes + 64, 0);
    cl.workspace = workspace.data();
    cl.workspace_bytes = workspace.size();
    ASSERT_EQ(fa_backward_supported(&g, &cl, err, sizeof err), FA_STATUS_OK) << err;
    ASSERT_EQ(fa_backward(&g, &cl, err, sizeof err), FA_STATUS_OK) << err;
    EXPECT_TRUE(bytes_of(cpp.dq.storage) == bytes_of(capi.dq.storage)) << "dq differs between the C and C++ APIs";
    EXPECT_TRUE(bytes_of(cpp.dk.storage) == bytes_of(capi.dk.storage)) << "dk differs between the C and C++ APIs";
    EXPECT_TRUE(bytes_of(cpp.dv.storage) == bytes_of(capi.dv.storage)) << "dv differs between the C and C++ APIs";
  }
}

std::string backend_name(const ::testing::TestParamInfo<Backend>& info) { return flashattn::to_string(info.param); }
INSTANTIATE_TEST_SUITE_P(Backends, CApiSameBits, ::testing::Values(Backend::kCpu, Backend::kReference), backend_name);

// Any nonzero causal is true, as a C boolean.
TEST(CApi, CausalIsACBoolean) {
  Case c;
  c.seqlen_q = 13;
  c.seqlen_k = 21;
  c.causal = true;
  const uint64_t seed = fresh_seed("capi causal");
  Problem one = make_problem(c, seed), two = make_problem(c, seed);
  fa_forward_params f1 = to_c(one.forward_params()), f2 = to_c(two.forward_params());
  ASSERT_EQ(f1.causal, 1);
  f2.causal = -7;
  ASSERT_EQ(fa_forward(&f1, nullptr, nullptr, 0), FA_STATUS_OK);
  ASSERT_EQ(fa_forward(&f2, nullptr, nullptr, 0), FA_STATUS_OK);
  EXPECT_TRUE(bytes_of(one.o.storage) == bytes_of(two.o.storage));
}

// Each C error is the C++ error: same code, same message, nothing written.
TEST(CApi, ErrorsMatchCpp) {
  Case c;
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 2;
  Problem dense = make_problem(c, fresh_seed("capi errors"));
  Case wide = c;
  wide.head_dim_v = flashattn::detail::kCpuMaxHeadDim + 8;
  Problem too_wide = make_problem(wide, fresh_seed("capi errors, head_dim_v too large"));
  std::vector<uint8_t> small_workspace(8);
  struct Bad {
    const char* what;
    Problem* problem;
    void (*mutate)(AttentionParams&, Launch&, void* workspace);
    fa_status code;
  };
  const Bad bad[] = {
      {"dtype", &dense, [](AttentionParams& f, Launch&, void*) { f.dtype = static_cast<DType>(5); },
       FA_STATUS_INVALID_ARGUMENT},
      {"null q", &dense, [](AttentionParams& f, Launch&, void*) { f.q.data = nullptr; }, FA_STATUS_INVALID_ARGUMENT},
      {"heads", &dense, [](AttentionParams& f, Launch&, void*) { f.heads_kv = 3; }, FA_STATUS_INVALID_ARGUMENT},
      {"alignment", &dense, [](AttentionParams& f, Launch&, void*) { f.alignment = static_cast<Alignment>(9); },
       FA_STATUS_INVALID_ARGUMENT},
      {"softcap", &dense, [](AttentionParams& f, Launch&, void*) { f.softcap = std::nanf(""); },
       FA_STATUS_INVALID_ARGUMENT},
      {"head_dim_v", &too_wide, [](AttentionParams&, Launch&, void*) {}, FA_STATUS_NOT_SUPPORTED},
      {"backend", &dense, [](AttentionParams&, Launch& l, void*) { l.backend = static_cast<Backend>(17); },
       FA_STATUS_INVALID_ARGUMENT},
      {"threads", &dense, [](AttentionParams&, Launch& l, void*) { l.num_threads = -3; }, FA_STATUS_INVALID_ARGUMENT},
      {"null workspace", &dense, [](AttentionParams&, Launch& l, void*) { l.workspace_bytes = 1; },
       FA_STATUS_INVALID_ARGUMENT},
      {"workspace too small", &dense,
       [](AttentionParams&, Launch& l, void* ws) {
         l.backend = Backend::kStandard;  // needs a score matrix of scratch
         l.workspace = ws;
         l.workspace_bytes = 1;
       },
       FA_STATUS_WORKSPACE_TOO_SMALL},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    Problem& p = *b.problem;
    ForwardParams f = p.forward_params();
    Launch l;
    b.mutate(f, l, small_workspace.data());
    const Status want = flashattn::forward(f, l);
    ASSERT_FALSE(want.ok());
    const auto before = outputs_of(p);
    const fa_forward_params cf = to_c(f);
    const fa_launch cl = to_c(l);
    char err[512];
    EXPECT_EQ(fa_forward(&cf, &cl, err, sizeof err), b.code);
    EXPECT_EQ(static_cast<fa_status>(want.code), b.code);
    EXPECT_EQ(std::string(err), want.message);
    EXPECT_TRUE(outputs_of(p) == before) << "a rejected C call wrote to its outputs";
    if (b.code != FA_STATUS_WORKSPACE_TOO_SMALL) {
      EXPECT_EQ(fa_forward_supported(&cf, &cl, err, sizeof err), b.code);
      EXPECT_EQ(std::string(err), want.message);
      size_t bytes = 12345;
      EXPECT_EQ(fa_forward_workspace_size(&cf, &cl, &bytes, err, sizeof err), b.code);
      EXPECT_EQ(bytes, 12345u);
    }

    BackwardParams g = p.backward_params();
    b.mutate(g, l, small_workspace.data());
    const Status want_b = flashattn::backward(g, l);
    const fa_backward_params cg = to_c(g);
    EXPECT_EQ(fa_backward(&cg, &cl, err, sizeof err), static_cast<fa_status>(want_b.code));
    EXPECT_EQ(std::string(err), want_b.message);
    EXPECT_TRUE(outputs_of(p) == before) << "a rejected C call wrote to its outputs";
  }
}

// Messages are truncated to err_len - 1 bytes plus NUL; nothing past err_len is touched.
TEST(CApi, MessageTruncation) {
  Problem p = make_problem(Case{}, fresh_seed("capi truncation"));
  fa_forward_params f = to_c(p.forward_params());
  f.heads_kv = 0;
  char full[512];
  ASSERT_EQ(fa_forward(&f, nullptr, full, sizeof full), FA_STATUS_INVALID_ARGUMENT);
  const std::string message = full;
  ASSERT_GT(message.size(), 10u);
  for (size_t len : {size_t{0}, size_t{1}, size_t{2}, size_t{8}, message.size(), message.size() + 1}) {
    SCOPED_TRACE("err_len " + std::to_string(len));
    std::vector<char> buf(message.size() + 16, '#');
    ASSERT_EQ(fa_forward(&f, nullptr, buf.data(), len), FA_STATUS_INVALID_ARGUMENT);
    if (len > 0) {
      EXPECT_EQ(std::string(buf.data()), message.substr(0, len - 1));
    }
    for (size_t i = len; i < buf.size(); ++i) ASSERT_EQ(buf[i], '#') << "byte " << i << " written";
  }
}

TEST(CApi, NullErrorBufferIsFine) {
  Problem p = make_problem(Case{}, fresh_seed("capi null err"));
  fa_forward_params f = to_c(p.forward_params());
  f.dtype = 42;
  EXPECT_EQ(fa_forward(&f, nullptr, nullptr, 0), FA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(fa_forward(&f, nullptr, nullptr, 100), FA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(fa_forward_supported(nullptr, nullptr, nullptr, 0), FA_STATUS_INVALID_ARGUMENT);
  f.dtype = FA_DTYPE_FLOAT32;
  EXPECT_EQ(fa_forward(&f, nullptr, nullptr, 0), FA_STATUS_OK);
}

TEST(CApi, SuccessWritesAnEmptyMessage) {
  Problem p = make_problem(Case{}, fresh_seed("capi success"));
  const fa_forward_params f = to_c(p.forward_params());
  char err[32] = "stale text from before";
  ASSERT_EQ(fa_forward(&f, nullptr, err, sizeof err), FA_STATUS_OK);
  EXPECT_STREQ(err, "");
}

TEST(CApi, NullPointersAreRejected) {
  Problem p = make_problem(Case{}, fresh_seed("capi null"));
  const fa_forward_params f = to_c(p.forward_params());
  const fa_backward_params g = to_c(p.backward_params());
  char err[256];
  size_t bytes = 0;
  EXPECT_EQ(fa_forward(nullptr, nullptr, err, sizeof err), FA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(err).rfind("params", 0), 0u) << err;
  EXPECT_EQ(fa_backward(nullptr, nullptr, err, sizeof err), FA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(fa_backward_workspace_size(nullptr, nullptr, &bytes, err, sizeof err), FA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(fa_forward_workspace_size(&f, nullptr, nullptr, err, sizeof err), FA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(err).rfind("bytes", 0), 0u) << err;
  EXPECT_EQ(fa_backward_workspace_size(&g, nullptr, nullptr, err, sizeof err), FA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(err).rfind("bytes", 0), 0u) << err;
}

// A struct_size the library does not know is rejected before anything is read or written.
TEST(CApi, StructSizeMismatchIsRejected) {
  Problem p = make_problem(Case{}, fresh_seed("capi struct_size"));
  run_forward(p, Backend::kReference);
  const auto before = outputs_of(p);
  char err[256];
  // (Not -8: the fa_backward_params of C ABI v1 was 8 bytes shorter than v2's, and is known.)
  for (size_t delta : {size_t{8}, size_t{0} - 4, size_t{0} - sizeof(fa_forward_params), size_t{1}}) {
    SCOPED_TRACE("struct_size delta " + std::to_string(static_cast<int64_t>(delta)));
    fa_forward_params f = to_c(p.forward_params());
    f.struct_size += delta;
    EXPECT_EQ(fa_forward(&f, nullptr, err, sizeof err), FA_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(err).rfind("params.struct_size", 0), 0u) << err;
    size_t bytes = 777;
    EXPECT_EQ(fa_forward_workspace_size(&f, nullptr, &bytes, err, sizeof err), FA_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(bytes, 777u);

    fa_backward_params g = to_c(p.backward_params());
    g.struct_size += delta;
    EXPECT_EQ(fa_backward(&g, nullptr, err, sizeof err), FA_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(err).rfind("params.struct_size", 0), 0u) << err;

    const fa_forward_params good = to_c(p.forward_params());
    fa_launch l;
    fa_launch_init(&l);
    l.struct_size += delta;
    EXPECT_EQ(fa_forward(&good, &l, err, sizeof err), FA_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(err).rfind("launch.struct_size", 0), 0u) << err;
    EXPECT_EQ(fa_forward_supported(&good, &l, err, sizeof err), FA_STATUS_INVALID_ARGUMENT);
  }
  EXPECT_TRUE(outputs_of(p) == before) << "a call with a bad struct_size wrote to its outputs";
}

// Callers built against C ABI v1 keep working: their fa_backward_params ends before
// `deterministic`. The struct sits in an allocation of exactly the v1 size, so that a read past it
// is a heap overflow (caught by the ASan suite). Such a caller gets the default mode; on the CPU,
// both modes give the same bits (CPU backends are always deterministic).
TEST(CApi, BackwardParamsV1StillAccepted) {
  const Case c = varlen_case();
  const uint64_t seed = fresh_seed("capi v1 backward");
  Problem cpp = make_problem(c, seed), v1 = make_problem(c, seed), v2 = make_problem(c, seed);
  for (Problem* p : {&cpp, &v1, &v2}) run_forward(*p, Backend::kReference);
  Launch launch;
  launch.backend = Backend::kCpu;
  launch.num_threads = 2;
  ASSERT_TRUE(flashattn::backward(cpp.backward_params(), launch).ok());
  const fa_launch cl = to_c(launch);
  char err[256];

  constexpr size_t kV1Size = offsetof(fa_backward_params, deterministic);
  static_assert(sizeof(void*) != 8 || kV1Size == 488, "the v1 layout is frozen");
  const fa_backward_params full = to_c(v1.backward_params());
  void* block = std::malloc(kV1Size);
  ASSERT_NE(block, nullptr);
  std::memcpy(block, &full, kV1Size);
  static_cast<fa_backward_params*>(block)->struct_size = kV1Size;
  const fa_status s = fa_backward(static_cast<const fa_backward_params*>(block), &cl, err, sizeof err);
  size_t bytes = 0, cpp_bytes = 0;
  const fa_status ws = fa_backward_workspace_size(static_cast<const fa_backward_params*>(block), &cl, &bytes, err,
                                                  sizeof err);
  std::free(block);
  ASSERT_EQ(s, FA_STATUS_OK) << err;
  ASSERT_EQ(ws, FA_STATUS_OK) << err;
  ASSERT_TRUE(flashattn::backward_workspace_size(cpp.backward_params(), launch, &cpp_bytes).ok());
  EXPECT_EQ(bytes, cpp_bytes);
  EXPECT_TRUE(bytes_of(cpp.dq.storage) == bytes_of(v1.dq.storage)) << "dq differs for a v1 caller";
  EXPECT_TRUE(bytes_of(cpp.dk.storage) == bytes_of(v1.dk.storage)) << "dk differs for a v1 caller";
  EXPECT_TRUE(bytes_of(cpp.dv.storage) == bytes_of(v1.dv.storage)) << "dv differs for a v1 caller";

  // A v2 caller asking for the deterministic mode: the CPU's bits are the same.
  fa_backward_params det = to_c(v2.backward_params());
  ASSERT_EQ(det.struct_size, sizeof(fa_backward_params));
  det.deterministic = 1;
  ASSERT_EQ(fa_backward(&det, &cl, err, sizeof err), FA_STATUS_OK) << err;
  EXPECT_TRUE(bytes_of(cpp.dq.storage) == bytes_of(v2.dq.storage)) << "dq differs in the deterministic mode";
  EXPECT_TRUE(bytes_of(cpp.dk.storage) == bytes_of(v2.dk.storage)) << "dk differs in the deterministic mode";
  EXPECT_TRUE(bytes_of(cpp.dv.storage) == bytes_of(v2.dv.storage)) << "dv differs in the deterministic mode";
}

// No shared state: concurrent calls (one of them failing) each get their own result and message.
TEST(CApi, ConcurrentCallsAreIndependent) {
  Case c;
  c.seqlen_q = 70;
  c.seqlen_k = 90;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.causal = true;
  const uint64_t seed = fresh_seed("capi concurrent");
  Problem serial = make_problem(c, seed);
  const fa_forward_params fs = to_c(serial.forward_params());
  ASSERT_EQ(fa_forward(&fs, nullptr, nullptr, 0), FA_STATUS_OK);
  const auto want = outputs_of(serial);

  constexpr int kCallers = 3, kRounds = 8;
  std::vector<Problem> problems;
  for (int t = 0; t < kCallers; ++t) problems.push_back(make_problem(c, seed));
  std::vector<int> failures(kCallers, 0);
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t)
    callers.emplace_back([&, t] {
      const fa_forward_params good = to_c(problems[t].forward_params());
      fa_forward_params bad = good;
      bad.window_left = -3;
      for (int r = 0; r < kRounds; ++r) {
        char err[128];
        if (fa_forward(&good, nullptr, err, sizeof err) != FA_STATUS_OK || err[0] != '\0') ++failures[t];
        if (fa_forward(&bad, nullptr, err, sizeof err) != FA_STATUS_INVALID_ARGUMENT ||
            std::string(err).rfind("window_left", 0) != 0)
          ++failures[t];
      }
    });
  for (auto& th : callers) th.join();
  for (int t = 0; t < kCallers; ++t) {
    EXPECT_EQ(failures[t], 0) << "caller " << t;
    EXPECT_TRUE(outputs_of(problems[t]) == want) << "caller " << t << " got different bits from the serial call";
  }
}

TEST(CApi, Names) {
  EXPECT_STREQ(fa_status_string(FA_STATUS_OK), "ok");
  EXPECT_STREQ(fa_status_string(FA_STATUS_NOT_SUPPORTED), flashattn::to_string(flashattn::StatusCode::kNotSupported));
  EXPECT_STREQ(fa_status_string(99), "unknown");
  EXPECT_STREQ(fa_dtype_string(FA_DTYPE_BFLOAT16), "bf16");
  EXPECT_STREQ(fa_dtype_string(-1), "unknown");
  EXPECT_STREQ(fa_backend_string(FA_BACKEND_CPU), "cpu");
  EXPECT_STREQ(fa_backend_string(12), "unknown");
}

}  // namespace
}  // namespace fa_test
