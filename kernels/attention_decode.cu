// Decode attention (one query token per sequence) over a contiguous or paged KV cache,
// with grouped-query heads and a flash-decoding split of the sequence.
//
// One CTA handles (sequence split, kv head, chunk of G query heads of that kv head, batch
// row): K/V rows are read once for all G heads. Inside the CTA, "workers" of LPK lanes each
// own one key row at a time (LPK * 8 >= head_dim; each lane holds 8 dims in registers) and
// keep their own online-softmax state; workers merge through shared memory at the end.
// With more than one split, each split writes its normalised partial output and its
// log-sum-exp (base 2) to the workspace, and a second kernel combines them.
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

template <typename T, int D, int G, int UNROLL, bool PAGED>
__global__ void __launch_bounds__(kThreads) decode_kernel(Params p) {
    constexpr int LPK = lanes_per_key(D);
    constexpr int WPW = 32 / LPK;          // workers per warp
    constexpr int NW = kWarps * WPW;       // workers per CTA
    using V8 = Vec<T, 8>;

    const int split = blockIdx.z;
    const int chunks = (p.q_heads / p.kv_heads) / G;
    const int kvh = blockIdx.y / chunks;
    const int h0 = kvh * (p.q_heads / p.kv_heads) + (blockIdx.y % chunks) * G;
    const int b = blockIdx.x;  // x: up to 2^31-1 sequences (z would cap it at 65535)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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

    float m[G], l[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
    }

    const T *kbase = static_cast<const T *>(p.k);
    const T *vbase = static_cast<const T *>(p.v);
    // The trip count must be the same for every lane of a warp (the shuffles below use the
    // full mask), so the loop runs over warp-uniform bases and masks keys past the end.
    const int wbase = warp * WPW;
    for (int jb = s_lo + wbase; jb < s_hi; jb += NW * UNROLL) {
        const int j0 = jb + (worker - wbase);
        V8 kv[UNROLL], vv[UNROLL];
        bool ok[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = j0 + u * NW;
            int64_t row = -1;
            if (j < s_hi) {
                if (PAGED) {
                    const int blk = p.block_table[(int64_t)b * p.max_blocks + j / p.block_size];
                    if (blk >= 0 && blk < p.num_blocks)
                        row = ((int64_t)blk * p.kv_heads + kvh) * p.block_size + j % p.block_size;
                } else {
                    row = ((int64_t)b * p.kv_heads + kvh) * p.capacity + j;
                }
            }
            ok[u] = row >= 0;
            if (ok[u] && active) {
                kv[u] = reinterpret_cast<const V8 *>(kbase + row * D)[sub];
                vv[u] = reinterpret_cast<const V8 *>(vbase + row * D)[sub];
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) kv[u].v[e] = vv[u].v[e] = from_f32<T>(0.f);
            }
        }
        float s[UNROLL][G];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
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
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) mx = fmaxf(mx, s[u][g]);
            if (mx == -INFINITY) continue;  // nothing valid yet for this worker
            const float corr = exp2f(m[g] - mx);  // m == -inf -> 0
            l[g] *= corr;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const float w = exp2f(s[u][g] - mx);  // invalid key: exp2(-inf) = 0
                l[g] += w;
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(w, to_f32(vv[u].v[e]), acc[g][e]);
            }
            m[g] = mx;
        }
    }

    // Merge the NW workers.
    __shared__ float sm_m[NW][G], sm_l[NW][G];
    __shared__ float sm_acc[NW][G][D];
    if (sub == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            sm_m[worker][g] = m[g];
            sm_l[worker][g] = l[g];
        }
    }
    if (active) {
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int e = 0; e < 8; ++e) sm_acc[worker][g][sub * 8 + e] = acc[g][e];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += kThreads) {
        const int g = idx / D, d = idx % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; ++w) M = fmaxf(M, sm_m[w][g]);
        float L = 0.f, O = 0.f;
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                const float c = exp2f(sm_m[w][g] - M);
                L = fmaf(sm_l[w][g], c, L);
                O = fmaf(sm_acc[w][g][d], c, O);
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

inline int choose_splits(const fl_decode_attention_args *a) {
    if (a->num_splits > 0) return a->num_splits;
    const int group = a->q_heads / a->kv_heads;
    const int64_t units = (int64_t)a->batch * a->kv_heads * (group / group_tile(group));
    const int sms = a->sm_count > 0 ? a->sm_count : 132;
    const int64_t target = 4LL * sms;  // CTAs to aim for
    int64_t s = units > 0 ? (target + units - 1) / units : 1;
    const int64_t by_len = (a->max_seq_len + 255) / 256;  // >= 256 keys per split
    if (s > by_len) s = by_len;
    if (s > 256) s = 256;
    return (int)(s < 1 ? 1 : s);
}

template <typename T, int D, int G>
fl_status launch_g(const fl_decode_attention_args *a, Params &p, cudaStream_t st) {
    constexpr int UNROLL = G >= 8 ? 2 : 4;
    const int group = a->q_heads / a->kv_heads;
    dim3 grid(a->batch, a->kv_heads * (group / G), p.num_splits);
    if (a->layout == FL_KV_PAGED)
        decode_kernel<T, D, G, UNROLL, true><<<grid, kThreads, 0, st>>>(p);
    else
        decode_kernel<T, D, G, UNROLL, false><<<grid, kThreads, 0, st>>>(p);
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
