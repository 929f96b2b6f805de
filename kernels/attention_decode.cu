// Decode attention (one query token per sequence) over a contiguous or paged KV cache,
// with grouped-query heads and a flash-decoding split of the sequence.
//
// Two kernels, both one CTA per (batch row, kv head, chunk of G query heads of that kv head,
// sequence split), so K/V rows are read once for all G heads; both stream K/V through
// shared memory with cp.async several tiles ahead of the math. With more than one split,
// each split writes its normalised partial output and its log-sum-exp (base 2) to the
// workspace; the last split CTA of each group combines them when they are few
// (finish_splits), else a third kernel does.
//
// - G >= 2 (GQA, MQA): decode_mma_kernel, W warps (8 on Hopper), tensor cores (see the
//   comment there).
// - G == 1 (MHA): decode_kernel (except at head_dim 128 on sm_90 over a paged cache at narrow
//   batches, or over a contiguous one with long contexts and wide batches, where the
//   tensor-core kernel is faster: see mha_on_mma),
//   4 warps of CUDA-core
//   "workers" of LPK lanes, each owning one key row at a time (each lane 8 dims) with its own
//   online-softmax state, merged through shared memory at the end. One head per K/V row keeps
//   the math light enough for CUDA cores to keep up with the reads; its copies run ahead
//   through a per-thread ring (below).
// - f32 (any G): decode_kernel too (the tensor cores take 16-bit inputs only), with G heads of
//   a group per CTA as for the tensor-core path; a lane's 8 dims are then 32 bytes, two
//   16-byte copies per row and per lane. All math in f32, as for the 16-bit types.
//
// Why tensor cores for G >= 2: a CUDA-core kernel doing the G-fold math per key runs out of
// issue slots before HBM runs out of bandwidth (see the tensor-core path below).
#include "common/common.cuh"

namespace fl {
namespace attn {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

struct Params {
    const void *q, *k, *v;
    void *out;
    const int32_t *seq_lens;
    const int32_t *block_table;
    int32_t batch, q_heads, kv_heads, capacity, block_size, max_blocks, num_blocks, window;
    float scale_log2;  // softmax scale * log2(e)
    int32_t num_splits;
    float *ws_o;       // [batch, q_heads, splits, D]
    float *ws_lse;     // [batch, q_heads, splits]
    // Fused combine (see finish_splits): one arrival counter per CTA group (sequence, head
    // group), zero between launches; null: the combine kernel runs instead.
    int32_t *counters;
};

// The workspace starts with the fused combine's counters: a fixed region whatever the call's
// shape, so a workspace reused across shapes never holds partial sums where a later call
// counts. Zeroed when the workspace is made (DecodeWorkspace); every fused launch leaves its
// counters at zero again.
constexpr int64_t kCounterBytes = 4096;
constexpr int64_t kMaxFusedGroups = kCounterBytes / 4;
// Fused when the last CTA's combine stays small: splits x heads per CTA at most this.
constexpr int kMaxFusedRows = 64;
// Head dims with the fused combine compiled in (at 256 the tensor-core kernel sits at the
// register limit and the combine's code made it spill).
constexpr int kMaxFusedD = 128;

// The split combine, fused into the split kernel when it is small: after its partials are in
// the workspace, the CTA that arrives last among the splits of its (sequence, head group)
// combines them into the output (the same weights as combine_kernel, summed in split order,
// so the result does not depend on which CTA is last) and re-arms the group's counter. Saves
// the combine kernel's launch and the wait for the whole split grid, which a short sequence in
// a long cache pays on every layer. `flag`: one int of shared memory that is free by now.
template <typename T, int D>
__device__ __forceinline__ void finish_splits(const Params &p, int b, int h0, int G, int *flag) {
    __threadfence();  // this CTA's partials are visible before its arrival is counted
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t *c = p.counters + (int64_t)blockIdx.x * gridDim.y + blockIdx.y;
        const bool last = atomicAdd(c, 1) == p.num_splits - 1;
        if (last) *c = 0;  // the next launch is stream-ordered after this one
        *flag = last;
    }
    __syncthreads();
    if (!*flag) return;
    __threadfence();
    const int S = p.num_splits;
    for (int e = threadIdx.x; e < G * D; e += blockDim.x) {
        const int64_t bh = (int64_t)b * p.q_heads + h0 + e / D;
        const int d = e % D;
        const float *lse = p.ws_lse + bh * S;
        const float *o = p.ws_o + bh * S * D + d;
        float M = -INFINITY;
        for (int sp = 0; sp < S; ++sp) M = fmaxf(M, __ldcg(lse + sp));
        float L = 0.f, O = 0.f;
        if (M != -INFINITY) {
            for (int sp = 0; sp < S; ++sp) {
                const float w = exp2f(__ldcg(lse + sp) - M);
                L += w;
                O = fmaf(w, __ldcg(o + (int64_t)sp * D), O);
            }
        }
        static_cast<T *>(p.out)[bh * D + d] = from_f32<T>(L > 0.f ? O / L : 0.f);
    }
}

__host__ __device__ constexpr int lanes_per_key(int d) {
    return d / 8 <= 8 ? 8 : (d / 8 <= 16 ? 16 : 32);
}
// CUDA-core kernel copy ring: each lane streams its own 16-byte slices of K and V into a
// per-thread ring of S stages in shared memory (16 B x 2 x U keys per stage), S - 1 stages
// ahead of the math. A lane only ever reads the slots it copied itself, so
// cp.async.wait_group alone orders copy and read: no block barrier in the key loop. Bytes in
// flight per SM: 4 CTAs x 128 threads x (S - 1) x U x 32 B = 128 KB (G = 1, D = 128).
// S x U x 4 KB = 48 KB of shared memory per CTA (the static limit), 4 CTAs per SM on sm_90.
// f32 (`bytes` = 4): a lane's 8 dims are two 16-byte slices (CH = 2), so S x U is halved to
// stay at 48 KB: U = 2, S = 3, the same 128 KB in flight per SM at 4 CTAs per SM.
__host__ __device__ constexpr int keys_per_stage(int g, int bytes = 2) {
    return bytes == 4 ? 2 : (g >= 4 ? 2 : 4);
}
__host__ __device__ constexpr int stages(int g, int bytes = 2) {
    return bytes == 4 ? 3 : (g >= 4 ? 6 : 3);
}
// CTAs per SM that the register bound guarantees (G = 8 holds 128 floats of q and acc; f32
// with G >= 4 holds 64-128 of them plus two 8-float K and V rows per key of the stage).
__host__ __device__ constexpr int ctas_per_sm(int g, int bytes = 2) {
    return bytes == 4 ? (g >= 4 ? 2 : 4) : (g >= 8 ? 2 : 4);
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// cp_async16 / cp_async_commit / cp_async_wait: common.cuh's (their "memory" clobbers matter
// here: there is no __syncthreads in the key loop).

template <typename T, int D, int G, bool PAGED>
__global__ void __launch_bounds__(kThreads, ctas_per_sm(G, sizeof(T))) decode_kernel(Params p) {
    pdl_trigger();  // the combine (sm_90: a programmatic dependent launch) may be scheduled now
    constexpr int LPK = lanes_per_key(D);
    constexpr int WPW = 32 / LPK;          // workers per warp
    constexpr int NW = kWarps * WPW;       // workers per CTA
    constexpr int U = keys_per_stage(G, sizeof(T));  // keys per worker per stage
    constexpr int S = stages(G, sizeof(T));
    constexpr int TK = NW * U;             // keys per stage (tile) of the CTA
    constexpr int CH = (int)sizeof(T) * 8 / 16;  // 16-byte slices of a lane's 8 dims
    constexpr int EPC = 8 / CH;                  // elements per slice
    constexpr int kPipe = S * U * 2 * CH * kThreads;  // 16-byte slots
    static_assert(CH == 1 || CH == 2, "16- or 32-bit elements");
    static_assert(kPipe * 16 <= 48 * 1024, "static shared memory limit");
    static_assert((NW * G * D + 2 * NW * G) * 4 <= kPipe * 16, "merge buffers fit the ring");
    static_assert(S * U <= 32, "validity bits fit a word");
    using V8 = Vec<T, 8>;
    using VC = Vec<T, EPC>;  // one 16-byte slice
    // Slot (stage st, key u, K or V, slice c, thread) = (((st * U + u) * 2 + kv) * CH + c) *
    // kThreads + tid: a warp touches 512 contiguous bytes per access (no bank conflicts).
    // After the key loop the same memory holds the merge buffers.
    __shared__ __align__(16) uint4 ring[kPipe];

    const int split = blockIdx.z;
    const int chunks = (p.q_heads / p.kv_heads) / G;
    const int kvh = blockIdx.y / chunks;
    const int h0 = kvh * (p.q_heads / p.kv_heads) + (blockIdx.y % chunks) * G;
    const int b = blockIdx.x;  // x: up to 2^31-1 sequences (z would cap it at 65535)
    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int sub = lane % LPK;
    const int worker = warp * WPW + lane / LPK;
    const bool active = sub * 8 < D;

    int len = p.seq_lens[b];
    const int cap = PAGED ? p.max_blocks * p.block_size : p.capacity;
    len = len < 0 ? 0 : (len > cap ? cap : len);
    const int lo = p.window > 0 ? max(0, len - p.window) : 0;
    const int n = len - lo;
    const int chunk = (n + p.num_splits - 1) / p.num_splits;
    const int s_lo = lo + split * chunk;
    const int s_hi = min(len, s_lo + chunk);
    // Same for every thread of the CTA, so every lane runs the same trip count (the
    // shuffles below use the full mask); keys past s_hi are masked.
    const int ntiles = s_hi > s_lo ? (s_hi - s_lo + TK - 1) / TK : 0;

    const T *kbase = static_cast<const T *>(p.k);
    const T *vbase = static_cast<const T *>(p.v);
    const int64_t tbl = (int64_t)b * p.max_blocks;
    const int64_t head_row0 = ((int64_t)b * p.kv_heads + kvh) * p.capacity;  // contiguous
    const int key0 = s_lo + worker;  // key of (tile 0, u 0) for this worker
    const uint32_t ring0 = smem_u32(ring) + (uint32_t)tid * 16u;

    // Paged: block id of key u of tile `tile` (-1 past the end).
    auto block_of = [&](int tile, int u) -> int {
        const int j = key0 + tile * TK + u * NW;
        return j < s_hi ? __ldg(p.block_table + tbl + j / p.block_size) : -1;
    };
    // Starts the copies of tile `tile` into stage st and returns its validity bits.
    auto issue = [&](int tile, int st, const int (&blk)[U]) -> uint32_t {
        uint32_t bits = 0;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = key0 + tile * TK + u * NW;
            int64_t row = -1;
            if (j < s_hi) {
                if (PAGED) {
                    if (blk[u] >= 0 && blk[u] < p.num_blocks)
                        row = ((int64_t)blk[u] * p.kv_heads + kvh) * p.block_size +
                              j % p.block_size;
                } else {
                    row = head_row0 + j;
                }
            }
            if (row >= 0) bits |= 1u << u;
            if (active && tile < ntiles) {  // tiles past the end are never read
                const uint32_t dk = ring0 + (uint32_t)(((st * U + u) * 2 * CH) * kThreads) * 16u;
                const int64_t off = row >= 0 ? row * D + sub * 8 : 0;
                const int nb = row >= 0 ? 16 : 0;  // invalid key: zeros (V * 0 stays 0)
#pragma unroll
                for (int c = 0; c < CH; ++c) {
                    cp_async16(dk + (uint32_t)(c * kThreads) * 16u, kbase + off + c * EPC, nb);
                    cp_async16(dk + (uint32_t)((CH + c) * kThreads) * 16u,
                               vbase + off + c * EPC, nb);
                }
            }
        }
        return bits << (st * U);
    };

    // Query rows, pre-scaled by scale * log2(e) so that exp2 gives the softmax weights.
    float q[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        V8 qv;
        if (active) {
            const T *qrow = static_cast<const T *>(p.q) + ((int64_t)b * p.q_heads + h0 + g) * D;
            if constexpr (CH == 1) {
                qv = reinterpret_cast<const V8 *>(qrow)[sub];
            } else {  // two 16-byte loads (the row is only 16-byte aligned)
#pragma unroll
                for (int c = 0; c < CH; ++c) {
                    const VC x = reinterpret_cast<const VC *>(qrow)[sub * CH + c];
#pragma unroll
                    for (int e = 0; e < EPC; ++e) qv.v[c * EPC + e] = x.v[e];
                }
            }
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) q[g][e] = active ? to_f32(qv.v[e]) * p.scale_log2 : 0.f;
    }

    // Prologue: stages 0 .. S-2 in flight (block ids fetched together, then the copies).
    uint32_t okm = 0;  // bit st * U + u: key u of the tile in stage st is valid
    int nblk[U];       // paged: block ids of the next tile to issue, fetched a tile early
    {
        int pb[S - 1][U];
#pragma unroll
        for (int t = 0; t < S - 1; ++t)
#pragma unroll
            for (int u = 0; u < U; ++u) pb[t][u] = PAGED ? block_of(t, u) : 0;
#pragma unroll
        for (int t = 0; t < S - 1; ++t) {
            okm |= issue(t, t, pb[t]);
            cp_async_commit();
        }
#pragma unroll
        for (int u = 0; u < U; ++u) nblk[u] = PAGED ? block_of(S - 1, u) : 0;
    }

    float m[G], l[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
    }

    int st_c = 0, st_i = S - 1;  // stage computed / issued this iteration
    for (int t = 0; t < ntiles; ++t) {
        cp_async_wait<S - 2>();  // this thread's copies of tile t have landed
        // Stage st_i was read by this thread in iteration t - 1 (its values were consumed,
        // so those shared loads completed before this in-order issue).
        const uint32_t keep = ~(((1u << U) - 1u) << (st_i * U));
        okm = (okm & keep) | issue(t + S - 1, st_i, nblk);
        cp_async_commit();
        if (PAGED) {
#pragma unroll
            for (int u = 0; u < U; ++u) nblk[u] = block_of(t + S, u);  // used next iteration
        }

        V8 kv[U], vv[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            ok[u] = (okm >> (st_c * U + u)) & 1u;
            if (active) {
                const int slot = ((st_c * U + u) * 2 * CH) * kThreads + tid;
#pragma unroll
                for (int c = 0; c < CH; ++c) {
                    const VC xk = *reinterpret_cast<const VC *>(&ring[slot + c * kThreads]);
                    const VC xv =
                        *reinterpret_cast<const VC *>(&ring[slot + (CH + c) * kThreads]);
#pragma unroll
                    for (int e = 0; e < EPC; ++e) {
                        kv[u].v[c * EPC + e] = xk.v[e];
                        vv[u].v[c * EPC + e] = xv.v[e];
                    }
                }
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) kv[u].v[e] = vv[u].v[e] = from_f32<T>(0.f);
            }
        }
        st_c = st_c + 1 == S ? 0 : st_c + 1;
        st_i = st_i + 1 == S ? 0 : st_i + 1;

        float s[U][G];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float kf[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) kf[e] = to_f32(kv[u].v[e]);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float d = 0.f;
#pragma unroll
                for (int e = 0; e < 8; ++e) d = fmaf(q[g][e], kf[e], d);
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                s[u][g] = ok[u] ? d : -INFINITY;
            }
        }
        float vf[U][8];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int e = 0; e < 8; ++e) vf[u][e] = to_f32(vv[u].v[e]);
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[u][g]);
            if (mx == -INFINITY) continue;  // nothing valid yet for this worker
            const float corr = exp2f(m[g] - mx);  // m == -inf -> 0
            l[g] *= corr;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float w = exp2f(s[u][g] - mx);  // invalid key: exp2(-inf) = 0
                l[g] += w;
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(w, vf[u][e], acc[g][e]);
            }
            m[g] = mx;
        }
    }

    // Merge the NW workers, in the ring's memory once every warp is done with it (no copy
    // is pending: tiles past the end issue none, but wait anyway).
    cp_async_wait<0>();
    __syncthreads();
    float *sm_acc = reinterpret_cast<float *>(ring);  // [NW][G][D]
    float *sm_m = sm_acc + NW * G * D;                 // [NW][G]
    float *sm_l = sm_m + NW * G;                       // [NW][G]
    if (sub == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            sm_m[worker * G + g] = m[g];
            sm_l[worker * G + g] = l[g];
        }
    }
    if (active) {
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int e = 0; e < 8; ++e) sm_acc[(worker * G + g) * D + sub * 8 + e] = acc[g][e];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += kThreads) {
        const int g = idx / D, d = idx % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; ++w) M = fmaxf(M, sm_m[w * G + g]);
        float L = 0.f, O = 0.f;
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                const float c = exp2f(sm_m[w * G + g] - M);
                L = fmaf(sm_l[w * G + g], c, L);
                O = fmaf(sm_acc[(w * G + g) * D + d], c, O);
            }
        }
        const int h = h0 + g;
        const float o = L > 0.f ? O / L : 0.f;
        if (p.num_splits == 1) {
            static_cast<T *>(p.out)[((int64_t)b * p.q_heads + h) * D + d] = from_f32<T>(o);
        } else {
            const int64_t bh = (int64_t)b * p.q_heads + h;
            p.ws_o[(bh * p.num_splits + split) * D + d] = o;
            if (d == 0) p.ws_lse[bh * p.num_splits + split] = L > 0.f ? M + log2f(L) : -INFINITY;
        }
    }
    if constexpr (D <= kMaxFusedD)
        if (p.counters) finish_splits<T, D>(p, b, h0, G, reinterpret_cast<int *>(ring));
}

// ---------------------------------------------------------------- tensor-core path (G >= 2)
// Why: with G query heads per K/V row the CUDA-core loop above costs ~120-150 warp
// instructions per key for G = 4 (8 FMAs + 4 shuffles + 4 adds per head per 16-lane worker
// for the dot products, 8 FMAs per head for P V, softmax), i.e. ~30-38 issue cycles per key
// per SM, against the ~40-45 cycles per 512-byte key row that ~3 TB/s leaves each SM: the
// issue slots, not HBM, set the pace. mma.sync.m16n8k16 does a 16 x 8 x 16 block in one
// instruction: the G heads (padded to 16 rows) are the A operand, a 16-key tile of K (from
// shared memory, ldmatrix) is B, so S for 16 keys x G heads at head_dim 128 is 16 mma, and
// P V another 16 (V with ldmatrix.trans, P straight from the S accumulators, the
// FlashAttention-2 register trick). About 13 instructions per key in all, copies included.
//
// One CTA is W warps for one (batch row, kv head, chunk of G <= 8 heads, split). Each warp
// streams 16-key tiles of K and V through its own ring of S stages in shared memory with
// cp.async, S - 1 tiles ahead of its math, so only __syncwarp orders copies and reads; warp w
// takes tiles w, w + W, ... of the split, so the CTA reads W x 16 adjacent keys (W x 4 KB of
// K and of V at D = 128) at a time, and the W online-softmax states are merged through shared
// memory at the end. Rows are stored unpadded with their 16-byte chunks XOR-swizzled by
// (key & 7) where D / 8 is a multiple of 8 (D = 64, 128, 256), padded by 16 bytes otherwise,
// so the 8 rows an ldmatrix phase reads hit distinct banks either way.
//
// Why W warps in one CTA and not W one-warp CTAs: the same bytes in flight, but longer runs of
// adjacent keys per CTA, which the HBM reads faster; swizzled rows beat padded ones at every W
// although both are conflict-free (kernels/experiments/attention_decode.md has the sweep).
// Shared memory per CTA: W x S x 2 x 16 x D x 2 B: 128 KB at W = 8, S = 2, D = 128. Before
// Hopper (99-163 KB per block) W is halved (64 KB).

// Configuration of the tensor-core kernel: W warps per CTA, each with its own ring of S
// stages; SW: rows stored unpadded with the 16-byte chunks XOR-swizzled by (key & 7) (the 8
// rows an ldmatrix phase reads still hit distinct banks) instead of padded by 16 bytes.
template <int W_, int S_, bool SW_> struct MmaCfg {
    static constexpr int W = W_, S = S_;
    static constexpr bool SW = SW_;
};
// The configuration used: Hopper (228 KB of shared memory per SM) W = 8 warps (4 at D = 256),
// 2 stages, 128 KB per CTA; before Hopper (sm_86/89 allow 99 KB per block) half the warps,
// 64 KB. Swizzled where the row has a multiple of 8 chunks.
__host__ __device__ constexpr int mma_for_w(int d, bool hopper) {
    return (hopper ? 8 : 4) / (d > 128 ? 2 : 1);
}
constexpr int kMmaForS = 2;
__host__ __device__ constexpr bool mma_for_sw(int d) { return (d / 8) % 8 == 0; }
template <int D, bool HOPPER>
using MmaFor = MmaCfg<mma_for_w(D, HOPPER), kMmaForS, mma_for_sw(D)>;

__host__ __device__ constexpr int mma_ld(int d, bool sw) { return sw ? d : d + 8; }
__host__ __device__ constexpr int mma_smem_bytes(int d, int w, int s, bool sw) {
    return w * s * 2 * 16 * mma_ld(d, sw) * 2;
}
// CTAs per SM with smem_kb of shared memory per SM (228 on sm_90; 1 KB reserved per CTA), at
// most 16 CTAs and 64 warps.
__host__ __device__ constexpr int mma_ctas_per_sm(int d, int w, int s, bool sw, int smem_kb = 228) {
    int n = (smem_kb * 1024) / (mma_smem_bytes(d, w, s, sw) + 1024);
    n = n > 16 ? 16 : n;
    n = n > 64 / w ? 64 / w : n;
    return n < 1 ? 1 : n;
}

// Launch bound of decode_mma_kernel: the CTAs per SM that fit in sm_90's shared memory, but
// at most 12 warps' worth (more only capped the registers: W = 8 at D = 64 fits 3 CTAs, and
// 85 registers spilled), and on sm_8x at most 8 warps' worth (bounding registers for 12
// one-warp CTAs there made the kernel spill: 92 bytes at D = 128).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FL_MMA_WARPS_BOUND 8
#else
#define FL_MMA_WARPS_BOUND 12
#endif
__host__ __device__ constexpr int mma_min_ctas(int d, int w, int s, bool sw, int warps_bound) {
    const int cap = warps_bound / w > 0 ? warps_bound / w : 1;
    return mma_ctas_per_sm(d, w, s, sw) < cap ? mma_ctas_per_sm(d, w, s, sw) : cap;
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// c += a * b, m16n8k16, row.col, f32 accumulate, for rows 0-7 only: c = (row gid, cols
// 2 t4, 2 t4 + 1). A's rows 8-15 are zero here, so that half of the accumulator is not kept.
template <typename T> struct Mma;
template <> struct Mma<__half> {
    __device__ __forceinline__ static void run(float (&c)[2], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
        // rows 8-15 (always zero here: A rows 8-15 are zero) go to scratch PTX registers
        asm volatile(
            "{\n.reg .f32 x2, x3;\n"
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,x2,x3}, {%2,%3,%4,%5}, "
            "{%6,%7}, {%8,%9,%10,%10};\n}\n"
            : "=f"(c[0]), "=f"(c[1])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
              "f"(0.f));
    }
    __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};
template <> struct Mma<__nv_bfloat16> {
    __device__ __forceinline__ static void run(float (&c)[2], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
        // rows 8-15 (always zero here: A rows 8-15 are zero) go to scratch PTX registers
        asm volatile(
            "{\n.reg .f32 x2, x3;\n"
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,x2,x3}, {%2,%3,%4,%5}, "
            "{%6,%7}, {%8,%9,%10,%10};\n}\n"
            : "=f"(c[0]), "=f"(c[1])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
              "f"(0.f));
    }
    __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};

template <typename T, int D, int G, bool PAGED, int W, int S, bool SW>
__global__ void __launch_bounds__(32 * W, mma_min_ctas(D, W, S, SW, FL_MMA_WARPS_BOUND))
    decode_mma_kernel(Params p) {
    pdl_trigger();  // the combine (sm_90: a programmatic dependent launch) may be scheduled now
    constexpr int LD = mma_ld(D, SW);     // row stride, elements
    constexpr int KD = D / 16;            // k-steps of Q K^T
    constexpr int DT = D / 8;             // 8-wide column tiles of O
    constexpr int CPR = D / 8;            // 16-byte chunks per row
    constexpr int STAGE = 2 * 16 * LD;    // elements: K tile [16][LD], then V tile [16][LD]
    constexpr int RING = S * STAGE * 2;   // bytes of one warp's ring
    static_assert(G >= 1 && G <= 8, "heads fill rows 0-7 of the m16 tile");
    static_assert(D % 16 == 0 && DT % 2 == 0 && (16 * CPR) % 32 == 0, "head_dim");
    static_assert(S >= 2 && S <= 4, "validity bits fit 64 bits");
    static_assert(W == 1 || 8 * D * 4 + 64 <= RING, "a warp's merge buffer fits its ring");
    extern __shared__ __align__(16) unsigned char mma_smem[];  // W rings of RING bytes

    const int split = blockIdx.z;
    const int chunks = (p.q_heads / p.kv_heads) / G;
    const int kvh = blockIdx.y / chunks;
    const int h0 = kvh * (p.q_heads / p.kv_heads) + (blockIdx.y % chunks) * G;
    const int b = blockIdx.x;  // x: up to 2^31-1 sequences (z would cap it at 65535)
    const int lane = threadIdx.x & 31;
    const int warp = W == 1 ? 0 : (int)(threadIdx.x >> 5);
    const int gid = lane >> 2, t4 = lane & 3;  // mma fragment row / column pair

    int len = p.seq_lens[b];
    const int cap = PAGED ? p.max_blocks * p.block_size : p.capacity;
    len = len < 0 ? 0 : (len > cap ? cap : len);
    const int lo = p.window > 0 ? max(0, len - p.window) : 0;
    const int n = len - lo;
    const int chunk = (n + p.num_splits - 1) / p.num_splits;
    const int s_lo = lo + split * chunk;
    const int s_hi = min(len, s_lo + chunk);
    // 16-key tiles of the split; warp w takes tiles w, w + W, w + 2W, ... (its tile t is tile
    // t W + w of the split), so the W warps of a CTA read W x 16 adjacent keys at a time.
    const int nsplit = s_hi > s_lo ? (s_hi - s_lo + 15) / 16 : 0;
    const int ntiles = nsplit > warp ? (nsplit - warp + W - 1) / W : 0;

    const T *kbase = static_cast<const T *>(p.k);
    const T *vbase = static_cast<const T *>(p.v);
    const int64_t tbl = (int64_t)b * p.max_blocks;
    const int64_t head_row0 = ((int64_t)b * p.kv_heads + kvh) * p.capacity;  // contiguous
    const uint32_t sbase = smem_u32(mma_smem) + (uint32_t)(warp * RING);

    // Paged: lanes 0-15 fetch the block id of key `lane` of tile `tile` (-1 past the end).
    auto block_of = [&](int tile) -> int {
        const int j = s_lo + (tile * W + warp) * 16 + lane;
        return lane < 16 && j < s_hi ? __ldg(p.block_table + tbl + j / p.block_size) : -1;
    };
    // Starts the copies of tile `tile` into stage st; returns the tile's 16 validity bits.
    // Lane k < 16 finds the row of key k; every 16-byte chunk gets it by a shuffle.
    auto issue = [&](int tile, int st, int blk) -> uint32_t {
        const int j = s_lo + (tile * W + warp) * 16 + lane;
        int64_t off = -1;  // element offset of the row
        if (lane < 16 && j < s_hi) {
            if (PAGED) {
                if (blk >= 0 && blk < p.num_blocks)
                    off = (((int64_t)blk * p.kv_heads + kvh) * p.block_size + j % p.block_size) *
                          D;
            } else {
                off = (head_row0 + j) * D;
            }
        }
        const uint32_t bits = __ballot_sync(0xffffffffu, off >= 0) & 0xffffu;
        if (tile < ntiles) {  // warp-uniform; tiles past the end are never read
            const uint32_t sk = sbase + (uint32_t)(st * STAGE * 2);
            const uint32_t sv = sk + (uint32_t)(16 * LD * 2);
#pragma unroll 4
            for (int i = 0; i < 16 * CPR / 32; ++i) {  // (4: bounds the addresses kept live)
                const int c = lane + 32 * i;
                const int key = c / CPR, part = c % CPR;
                const int64_t o = __shfl_sync(0xffffffffu, off, key);
                const uint32_t dst = SW ? (uint32_t)(key * LD * 2 + ((part ^ (key & 7)) << 4))
                                        : (uint32_t)((key * LD + part * 8) * 2);
                const int64_t src = o >= 0 ? o + part * 8 : 0;
                const int nb = o >= 0 ? 16 : 0;  // invalid key: zeros (masked below)
                cp_async16(sk + dst, kbase + src, nb);
                cp_async16(sv + dst, vbase + src, nb);
            }
        }
        return bits;
    };

    // Prologue: tiles 0 .. S-2 in flight.
    uint64_t okm = 0;  // bits 16 st .. 16 st + 15: keys of the tile in stage st that are valid
    int nblk;          // paged: block id (lanes 0-15) for the next tile to issue
    {
        int pb[S - 1];
#pragma unroll
        for (int t = 0; t < S - 1; ++t) pb[t] = PAGED ? block_of(t) : 0;
#pragma unroll
        for (int t = 0; t < S - 1; ++t) {
            okm |= (uint64_t)issue(t, t, pb[t]) << (16 * t);
            cp_async_commit();
        }
        nblk = PAGED ? block_of(S - 1) : 0;
    }

    // Q as the A operand: row gid = head h0 + gid (rows >= G and rows 8-15 are zero);
    // a0 = (row gid, k 2t4..2t4+1), a2 = (row gid, k 8+2t4..); a1 = a3 = 0.
    uint32_t qa[KD][2];
    {
        const bool qok = gid < G;
        const uint32_t *qrow = reinterpret_cast<const uint32_t *>(
            static_cast<const T *>(p.q) + ((int64_t)b * p.q_heads + h0 + (qok ? gid : 0)) * D);
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) {
            qa[kk][0] = qok ? qrow[kk * 8 + t4] : 0u;
            qa[kk][1] = qok ? qrow[kk * 8 + 4 + t4] : 0u;
        }
    }

    float o[DT][2];  // O rows gid, columns j * 8 + 2 t4 + {0, 1}
#pragma unroll
    for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = 0.f;
    float m = -INFINITY;  // running max of row gid (base 2, scaled), same in the quad
    float l = 0.f;        // this lane's part of the row sum (the quad is summed at the end)
    const float sl2 = p.scale_log2;

    // ldmatrix lane roles. K (non-trans): (keys 0-7, k 0-7), (keys 0-7, k 8-15),
    // (keys 8-15, k 0-7), (keys 8-15, k 8-15). V (trans): (keys 0-7, d 0-7),
    // (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15).
    // Swizzled rows: chunk c of key k sits at chunk c ^ (k & 7) = c ^ mr; with c = 2 kk + (mat &
    // 1) for K and c = j + (mat >> 1) (j even) for V that is 2 kk ^ k_x and j ^ v_x.
    const int mat = lane >> 3, mr = lane & 7;
    const uint32_t k_lane = SW ? (uint32_t)((((mat >> 1) * 8 + mr) * LD) * 2)
                               : (uint32_t)((((mat >> 1) * 8 + mr) * LD + (mat & 1) * 8) * 2);
    const uint32_t v_lane = SW ? (uint32_t)((((mat & 1) * 8 + mr) * LD) * 2)
                               : (uint32_t)((((mat & 1) * 8 + mr) * LD + (mat >> 1) * 8) * 2);
    const uint32_t k_x = (uint32_t)((mat & 1) ^ mr), v_x = (uint32_t)((mat >> 1) ^ mr);

    int st_c = 0, st_i = S - 1;  // stage computed / issued this iteration
    for (int t = 0; t < ntiles; ++t) {
        cp_async_wait<S - 2>();  // this lane's copies of tile t have landed
        __syncwarp();            // ... and every lane's; all lanes are done with stage st_i
        okm = (okm & ~(0xffffull << (16 * st_i))) |
              ((uint64_t)issue(t + S - 1, st_i, nblk) << (16 * st_i));
        cp_async_commit();
        if (PAGED) nblk = block_of(t + S);  // used by the next iteration's issue
        const uint32_t vbits = (uint32_t)(okm >> (16 * st_c)) & 0xffffu;
        const uint32_t kb = sbase + (uint32_t)(st_c * STAGE * 2) + k_lane;
        const uint32_t vb = sbase + (uint32_t)(st_c * STAGE * 2 + 16 * LD * 2) + v_lane;
        st_c = st_c + 1 == S ? 0 : st_c + 1;
        st_i = st_i + 1 == S ? 0 : st_i + 1;

        // S = Q K^T for 16 keys: n-tile 0 = keys 0-7, n-tile 1 = keys 8-15.
        float sc[2][2];
#pragma unroll
        for (int j = 0; j < 2; ++j) sc[j][0] = sc[j][1] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) {
            uint32_t bk[4];
            ldsm_x4(bk, kb + (SW ? (((uint32_t)(2 * kk) ^ k_x) << 4) : (uint32_t)(kk * 32)));
            const uint32_t a[4] = {qa[kk][0], 0u, qa[kk][1], 0u};
            Mma<T>::run(sc[0], a, bk[0], bk[1]);
            Mma<T>::run(sc[1], a, bk[2], bk[3]);
        }

        // Online softmax (base 2) of row gid over keys j * 8 + 2 t4 + e.
        float x[2][2];
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const bool ok = (vbits >> (j * 8 + 2 * t4 + e)) & 1u;
                x[j][e] = ok ? sc[j][e] * sl2 : -INFINITY;
                mx = fmaxf(mx, x[j][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m, mx);
        const float mu = mn == -INFINITY ? 0.f : mn;  // nothing valid yet: no inf - inf
        const float corr = exp2f(m - mu);              // m == -inf -> 0
        m = mn;
        float rs = 0.f;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                x[j][e] = exp2f(x[j][e] - mu);  // masked: exp2(-inf) = 0
                rs += x[j][e];
            }
        l = fmaf(l, corr, rs);
#pragma unroll
        for (int j = 0; j < DT; ++j) {
            o[j][0] *= corr;
            o[j][1] *= corr;
        }

        // O += P V: P (16 rows x 16 keys) from the S accumulator layout, rows 8-15 zero.
        const uint32_t a[4] = {Mma<T>::pack(x[0][0], x[0][1]), 0u, Mma<T>::pack(x[1][0], x[1][1]),
                               0u};
#pragma unroll
        for (int j = 0; j < DT; j += 2) {
            uint32_t bv[4];
            ldsm_x4_t(bv, vb + (SW ? (((uint32_t)j ^ v_x) << 4) : (uint32_t)(j * 16)));
            Mma<T>::run(o[j], a, bv[0], bv[1]);
            Mma<T>::run(o[j + 1], a, bv[2], bv[3]);
        }
    }
    cp_async_wait<0>();

    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if constexpr (W == 1) {
        if (gid < G) {
            const int64_t bh = (int64_t)b * p.q_heads + h0 + gid;
            const float inv = l > 0.f ? 1.f / l : 0.f;
            if (p.num_splits == 1) {
                T *orow = static_cast<T *>(p.out) + bh * D + 2 * t4;
#pragma unroll
                for (int j = 0; j < DT; ++j)
                    *reinterpret_cast<uint32_t *>(orow + j * 8) =
                        Mma<T>::pack(o[j][0] * inv, o[j][1] * inv);
            } else {
                float *w = p.ws_o + (bh * p.num_splits + split) * D + 2 * t4;
#pragma unroll
                for (int j = 0; j < DT; ++j)
                    *reinterpret_cast<float2 *>(w + j * 8) =
                        make_float2(o[j][0] * inv, o[j][1] * inv);
                if (t4 == 0)
                    p.ws_lse[bh * p.num_splits + split] = l > 0.f ? m + log2f(l) : -INFINITY;
            }
        }
    } else {
        // Merge the W warps' states: each warp leaves (O unnormalised [8][D], m[8], l[8]) in
        // its own ring (its copies have all landed), then the CTA combines them per element.
        __syncwarp();
        float *mine = reinterpret_cast<float *>(mma_smem + warp * RING);
        if (gid < G) {
#pragma unroll
            for (int j = 0; j < DT; ++j)
                *reinterpret_cast<float2 *>(mine + gid * D + j * 8 + 2 * t4) =
                    make_float2(o[j][0], o[j][1]);
            if (t4 == 0) {
                mine[8 * D + gid] = m;
                mine[8 * D + 8 + gid] = l;
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < G * D; e += 32 * W) {
            const int r = e / D, d = e % D;
            float M = -INFINITY;
#pragma unroll
            for (int w = 0; w < W; ++w)
                M = fmaxf(M, reinterpret_cast<const float *>(mma_smem + w * RING)[8 * D + r]);
            float L = 0.f, O = 0.f;
#pragma unroll
            for (int w = 0; w < W; ++w) {
                const float *s = reinterpret_cast<const float *>(mma_smem + w * RING);
                const float f = M == -INFINITY ? 0.f : exp2f(s[8 * D + r] - M);
                L = fmaf(f, s[8 * D + 8 + r], L);
                O = fmaf(f, s[r * D + d], O);
            }
            const int64_t bh = (int64_t)b * p.q_heads + h0 + r;
            const float inv = L > 0.f ? 1.f / L : 0.f;
            if (p.num_splits == 1) {
                static_cast<T *>(p.out)[bh * D + d] = from_f32<T>(O * inv);
            } else {
                p.ws_o[(bh * p.num_splits + split) * D + d] = O * inv;
                if (d == 0)
                    p.ws_lse[bh * p.num_splits + split] = L > 0.f ? M + log2f(L) : -INFINITY;
            }
        }
    }
    if constexpr (D <= kMaxFusedD)
        if (p.counters) finish_splits<T, D>(p, b, h0, G, reinterpret_cast<int *>(mma_smem));
}

// Combines the splits of one (batch, head): weights 2^(lse_s - max lse). The tensor-core path
// uses up to 256 splits, so the splits are spread over the threads too: thread (r, c) sums
// float4 chunk c of splits r, r + R, ... (R = kCombineThreads / (D / 4) independent loads in
// flight per chunk), then the R partial sums are added in a fixed order (deterministic).
constexpr int kCombineThreads = 256;
template <typename T, int D>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(Params p) {
    pdl_wait();  // launched as a programmatic dependent of the split kernel on sm_90
    constexpr int D4 = D / 4;
    constexpr int R = kCombineThreads / D4;
    static_assert(D % 4 == 0 && R >= 1, "head_dim");
    const int64_t bh = blockIdx.x;
    const int S = p.num_splits;
    extern __shared__ float w[];  // S weights
    __shared__ float red[32];
    __shared__ float4 part[R][D4];
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < S; s += blockDim.x) mx = fmaxf(mx, p.ws_lse[bh * S + s]);
    mx = block_max(mx, red);
    float sum = 0.f;
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const float e = mx == -INFINITY ? 0.f : exp2f(p.ws_lse[bh * S + s] - mx);
        w[s] = e;
        sum += e;
    }
    sum = block_sum(sum, red);  // has a barrier: w[] is visible after it
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int tid = threadIdx.x;
    if (tid < R * D4) {
        const int c = tid % D4, r = tid / D4;
        const float4 *src = reinterpret_cast<const float4 *>(p.ws_o + bh * S * D) + c;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int s = r; s < S; s += R) {
            const float4 v = src[(int64_t)s * D4];
            const float ws = w[s];
            acc.x = fmaf(ws, v.x, acc.x);
            acc.y = fmaf(ws, v.y, acc.y);
            acc.z = fmaf(ws, v.z, acc.z);
            acc.w = fmaf(ws, v.w, acc.w);
        }
        part[r][c] = acc;
    }
    __syncthreads();
    if (tid < D4) {
        float4 o = part[0][tid];
#pragma unroll
        for (int r = 1; r < R; ++r) {
            o.x += part[r][tid].x;
            o.y += part[r][tid].y;
            o.z += part[r][tid].z;
            o.w += part[r][tid].w;
        }
        Vec<T, 4> ov;
        ov.v[0] = from_f32<T>(o.x * inv);
        ov.v[1] = from_f32<T>(o.y * inv);
        ov.v[2] = from_f32<T>(o.z * inv);
        ov.v[3] = from_f32<T>(o.w * inv);
        reinterpret_cast<Vec<T, 4> *>(static_cast<T *>(p.out) + bh * D)[tid] = ov;
    }
}

// The tensor-core kernel's configuration for a call: MmaFor<D, device is sm_90+>.
struct MmaChoice {
    int w, s;
    bool sw;
};
inline MmaChoice mma_choice(int d) {
    const bool hopper = cc_major() >= 9;  // MmaFor<d, hopper>, from the same functions
    return {mma_for_w(d, hopper), kMmaForS, mma_for_sw(d)};
}

inline int group_tile(int group) {
    return group % 8 == 0 ? 8 : group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
}

inline bool valid(const fl_decode_attention_args *a) {
    if (!a || a->batch < 0 || a->q_heads < 1 || a->kv_heads < 1 || a->q_heads % a->kv_heads)
        return false;
    if (a->dtype != FL_DTYPE_F32 && a->dtype != FL_DTYPE_F16 && a->dtype != FL_DTYPE_BF16)
        return false;
    const int d = a->head_dim;
    if (d != 64 && d != 80 && d != 96 && d != 128 && d != 256) return false;
    if (a->max_seq_len < 0 || a->window < 0 || a->num_splits < 0 || !(a->scale == a->scale))
        return false;
    if (a->layout == FL_KV_CONTIGUOUS) {
        if (a->kv_block_size < 1 || a->max_seq_len > a->kv_block_size) return false;
    } else if (a->layout == FL_KV_PAGED) {
        if (a->kv_block_size < 1 || a->max_blocks_per_seq < 1 || a->num_blocks < 1) return false;
        if ((int64_t)a->max_seq_len > (int64_t)a->kv_block_size * a->max_blocks_per_seq)
            return false;
    } else {
        return false;
    }
    return true;
}

// Fewest keys per split: more, shorter splits at short contexts were slower in whole decode
// steps, although 256 leaves a batch-1 step with few CTAs (see
// kernels/experiments/attention_decode.md).
constexpr int64_t kSplitMinKeys = 256;

// MHA (group 1) at head_dim 128, f16/bf16, on sm_90: the tensor-core kernel (G = 1, 15 of its
// 16 rows idle) instead of the CUDA-core one where it reads faster
// - over a paged cache with batch x kv heads < 128: there the CUDA-core kernel is ~3 us slower
//   at short contexts (one 140-key sequence, 32 heads: 9.1 us paged against 6.0 contiguous,
//   not profiled; its per-tile block lookups are the suspect) and the tensor-core kernel takes
//   6.9-7.2 us: a continuous-batching runner's batch-1 decode step. With more CTAs than that
//   the CUDA-core kernel's 4 CTAs per SM win on a paged cache too (64 sequences of 1,100 keys
//   in 16-token blocks: 389 us, 98.5% of copy, against 398 us);
// - over a contiguous cache with batch x kv heads >= 128 and max_seq_len >= 4096: there both
//   run at the read-bandwidth ceiling and the tensor-core kernel's long runs of adjacent keys
//   (8 warps x 16 keys per CTA) read slightly faster; below either bound (a batch-1 engine step
//   has batch x kv heads = 32) the CUDA-core kernel's 4 CTAs per SM win
//   (kernels/experiments/attention_decode.md).
inline bool mha_on_mma(const fl_decode_attention_args *a) {
    if (a->q_heads != a->kv_heads || a->head_dim != 128 || a->dtype == FL_DTYPE_F32) return false;
    if (cc_major() < 9) return false;
    const bool wide = (int64_t)a->batch * a->kv_heads >= 128;
    return a->layout == FL_KV_PAGED ? !wide : wide && a->max_seq_len >= 4096;
}

// Tensor-core CTAs per SM, for the split choice: sm_90 has 228 KB per SM; before it, 100 KB is
// the smallest (sm_86/89; sm_80 has 164 KB, where this undercounts and the split comes out
// coarser, not wrong).
inline int mma_ctas(int d) {
    const MmaChoice c = mma_choice(d);
    return mma_ctas_per_sm(d, c.w, c.s, c.sw, cc_major() >= 9 ? 228 : 100);
}

// Splits: fill whole waves of CTAs. A wave is sms x (CTAs per SM of the kernel used) CTAs; with `units`
// (batch x kv heads x head chunks) CTAs per split, s splits take ceil(units s / wave) waves of
// 1/s of the work each, so the time goes as cost(s) = ceil(units s / wave) / s. Take the
// smallest s within 5% of the best cost (fewer splits: less workspace traffic, no combine
// when s = 1), with >= kSplitMinKeys keys per split and at most 256 splits.
inline int choose_splits(const fl_decode_attention_args *a) {
    if (a->num_splits > 0) return a->num_splits;
    const int group = a->q_heads / a->kv_heads;
    const int gt = group_tile(group);
    const int64_t units = (int64_t)a->batch * a->kv_heads * (group / gt);
    if (units < 1) return 1;
    const int64_t sms = a->sm_count > 0 ? a->sm_count : 132;
    const int64_t wave = sms * (a->dtype == FL_DTYPE_F32 ? ctas_per_sm(gt, 4)
                                : gt >= 2 || mha_on_mma(a) ? mma_ctas(a->head_dim)
                                                         : ctas_per_sm(1));
    if (units >= 64 * wave) return 1;  // >= 64 waves already: splitting gains < 2%
    const int64_t keys = kSplitMinKeys;
    int64_t smax = (a->max_seq_len + keys - 1) / keys;  // >= `keys` keys per split
    if (smax > 256) smax = 256;
    if (smax < 1) smax = 1;
    // cost(s) = waves(s) / s, compared as fractions: waves(s) * best_s < best_waves * s.
    int64_t best_s = 1, best_w = (units + wave - 1) / wave;
    for (int64_t s = 2; s <= smax; ++s) {
        const int64_t w = (units * s + wave - 1) / wave;
        if (w * best_s < best_w * s) { best_s = s; best_w = w; }
    }
    for (int64_t s = 1; s <= smax; ++s) {  // smallest s with cost <= 1.05 x best
        const int64_t w = (units * s + wave - 1) / wave;
        if (w * best_s * 100 <= best_w * s * 105) return (int)s;
    }
    return (int)best_s;
}

template <typename T, int D, int G, int W, int S, bool SW>
fl_status launch_mma(const fl_decode_attention_args *a, Params &p, dim3 grid, cudaStream_t st) {
    constexpr int smem = mma_smem_bytes(D, W, S, SW);
    auto kern = a->layout == FL_KV_PAGED ? decode_mma_kernel<T, D, G, true, W, S, SW>
                                         : decode_mma_kernel<T, D, G, false, W, S, SW>;
    if (smem > 48 * 1024) {
        const cudaError_t e =
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return (fl_status)e;
        }
    }
    kern<<<grid, 32 * W, smem, st>>>(p);
    return launch_status();
}

// The split combine. On sm_90 it is a programmatic dependent launch: its CTAs are scheduled
// while the split kernel's last CTAs run (every split CTA triggers at its start) and wait in
// griddepcontrol.wait for its completion, so the second launch's latency hides behind the
// first's tail. Before sm_90 it is a plain launch.
template <typename T, int D>
fl_status launch_combine(const fl_decode_attention_args *a, Params &p, cudaStream_t st) {
    const int64_t bhs = (int64_t)a->batch * a->q_heads;
    if (bhs > 0x7fffffffLL) return FL_ERR_INVALID_ARGUMENT;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)bhs);
    cfg.blockDim = dim3(kCombineThreads);
    cfg.dynamicSmemBytes = sizeof(float) * p.num_splits;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = cc_major() >= 9 ? 1 : 0;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, combine_kernel<T, D>, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return (fl_status)e;
    }
    return FL_OK;
}

// The tensor-core kernel at group tile G, configured by MmaFor for the device.
template <typename T, int D, int G>
fl_status launch_mma_auto(const fl_decode_attention_args *a, Params &p, dim3 grid,
                          cudaStream_t st) {
    if (cc_major() >= 9) {
        using C = MmaFor<D, true>;
        return launch_mma<T, D, G, C::W, C::S, C::SW>(a, p, grid, st);
    }
    using C = MmaFor<D, false>;
    return launch_mma<T, D, G, C::W, C::S, C::SW>(a, p, grid, st);
}

template <typename T, int D, int G>
fl_status launch_g(const fl_decode_attention_args *a, Params &p, cudaStream_t st) {
    const int group = a->q_heads / a->kv_heads;
    dim3 grid(a->batch, a->kv_heads * (group / G), p.num_splits);
    if (D > kMaxFusedD || p.num_splits * G > kMaxFusedRows ||
        (int64_t)grid.x * grid.y > kMaxFusedGroups)
        p.counters = nullptr;
    // The split kernel's status, then the combine when there are splits and the split kernel
    // does not combine them itself.
    auto combine = [&](fl_status s) {
        return s != FL_OK || p.num_splits == 1 || p.counters ? s : launch_combine<T, D>(a, p, st);
    };
    if constexpr (G >= 2 && sizeof(T) == 2) {  // grouped heads: tensor cores
        return combine(launch_mma_auto<T, D, G>(a, p, grid, st));
    } else {
        if constexpr (sizeof(T) == 2 && D == 128)  // MHA: see mha_on_mma
            if (mha_on_mma(a)) return combine(launch_mma_auto<T, D, 1>(a, p, grid, st));
        // MHA (one head per K/V row: the math is light), and f32: CUDA cores
        if (a->layout == FL_KV_PAGED)
            decode_kernel<T, D, G, true><<<grid, kThreads, 0, st>>>(p);
        else
            decode_kernel<T, D, G, false><<<grid, kThreads, 0, st>>>(p);
        return combine(launch_status());
    }
}

template <typename T, int D>
fl_status launch_d(const fl_decode_attention_args *a, Params &p, cudaStream_t st) {
    switch (group_tile(a->q_heads / a->kv_heads)) {
    case 8: return launch_g<T, D, 8>(a, p, st);
    case 4: return launch_g<T, D, 4>(a, p, st);
    case 2: return launch_g<T, D, 2>(a, p, st);
    default: return launch_g<T, D, 1>(a, p, st);
    }
}

template <typename T>
fl_status launch_t(const fl_decode_attention_args *a, Params &p, cudaStream_t st) {
    switch (a->head_dim) {
    case 64: return launch_d<T, 64>(a, p, st);
    case 80: return launch_d<T, 80>(a, p, st);
    case 96: return launch_d<T, 96>(a, p, st);
    case 128: return launch_d<T, 128>(a, p, st);
    case 256: return launch_d<T, 256>(a, p, st);
    default: return FL_ERR_INVALID_ARGUMENT;
    }
}

}  // namespace attn
}  // namespace fl

extern "C" int32_t fl_attention_decode_num_splits(const fl_decode_attention_args *a) {
    if (!fl::attn::valid(a)) return 0;
    return fl::attn::choose_splits(a);
}

extern "C" int64_t fl_attention_decode_workspace_size(const fl_decode_attention_args *a) {
    if (!fl::attn::valid(a)) return -1;
    const int64_t s = fl::attn::choose_splits(a);
    if (s <= 1) return 0;
    const int64_t bh = (int64_t)a->batch * a->q_heads;
    // the fused combine's counters, partial outputs, then the lse values, each region
    // 16-byte aligned
    const int64_t o = bh * s * a->head_dim * 4;
    const int64_t l = (bh * s * 4 + 15) / 16 * 16;
    return fl::attn::kCounterBytes + o + l;
}

extern "C" fl_status fl_attention_decode(const fl_decode_attention_args *a, void *workspace,
                                         int64_t workspace_bytes, fl_stream stream) {
    using namespace fl::attn;
    if (!valid(a)) return FL_ERR_INVALID_ARGUMENT;
    if (a->batch == 0) return FL_OK;
    if (!a->q || !a->k || !a->v || !a->out || !a->seq_lens) return FL_ERR_INVALID_ARGUMENT;
    if (a->layout == FL_KV_PAGED && !a->block_table) return FL_ERR_INVALID_ARGUMENT;
    if (!fl::aligned16(a->q) || !fl::aligned16(a->k) || !fl::aligned16(a->v) ||
        !fl::aligned16(a->out))
        return FL_ERR_MISALIGNED;
    const int splits = choose_splits(a);
    const int64_t need = fl_attention_decode_workspace_size(a);
    if (need > 0 && (!workspace || workspace_bytes < need || !fl::aligned16(workspace)))
        return FL_ERR_INVALID_ARGUMENT;
    Params p;
    p.q = a->q; p.k = a->k; p.v = a->v; p.out = a->out;
    p.seq_lens = a->seq_lens; p.block_table = a->block_table;
    p.batch = a->batch; p.q_heads = a->q_heads; p.kv_heads = a->kv_heads;
    p.capacity = a->kv_block_size; p.block_size = a->kv_block_size;
    p.max_blocks = a->max_blocks_per_seq; p.num_blocks = a->num_blocks;
    p.window = a->window;
    p.scale_log2 = a->scale * kLog2e;
    p.num_splits = splits;
    const int64_t bh = (int64_t)a->batch * a->q_heads;
    char *ws = static_cast<char *>(workspace);
    p.counters = splits > 1 ? reinterpret_cast<int32_t *>(ws) : nullptr;
    p.ws_o = splits > 1 ? reinterpret_cast<float *>(ws + kCounterBytes) : nullptr;
    p.ws_lse = splits > 1 ? reinterpret_cast<float *>(ws + kCounterBytes +
                                                      bh * splits * a->head_dim * 4)
                          : nullptr;
    cudaStream_t st = fl::as_stream(stream);
    if (a->dtype == FL_DTYPE_F32) return launch_t<float>(a, p, st);
    if (a->dtype == FL_DTYPE_F16) return launch_t<__half>(a, p, st);
    return launch_t<__nv_bfloat16>(a, p, st);
}
