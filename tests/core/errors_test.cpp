// One test per argument error the API promises to catch. Each bad call goes through supported(),
// workspace_size() and run() of every backend and must fail the same way in all three, with a
// message naming the argument, having written nothing: every buffer the call can reach holds a
// sentinel byte pattern before the call and is compared byte for byte afterwards.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/backends.hpp"
#include "flashattn/flashattn.hpp"
#include "support/test_util.hpp"

namespace fa_test {
namespace {

using flashattn::BackwardParams;
using flashattn::ForwardParams;
using flashattn::Launch;
using flashattn::Status;
using flashattn::StatusCode;

constexpr int64_t kMaxHeadDim = flashattn::detail::kCpuMaxHeadDim;
// A stride whose product with any extent >= 2, plus the other dimensions' terms, overflows int64_t.
constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr size_t kUntouchedBytes = 0x5eed5eedu;

template <class T>
void fill_sentinel(std::vector<T>& v) {
  auto* b = reinterpret_cast<uint8_t*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(T); ++i) b[i] = static_cast<uint8_t>(0xA5 ^ (i * 37));
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  const auto* b = reinterpret_cast<const uint8_t*>(v.data());
  return {b, b + v.size() * sizeof(T)};
}

// Every buffer a call could touch, inputs included.
std::vector<std::vector<uint8_t>> snapshot(const Problem& p) {
  return {bytes_of(p.q.storage),  bytes_of(p.k.storage),  bytes_of(p.v.storage),  bytes_of(p.o.storage),
          bytes_of(p.d_o.storage), bytes_of(p.dq.storage), bytes_of(p.dk.storage), bytes_of(p.dv.storage),
          bytes_of(p.lse),        bytes_of(p.bias_storage), bytes_of(p.mask_storage), bytes_of(p.slopes),
          bytes_of(p.cu_q),       bytes_of(p.cu_k)};
}

Problem make_sentinel_problem(const Case& c) {
  Problem p = make_problem(c, fresh_seed("errors " + c.name()));
  for (auto* t : {&p.o, &p.dq, &p.dk, &p.dv}) fill_sentinel(t->storage);
  fill_sentinel(p.lse);
  return p;
}

// True when `arg` is the subject of `message`: a whole token (identifier characters and '.')
// before the message's first ':' (or anywhere when there is none).
bool names(const std::string& message, const std::string& arg) {
  const std::string subject = message.substr(0, message.find(':'));
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; };
  for (size_t at = subject.find(arg); at != std::string::npos; at = subject.find(arg, at + 1)) {
    const bool starts = at == 0 || !ident(subject[at - 1]);
    const bool ends = at + arg.size() == subject.size() || !ident(subject[at + arg.size()]);
    if (starts && ends) return true;
  }
  return false;
}

// The three entry points of one operation.
template <class Params>
struct Api;
template <>
struct Api<ForwardParams> {
  static constexpr const char* kName = "forward";
  static Status supported(const ForwardParams& p, const Launch& l) { return flashattn::forward_supported(p, l); }
  static Status workspace(const ForwardParams& p, const Launch& l, size_t* b) {
    return flashattn::forward_workspace_size(p, l, b);
  }
  static Status run(const ForwardParams& p, const Launch& l) { return flashattn::forward(p, l); }
};
template <>
struct Api<BackwardParams> {
  static constexpr const char* kName = "backward";
  static Status supported(const BackwardParams& p, const Launch& l) { return flashattn::backward_supported(p, l); }
  static Status workspace(const BackwardParams& p, const Launch& l, size_t* b) {
    return flashattn::backward_workspace_size(p, l, b);
  }
  static Status run(const BackwardParams& p, const Launch& l) { return flashattn::backward(p, l); }
};

// Runs the three entry points on a bad call and checks they agree on the error and write nothing.
template <class Params>
void expect_rejected(const Problem& p, const Params& params, const Launch& launch, StatusCode code,
                     const std::string& arg) {
  SCOPED_TRACE(std::string(Api<Params>::kName) + " on " + flashattn::to_string(launch.backend) + ", expecting " +
               flashattn::to_string(code) + " naming " + arg);
  const auto before = snapshot(p);
  size_t bytes = kUntouchedBytes;
  const Status supported = Api<Params>::supported(params, launch);
  // Running a call that validation wrongly accepts may touch memory out of bounds; stop here.
  ASSERT_FALSE(supported.ok()) << "supported() accepted the call";
  const Status workspace = Api<Params>::workspace(params, launch, &bytes);
  const Status run = Api<Params>::run(params, launch);
  EXPECT_STREQ(flashattn::to_string(supported.code), flashattn::to_string(code)) << supported.message;
  EXPECT_TRUE(names(supported.message, arg)) << "message \"" << supported.message << "\" does not name " << arg;
  EXPECT_STREQ(flashattn::to_string(workspace.code), flashattn::to_string(supported.code)) << workspace.message;
  EXPECT_EQ(workspace.message, supported.message);
  EXPECT_STREQ(flashattn::to_string(run.code), flashattn::to_string(supported.code)) << run.message;
  EXPECT_EQ(run.message, supported.message);
  EXPECT_EQ(bytes, kUntouchedBytes) << "workspace_size() wrote its result on error";
  EXPECT_TRUE(snapshot(p) == before) << "a rejected call wrote to memory";
}

class Errors : public ::testing::TestWithParam<Backend> {
 protected:
  // Every option on, strided layouts, GQA, Sq != Sk: the mutations start from a call that uses all of it.
  static Case dense_case() {
    Case c;
    c.batch = 2;
    c.seqlen_q = 17;
    c.seqlen_k = 23;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = 32;
    c.head_dim_v = 24;
    c.alibi = AlibiKind::kPerHead;
    c.bias = true;
    c.mask = MaskKind::kRandom;
    c.strided = true;
    return c;
  }
  static Case varlen_case() {
    Case c = dense_case();
    c.varlen_q = {5, 0, 9};
    c.varlen_k = {7, 3, 11};
    return c;
  }

  Launch launch() const {
    Launch l;
    l.backend = GetParam();
    return l;
  }

  // Applies mutate(params, launch) to a valid forward and backward call on `p`; both must fail.
  template <class Mutate>
  void expect_error(Problem& p, Mutate&& mutate, StatusCode code, const std::string& arg) {
    expect_forward_error(p, mutate, code, arg);
    expect_backward_error(p, mutate, code, arg);
  }
  template <class Mutate>
  void expect_forward_error(Problem& p, Mutate&& mutate, StatusCode code, const std::string& arg) {
    ForwardParams f = p.forward_params();
    Launch l = launch();
    mutate(f, l);
    expect_rejected(p, f, l, code, arg);
  }
  template <class Mutate>
  void expect_backward_error(Problem& p, Mutate&& mutate, StatusCode code, const std::string& arg) {
    BackwardParams g = p.backward_params();
    Launch l = launch();
    mutate(g, l);
    expect_rejected(p, g, l, code, arg);
  }
  template <class Mutate>
  void expect_invalid(Mutate&& mutate, const std::string& arg) {
    expect_error(dense_, mutate, StatusCode::kInvalidArgument, arg);
  }

  Problem dense_ = make_sentinel_problem(dense_case());
  Problem varlen_ = make_sentinel_problem(varlen_case());
};

// The unmodified calls are valid, so every rejection below is caused by its one mutation.
TEST_P(Errors, BaselineCallsAreAccepted) {
  for (Problem* p : {&dense_, &varlen_}) {
    Status s = flashattn::forward_supported(p->forward_params(), launch());
    EXPECT_TRUE(s.ok()) << s.message;
    s = flashattn::backward_supported(p->backward_params(), launch());
    EXPECT_TRUE(s.ok()) << s.message;
  }
}

TEST_P(Errors, NullQ) {
  expect_invalid([](auto& p, Launch&) { p.q.data = nullptr; }, "q");
}
TEST_P(Errors, NullK) {
  expect_invalid([](auto& p, Launch&) { p.k.data = nullptr; }, "k");
}
TEST_P(Errors, NullV) {
  expect_invalid([](auto& p, Launch&) { p.v.data = nullptr; }, "v");
}
TEST_P(Errors, NullO) {
  expect_invalid([](auto& p, Launch&) { p.o.data = nullptr; }, "o");
}
TEST_P(Errors, NullDO) {
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.d_o.data = nullptr; },
                        StatusCode::kInvalidArgument, "d_o");
}
TEST_P(Errors, NullLseInBackward) {
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.lse = nullptr; }, StatusCode::kInvalidArgument,
                        "lse");
}
TEST_P(Errors, NullDQ) {
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.dq.data = nullptr; },
                        StatusCode::kInvalidArgument, "dq");
}
TEST_P(Errors, NullDK) {
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.dk.data = nullptr; },
                        StatusCode::kInvalidArgument, "dk");
}
TEST_P(Errors, NullDV) {
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.dv.data = nullptr; },
                        StatusCode::kInvalidArgument, "dv");
}

// Null pointers are fine where the tensor is empty (and the forward's lse is optional).
TEST_P(Errors, NullPointersAllowedWhereNothingIsRead) {
  ForwardParams f = dense_.forward_params();
  f.maybe_lse = nullptr;
  Status s = flashattn::forward_supported(f, launch());
  EXPECT_TRUE(s.ok()) << s.message;
  f.seqlen_q = 0;
  f.q.data = nullptr;
  f.o.data = nullptr;
  s = flashattn::forward_supported(f, launch());
  EXPECT_TRUE(s.ok()) << s.message;
  const auto before = snapshot(dense_);
  s = flashattn::forward(f, launch());
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_TRUE(snapshot(dense_) == before) << "an empty forward wrote to memory";
}

// Shapes the raw-pointer API can see: an output whose strides are too small for its own shape
// would have two elements share memory (and threads race on them).
TEST_P(Errors, MismatchedOutputShapeO) {
  expect_forward_error(dense_, [](ForwardParams& p, Launch&) { p.o.head_stride = p.head_dim_v - 1; },
                       StatusCode::kInvalidArgument, "o");
  expect_forward_error(dense_, [](ForwardParams& p, Launch&) { p.o.row_stride = p.o.head_stride; },
                       StatusCode::kInvalidArgument, "o");
}
TEST_P(Errors, MismatchedOutputShapeLse) {
  expect_forward_error(dense_, [](ForwardParams& p, Launch&) { p.lse_head_stride = p.seqlen_q - 1; },
                       StatusCode::kInvalidArgument, "maybe_lse");
}
TEST_P(Errors, MismatchedOutputShapeGradients) {
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.dq.head_stride = 0; },
                        StatusCode::kInvalidArgument, "dq");
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.dk.row_stride = 1; },
                        StatusCode::kInvalidArgument, "dk");
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.dv.batch_stride = p.dv.row_stride; },
                        StatusCode::kInvalidArgument, "dv");
}

TEST_P(Errors, HeadsQNotMultipleOfHeadsKv) {
  expect_invalid([](auto& p, Launch&) { p.heads_kv = 3; }, "heads_q");
}
TEST_P(Errors, HeadsZero) {
  expect_invalid([](auto& p, Launch&) { p.heads_q = 0; }, "heads_q");
  expect_invalid([](auto& p, Launch&) { p.heads_kv = 0; }, "heads_kv");
}
TEST_P(Errors, HeadDimZero) {
  expect_invalid([](auto& p, Launch&) { p.head_dim = 0; }, "head_dim");
  expect_invalid([](auto& p, Launch&) { p.head_dim_v = -1; }, "head_dim_v");
}

TEST_P(Errors, HeadDimAboveBackendMax) {
  Case c;
  c.batch = 1;
  c.seqlen_q = 3;
  c.seqlen_k = 5;
  c.heads_q = c.heads_kv = 1;
  c.head_dim = kMaxHeadDim + 8;
  Problem p = make_sentinel_problem(c);
  expect_error(p, [](auto&, Launch&) {}, StatusCode::kNotSupported, "head_dim");
  c.head_dim = 64;
  c.head_dim_v = kMaxHeadDim + 8;
  Problem pv = make_sentinel_problem(c);
  expect_error(pv, [](auto&, Launch&) {}, StatusCode::kNotSupported, "head_dim_v");
}

TEST_P(Errors, NegativeLengths) {
  expect_invalid([](auto& p, Launch&) { p.batch = -1; }, "batch");
  expect_invalid([](auto& p, Launch&) { p.seqlen_q = -1; }, "seqlen_q");
  expect_invalid([](auto& p, Launch&) { p.seqlen_k = -5; }, "seqlen_k");
}

TEST_P(Errors, CuSeqlensNotStartingAtZero) {
  std::vector<int32_t> q = varlen_.cu_q, k = varlen_.cu_k;
  for (int32_t& x : q) x += 1;
  expect_error(varlen_, [&](auto& p, Launch&) { p.maybe_cu_seqlens_q = q.data(); }, StatusCode::kInvalidArgument,
               "maybe_cu_seqlens_q");
  for (int32_t& x : k) x += 2;
  expect_error(varlen_, [&](auto& p, Launch&) { p.maybe_cu_seqlens_k = k.data(); }, StatusCode::kInvalidArgument,
               "maybe_cu_seqlens_k");
}

TEST_P(Errors, CuSeqlensNonMonotone) {
  // q lengths {5, 0, 9} -> offsets {0, 5, 5, 14}; make the third offset go backwards.
  std::vector<int32_t> q = varlen_.cu_q, k = varlen_.cu_k;
  q[2] = 4;
  expect_error(varlen_, [&](auto& p, Launch&) { p.maybe_cu_seqlens_q = q.data(); }, StatusCode::kInvalidArgument,
               "maybe_cu_seqlens_q");
  k[3] = k[2] - 1;
  expect_error(varlen_, [&](auto& p, Launch&) { p.maybe_cu_seqlens_k = k.data(); }, StatusCode::kInvalidArgument,
               "maybe_cu_seqlens_k");
}

TEST_P(Errors, CuSeqlensLengthAboveMaximum) {
  expect_error(varlen_, [](auto& p, Launch&) { p.seqlen_q -= 1; }, StatusCode::kInvalidArgument, "maybe_cu_seqlens_q");
  expect_error(varlen_, [](auto& p, Launch&) { p.seqlen_k -= 1; }, StatusCode::kInvalidArgument, "maybe_cu_seqlens_k");
}

TEST_P(Errors, OnlyOneCuSeqlens) {
  expect_error(varlen_, [](auto& p, Launch&) { p.maybe_cu_seqlens_k = nullptr; }, StatusCode::kInvalidArgument,
               "maybe_cu_seqlens_k");
  expect_error(varlen_, [](auto& p, Launch&) { p.maybe_cu_seqlens_q = nullptr; }, StatusCode::kInvalidArgument,
               "maybe_cu_seqlens_q");
}

TEST_P(Errors, StridesOverflowInt64) {
  expect_invalid([](auto& p, Launch&) { p.q.batch_stride = kHuge; }, "q");
  expect_invalid([](auto& p, Launch&) { p.k.row_stride = kHuge; }, "k");
  expect_invalid([](auto& p, Launch&) { p.v.head_stride = kHuge; }, "v");
  expect_invalid([](auto& p, Launch&) { p.o.batch_stride = kHuge; }, "o");
  expect_invalid([](auto& p, Launch&) { p.maybe_bias.row_stride = kHuge; }, "maybe_bias");
  expect_invalid([](auto& p, Launch&) { p.maybe_mask.head_stride = kHuge; }, "maybe_mask");
  expect_invalid([](auto& p, Launch&) { p.alibi_batch_stride = kHuge; },
                 "maybe_alibi_slopes");
  expect_forward_error(dense_, [](ForwardParams& p, Launch&) { p.lse_batch_stride = kHuge; },
                       StatusCode::kInvalidArgument, "maybe_lse");
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.lse_head_stride = kHuge; },
                        StatusCode::kInvalidArgument, "lse");
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.dk.batch_stride = kHuge; },
                        StatusCode::kInvalidArgument, "dk");
  // Sizes alone can overflow too: 2^58 rows of 120-element rows.
  expect_invalid([](auto& p, Launch&) { p.seqlen_k = int64_t{1} << 58; }, "k");
}

TEST_P(Errors, NegativeStrides) {
  expect_invalid([](auto& p, Launch&) { p.q.row_stride = -p.q.row_stride; }, "q");
  expect_invalid([](auto& p, Launch&) { p.k.batch_stride = -1; }, "k");
  expect_invalid([](auto& p, Launch&) { p.v.head_stride = -1; }, "v");
  expect_invalid([](auto& p, Launch&) { p.o.row_stride = -1; }, "o");
  expect_invalid([](auto& p, Launch&) { p.maybe_bias.batch_stride = -1; }, "maybe_bias");
  expect_invalid([](auto& p, Launch&) { p.maybe_mask.row_stride = -1; }, "maybe_mask");
  expect_invalid([](auto& p, Launch&) { p.alibi_batch_stride = -1; }, "alibi_batch_stride");
  expect_forward_error(dense_, [](ForwardParams& p, Launch&) { p.lse_head_stride = -1; },
                       StatusCode::kInvalidArgument, "maybe_lse");
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.d_o.row_stride = -1; },
                        StatusCode::kInvalidArgument, "d_o");
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.dq.head_stride = -1; },
                        StatusCode::kInvalidArgument, "dq");
  expect_backward_error(dense_, [](BackwardParams& p, Launch&) { p.dv.row_stride = -1; },
                        StatusCode::kInvalidArgument, "dv");
}

TEST_P(Errors, UnsupportedDtype) {
  expect_invalid([](auto& p, Launch&) { p.dtype = static_cast<DType>(3); }, "dtype");
  expect_invalid([](auto& p, Launch&) { p.dtype = static_cast<DType>(-1); }, "dtype");
  expect_invalid([](auto& p, Launch&) { p.maybe_bias.dtype = static_cast<DType>(7); }, "maybe_bias.dtype");
}

TEST_P(Errors, BadWindowOrAlignment) {
  expect_invalid([](auto& p, Launch&) { p.window_left = -2; }, "window_left");
  expect_invalid([](auto& p, Launch&) { p.window_right = -100; }, "window_right");
  expect_invalid([](auto& p, Launch&) { p.alignment = static_cast<Alignment>(2); }, "alignment");
}

TEST_P(Errors, BadSoftcap) {
  for (float cap : {-1.0f, -1e-30f, kNaN, kInf, -kInf}) {
    SCOPED_TRACE("softcap " + std::to_string(cap));
    expect_invalid([cap](auto& p, Launch&) { p.softcap = cap; }, "softcap");
  }
}

TEST_P(Errors, NonFiniteScale) {
  for (float scale : {kNaN, kInf, -kInf}) {
    SCOPED_TRACE("softmax_scale " + std::to_string(scale));
    expect_invalid([scale](auto& p, Launch&) { p.softmax_scale = scale; }, "softmax_scale");
  }
}

TEST_P(Errors, BadBackendEnum) {
  for (int32_t b : {-1, 6, 1000}) {
    SCOPED_TRACE("backend " + std::to_string(b));
    expect_invalid([b](auto&, Launch& l) { l.backend = static_cast<Backend>(b); }, "launch.backend");
  }
}

TEST_P(Errors, NegativeNumThreads) {
  expect_invalid([](auto&, Launch& l) { l.num_threads = -1; }, "launch.num_threads");
}

TEST_P(Errors, NullWorkspaceWithNonZeroSize) {
  expect_invalid([](auto&, Launch& l) { l.workspace_bytes = 64; }, "launch.workspace");
}

// A 64-byte aligned scratch buffer with guard bytes after it.
struct Workspace {
  static constexpr size_t kGuard = 256;
  std::vector<uint8_t> storage;
  size_t bytes;
  explicit Workspace(size_t n) : storage(n + kGuard + 64), bytes(n) { fill_sentinel(storage); }
  uint8_t* data() {
    const auto addr = reinterpret_cast<uintptr_t>(storage.data());
    return storage.data() + ((64 - addr % 64) % 64);
  }
};

// workspace_size() is exactly what run() needs: one byte less is rejected before anything is
// written; the exact size runs, writes nothing past it, and gives the bits the library's own
// allocation gives.
template <class Params>
void expect_workspace_size_is_exact(Problem& p, const Params& params, Launch launch,
                                    const std::vector<HostTensor*>& outputs, bool lse_output) {
  SCOPED_TRACE(std::string(Api<Params>::kName) + " on " + flashattn::to_string(launch.backend));
  size_t need = kUntouchedBytes;
  const Status size = Api<Params>::workspace(params, launch, &need);
  ASSERT_TRUE(size.ok()) << size.message;
  ASSERT_NE(need, kUntouchedBytes);

  Workspace ws(need);
  if (need > 0) {
    launch.workspace = ws.data();
    launch.workspace_bytes = need - 1;
    const auto before = snapshot(p);
    const auto ws_before = ws.storage;
    const Status s = Api<Params>::run(params, launch);
    EXPECT_STREQ(flashattn::to_string(s.code), flashattn::to_string(StatusCode::kWorkspaceTooSmall)) << s.message;
    EXPECT_TRUE(names(s.message, "launch.workspace_bytes")) << s.message;
    EXPECT_TRUE(snapshot(p) == before) << "a rejected call wrote to its outputs";
    EXPECT_TRUE(ws.storage == ws_before) << "a rejected call wrote to its workspace";
  }

  launch.workspace = ws.data();  // non-null even when need == 0
  launch.workspace_bytes = need;
  const Status s = Api<Params>::run(params, launch);
  ASSERT_TRUE(s.ok()) << s.message;
  const size_t offset = static_cast<size_t>(ws.data() - ws.storage.data());
  for (size_t i = offset + need; i < ws.storage.size(); ++i) {
    const uint8_t sentinel = static_cast<uint8_t>(0xA5 ^ (i * 37));
    ASSERT_EQ(ws.storage[i], sentinel) << "run() wrote " << (i - offset - need + 1) << " bytes past workspace_size()";
  }
  std::vector<std::vector<uint8_t>> with_caller_workspace;
  for (HostTensor* t : outputs) with_caller_workspace.push_back(bytes_of(t->storage));
  if (lse_output) with_caller_workspace.push_back(bytes_of(p.lse));

  for (HostTensor* t : outputs) fill_sentinel(t->storage);
  if (lse_output) fill_sentinel(p.lse);
  launch.workspace = nullptr;
  launch.workspace_bytes = 0;
  const Status own = Api<Params>::run(params, launch);
  ASSERT_TRUE(own.ok()) << own.message;
  std::vector<std::vector<uint8_t>> with_own_workspace;
  for (HostTensor* t : outputs) with_own_workspace.push_back(bytes_of(t->storage));
  if (lse_output) with_own_workspace.push_back(bytes_of(p.lse));
  EXPECT_TRUE(with_caller_workspace == with_own_workspace)
      << "results differ between a caller workspace and the library's own";
}

TEST_P(Errors, WorkspaceSizeIsWhatRunNeeds) {
  for (Problem* p : {&dense_, &varlen_}) {
    SCOPED_TRACE(p->c.name());
    expect_workspace_size_is_exact(*p, p->forward_params(), launch(), {&p->o}, true);
    expect_workspace_size_is_exact(*p, p->backward_params(), launch(), {&p->dq, &p->dk, &p->dv}, false);
  }
}

// workspace_size() never wraps around for problems too large to address: it grows with the
// problem, and the standard backend (one [seqlen_q, seqlen_k] fp32 score matrix per worker) reports
// at least that matrix or rejects the call. Only supported() and workspace_size() run here.
TEST_P(Errors, WorkspaceSizeNeverWrapsAround) {
  static float dummy[1];
  size_t last_forward = 0, last_backward = 0;
  for (int shift : {12, 16, 20, 24, 31, 32, 40}) {
    const int64_t n = int64_t{1} << shift;
    SCOPED_TRACE("seqlen_q = seqlen_k = 2^" + std::to_string(shift));
    ForwardParams f;
    f.batch = 1;
    f.seqlen_q = f.seqlen_k = n;
    f.heads_q = f.heads_kv = 1;
    f.head_dim = 64;
    f.q = f.k = f.v = flashattn::contiguous(static_cast<const void*>(dummy), n, 1, 64);
    f.o = flashattn::contiguous(static_cast<void*>(dummy), n, 1, 64);
    BackwardParams g;
    static_cast<flashattn::AttentionParams&>(g) = f;
    g.o = g.d_o = f.q;
    g.lse = dummy;
    g.lse_head_stride = n;
    g.dq = g.dk = g.dv = f.o;
    Launch l = launch();
    l.num_threads = 1;
    const long double matrix = static_cast<long double>(n) * static_cast<long double>(n) * sizeof(float);

    size_t bytes = 0;
    Status s = flashattn::forward_workspace_size(f, l, &bytes);
    EXPECT_EQ(flashattn::forward_supported(f, l).code, s.code);
    if (s.ok()) {
      EXPECT_GE(bytes, last_forward) << "forward workspace shrank as the problem grew";
      last_forward = bytes;
      if (l.backend == Backend::kStandard) {
        EXPECT_GE(static_cast<long double>(bytes), matrix) << "reported " << bytes << " bytes: wrapped around";
      }
    }
    s = flashattn::backward_workspace_size(g, l, &bytes);
    EXPECT_EQ(flashattn::backward_supported(g, l).code, s.code);
    if (s.ok()) {
      EXPECT_GE(bytes, last_backward) << "backward workspace shrank as the problem grew";
      last_backward = bytes;
      if (l.backend == Backend::kStandard) {
        EXPECT_GE(static_cast<long double>(bytes), matrix) << "reported " << bytes << " bytes: wrapped around";
      }
    }
  }
}

std::string backend_name(const ::testing::TestParamInfo<Backend>& info) { return flashattn::to_string(info.param); }

INSTANTIATE_TEST_SUITE_P(AllBackends, Errors,
                         ::testing::Values(Backend::kCpu, Backend::kReference, Backend::kStandard, Backend::kAuto),
                         backend_name);

}  // namespace
}  // namespace fa_test
