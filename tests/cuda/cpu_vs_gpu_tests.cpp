// The CPU and CUDA backends on the same inputs (run on a GPU machine only; built in CI). Each case
// builds one fp16/bf16 problem with tests/support (fresh seed printed, FLASHATTN_TEST_SEED=N
// replays; outputs and the gaps of strided layouts poisoned with NaN), runs it through the public
// API with Backend::kCpu on host memory and Backend::kCudaSm80 on a device copy with the same
// strides, and holds both to the rule of every low-precision test, against the fp64 reference on
// the same rounded inputs: max error <= 2x (gradients 3x) that of textbook attention computed in
// the storage dtype, plus a small floor; LSE within each backend's own tests' bound. The backward
// of both reads the same o and lse (the reference forward's, o rounded to the storage dtype).
// Neither backend may write outside the valid elements. |GPU - CPU| is printed per case.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/support/cuda_test_util.hpp"
#include "support/test_util.hpp"

namespace fa_test {
namespace {

// LSE is fp32 in both, from the same rounded inputs: the CPU's forward tests hold it to 2e-5
// relative, the GPU's (exp2 on fp32 scores) to 2e-3.
constexpr double kCpuLseTolerance = 2e-5;
constexpr double kGpuLseTolerance = 2e-3;

using fa_cuda_test::DeviceBuffer;

// The host problem's every array on the device, in the same layout, and its params with the
// pointers moved there (strides, options and sizes unchanged).
struct DeviceProblem {
  DeviceBuffer<float> q, k, v, o, d_o, dq, dk, dv, lse, slopes, bias;
  DeviceBuffer<int32_t> cu_q, cu_k;
  DeviceBuffer<uint8_t> mask;

  void upload(const Problem& p) {
    for (auto [dst, src] : {std::pair{&q, &p.q}, {&k, &p.k}, {&v, &p.v}, {&o, &p.o}, {&d_o, &p.d_o}, {&dq, &p.dq},
                            {&dk, &p.dk}, {&dv, &p.dv}})
      CUDA_OK(dst->upload(src->storage));
    CUDA_OK(lse.upload(p.lse));
    if (!p.cu_q.empty()) {
      CUDA_OK(cu_q.upload(p.cu_q));
      CUDA_OK(cu_k.upload(p.cu_k));
    }
    if (!p.slopes.empty()) CUDA_OK(slopes.upload(p.slopes));
    if (!p.bias_storage.empty()) CUDA_OK(bias.upload(p.bias_storage));
    if (!p.mask_storage.empty()) CUDA_OK(mask.upload(p.mask_storage));
  }

  void move_inputs(flashattn::AttentionParams* a) const {
    a->q.data = q.ptr;
    a->k.data = k.ptr;
    a->v.data = v.ptr;
    if (a->maybe_cu_seqlens_q != nullptr) {
      a->maybe_cu_seqlens_q = cu_q.ptr;
      a->maybe_cu_seqlens_k = cu_k.ptr;
    }
    if (a->maybe_alibi_slopes != nullptr) a->maybe_alibi_slopes = slopes.ptr;
    if (a->maybe_bias.data != nullptr) a->maybe_bias.data = bias.ptr;
    if (a->maybe_mask.data != nullptr) a->maybe_mask.data = mask.ptr;
  }

  flashattn::ForwardParams forward_params(Problem& host) const {
    flashattn::ForwardParams f = host.forward_params();
    move_inputs(&f);
    f.o.data = o.ptr;
    if (f.maybe_lse != nullptr) f.maybe_lse = lse.ptr;
    return f;
  }

  flashattn::BackwardParams backward_params(Problem& host) const {
    flashattn::BackwardParams g = host.backward_params();
    move_inputs(&g);
    g.o.data = o.ptr;
    g.d_o.data = d_o.ptr;
    g.lse = lse.ptr;
    g.dq.data = dq.ptr;
    g.dk.data = dk.ptr;
    g.dv.data = dv.ptr;
    return g;
  }
};

// Runs `call` (flashattn::forward or backward) on the sm80 path with the caller-owned device
// workspace that `workspace_size` asks for, poisoned: nothing may be read before it is written.
template <class Params>
void run_on_gpu(const Params& params,
                flashattn::Status (*workspace_size)(const Params&, const flashattn::Launch&, size_t*),
                flashattn::Status (*call)(const Params&, const flashattn::Launch&)) {
  flashattn::Launch launch;
  launch.backend = Backend::kCudaSm80;
  size_t bytes = 0;
  const flashattn::Status sized = workspace_size(params, launch, &bytes);
  ASSERT_TRUE(sized.ok()) << sized.message;
  DeviceBuffer<uint8_t> workspace;
  CUDA_OK(workspace.allocate(bytes));
  CUDA_OK(workspace.poison());
  launch.workspace = bytes > 0 ? workspace.ptr : nullptr;
  launch.workspace_bytes = bytes;
  const flashattn::Status st = call(params, launch);
  ASSERT_TRUE(st.ok()) << st.message;
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
}

// The forward of `p` (outputs poisoned) on the GPU; o and lse come back into p.
void gpu_forward(Problem& p) {
  DeviceProblem d;
  d.upload(p);
  if (::testing::Test::HasFatalFailure()) return;
  run_on_gpu(d.forward_params(p), flashattn::forward_workspace_size, flashattn::forward);
  if (::testing::Test::HasFatalFailure()) return;
  CUDA_OK(d.o.copy_to(p.o.storage.data()));
  CUDA_OK(d.lse.copy_to(p.lse.data()));
}

// The backward of `p` (o, lse given; gradients poisoned) on the GPU; dq, dk, dv come back into p.
void gpu_backward(Problem& p) {
  DeviceProblem d;
  d.upload(p);
  if (::testing::Test::HasFatalFailure()) return;
  run_on_gpu(d.backward_params(p), flashattn::backward_workspace_size, flashattn::backward);
  if (::testing::Test::HasFatalFailure()) return;
  CUDA_OK(d.dq.copy_to(p.dq.storage.data()));
  CUDA_OK(d.dk.copy_to(p.dk.storage.data()));
  CUDA_OK(d.dv.copy_to(p.dv.storage.data()));
}

// 16-bit words of `got` outside t's valid elements (the gaps of strided layouts) that differ from
// `before`, the poisoned storage the run started from.
int64_t written_outside(const HostTensor& got, const std::vector<float>& before) {
  std::vector<uint8_t> valid(got.storage.size() * 2, 0);
  for (int64_t b = 0; b < got.batch; ++b)
    for (int64_t r = 0; r < got.rows; ++r)
      for (int64_t h = 0; h < got.heads; ++h)
        for (int64_t x = 0; x < got.dim; ++x) valid[static_cast<size_t>(got.offset(b, r, h, x))] = 1;
  const auto* now = reinterpret_cast<const uint16_t*>(got.storage.data());
  const auto* was = reinterpret_cast<const uint16_t*>(before.data());
  int64_t n = 0;
  for (size_t i = 0; i < valid.size(); ++i) n += !valid[i] && now[i] != was[i];
  return n;
}

void check_forward(const Case& c) {
  Problem cpu = make_problem(c, fresh_seed(c.name()));
  Problem gpu = cpu;  // the same inputs and the same poison
  const std::vector<float> o_before = cpu.o.storage;
  Problem exact = as_fp32(cpu);
  run_forward(exact, Backend::kReference);
  run_forward(cpu, Backend::kCpu);
  if (::testing::Test::HasFatalFailure()) return;
  gpu_forward(gpu);
  if (::testing::Test::HasFatalFailure()) return;

  const double bound = 2 * lowp_standard_errors(exact, c.dtype, /*backward=*/false).o + kLowpFloorForward;
  double err[2] = {0, 0};
  for (const auto& [name, got, lse_tolerance] : {std::tuple{"cpu", &cpu, kCpuLseTolerance}, {"gpu", &gpu, kGpuLseTolerance}}) {
    SCOPED_TRACE(name);
    const Error eo = compare(got->o, exact.o, exact, /*k_side=*/false);
    EXPECT_EQ(eo.nan_count, 0) << "O elements left NaN";
    EXPECT_LE(eo.max_abs, bound) << "max |O - O_ref|";
    err[got == &gpu] = eo.max_abs;
    EXPECT_EQ(written_outside(got->o, o_before), 0) << "O written outside its valid elements";
    if (c.lse) {
      const Error el = compare_lse(*got, exact);
      EXPECT_EQ(el.nan_count, 0) << "LSE elements left NaN";
      EXPECT_LE(el.max_abs, lse_tolerance * std::max(1.0, el.max_ref)) << "max |LSE - LSE_ref|";
    }
  }
  const double diff = compare(gpu.o, cpu.o, exact, false).max_abs;
  std::printf("  O: cpu err %.3g, gpu err %.3g, bound %.3g; |gpu - cpu| %.3g\n", err[0], err[1], bound, diff);
}

void check_backward(const Case& c) {
  Problem cpu = make_problem(c, fresh_seed(c.name()));
  run_forward(cpu, Backend::kReference);  // o (rounded to the dtype) and lse: what both backwards read
  if (::testing::Test::HasFatalFailure()) return;
  Problem exact = as_fp32(cpu);
  run_forward(exact, Backend::kReference);
  run_backward(exact, Backend::kReference);
  Problem gpu = cpu;
  const Problem before = cpu;  // poisoned gradients
  run_backward(cpu, Backend::kCpu);
  if (::testing::Test::HasFatalFailure()) return;
  gpu_backward(gpu);
  if (::testing::Test::HasFatalFailure()) return;

  const LowpErrors lp = lowp_standard_errors(exact, c.dtype, /*backward=*/true);
  for (const auto& [what, lowp, k_side, member] :
       {std::tuple{"dq", lp.dq, false, &Problem::dq}, {"dk", lp.dk, true, &Problem::dk}, {"dv", lp.dv, true, &Problem::dv}}) {
    SCOPED_TRACE(what);
    double err[2] = {0, 0}, bound = 0;
    for (const auto& [name, got] : {std::pair{"cpu", &cpu}, {"gpu", &gpu}}) {
      SCOPED_TRACE(name);
      const Error e = compare(got->*member, exact.*member, exact, k_side);
      bound = 3 * lowp + kLowpFloorBackward * std::max(1.0, e.max_ref);
      EXPECT_EQ(e.nan_count, 0) << "gradient elements left NaN";
      EXPECT_LE(e.max_abs, bound) << "max error vs the fp64 reference";
      EXPECT_EQ(written_outside(got->*member, (before.*member).storage), 0) << "written outside the valid elements";
      err[got == &gpu] = e.max_abs;
    }
    const double diff = compare(gpu.*member, cpu.*member, exact, k_side).max_abs;
    std::printf("  %s: cpu err %.3g, gpu err %.3g, bound %.3g; |gpu - cpu| %.3g\n", what, err[0], err[1], bound, diff);
  }
}

// ---- cases: fp16 and bf16, sizes that are not tile multiples, Sq != Sk both ways ----

Case make(DType t, int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
  Case c;
  c.dtype = t;
  c.batch = batch;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.heads_q = hq;
  c.heads_kv = hkv;
  c.head_dim = d;
  return c;
}
Case causal(Case c, Alignment a) {
  c.causal = true;
  c.alignment = a;
  return c;
}
Case window(Case c, int64_t left, int64_t right) {
  c.window_left = left;
  c.window_right = right;
  return c;
}
Case varlen(Case c) {
  c.varlen_q = {0, 17, 113, 5, 70};  // empty sequences on both sides
  c.varlen_k = {13, 0, 203, 64, 70};
  return c;
}
Case strided(Case c) {
  c.strided = true;
  return c;
}

// What both backends' forward and backward take (the sm80 backward: d <= 128, dv = d, no score
// modifiers).
std::vector<Case> common_cases() {
  constexpr Alignment kBR = Alignment::kBottomRight, kTL = Alignment::kTopLeft;
  std::vector<Case> cases;
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    const int64_t d = t == DType::kBFloat16 ? 128 : 64;  // the two bar head dims, one per dtype
    cases.push_back(make(t, 2, 17, 17, 2, 2, 64));
    cases.push_back(make(t, 2, 113, 203, 2, 2, 128));
    cases.push_back(make(t, 1, 203, 113, 2, 2, d));
    cases.push_back(make(t, 1, 1, 203, 2, 2, d));
    for (Alignment a : {kBR, kTL}) {
      cases.push_back(causal(make(t, 1, 113, 203, 2, 2, d), a));
      cases.push_back(causal(make(t, 2, 203, 113, 2, 2, d), a));  // bottom-right: rows that see no key
    }
    cases.push_back(window(make(t, 1, 203, 181, 2, 2, d), 37, 5));
    cases.push_back(window(causal(make(t, 1, 203, 113, 2, 2, d), kBR), 20, -1));
    cases.push_back(causal(make(t, 1, 113, 203, 6, 2, d), kBR));  // GQA
    cases.push_back(make(t, 1, 203, 203, 4, 1, d));               // MQA
    cases.push_back(causal(varlen(make(t, 0, 0, 0, 4, 2, d)), kBR));
    cases.push_back(varlen(make(t, 0, 0, 0, 4, 2, d)));
    cases.push_back(strided(causal(make(t, 2, 113, 203, 4, 2, d), kTL)));
  }
  Case odd = make(DType::kFloat16, 1, 113, 97, 2, 2, 96);
  odd.scale = 0.3f;
  cases.push_back(odd);
  cases.push_back(make(DType::kBFloat16, 1, 97, 113, 2, 2, 40));  // runs on a larger instantiation
  return cases;
}

std::vector<Case> forward_cases() {
  std::vector<Case> cases = common_cases();
  // The forward's score modifiers and V head dims, once each, with causal, GQA and varlen.
  Case softcap = causal(make(DType::kBFloat16, 2, 203, 203, 2, 2, 64), Alignment::kBottomRight);
  softcap.softcap = 30.0f;
  cases.push_back(softcap);
  Case alibi = causal(make(DType::kFloat16, 2, 113, 203, 4, 2, 128), Alignment::kTopLeft);
  alibi.alibi = AlibiKind::kPerBatchHead;
  cases.push_back(alibi);
  Case bias = make(DType::kBFloat16, 2, 113, 203, 2, 1, 64);
  bias.bias = true;
  bias.bias_dtype = DType::kBFloat16;
  bias.bias_broadcast = true;
  cases.push_back(bias);
  Case keys = make(DType::kFloat16, 3, 113, 203, 2, 2, 128);
  keys.mask = MaskKind::kKeyPadding;
  cases.push_back(keys);
  Case blocks = make(DType::kBFloat16, 1, 300, 257, 2, 2, 128);
  blocks.mask = MaskKind::kBlockSparse;
  cases.push_back(blocks);
  Case everything = varlen(causal(make(DType::kBFloat16, 0, 0, 0, 4, 2, 64), Alignment::kBottomRight));
  everything.softcap = 20.0f;
  everything.alibi = AlibiKind::kPerHead;
  cases.push_back(everything);
  Case dv = causal(make(DType::kBFloat16, 1, 203, 113, 2, 2, 64), Alignment::kBottomRight);
  dv.head_dim_v = 128;
  cases.push_back(dv);
  Case no_lse = make(DType::kFloat16, 1, 113, 113, 2, 2, 64);
  no_lse.lse = false;
  cases.push_back(no_lse);
  return cases;
}

// GoogleTest names: the case's own name with every run of other characters as one '_'.
std::string test_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name;
  for (const char ch : info.param.name()) {
    if (std::isalnum(static_cast<unsigned char>(ch))) name += ch;
    else if (!name.empty() && name.back() != '_') name += '_';
  }
  while (!name.empty() && name.back() == '_') name.pop_back();
  return name;
}

class CpuVsGpuSmallForward : public ::testing::TestWithParam<Case> {};
class CpuVsGpuSmallBackward : public ::testing::TestWithParam<Case> {};
TEST_P(CpuVsGpuSmallForward, BothMatchTheReference) { check_forward(GetParam()); }
TEST_P(CpuVsGpuSmallBackward, BothMatchTheReference) { check_backward(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Cases, CpuVsGpuSmallForward, ::testing::ValuesIn(forward_cases()), test_name);
INSTANTIATE_TEST_SUITE_P(Cases, CpuVsGpuSmallBackward, ::testing::ValuesIn(common_cases()), test_name);

}  // namespace
}  // namespace fa_test
