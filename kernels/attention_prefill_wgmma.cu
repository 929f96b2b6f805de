// Causal prefill attention on Hopper tensor cores (wgmma + TMA), head_dim 128, f16 / bf16: what
// fl_attention_prefill runs on sm_90 for those calls (the mma.sync kernel of
// attention_prefill.cu runs every other call, and every call that FL_PREFILL_KERNEL_MMA_SYNC
// forces onto it). CAUSAL = false (a compile-time flag: the causal instantiations are the code
// they were before it) is fl_attention_prefill_bidirectional's: every key tile of the sequence,
// only the last one masked (its keys past the sequence end).
//
// One CTA owns BM = 128 query rows of one (sequence, q head): two consumer warpgroups of 64
// rows each and one producer warpgroup. Key tiles of BN = 128 keys, from the diagonal tile down:
//   producer  one thread issues TMA copies (128B-swizzled boxes of 128 rows x 64 columns) of
//             Q once and of K_j and V_j into two-stage rings, each stage guarded by a "full"
//             mbarrier (TMA byte count) and an "empty" one (one arrival per consumer warp);
//   S_j = Q K_j^T   8 x wgmma.m64n128k16, both operands in shared memory (K-major)
//   O += P V        8 x wgmma.m64n128k16, P from registers (the S accumulator layout is the A
//                   fragment layout), V in shared memory MN-major (transposed B)
// Within a warpgroup the P V product of tile j+1 is issued right after S_j and runs while the
// softmax of S_j is computed (FlashAttention-3's intra-warpgroup overlap); O is rescaled once
// that product has landed, and only in warps where some row's running max moved. There is no
// CTA-wide barrier after the set-up, so the two warpgroups drift apart and one's softmax
// overlaps the other's wgmmas. Registers: O 64, S 64, P 32 per consumer thread.
// TMA reads whole 128-row boxes: rows past the sequence's end belong to the next sequence
// (or are zero past the last token); they are masked out of every softmax and never written,
// but a NaN or Inf in a neighbour's V rows would reach these rows' output through 0 * Inf.
// CTAs are persistent (one per SM, see item_of). Not yet done (what FA3 adds): explicit
// ping-pong scheduling of the two warpgroups, GQA heads sharing a CTA, a dynamic (atomic)
// work queue, and 2 CTAs' worth of overlap for short sequences (where it trails cuDNN most).
#include <cuda.h>
#include <cudaTypedefs.h>

#include "common/common.cuh"
#include "common/wgmma.cuh"
#include "common/tma_host.cuh"

namespace fl {
namespace prefill_wgmma {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int D = 128, WGS = 2, BM = 64 * WGS, BN = 128;
constexpr int THREADS = 128 * (WGS + 1);  // consumer warpgroups, then the producer warpgroup
constexpr int TILE_BYTES = BM * D * 2;   // Q (BM rows), K or V (BN rows): 32 KB each
static_assert(BM == BN, "one box shape for Q, K and V");
constexpr int BAR_OFF = 5 * TILE_BYTES;  // Q, 2 x K, 2 x V, then the mbarriers
constexpr int SMEM_BYTES = BAR_OFF + 128 + 1024;  // 10 mbarriers, alignment slack

struct Params {
    CUtensorMap tq, tk, tv;  // [total_tokens, heads, 128] as 3-d maps, boxes of 128 x 1 x 64
    void *out;
    const int32_t *cu_seqlens;
    int32_t batch, q_heads, kv_heads, total_tokens, window;
    int32_t m_blocks, n_work;  // query blocks per sequence (max_seq_len / BM), work items
    float scale_log2;          // softmax scale * log2(e), > 0
};

// One work item = BM query rows of one (sequence, q head); item w: query block
// m_blocks - 1 - w / (heads x batch) (heavy, late blocks first), head w % heads, sequence
// (w / heads) % batch. Fills the item's ranges; false when the block lies past its sequence.
struct Work {
    int h, kvh, start, len, q_start, n_lo, n_hi;
};
template <bool CAUSAL>
__device__ __forceinline__ bool work_item(const Params &p, int w, Work &it) {
    if (w >= p.n_work) return false;
    const int hb = p.q_heads * p.batch;
    const int m_block = p.m_blocks - 1 - w / hb;
    it.h = w % p.q_heads;
    it.kvh = it.h / (p.q_heads / p.kv_heads);
    packed_seq(p.cu_seqlens, (w % hb) / p.q_heads, p.total_tokens, it.start, it.len);
    it.q_start = m_block * BM;
    if (it.q_start >= it.len) return false;
    if constexpr (CAUSAL) {
        const int q_last = min(it.q_start + BM, it.len) - 1;
        // Key tiles [n_lo, n_hi): keys 0..q_last (causal), >= q_start - window + 1 (window).
        it.n_hi = (q_last + BN) / BN;
        it.n_lo = p.window > 0 ? max(0, it.q_start - p.window + 1) / BN : 0;
    } else {  // every key of the sequence
        it.n_hi = (it.len + BN - 1) / BN;
        it.n_lo = 0;
    }
    return true;
}

// The work item CTA blockIdx.x takes in round r: rounds of gridDim.x items, walked forwards in
// even rounds and backwards in odd ones. Items get lighter as w grows, so a CTA that drew a
// heavy item in one round draws a light one in the next (a plain stride leaves the last CTAs
// less work than the first; kernels/experiments/attention_prefill.md).
__device__ __forceinline__ int item_of(const Params &p, int r) {
    const int g = (int)gridDim.x, c = (int)blockIdx.x;
    return r * g + ((r & 1) ? g - 1 - c : c);
}

// Persistent: gridDim.x CTAs (at most one per SM) walk the work items round by round
// (item_of). The producer runs ahead across items, so the next item's Q and first K/V tiles
// load while the consumers finish the current one and write its output (what short
// sequences need most).
template <typename T, bool CAUSAL>
__global__ void __launch_bounds__(THREADS, 1) prefill_wgmma_kernel(const __grid_constant__ Params p) {
#ifdef FL_HAVE_WGMMA
    using namespace fl::wg;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t s_q = base;
    auto s_k = [&](int sl) { return base + (uint32_t)((1 + sl) * TILE_BYTES); };
    auto s_v = [&](int sl) { return base + (uint32_t)((3 + sl) * TILE_BYTES); };
    const uint32_t full_q = base + BAR_OFF, empty_q = base + BAR_OFF + 8u;
    auto full_k = [&](int sl) { return base + BAR_OFF + 8u * (2 + sl); };
    auto full_v = [&](int sl) { return base + BAR_OFF + 8u * (4 + sl); };
    auto empty_k = [&](int sl) { return base + BAR_OFF + 8u * (6 + sl); };
    auto empty_v = [&](int sl) { return base + BAR_OFF + 8u * (8 + sl); };

    const int tid = threadIdx.x;
    if (tid == 0) {
        mbar_init(full_q, 1);
        mbar_init(empty_q, 8);  // one arrival per consumer warp
        for (int sl = 0; sl < 2; ++sl) {
            mbar_init(full_k(sl), 1);
            mbar_init(full_v(sl), 1);
            mbar_init(empty_k(sl), 8);
            mbar_init(empty_v(sl), 8);
        }
        fence_mbar_init();
    }
    __syncthreads();

    // Ring positions run on across work items: K/V tile number `kv` of this CTA uses stage
    // kv & 1 in phase (kv >> 1) & 1; Q item number `qn` the Q buffer in phase qn & 1. A fresh
    // barrier passes a wait on the "previous" phase, which is how the producer's first waits
    // on the empty barriers return at once.
    // Registers move from the producer warpgroup (24 each) to the consumers (240): per SM
    // sub-partition one warp of each, 24 + 2 x 240 <= 512 registers per thread slot.
    if (tid >= 128 * WGS) {  // the producer warpgroup: one thread issues every copy
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid == 128 * WGS) {
            int kv = 0, qn = 0;
            for (int r = 0; r * (int)gridDim.x < p.n_work; ++r) {
                Work it;
                if (!work_item<CAUSAL>(p, item_of(p, r), it)) continue;
                mbar_wait(empty_q, (qn & 1) ^ 1);
                ++qn;
                mbar_expect_tx(full_q, TILE_BYTES);
                for (int c = 0; c < 2; ++c)
                    tma_load_3d(s_q + c * (TILE_BYTES / 2), &p.tq, full_q, 64 * c, it.h, it.start + it.q_start);
                for (int j = it.n_hi - 1; j >= it.n_lo; --j, ++kv) {
                    const int sl = kv & 1, ph = ((kv >> 1) & 1) ^ 1;
                    const int row = it.start + j * BN;
                    mbar_wait(empty_k(sl), ph);
                    mbar_expect_tx(full_k(sl), TILE_BYTES);
                    for (int c = 0; c < 2; ++c)
                        tma_load_3d(s_k(sl) + c * (TILE_BYTES / 2), &p.tk, full_k(sl), 64 * c, it.kvh, row);
                    mbar_wait(empty_v(sl), ph);
                    mbar_expect_tx(full_v(sl), TILE_BYTES);
                    for (int c = 0; c < 2; ++c)
                        tma_load_3d(s_v(sl) + c * (TILE_BYTES / 2), &p.tv, full_v(sl), 64 * c, it.kvh, row);
                }
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const float sc = p.scale_log2;
    const uint32_t q_wg = s_q + (uint32_t)(wg * 64 * 128);  // this warpgroup's 64 rows

    float o[64], s[64];
    uint32_t pa[8][4];  // P of the previous tile, as the A fragments of 8 k-steps
    float m0, m1, l0, l1;  // running max (scaled, log2 units) and partial sums of rows r0, r1
    int wg_first, wg_last, r0, r1;

    // Every wgmma below is issued unconditionally by both warpgroups (a wgmma in a path ptxas
    // cannot prove warpgroup-uniform gets serialised, warning C7520). A tile that holds no key a
    // row of this warpgroup sees (a warpgroup past the sequence end, a tile before its window)
    // is computed fully masked and adds nothing.
    auto issue_s = [&](int sl) {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            const uint32_t off = (uint32_t)((kk >> 2) * (TILE_BYTES / 2) + (kk & 3) * 32);
            Wg<T>::ss_m64n128k16(s, mdesc(q_wg + off, 16, 1024), mdesc(s_k(sl) + off, 16, 1024), kk);
        }
        wgmma_commit();
    };
    auto issue_pv = [&](int sl) {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
            Wg<T>::rs_m64n128k16_tb(o, pa[kk], mdesc(s_v(sl) + (uint32_t)kk * 2048u, TILE_BYTES / 2, 1024));
        wgmma_commit();
    };
    // Online softmax of S_j in place (s becomes P), returning the factors O must be rescaled by;
    // seq_len: the sequence's length (non-causal: its keys end there).
    auto softmax = [&](int j, int seq_len, float &a0, float &a1, float &sum0, float &sum1) {
        // s[4c + e] = (row r0, key 8c + 2t + e), s[4c + 2 + e] = (row r1, same key). Masks only
        // where a key of the tile lies beyond a row (the diagonal) or before its window;
        // non-causal: where it lies past the sequence end (the last tile only).
        if constexpr (CAUSAL) {
            const bool masked = (j + 1) * BN - 1 > wg_first || (p.window > 0 && j * BN <= wg_last - p.window);
            if (masked) {
#pragma unroll
                for (int c = 0; c < 16; ++c)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int key = j * BN + 8 * c + 2 * t + e;
                        if (key > r0 || (p.window > 0 && key <= r0 - p.window)) s[4 * c + e] = -INFINITY;
                        if (key > r1 || (p.window > 0 && key <= r1 - p.window)) s[4 * c + 2 + e] = -INFINITY;
                    }
            }
        } else {
            if ((j + 1) * BN > seq_len) {
#pragma unroll
                for (int c = 0; c < 16; ++c)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        if (j * BN + 8 * c + 2 * t + e >= seq_len) {
                            s[4 * c + e] = -INFINITY;
                            s[4 * c + 2 + e] = -INFINITY;
                        }
                    }
            }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int c = 0; c < 16; ++c) {
            mx0 = fmaxf(mx0, fmaxf(s[4 * c], s[4 * c + 1]));
            mx1 = fmaxf(mx1, fmaxf(s[4 * c + 2], s[4 * c + 3]));
        }
#pragma unroll
        for (int x = 1; x <= 2; x <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
        }
        const float n0 = fmaxf(m0, mx0 * sc), n1 = fmaxf(m1, mx1 * sc);  // sc > 0
        // A row with no visible key yet keeps m = -inf; exp2 against 0 then gives 0s.
        const float u0 = n0 == -INFINITY ? 0.f : n0, u1 = n1 == -INFINITY ? 0.f : n1;
        a0 = ex2_ftz(m0 - u0);
        a1 = ex2_ftz(m1 - u1);
        m0 = n0;
        m1 = n1;
        sum0 = 0.f;
        sum1 = 0.f;
#pragma unroll
        for (int c = 0; c < 16; ++c)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                s[4 * c + e] = ex2_ftz(fmaf(s[4 * c + e], sc, -u0));
                s[4 * c + 2 + e] = ex2_ftz(fmaf(s[4 * c + 2 + e], sc, -u1));
                sum0 += s[4 * c + e];
                sum1 += s[4 * c + 2 + e];
            }
    };
    auto rescale_and_pack = [&](float a0, float a1, float sum0, float sum1) {
        l0 = l0 * a0 + sum0;  // per-thread partial sums; the quad adds them at the end
        l1 = l1 * a1 + sum1;
        if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) {
#pragma unroll
            for (int c = 0; c < 16; ++c) {
                o[4 * c] *= a0;
                o[4 * c + 1] *= a0;
                o[4 * c + 2] *= a1;
                o[4 * c + 3] *= a1;
            }
        }
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i) pa[kk][i] = Wg<T>::pack(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
    };

    int kv = 0, qn = 0;
    for (int r = 0; r * (int)gridDim.x < p.n_work; ++r) {
        Work it;
        if (!work_item<CAUSAL>(p, item_of(p, r), it)) continue;
        const int ntiles = it.n_hi - it.n_lo;
        wg_first = it.q_start + 64 * wg;           // this warpgroup's first query row
        wg_last = min(wg_first + 63, it.len - 1);  // < wg_first: no rows here
        r0 = wg_first + 16 * warp + g;             // this thread's two rows
        r1 = r0 + 8;
#pragma unroll
        for (int i = 0; i < 64; ++i) o[i] = 0.f;
        m0 = m1 = -INFINITY;
        l0 = l1 = 0.f;

        float a0, a1, sum0, sum1;
        mbar_wait(full_q, qn & 1);
        ++qn;
        {  // the diagonal tile: S only
            const int sl = kv & 1;
            mbar_wait(full_k(sl), (kv >> 1) & 1);
            wgmma_fence();
            issue_s(sl);
            wgmma_wait<0>();
            fence_regs(s);
            if (lane == 0) {
                mbar_arrive(empty_k(sl));
                if (ntiles == 1) mbar_arrive(empty_q);
            }
            softmax(it.n_hi - 1, it.len, a0, a1, sum0, sum1);
            rescale_and_pack(a0, a1, sum0, sum1);
        }
        for (int i = 1; i < ntiles; ++i) {
            const int c = kv + i, sl = c & 1, pl = sl ^ 1;
            mbar_wait(full_k(sl), (c >> 1) & 1);
            mbar_wait(full_v(pl), ((c - 1) >> 1) & 1);
            // S_j, then O += P_{j+1} V_{j+1}, which runs while S_j's softmax is computed
            wgmma_fence();
            issue_s(sl);
            issue_pv(pl);
            wgmma_wait<1>();
            fence_regs(s);
            if (lane == 0) {
                mbar_arrive(empty_k(sl));
                if (i == ntiles - 1) mbar_arrive(empty_q);  // the item's last use of Q
            }
            softmax(it.n_hi - 1 - i, it.len, a0, a1, sum0, sum1);
            wgmma_wait<0>();  // O and pa may be touched again
            fence_regs(o);
            if (lane == 0) mbar_arrive(empty_v(pl));
            rescale_and_pack(a0, a1, sum0, sum1);
        }
        {  // the last P V product
            const int c = kv + ntiles - 1, pl = c & 1;
            mbar_wait(full_v(pl), (c >> 1) & 1);
            wgmma_fence();
            issue_pv(pl);
            wgmma_wait<0>();
            fence_regs(o);
            if (lane == 0) mbar_arrive(empty_v(pl));
        }
        kv += ntiles;

#pragma unroll
        for (int x = 1; x <= 2; x <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, x);
            l1 += __shfl_xor_sync(0xffffffffu, l1, x);
        }
        // __fdividef (2 ulp; l >= 1 for a row with a visible key): an IEEE division is a called
        // subroutine, and with relocatable device code ptxas then serialises every wgmma of the
        // kernel (warning C7509).
        const float i0 = l0 > 0.f ? __fdividef(1.f, l0) : 0.f, i1 = l1 > 0.f ? __fdividef(1.f, l1) : 0.f;
        const int64_t q_stride = (int64_t)p.q_heads * D;
        T *og = static_cast<T *>(p.out) + (int64_t)it.start * q_stride + (int64_t)it.h * D;
#pragma unroll
        for (int c = 0; c < 16; ++c) {
            const int col = 8 * c + 2 * t;
            if (r0 < it.len && r0 <= wg_last)
                *reinterpret_cast<uint32_t *>(og + (int64_t)r0 * q_stride + col) =
                    Wg<T>::pack(o[4 * c] * i0, o[4 * c + 1] * i0);
            if (r1 < it.len && r1 <= wg_last)
                *reinterpret_cast<uint32_t *>(og + (int64_t)r1 * q_stride + col) =
                    Wg<T>::pack(o[4 * c + 2] * i1, o[4 * c + 3] * i1);
        }
    }
#endif
}

// The kernel body exists only in sm_90a code. Without sm_90 in the build (FL_CUDA_ARCHS), a
// Hopper GPU would run the empty body JIT-compiled from compute_80 PTX and write nothing:
// such a library hands every call to the mma.sync kernel. sm_90 without the `a` features is
// refused at compile time (below), so "some 9.x target in the build" means sm_90a.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1000 && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_prefill_wgmma.cu needs sm_90a for Hopper: name 90a, not 90, in FL_CUDA_ARCHS"
#endif
#ifdef __CUDA_ARCH_LIST__
constexpr int kArchList[] = {__CUDA_ARCH_LIST__};
constexpr bool have_sm90(int i = 0) {
    return i < (int)(sizeof(kArchList) / sizeof(kArchList[0])) &&
           ((kArchList[i] >= 900 && kArchList[i] < 1000) || have_sm90(i + 1));
}
constexpr bool kHaveSm90Code = have_sm90();
#else
constexpr bool kHaveSm90Code = true;  // an nvcc without the list (< 11.5): assume it is there
#endif

// Whether this process's device runs the kernel (compute capability 9.x: sm_90a code).
inline bool device_ok() { return cc_major() == 9; }

// [tokens, heads, 128] 16-bit row-major as a 3-d map (innermost first), boxes of 64 elements
// (128 bytes: the 128-byte swizzle's span) x 1 head x 128 tokens; out-of-range rows read 0.
inline bool make_map(CUtensorMap *m, CUtensorMapDataType dt, const void *ptr, int heads, int tokens) {
    const auto enc = encode_fn();
    if (!enc) return false;
    const cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)heads, (cuuint64_t)tokens};
    const cuuint64_t strides[2] = {(cuuint64_t)D * 2, (cuuint64_t)heads * D * 2};
    const cuuint32_t box[3] = {64, 1, (cuuint32_t)BN};
    const cuuint32_t estr[3] = {1, 1, 1};
    return enc(m, dt, 3, const_cast<void *>(ptr), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename T, bool CAUSAL>
fl_status launch_t(const fl_prefill_attention_args *a, cudaStream_t st) {
    Params p;
    const CUtensorMapDataType dt =
        a->dtype == FL_DTYPE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    if (!make_map(&p.tq, dt, a->q, a->q_heads, a->total_tokens) ||
        !make_map(&p.tk, dt, a->k, a->kv_heads, a->total_tokens) ||
        !make_map(&p.tv, dt, a->v, a->kv_heads, a->total_tokens))
        return FL_ERR_UNSUPPORTED_DTYPE;  // no TMA here: the mma.sync kernel runs instead
    p.out = a->out;
    p.cu_seqlens = a->cu_seqlens;
    p.batch = a->batch;
    p.q_heads = a->q_heads;
    p.kv_heads = a->kv_heads;
    p.total_tokens = a->total_tokens;
    p.window = a->window;
    p.scale_log2 = a->scale * kLog2e;
    const int64_t m_blocks = ceil_div(a->max_seq_len, BM);
    const int64_t n_work = m_blocks * a->q_heads * a->batch;
    if (n_work > INT32_MAX / 2) return FL_ERR_UNSUPPORTED_DTYPE;  // the mma.sync kernel runs it
    p.m_blocks = (int32_t)m_blocks;
    p.n_work = (int32_t)n_work;
    if (!kHaveSm90Code) return FL_ERR_UNSUPPORTED_DTYPE;
    auto kern = prefill_wgmma_kernel<T, CAUSAL>;
    const cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return (fl_status)e;
    }
    // One resident CTA per SM (its shared memory allows no second), each walking work items.
    const unsigned grid = (unsigned)std::min<int64_t>(n_work, sm_count());
    kern<<<grid, THREADS, SMEM_BYTES, st>>>(p);
    return launch_status();
}

// Arguments already checked by fl_attention_prefill (causal) or
// fl_attention_prefill_bidirectional (not). FL_ERR_UNSUPPORTED_DTYPE when this path cannot run
// the call (head_dim != 128, f32, a device other than sm_90): the caller then uses the mma.sync
// kernel.
fl_status launch(const fl_prefill_attention_args *a, bool causal, cudaStream_t st) {
    if (a->head_dim != D || a->dtype == FL_DTYPE_F32 || !device_ok())
        return FL_ERR_UNSUPPORTED_DTYPE;
    if (a->dtype == FL_DTYPE_F16)
        return causal ? launch_t<__half, true>(a, st) : launch_t<__half, false>(a, st);
    return causal ? launch_t<__nv_bfloat16, true>(a, st) : launch_t<__nv_bfloat16, false>(a, st);
}

}  // namespace prefill_wgmma
}  // namespace fl
