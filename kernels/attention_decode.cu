// Decode attention (one query token per sequence) over a contiguous or paged KV cache,
// with grouped-query heads and a flash-decoding split of the sequence.
//
// One CTA handles (batch row, kv head, chunk of G query heads of that kv head, sequence
// split): K/V rows are read once for all G heads. Inside the CTA, "workers" of LPK lanes each
// own one key row at a time (LPK * 8 >= head_dim; each lane holds 8 dims) and keep their own
// online-softmax state; workers merge through shared memory at the end. With more than one
// split, each split writes its normalised partial output and its log-sum-exp (base 2) to the
// workspace, and a second kernel combines them.
//
// Memory pipeline (why): a GQA key row feeds G query heads, so the per-key math (G dot
// products with shuffle reductions, online softmax, G x 8 FMAs into the accumulators) is
// several times longer than for MHA. When a warp loads a tile into registers and then does
// that math, its loads are idle for the whole math phase: the first version reached only
// 51-87% of copy bandwidth for 32/8 heads (and at 141-167 registers only 3 CTAs fitted per
// SM, so the 4-per-SM split target ran 1.33 waves). Here every lane streams its own 16-byte
// slices of K and V into a per-thread ring of S stages in shared memory with cp.async
// (16 B x 2 x U keys per stage), S - 1 stages ahead of the math. A lane only ever reads the
// slots it copied itself, so cp.async.wait_group alone orders the copy before the read: no
// block barrier in the key loop, and warps run freely. Bytes in flight per SM while the math
// runs: 4 CTAs x 128 threads x (S - 1) x U x 32 B = 160 KB (G = 4, D = 128), against the
// ~23-45 KB that ~3 TB/s x ~1-2 us of loaded HBM latency / 132 SMs needs, so HBM stays busy.
// Registers are bounded by __launch_bounds__ so that 4 CTAs fit per SM (2 for G = 8), and
// the split count fills whole waves of that many CTAs (see choose_splits).
//
// Tensor cores (mma for S = Q K^T and P V) were not needed: with the copies decoupled, the
// CUDA-core math costs about 15 issue cycles per key per SM for G = 4 (~47 warp instructions
// per key over 4 schedulers), against the ~39 cycles per 512-byte key row that 3 TB/s
// allows per SM at 1.75 GHz.
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
};

__host__ __device__ constexpr int lanes_per_key(int d) {
    return d / 8 <= 8 ? 8 : (d / 8 <= 16 ? 16 : 32);
}
// Keys per worker per stage, and stages: S x U x 4 KB = 48 KB of shared memory per CTA
// (the static limit), 4 CTAs per SM on sm_90 (228 KB).
__host__ __device__ constexpr int keys_per_stage(int g) { return g >= 4 ? 2 : 4; }
__host__ __device__ constexpr int stages(int g) { return g >= 4 ? 6 : 3; }
// CTAs per SM that the register bound guarantees (G = 8 holds 128 floats of q and acc).
__host__ __device__ constexpr int ctas_per_sm(int g) { return g >= 8 ? 2 : 4; }

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared; bytes = 0 writes zeros and reads nothing. The "memory" clobbers
// keep the compiler from moving shared-memory reads across the copy and the wait (there is
// no __syncthreads in the key loop to do it).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <typename T, int D, int G, bool PAGED>
__global__ void __launch_bounds__(kThreads, ctas_per_sm(G)) decode_kernel(Params p) {
    constexpr int LPK = lanes_per_key(D);
    constexpr int WPW = 32 / LPK;          // workers per warp
    constexpr int NW = kWarps * WPW;       // workers per CTA
    constexpr int U = keys_per_stage(G);   // keys per worker per stage
    constexpr int S = stages(G);
    constexpr int TK = NW * U;             // keys per stage (tile) of the CTA
    constexpr int kPipe = S * U * 2 * kThreads;  // 16-byte slots
    static_assert(kPipe * 16 <= 48 * 1024, "static shared memory limit");
    static_assert((NW * G * D + 2 * NW * G) * 4 <= kPipe * 16, "merge buffers fit the ring");
    static_assert(S * U <= 32, "validity bits fit a word");
    using V8 = Vec<T, 8>;
    // Slot (stage st, key u, K or V, thread) = ((st * U + u) * 2 + kv) * kThreads + tid: a
    // warp touches 512 contiguous bytes per access (no bank conflicts). After the key loop
    // the same memory holds the merge buffers.
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
                const uint32_t dk = ring0 + (uint32_t)(((st * U + u) * 2) * kThreads) * 16u;
                const int64_t off = row >= 0 ? row * D + sub * 8 : 0;
                const int nb = row >= 0 ? 16 : 0;  // invalid key: zeros (V * 0 stays 0)
                cp_async16(dk, kbase + off, nb);
                cp_async16(dk + kThreads * 16u, vbase + off, nb);
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
            qv = reinterpret_cast<const V8 *>(static_cast<const T *>(p.q) +
                                              ((int64_t)b * p.q_heads + h0 + g) * D)[sub];
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
                const int slot = ((st_c * U + u) * 2) * kThreads + tid;
                kv[u] = *reinterpret_cast<const V8 *>(&ring[slot]);
                vv[u] = *reinterpret_cast<const V8 *>(&ring[slot + kThreads]);
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
}

// Combines the splits of one (batch, head): weights 2^(lse_s - max lse).
template <typename T, int D>
__global__ void combine_kernel(Params p) {
    const int64_t bh = blockIdx.x;
    const int S = p.num_splits;
    extern __shared__ float w[];  // S weights
    __shared__ float red[32];
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
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.f;
        for (int s = 0; s < S; ++s) o = fmaf(w[s], p.ws_o[(bh * S + s) * D + d], o);
        static_cast<T *>(p.out)[bh * D + d] = from_f32<T>(o * inv);
    }
}

inline int group_tile(int group) {
    return group % 8 == 0 ? 8 : group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
}

inline bool valid(const fl_decode_attention_args *a) {
    if (!a || a->batch < 0 || a->q_heads < 1 || a->kv_heads < 1 || a->q_heads % a->kv_heads)
        return false;
    if (a->dtype != FL_DTYPE_F16 && a->dtype != FL_DTYPE_BF16) return false;
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

// Splits: fill whole waves of CTAs. A wave is sms x ctas_per_sm(G) CTAs; with `units`
// (batch x kv heads x head chunks) CTAs per split, s splits take ceil(units s / wave) waves of
// 1/s of the work each, so the time goes as cost(s) = ceil(units s / wave) / s. Take the
// smallest s within 5% of the best cost (fewer splits: less workspace traffic, no combine
// when s = 1), with >= 256 keys per split and at most 256 splits. (The first version aimed
// at 4 x sms CTAs with ceil, which ran 1.03-1.33 waves at several issue shapes.)
inline int choose_splits(const fl_decode_attention_args *a) {
    if (a->num_splits > 0) return a->num_splits;
    const int group = a->q_heads / a->kv_heads;
    const int gt = group_tile(group);
    const int64_t units = (int64_t)a->batch * a->kv_heads * (group / gt);
    if (units < 1) return 1;
    const int64_t sms = a->sm_count > 0 ? a->sm_count : 132;
    const int64_t wave = sms * ctas_per_sm(gt);
    if (units >= 64 * wave) return 1;  // >= 64 waves already: splitting gains < 2%
    int64_t smax = (a->max_seq_len + 255) / 256;  // >= 256 keys per split
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

template <typename T, int D, int G>
fl_status launch_g(const fl_decode_attention_args *a, Params &p, cudaStream_t st) {
    const int group = a->q_heads / a->kv_heads;
    dim3 grid(a->batch, a->kv_heads * (group / G), p.num_splits);
    if (a->layout == FL_KV_PAGED)
        decode_kernel<T, D, G, true><<<grid, kThreads, 0, st>>>(p);
    else
        decode_kernel<T, D, G, false><<<grid, kThreads, 0, st>>>(p);
    fl_status s = launch_status();
    if (s != FL_OK || p.num_splits == 1) return s;
    const size_t smem = sizeof(float) * p.num_splits;
    combine_kernel<T, D><<<a->batch * a->q_heads, 128, smem, st>>>(p);
    return launch_status();
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
    // partial outputs, then the lse values, each region 16-byte aligned
    const int64_t o = bh * s * a->head_dim * 4;
    const int64_t l = (bh * s * 4 + 15) / 16 * 16;
    return o + l;
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
    p.ws_o = splits > 1 ? static_cast<float *>(workspace) : nullptr;
    p.ws_lse = splits > 1 ? reinterpret_cast<float *>(static_cast<char *>(workspace) +
                                                      bh * splits * a->head_dim * 4)
                          : nullptr;
    cudaStream_t st = fl::as_stream(stream);
    if (a->dtype == FL_DTYPE_F16) return launch_t<__half>(a, p, st);
    return launch_t<__nv_bfloat16>(a, p, st);
}
