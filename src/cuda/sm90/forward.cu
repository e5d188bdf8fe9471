// Host side of the Hopper forward: the selection shared by supported(), workspace() and run(), the
// translation of ForwardParams into the kernel's params (tensor maps and the persistent schedule
// included; pack-GQA by policy.hpp's rule, pack_gqa), and the grid. What this path does not take is
// refused with the reason, and kAuto then runs the sm80 path.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "core/problem.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/host_checks.hpp"
#include "cuda/primitives/sm90/tma.cuh"
#include "cuda/primitives/math.cuh"  // kLog2e
#include "cuda/sm90/kernel_params.hpp"
#include "cuda/sm90/launch_forward.hpp"
#include "cuda/sm90/pack_gqa.hpp"
#include "cuda/sm90/shared_tails.hpp"
#include "cuda/sm90/policy.hpp"
#include "cuda/sm90/split_tail.cuh"  // SplitLayout
#include "cuda/sm90/tile_scheduler.cuh"  // split_units_begin, shared_tail_item, kSharedTailConsumers

namespace flashattn::detail {
namespace {

using sm90::ForwardKernelParams;
using sm90::ForwardTiles;

struct Instance {
  int head_dim;
  DType dtype;
  cudaError_t (*launch)(const ForwardKernelParams&, int, cudaStream_t);
};

// The built instantiations, then a sentinel so that a build without sm_90a still has a table;
// kBuilt counts the real ones.
constexpr Instance kInstances[] = {
#define FLASHATTN_SM90_FORWARD_INSTANCE(HEAD_DIM, DTYPE) {HEAD_DIM, DTYPE, &sm90::launch_forward<HEAD_DIM, DTYPE>},
#include "cuda/sm90/instantiations/forward_list.inc"
#undef FLASHATTN_SM90_FORWARD_INSTANCE
    {0, DType::kFloat32, nullptr},
};

Status not_supported(std::string what) {
  return {StatusCode::kNotSupported, "cuda sm90 forward: " + std::move(what)};
}

constexpr int kBuilt = static_cast<int>(sizeof(kInstances) / sizeof(kInstances[0])) - 1;
bool any_built() { return kBuilt > 0; }

// The instantiation that serves p: of p's dtype, the smallest head dim at least p's (zero padding
// serves the rest). Null when none.
const Instance* pick_instance(const ForwardParams& p) {
  const Dims d = resolve_dims(p);
  const Instance* best = nullptr;
  for (int i = 0; i < kBuilt; ++i)
    if (kInstances[i].dtype == p.dtype && kInstances[i].head_dim >= d.head_dim &&
        (best == nullptr || kInstances[i].head_dim < best->head_dim))
      best = &kInstances[i];
  return best;
}

int largest_head_dim(DType dtype) {
  int largest = 0;
  for (int i = 0; i < kBuilt; ++i)
    if (kInstances[i].dtype == dtype && kInstances[i].head_dim > largest) largest = kInstances[i].head_dim;
  return largest;
}

// The tile policy that serves a problem on inst (policy.hpp): by head dim, and by whether the mask
// is a band (window sides as in ForwardKernelParams). launch_forward makes the same choice.
ForwardTiles tiles_for(const Instance& inst, int window_left, int window_right) {
  return sm90::forward_tiles(inst.head_dim, sm90::banded(window_left, window_right));
}
ForwardTiles tiles_for(const Instance& inst, const ForwardParams& p) {
  const cuda_host::KernelBand band = cuda_host::kernel_band(p, resolve_dims(p));
  return tiles_for(inst, band.window_left, band.window_right);
}

// Where 32-bit indices of the kernel would not hold: the packed rows of a varlen problem (upper
// bound: batch x longest) and the number of work items. Empty when they hold.
std::string schedule_limits(const Dims& d, int block_m) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (d.varlen && d.batch * (d.seqlen_q + d.seqlen_k) + 2 * block_m > kMax)
    return "batch x (seqlen_q + seqlen_k) above 2^31 - 1 (32-bit packed row indices of a variable-length batch)";
  const int64_t m_blocks = (d.seqlen_q + block_m - 1) / block_m;
  if ((m_blocks + 1) * d.batch * d.heads_q > kMax - 4096)
    return "batch x heads_q x query tiles above 2^31 - 4096 (work items)";
  return {};
}

// Whether every work item of the problem of k (its band and varlen fields set) costs the same: no
// causal/window band (so no paired tiles), no varlen.
bool uniform_items(const ForwardKernelParams& k) {
  return !sm90::banded(k.window_left, k.window_right) && k.maybe_cu_seqlens_q == nullptr;
}

// The persistent grid (one block per multiprocessor) where the head dim's policy asks for it, else
// one block per work item (the launch shape of steps 1-3), for the problem of k (its band and
// varlen fields set: kUniformItems asks that every item cost the same, no band and no varlen).
// FLASHATTN_SM90_PERSISTENT=0 or 1 in the environment (read once; for measurements) overrides the
// policy for every head dim.
bool persistent_schedule(const ForwardTiles& tiles, const ForwardKernelParams& k) {
  static const int forced = [] {
    const char* env = std::getenv("FLASHATTN_SM90_PERSISTENT");
    if (env == nullptr) return -1;
    return std::strcmp(env, "0") == 0 ? 0 : 1;
  }();
  if (forced >= 0) return forced == 1;
  return tiles.persistent == sm90::Persistence::kAlways ||
         (tiles.persistent == sm90::Persistence::kUniformItems && uniform_items(k));
}

// Every field of the kernel params but the tensor maps: addresses, shapes, the band and the
// schedule (what the workspace query needs, without encoding the maps).
void schedule_params(const ForwardParams& p, const Instance& inst, ForwardKernelParams* k) {
  const Dims d = resolve_dims(p);
  const ForwardTiles tiles = tiles_for(inst, p);
  *k = ForwardKernelParams{};
  k->o = p.o.data;
  k->maybe_lse = p.maybe_lse;
  k->o_batch_stride = d.varlen ? 0 : p.o.batch_stride;
  k->o_row_stride = p.o.row_stride, k->o_head_stride = p.o.head_stride;
  k->lse_batch_stride = d.varlen ? 0 : p.lse_batch_stride;
  k->lse_head_stride = p.lse_head_stride;
  k->maybe_cu_seqlens_q = p.maybe_cu_seqlens_q;
  k->maybe_cu_seqlens_k = p.maybe_cu_seqlens_k;
  k->batch = static_cast<int>(d.batch);
  k->heads_q = static_cast<int>(d.heads_q);
  k->seqlen_q = static_cast<int>(d.seqlen_q);
  k->seqlen_k = static_cast<int>(d.seqlen_k);
  k->group = static_cast<int>(d.group);
  k->head_dim = static_cast<int>(d.head_dim);
  k->scale = d.scale;
  k->scale_log2 = d.scale * cuda::kLog2e;
  const cuda_host::KernelBand band = cuda_host::kernel_band(p, d);
  k->bottom_right = band.bottom_right;
  k->window_left = band.window_left;
  k->window_right = band.window_right;
  // Pack-GQA (policy.hpp's rule): items over (tile, kv head, batch), each tile holding the rows of
  // the group's query heads.
  k->pack_gqa = sm90::pack_gqa(d.seqlen_q, d.group, tiles.block_m());
  k->q = p.q.data;
  k->q_batch_stride = d.varlen ? 0 : p.q.batch_stride;
  k->q_row_stride = p.q.row_stride, k->q_head_stride = p.q.head_stride;
  k->item_heads = static_cast<int>(k->pack_gqa ? d.heads_kv : d.heads_q);
  const int64_t rows = k->pack_gqa ? d.seqlen_q * d.group : d.seqlen_q;
  // Tiles of unequal cost (a band) are paired for the persistent grid's static stride.
  k->m_blocks = static_cast<int>((rows + tiles.block_m() - 1) / tiles.block_m());
  k->pair_tiles = sm90::banded(band.window_left, band.window_right) && persistent_schedule(tiles, *k);
  // Shared tails (tile_scheduler.cuh): each (batch, head)'s last tile, when its rows fill one
  // consumer's slice and it has three key tiles or more, runs with its key tiles shared by the
  // three consumers. FLASHATTN_SM90_SHARED_TAILS=0 in the environment, read at every call (for
  // measurements: the tools flip it between calls), leaves it to one consumer. They are spread
  // (each in its head's items, tile_scheduler.cuh), or with FLASHATTN_SM90_SHARED_TAILS=first (for
  // measurements) numbered first.
  const int64_t heads = d.batch * k->item_heads;
  const int64_t tail_rows = rows - (k->m_blocks - 1) * int64_t{tiles.block_m()};
  const int64_t key_tiles = (d.seqlen_k + tiles.block_n - 1) / tiles.block_n;
  const char* shared_env = std::getenv("FLASHATTN_SM90_SHARED_TAILS");
  const bool shared_off = shared_env != nullptr && std::strcmp(shared_env, "0") == 0;
  k->shared_tails = 0;
  k->shared_tails_spread = !(shared_env != nullptr && std::strcmp(shared_env, "first") == 0);
  if (tiles.share_tails && !shared_off && !sm90::banded(band.window_left, band.window_right) && !d.varlen &&
      !k->pack_gqa && tail_rows <= ForwardTiles::kRowsPerConsumer && key_tiles >= sm90::kSharedTailConsumers)
    k->shared_tails = static_cast<int>(heads);
  const int64_t per_head = k->pair_tiles ? 2 * ((k->m_blocks + 1) / 2) : k->m_blocks;
  k->num_items = static_cast<int>(per_head * heads);  // a shared tail is its head's last tile's item
  k->split_round = ForwardKernelParams::kNoSplit;  // split_tail() decides, once the grid is known
  k->shared_tail_credit = 0;
  k->softcap = p.softcap;
  k->softcap_to_exp2 = p.softcap > 0.0f ? d.scale / p.softcap * 2.0f * cuda::kLog2e : 0.0f;
}

// The kernel params; the tensor maps' boxes follow the instantiation's tile shape. A map that TMA
// cannot describe (strides not multiples of 16 bytes, sizes out of range) gives a status naming
// the tensor and the field. Varlen: one batch entry of batch x longest rows, an upper bound of the
// packed total that the kernel never reads past (its boxes stop at each sequence's end); K and V
// as packed rows (tma.cuh: make_packed_rows_tensor_map), so that a sequence shorter than Bc, whose
// one box starts before its first row, reads zeros there rather than the previous sequence's rows
// (masked, but 0 x Inf or a NaN among them would reach P V as NaN).
Status kernel_params(const ForwardParams& p, const Instance& inst, ForwardKernelParams* k) {
  schedule_params(p, inst, k);
  const Dims d = resolve_dims(p);
  const ForwardTiles tiles = tiles_for(inst, k->window_left, k->window_right);
  const int64_t map_batch = d.varlen ? 1 : d.batch;
  const auto map_rows = [&](int64_t seqlen) { return d.varlen ? std::max<int64_t>(1, d.batch * seqlen) : seqlen; };
  const struct {
    CUtensorMap* map;
    const ConstTensor& t;
    int64_t seqlen, heads;
    int box_rows;
    const char* name;
  } maps[] = {{&k->q_map, p.q, map_rows(d.seqlen_q), d.heads_q, tiles.block_m(), "q"},
              {&k->k_map, p.k, map_rows(d.seqlen_k), d.heads_kv, tiles.block_n, "k"},
              {&k->v_map, p.v, map_rows(d.seqlen_k), d.heads_kv, tiles.block_n, "v"}};
  for (const auto& m : maps) {
    const bool packed_rows = d.varlen && m.map != &k->q_map;
    const Status s =
        packed_rows ? cuda::sm90::make_packed_rows_tensor_map(m.map, p.dtype, m.t.data, m.seqlen, m.heads, d.head_dim,
                                                              m.t.row_stride, m.t.head_stride, m.box_rows)
                    : cuda::sm90::make_attention_tensor_map(m.map, p.dtype, m.t.data, map_batch, m.seqlen, m.heads,
                                                            d.head_dim, m.t.batch_stride, m.t.row_stride,
                                                            m.t.head_stride, m.box_rows);
    if (!s) return {s.code, std::string(m.name) + ": " + s.message};
  }
  return {};
}

// Multiprocessors of `device`, asked of the runtime once per device.
int multiprocessors(int device) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cached[kCachedDevices] = {};
  if (device >= 0 && device < kCachedDevices)
    if (const int n = cached[device].load(std::memory_order_relaxed); n > 0) return n;
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n < 1) {
    cudaGetLastError();
    return 0;
  }
  if (device >= 0 && device < kCachedDevices) cached[device].store(n, std::memory_order_relaxed);
  return n;
}

// The grid: one block per multiprocessor (a block takes nearly all of one's shared memory), each
// running work items in a loop (paired items two at a time); or one block per item.
int grid_blocks(const ForwardKernelParams& k, const ForwardTiles& tiles, int device) {
  const int sms = persistent_schedule(tiles, k) ? multiprocessors(device) : 0;
  const int units = k.pair_tiles ? k.num_items / 2 : k.num_items;  // what the stride runs over
  return sms > 0 ? std::min(sms, units) : units;
}

// The split tail (tile_scheduler.cuh) of the problem of k on `blocks` blocks: where every item costs
// the same (no band, no varlen, so not paired), the grid is persistent, an item has two key tiles
// or more to split, and the plain schedule's last wave would leave enough idle: averaged over the
// blocks, (G ceil(N / G) - N) T / G >= 12 key tiles' time. The split costs each block about 5-6
// tiles' time whatever the problem (one more segment's pipeline ramp and Q load, the hand-over's
// fences, the counters' memset), and the plain schedule's half-empty last wave runs at a higher
// clock, so a small idle share does not pay (docs/perf.md, "The split tail": 1.94 waves of 32-tile
// items -5.6%, 15.5 waves of 128-tile items +4%, 1.21 waves +34%).
// FLASHATTN_SM90_SPLIT in the environment, read at every call (for tests and measurements: the
// tools flip it between calls): 0 never splits, 1 splits wherever the problem allows (any idle).
struct SplitTail {
  int round = ForwardKernelParams::kNoSplit;
  int key_tiles = 0;
  long long units = 0;
  int tail_credit = 0;  // ForwardKernelParams::shared_tail_credit
  int units_per_block = 0, units_extra = 0;  // L and R (tile_scheduler.cuh, tail_units_begin)
  size_t counter_bytes = 0, bytes = 0;  // of the workspace; 0: no split
};

// The split tail's credit per shared tail (tile_scheduler.cuh, tail_units_begin): what a shared tail
// costs less than an item, in units (key tiles): kSharedTailCreditPercent (shared_tails.hpp) of an
// item's key tiles, or FLASHATTN_SM90_SHARED_TAIL_CREDIT (percent, read at every call: for
// measurements). None where a block's range would then hold fewer than one item's key tiles (an item
// must be cut at most once).
int shared_tail_credit(ForwardKernelParams& k, int round, int key_tiles, long long units, int blocks) {
  if (k.shared_tails == 0) return 0;
  const char* env = std::getenv("FLASHATTN_SM90_SHARED_TAIL_CREDIT");
  const long long percent = env != nullptr ? std::strtol(env, nullptr, 10) : kSharedTailCreditPercent;
  const long long credit = std::min(percent, 100LL) * key_tiles / 100;
  constexpr int kMaxTails = 1 << 16;  // the table's walk over them, on the host at every call
  if (credit <= 0 || blocks > ForwardKernelParams::kMaxCreditBlocks || k.shared_tails > kMaxTails) return 0;
  // The shared tails of the whole rounds (items < round G; tile_scheduler.cuh: shared_tail_item),
  // counted per block (item i on block i % G), then summed over the blocks before each.
  const long long whole = static_cast<long long>(round) * blocks;
  std::fill(k.tails_before, k.tails_before + blocks + 1, 0);
  for (int h = 0; h < k.shared_tails; ++h) {
    const long long item = sm90::shared_tail_item(h, k.m_blocks, k.shared_tails_spread);
    if (item < whole) ++k.tails_before[item % blocks + 1];
  }
  for (int x = 0; x < blocks; ++x) k.tails_before[x + 1] += k.tails_before[x];
  const long long total = units - k.tails_before[blocks] * credit;
  if (total < 0) return 0;
  const int l = static_cast<int>(total / blocks), r = static_cast<int>(total % blocks);  // L and R
  const auto begin = [&](int x) {
    return sm90::split_units_begin(x, l, r) + static_cast<int>(credit) * k.tails_before[x];
  };
  for (int x = 0; x < blocks; ++x)
    if (begin(x + 1) - begin(x) < key_tiles) return 0;
  return static_cast<int>(credit);
}

SplitTail split_tail(ForwardKernelParams& k, const ForwardTiles& tiles, int blocks) {
  SplitTail split;
  const char* env = std::getenv("FLASHATTN_SM90_SPLIT");
  if (env != nullptr && std::strcmp(env, "0") == 0) return split;
  const bool force_split = env != nullptr && std::strcmp(env, "1") == 0;
  if (!uniform_items(k) || !persistent_schedule(tiles, k) || blocks < 2 || k.num_items <= blocks) return split;
  const int key_tiles = (k.seqlen_k + tiles.block_n - 1) / tiles.block_n;
  const long long rounds = (k.num_items + blocks - 1) / blocks, idle = rounds * blocks - k.num_items;
  constexpr long long kMinIdleTiles = 12;
  if (key_tiles < 2 || idle == 0 || (!force_split && idle * key_tiles < kMinIdleTiles * blocks)) return split;
  split.round = k.num_items / blocks - 1;
  // Shared tails numbered first (items 0 .. shared_tails - 1) stay in the rounds before the split;
  // spread ones in the split's items run as any item's parts (work_tile), one consumer on each.
  if (k.shared_tails > 0 && !k.shared_tails_spread && static_cast<long long>(split.round) * blocks < k.shared_tails)
    return SplitTail{};
  split.key_tiles = key_tiles;
  split.units = static_cast<long long>(k.num_items - split.round * blocks) * key_tiles;
  if (split.units > std::numeric_limits<int32_t>::max()) return SplitTail{};  // 32-bit unit indices
  split.tail_credit = shared_tail_credit(k, split.round, key_tiles, split.units, blocks);
  const long long cut =
      split.units - (split.tail_credit > 0 ? static_cast<long long>(k.tails_before[blocks]) * split.tail_credit : 0);
  split.units_per_block = static_cast<int>(cut / blocks);
  split.units_extra = static_cast<int>(cut % blocks);
  split.counter_bytes = sm90::SplitLayout::counter_bytes(blocks - 1, tiles.consumers);
  split.bytes = sm90::SplitLayout::bytes(blocks - 1, tiles.consumers, tiles.head_dim);
  return split;
}

// The device the call runs on (the current one); -1 when the runtime cannot say.
int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return device;
}

}  // namespace

Status cuda_sm90_forward_supported(const ForwardParams& p) {
  if (!any_built()) return not_supported("not built for sm_90a (FLASHATTN_CUDA_GENCODE has no sm_90a target)");
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    return not_supported("dtype fp32 (takes fp16 and bf16)");
  const Dims d = resolve_dims(p);
  if (d.head_dim_v != d.head_dim)
    return not_supported("head_dim_v " + std::to_string(d.head_dim_v) + " != head_dim " + std::to_string(d.head_dim) +
                         " (takes head_dim_v = head_dim)");
  if (d.head_dim % 8 != 0)
    return not_supported("head_dim " + std::to_string(d.head_dim) + " (takes multiples of 8)");
  const Instance* inst = pick_instance(p);
  if (inst == nullptr)
    return not_supported("head_dim " + std::to_string(d.head_dim) + " (the largest built is " +
                         std::to_string(largest_head_dim(p.dtype)) + ")");
  if (p.maybe_alibi_slopes != nullptr) return not_supported("maybe_alibi_slopes: ALiBi (not on this path)");
  if (p.maybe_bias.data != nullptr) return not_supported("maybe_bias: additive bias (not on this path)");
  if (p.maybe_mask.data != nullptr) return not_supported("maybe_mask: boolean mask (not on this path)");
  if (!(d.scale > 0.0f) || !std::isfinite(d.scale))
    return not_supported("softmax_scale " + std::to_string(d.scale) + " (takes finite positive scales)");
  if (const std::string limit = cuda_host::index_limits(d); !limit.empty()) return not_supported(limit);
  const ForwardTiles tiles = tiles_for(*inst, p);
  if (const std::string limit = schedule_limits(d, tiles.block_m()); !limit.empty())
    return not_supported(limit);

  cuda_host::Device device;
  if (!cuda_host::current_device(&device)) return not_supported("no usable CUDA device");
  if (device.major != 9 || device.minor != 0)
    return not_supported("compute capability " + std::to_string(device.major) + "." + std::to_string(device.minor) +
                         " (the sm_90a code runs on 9.0 only)");
  if (device.smem_optin < tiles.smem_bytes())
    return not_supported("head_dim " + std::to_string(d.head_dim) + " needs " + std::to_string(tiles.smem_bytes()) +
                         " bytes of shared memory per block, the device has " + std::to_string(device.smem_optin));
  if (const char* name = cuda_host::first_not_on_device(
          {{p.q.data, "q"},
           {p.k.data, "k"},
           {p.v.data, "v"},
           {p.o.data, "o"},
           {p.maybe_lse, "maybe_lse"},
           {p.maybe_cu_seqlens_q, "maybe_cu_seqlens_q"},
           {p.maybe_cu_seqlens_k, "maybe_cu_seqlens_k"}},
          device.index))
    return not_supported(std::string(name) + " is not device memory of the current device");
  const size_t elem = dtype_size(p.dtype);
  const struct { ConstTensor t; const char* name; } tensors[] = {{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {p.o, "o"}};
  for (const auto& t : tensors)
    if (!cuda_host::aligned_16(t.t, d.varlen, elem))
      return not_supported(std::string(t.name) + ": data and strides must be 16-byte aligned");
  ForwardKernelParams k;
  if (const Status s = kernel_params(p, *inst, &k); !s) return not_supported(s.message);
  return {};
}

namespace {

// The split tail p would take on the current device (none: an empty problem, no instance or device).
SplitTail split_tail_of(const ForwardParams& p) {
  const Instance* inst = pick_instance(p);
  if (inst == nullptr || p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return {};
  ForwardKernelParams k;
  const int device = current_device();
  if (device < 0) return {};
  schedule_params(p, *inst, &k);
  const ForwardTiles tiles = tiles_for(*inst, k.window_left, k.window_right);
  return split_tail(k, tiles, grid_blocks(k, tiles, device));
}

}  // namespace

// The split tail's workspace, where the problem takes one (0 otherwise).
size_t cuda_sm90_forward_workspace(const ForwardParams& p) { return split_tail_of(p).bytes; }

bool cuda_sm90_forward_packs_gqa(const ForwardParams& p) {
  const Instance* inst = pick_instance(p);
  if (inst == nullptr) return false;
  const Dims d = resolve_dims(p);
  return sm90::pack_gqa(d.seqlen_q, d.group, tiles_for(*inst, p).block_m());
}

int cuda_sm90_forward_shared_tails(const ForwardParams& p) {
  const Instance* inst = pick_instance(p);
  if (inst == nullptr || p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return 0;
  ForwardKernelParams k;
  schedule_params(p, *inst, &k);
  return k.shared_tails;
}

int cuda_sm90_forward_shared_tail_credit(const ForwardParams& p) { return split_tail_of(p).tail_credit; }

Status cuda_sm90_forward(const ForwardParams& p, void* workspace, void* stream) {
  const Instance* inst = pick_instance(p);
  if (inst == nullptr || p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return {};  // nothing to launch
  ForwardKernelParams k;
  // supported() encoded the same maps (for its checks), so this does not fail; it is encoded again
  // here because the maps travel by value in the kernel's parameters.
  if (const Status s = kernel_params(p, *inst, &k); !s)
    return {StatusCode::kInternal, "cuda sm90 forward: " + s.message};
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return {StatusCode::kInternal, std::string("cuda sm90 forward: cudaGetDevice failed: ") + cudaGetErrorString(e)};
  const ForwardTiles tiles = tiles_for(*inst, k.window_left, k.window_right);
  const int blocks = grid_blocks(k, tiles, device);
  const auto cu_stream = static_cast<cudaStream_t>(stream);
  if (const SplitTail split = split_tail(k, tiles, blocks); split.bytes > 0) {
    if (workspace == nullptr)
      return {StatusCode::kInvalidArgument, "cuda sm90 forward: workspace: null, the split tail needs " +
                                                std::to_string(split.bytes) + " bytes"};
    k.split_round = split.round;
    k.key_tiles = split.key_tiles;
    k.tail_units_per_block = split.units_per_block;
    k.tail_units_extra = split.units_extra;
    k.shared_tail_credit = split.tail_credit;
    k.split_counters = static_cast<int*>(workspace);
    k.split_partials = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + split.counter_bytes);
    if (const cudaError_t e = cudaMemsetAsync(workspace, 0, split.counter_bytes, cu_stream); e != cudaSuccess)
      return {StatusCode::kInternal, std::string("cuda sm90 forward: memset of the split counters failed: ") +
                                         cudaGetErrorString(e)};
  }
#ifdef FLASHATTN_SM90_TIMELINE
  // Timeline builds (timeline.cuh, tools/gpu/timeline.py): the device address of the stamps'
  // buffer, timeline::kRecords 64-bit words, from the environment at every call.
  if (const char* env = std::getenv("FLASHATTN_SM90_TIMELINE"); env != nullptr)
    k.timeline = reinterpret_cast<uint64_t*>(static_cast<uintptr_t>(std::strtoull(env, nullptr, 0)));
#endif
  if (const cudaError_t e = inst->launch(k, blocks, cu_stream); e != cudaSuccess)
    return {StatusCode::kInternal, std::string("cuda sm90 forward: launch failed: ") + cudaGetErrorString(e)};
  return {};
}

}  // namespace flashattn::detail
