// KV-cache append: this step's packed K and V rows scattered into a contiguous
// [batch, kv_heads, max_seq, head_dim] cache or a paged (vLLM-style) [num_blocks, kv_heads,
// block_size, head_dim] cache, with dtype conversion. Memory-bound copy. At the end of the file:
// the fused QKV split + RoPE + append, and the copy-on-write block copy of a paged cache.
//
// Work split: one row per token, blockDim = (units per token, rows per block); a unit is N
// elements of one head (16 bytes of cache). A thread issues its first unit's K and V loads
// before it looks the slot up (sequence, position, block table), so the index loads and the
// data loads are in flight together. Tokens whose slot is invalid are skipped and flagged.
#include <algorithm>

#include "common/common.cuh"

namespace fl {
namespace kv {

// Where token rows go.
struct Dest {
    int32_t batch;
    int64_t max_seq;             // contiguous
    const int32_t *block_table;  // paged: [batch, max_blocks]
    int32_t max_blocks;
    int64_t num_blocks;
    int32_t block_size;
};

// N elements of T: 16-byte accesses (several when N * sizeof(T) > 16) or one narrower
// vector access when VEC, element by element otherwise.
template <typename T, int N, bool VEC>
__device__ __forceinline__ void load_n(const T *__restrict__ p, T (&x)[N]) {
    if constexpr (!VEC) {
#pragma unroll
        for (int j = 0; j < N; ++j) x[j] = p[j];
    } else if constexpr (N * sizeof(T) > 16) {
        constexpr int C = 16 / sizeof(T);
#pragma unroll
        for (int i = 0; i < N / C; ++i) {
            const Vec<T, C> w = reinterpret_cast<const Vec<T, C> *>(p)[i];
#pragma unroll
            for (int j = 0; j < C; ++j) x[i * C + j] = w.v[j];
        }
    } else {
        const Vec<T, N> w = *reinterpret_cast<const Vec<T, N> *>(p);
#pragma unroll
        for (int j = 0; j < N; ++j) x[j] = w.v[j];
    }
}

template <typename Ti, typename Tc, int N, bool VEC>
__device__ __forceinline__ void store_n(Tc *p, const Ti (&x)[N]) {
    Vec<Tc, N> w;
#pragma unroll
    for (int j = 0; j < N; ++j) w.v[j] = from_f32<Tc>(to_f32(x[j]));
    if constexpr (VEC) {
        *reinterpret_cast<Vec<Tc, N> *>(p) = w;
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) p[j] = w.v[j];
    }
}

template <typename Ti, typename Tc, int N, bool VEC, bool PAGED>
__global__ void __launch_bounds__(256)
    append_kernel(const Ti *__restrict__ k, const Ti *__restrict__ v, int64_t k_stride,
                  int64_t v_stride, int64_t tokens, int32_t kv_heads, int32_t head_dim,
                  const int32_t *__restrict__ seq_ids, const int32_t *__restrict__ positions,
                  Tc *__restrict__ kc, Tc *__restrict__ vc, const Dest d, int32_t *err) {
    const int uph = head_dim / N;           // units per head
    const int row_units = kv_heads * uph;   // units per token
    for (int64_t tok = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; tok < tokens;
         tok += (int64_t)gridDim.x * blockDim.y) {
        int c = threadIdx.x;
        bool have = c < row_units;
        Ti kx[N], vx[N];
        int h = 0, u = 0;
        if (have) {
            h = c / uph;
            u = c - h * uph;
            load_n<Ti, N, VEC>(k + tok * k_stride + (int64_t)h * head_dim + u * N, kx);
            load_n<Ti, N, VEC>(v + tok * v_stride + (int64_t)h * head_dim + u * N, vx);
        }
        // The slot: element offset of head 0 and the stride between heads.
        const int s = __ldg(seq_ids + tok);
        const int p = __ldg(positions + tok);
        int code = 0;
        int64_t base = 0, head_stride = 0;
        if (s < 0 || s >= d.batch) {
            code = FL_KV_ERR_SEQUENCE;
        } else if (p < 0) {
            code = FL_KV_ERR_POSITION;
        } else if constexpr (PAGED) {
            const int bi = p / d.block_size;
            if (bi >= d.max_blocks) {
                code = FL_KV_ERR_POSITION;
            } else {
                const int b = __ldg(d.block_table + (int64_t)s * d.max_blocks + bi);
                if (b < 0 || b >= d.num_blocks) {
                    code = FL_KV_ERR_BLOCK;
                } else {
                    head_stride = (int64_t)d.block_size * head_dim;
                    base = ((int64_t)b * kv_heads * d.block_size + (p - bi * d.block_size)) *
                           head_dim;
                }
            }
        } else {
            if (p >= d.max_seq) {
                code = FL_KV_ERR_POSITION;
            } else {
                head_stride = d.max_seq * head_dim;
                base = ((int64_t)s * kv_heads * d.max_seq + p) * head_dim;
            }
        }
        if (code) {
            if (err && threadIdx.x == 0) atomicOr(err, code);
            continue;
        }
        while (have) {
            const int64_t off = base + h * head_stride + u * N;
            store_n<Ti, Tc, N, VEC>(kc + off, kx);
            store_n<Ti, Tc, N, VEC>(vc + off, vx);
            c += blockDim.x;
            have = c < row_units;
            if (have) {
                h = c / uph;
                u = c - h * uph;
                load_n<Ti, N, VEC>(k + tok * k_stride + (int64_t)h * head_dim + u * N, kx);
                load_n<Ti, N, VEC>(v + tok * v_stride + (int64_t)h * head_dim + u * N, vx);
            }
        }
    }
}

template <typename Ti, typename Tc, int N, bool VEC, bool PAGED>
fl_status launch(const Ti *k, const Ti *v, int64_t k_stride, int64_t v_stride, int64_t tokens,
                 int32_t kv_heads, int32_t head_dim, const int32_t *seq_ids,
                 const int32_t *positions, Tc *kc, Tc *vc, const Dest &d, int32_t *err,
                 cudaStream_t s) {
    const int row_units = kv_heads * (head_dim / N);
    const int bx = std::min(row_units, 256);
    const int by = std::max(1, 256 / bx);
    const unsigned grid = (unsigned)std::min<int64_t>(ceil_div(tokens, by), 1 << 20);
    append_kernel<Ti, Tc, N, VEC, PAGED><<<grid, dim3(bx, by), 0, s>>>(
        k, v, k_stride, v_stride, tokens, kv_heads, head_dim, seq_ids, positions, kc, vc, d, err);
    return launch_status();
}

template <typename Ti, typename Tc, bool PAGED>
fl_status append(const Ti *k, const Ti *v, int64_t k_stride, int64_t v_stride, int64_t tokens,
                 int32_t kv_heads, int32_t head_dim, const int32_t *seq_ids,
                 const int32_t *positions, Tc *kc, Tc *vc, const Dest &d, int32_t *err,
                 cudaStream_t s) {
    constexpr int N = vec16<Tc>();
    const bool vec = aligned16(k) && aligned16(v) && aligned16(kc) && aligned16(vc) &&
                     k_stride % N == 0 && v_stride % N == 0 && head_dim % N == 0;
    return vec ? launch<Ti, Tc, N, true, PAGED>(k, v, k_stride, v_stride, tokens, kv_heads,
                                               head_dim, seq_ids, positions, kc, vc, d, err, s)
               : launch<Ti, Tc, 1, false, PAGED>(k, v, k_stride, v_stride, tokens, kv_heads,
                                                 head_dim, seq_ids, positions, kc, vc, d, err, s);
}

// Checks shared by both launchers.
inline bool check_common(const void *k, const void *v, int64_t k_stride, int64_t v_stride,
                         int64_t tokens, int32_t kv_heads, int32_t head_dim,
                         const int32_t *seq_ids, const int32_t *positions, const void *kc,
                         const void *vc, int32_t batch) {
    if (tokens < 0 || kv_heads < 1 || head_dim < 1 || batch < 1) return false;
    if ((int64_t)kv_heads * head_dim > INT32_MAX) return false;
    if (k_stride < (int64_t)kv_heads * head_dim || v_stride < (int64_t)kv_heads * head_dim)
        return false;
    if (tokens > 0 && (!k || !v || !seq_ids || !positions || !kc || !vc)) return false;
    return true;
}

}  // namespace kv
}  // namespace fl

#define FL_KV_DISPATCH(PAGED)                                                                   \
    FL_DISPATCH_FLOAT(in_dtype, {                                                               \
        using in_t = scalar_t;                                                                  \
        FL_DISPATCH_FLOAT(cache_dtype,                                                          \
                          return fl::kv::append<in_t, scalar_t, PAGED>(                         \
                              static_cast<const in_t *>(k), static_cast<const in_t *>(v),       \
                              k_stride, v_stride, tokens, kv_heads, head_dim, seq_ids,          \
                              positions, static_cast<scalar_t *>(k_cache),                      \
                              static_cast<scalar_t *>(v_cache), d, err_flag,                    \
                              fl::as_stream(stream)));                                          \
    });                                                                                         \
    return FL_ERR_UNSUPPORTED_DTYPE;

extern "C" fl_status fl_kv_append(fl_dtype in_dtype, const void *k, const void *v,
                                  int64_t k_stride, int64_t v_stride, int64_t tokens,
                                  int32_t kv_heads, int32_t head_dim, const int32_t *seq_ids,
                                  const int32_t *positions, fl_dtype cache_dtype, void *k_cache,
                                  void *v_cache, int32_t batch, int64_t max_seq,
                                  int32_t *err_flag, fl_stream stream) {
    if (!fl::kv::check_common(k, v, k_stride, v_stride, tokens, kv_heads, head_dim, seq_ids,
                              positions, k_cache, v_cache, batch) ||
        max_seq < 1)
        return FL_ERR_INVALID_ARGUMENT;
    if (tokens == 0) return FL_OK;
    const fl::kv::Dest d{batch, max_seq, nullptr, 0, 0, 0};
    FL_KV_DISPATCH(false)
}

extern "C" fl_status fl_kv_append_paged(fl_dtype in_dtype, const void *k, const void *v,
                                        int64_t k_stride, int64_t v_stride, int64_t tokens,
                                        int32_t kv_heads, int32_t head_dim,
                                        const int32_t *seq_ids, const int32_t *positions,
                                        const int32_t *block_table, int32_t batch,
                                        int32_t max_blocks_per_seq, fl_dtype cache_dtype,
                                        void *k_cache, void *v_cache, int64_t num_blocks,
                                        int32_t block_size, int32_t *err_flag,
                                        fl_stream stream) {
    if (!fl::kv::check_common(k, v, k_stride, v_stride, tokens, kv_heads, head_dim, seq_ids,
                              positions, k_cache, v_cache, batch) ||
        max_blocks_per_seq < 1 || num_blocks < 1 || block_size < 1 ||
        (tokens > 0 && !block_table))
        return FL_ERR_INVALID_ARGUMENT;
    if (tokens == 0) return FL_OK;
    const fl::kv::Dest d{batch, 0, block_table, max_blocks_per_seq, num_blocks, block_size};
    FL_KV_DISPATCH(true)
}

// ---------------------------------------------------------------------------------------------
// Fused QKV split + RoPE + KV-cache append (fl_kv_rope_append / fl_kv_rope_append_paged).
//
// Input: the fused QKV GEMM output, a row of q_heads q heads, then kv_heads k heads, then
// kv_heads v heads per token. Output: rotated q to q_out [tokens, q_heads, d]; rotated k and v
// into the cache; optionally rotated k and v to k_out / v_out [tokens, kv_heads, d].
//
// Work split: the heads of one token are cut into "units" (a thread's share):
//   q/k head, rotate-half: a rotation unit is V elements of the first half plus the V partner
//     elements of the second half (V pairs); interleaved: V contiguous elements (V / 2 pairs);
//     then pass units of W elements past rotary_dim (copied);
//   v head: units of W elements (copied).
// A token's U units (q heads, then k, then v; consecutive threads on consecutive units, so
// loads and stores coalesce) are cut into `chunks` CTAs of B threads; a CTA is one (token,
// chunk) row, grid-stride over rows. Vector path: V = W = 16 / max(sizeof(I), sizeof(C)), so
// every access is at most 16 bytes and aligned; scalar path: V = 1 (rotate-half) or 2
// (interleaved, one pair), W = 1.
//
// The rotation is rope.cu's computed-angle path, step for step (kept identical on purpose so
// the fused kernel matches fl_rope_apply + fl_kv_append bit for bit): angle = __fmul_rn((float)
// pos, inv_freq[i]); sincosf; y0 = fma(x0, c, -(x1 * s)), y1 = fma(x1, c, x0 * s); rounded to
// the input dtype I (what fl_rope_apply stores), then I -> f32 -> C for the cache (what
// fl_kv_append does).
// ---------------------------------------------------------------------------------------------
namespace fl {
namespace kv {

// Inverse frequencies, by value (kernel parameter space), as rope.cu passes them.
struct RopeFreq {
    float v[FL_ROPE_MAX_PAIRS];
};

struct RopeGeom {
    int64_t tokens;
    int64_t qkv_stride;  // elements between token rows of qkv
    int32_t nq, nkv;     // q heads, kv heads
    int32_t head_dim, rotary_dim, half;
    int32_t rot_units;   // rotation units per q/k head
    int32_t qk_units;    // units per q/k head (rotation + pass)
    int32_t v_units;     // units per v head
    int32_t units;       // units per token: (nq + nkv) * qk_units + nkv * v_units
    int32_t chunks;      // CTAs per token
};

template <typename T, int N, bool VEC>
__device__ __forceinline__ void ld_units(const T *__restrict__ p, T (&x)[N]) {
    if constexpr (VEC) {
        const Vec<T, N> w = *reinterpret_cast<const Vec<T, N> *>(p);
#pragma unroll
        for (int j = 0; j < N; ++j) x[j] = w.v[j];
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) x[j] = p[j];
    }
}

// Stores x (already of the input dtype Ti) converted to To through f32.
template <typename Ti, typename To, int N, bool VEC>
__device__ __forceinline__ void st_units(To *p, const Ti (&x)[N]) {
    Vec<To, N> w;
#pragma unroll
    for (int j = 0; j < N; ++j) w.v[j] = from_f32<To>(to_f32(x[j]));
    if constexpr (VEC) {
        *reinterpret_cast<Vec<To, N> *>(p) = w;
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) p[j] = w.v[j];
    }
}

// The slot of (sequence s, position p): element offset of head 0 and the stride between
// heads, or an FL_KV_ERR_* code. Same rules as append_kernel.
template <bool PAGED>
__device__ __forceinline__ int slot_of(const Dest &d, int s, int p, int kv_heads, int head_dim,
                                       int64_t &base, int64_t &head_stride) {
    if (s < 0 || s >= d.batch) return FL_KV_ERR_SEQUENCE;
    if (p < 0) return FL_KV_ERR_POSITION;
    if constexpr (PAGED) {
        const int bi = p / d.block_size;
        if (bi >= d.max_blocks) return FL_KV_ERR_POSITION;
        const int b = __ldg(d.block_table + (int64_t)s * d.max_blocks + bi);
        if (b < 0 || b >= d.num_blocks) return FL_KV_ERR_BLOCK;
        head_stride = (int64_t)d.block_size * head_dim;
        base = ((int64_t)b * kv_heads * d.block_size + (p - bi * d.block_size)) * head_dim;
    } else {
        if (p >= d.max_seq) return FL_KV_ERR_POSITION;
        head_stride = d.max_seq * head_dim;
        base = ((int64_t)s * kv_heads * d.max_seq + p) * head_dim;
    }
    return 0;
}

template <typename Ti, typename Tc, int V, int W, bool VEC, bool INTERLEAVED, bool PAGED>
__global__ void __launch_bounds__(256)
    rope_append_kernel(const Ti *__restrict__ qkv, const RopeGeom g, const RopeFreq f,
                       const int32_t *__restrict__ seq_ids, const int32_t *__restrict__ positions,
                       Ti *__restrict__ q_out, Ti *__restrict__ k_out, Ti *__restrict__ v_out,
                       Tc *__restrict__ kc, Tc *__restrict__ vc, const Dest d, int32_t *err) {
    constexpr int NP = INTERLEAVED ? V / 2 : V;  // pairs per rotation unit
    const int64_t rows = g.tokens * g.chunks;
    const int hd = g.head_dim;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int64_t tok = row / g.chunks;
        const int u = (int)(row - tok * g.chunks) * blockDim.x + threadIdx.x;
        // Which head (0..nq: q, nq..nq+nkv: k, then v) and which elements.
        int head = 0, e0 = 0;   // e0: first element of the unit in its head
        bool rot = false, have = u < g.units;
        const int qk_total = (g.nq + g.nkv) * g.qk_units;
        if (have) {
            if (u < qk_total) {
                head = u / g.qk_units;
                const int r = u - head * g.qk_units;
                if (r < g.rot_units) {
                    rot = true;
                    e0 = r * V;
                } else {
                    e0 = g.rotary_dim + (r - g.rot_units) * W;
                }
            } else {
                const int uv = u - qk_total;
                const int hv = uv / g.v_units;
                head = g.nq + g.nkv + hv;
                e0 = (uv - hv * g.v_units) * W;
            }
        }
        const Ti *src = qkv + tok * g.qkv_stride + (int64_t)head * hd + e0;
        // Loads first (they do not depend on the slot).
        Ti a[V], b[V];
        if (have) {
            if (rot) {
                ld_units<Ti, V, VEC>(src, a);
                if constexpr (!INTERLEAVED) ld_units<Ti, V, VEC>(src + g.half, b);
            } else {
                // Pass / v unit: W elements into a[0..W).
                Ti t[W];
                ld_units<Ti, W, VEC>(src, t);
#pragma unroll
                for (int j = 0; j < W && j < V; ++j) a[j] = t[j];
            }
        }
        const int s = __ldg(seq_ids + tok);
        const int p = __ldg(positions + tok);
        int64_t base = 0, head_stride = 0;
        const int code = slot_of<PAGED>(d, s, p, g.nkv, hd, base, head_stride);
        if (code) {
            if (err && u == 0) atomicOr(err, code);
            continue;
        }
        if (!have) continue;
        if (rot) {
            const float pf = (float)p;
            if constexpr (INTERLEAVED) {
                const int i0 = e0 / 2;
#pragma unroll
                for (int m = 0; m < NP; ++m) {
                    float sn, cs, y0, y1;
                    sincosf(__fmul_rn(pf, f.v[i0 + m]), &sn, &cs);
                    rope_rotate(to_f32(a[2 * m]), to_f32(a[2 * m + 1]), cs, sn, y0, y1);
                    a[2 * m] = from_f32<Ti>(y0);
                    a[2 * m + 1] = from_f32<Ti>(y1);
                }
            } else {
#pragma unroll
                for (int m = 0; m < NP; ++m) {
                    float sn, cs, y0, y1;
                    sincosf(__fmul_rn(pf, f.v[e0 + m]), &sn, &cs);
                    rope_rotate(to_f32(a[m]), to_f32(b[m]), cs, sn, y0, y1);
                    a[m] = from_f32<Ti>(y0);
                    b[m] = from_f32<Ti>(y1);
                }
            }
        }
        // Stores: rot units write a (and b at + half for rotate-half); others W elements of a.
        if (head < g.nq) {
            Ti *dst = q_out + (tok * g.nq + head) * hd + e0;
            if (rot) {
                st_units<Ti, Ti, V, VEC>(dst, a);
                if constexpr (!INTERLEAVED) st_units<Ti, Ti, V, VEC>(dst + g.half, b);
            } else {
                Ti t[W];
#pragma unroll
                for (int j = 0; j < W && j < V; ++j) t[j] = a[j];
                st_units<Ti, Ti, W, VEC>(dst, t);
            }
        } else {
            const bool is_k = head < g.nq + g.nkv;
            const int kh = is_k ? head - g.nq : head - g.nq - g.nkv;
            Tc *cdst = (is_k ? kc : vc) + base + kh * head_stride + e0;
            Ti *odst = is_k ? k_out : v_out;
            if (odst) odst += (tok * g.nkv + kh) * hd + e0;
            if (rot) {
                st_units<Ti, Tc, V, VEC>(cdst, a);
                if (odst) st_units<Ti, Ti, V, VEC>(odst, a);
                if constexpr (!INTERLEAVED) {
                    st_units<Ti, Tc, V, VEC>(cdst + g.half, b);
                    if (odst) st_units<Ti, Ti, V, VEC>(odst + g.half, b);
                }
            } else {
                Ti t[W];
#pragma unroll
                for (int j = 0; j < W && j < V; ++j) t[j] = a[j];
                st_units<Ti, Tc, W, VEC>(cdst, t);
                if (odst) st_units<Ti, Ti, W, VEC>(odst, t);
            }
        }
    }
}

// Threads per CTA for U units per token: the fewest idle threads, among small CTAs when there
// are few tokens (spreading one decode step over several SMs) and large ones otherwise.
inline int rope_append_block(int64_t tokens, int units) {
    static const int small[] = {64, 96, 128};
    static const int large[] = {256, 224, 192, 160, 128};
    const bool few = tokens < 128;
    const int *cand = few ? small : large;
    const int n = few ? 3 : 5;
    int best = 0;
    int64_t best_waste = INT64_MAX;
    for (int i = 0; i < n; ++i) {
        const int64_t waste = ceil_div(units, cand[i]) * cand[i] - units;
        if (waste < best_waste) {  // ties keep the earlier (smaller when few, larger otherwise)
            best = cand[i];
            best_waste = waste;
        }
    }
    if (units <= 32) return 32;
    return best;
}

template <typename Ti, typename Tc, int V, int W, bool VEC, bool INTERLEAVED>
fl_status rope_append_launch(const Ti *qkv, RopeGeom g, const RopeFreq &f,
                             const int32_t *seq_ids, const int32_t *positions, Ti *q_out,
                             Ti *k_out, Ti *v_out, Tc *kc, Tc *vc, const Dest &d, int32_t *err,
                             cudaStream_t s) {
    g.rot_units = INTERLEAVED ? g.rotary_dim / V : g.half / V;
    g.qk_units = g.rot_units + (g.head_dim - g.rotary_dim) / W;
    g.v_units = g.head_dim / W;
    const int64_t units = (int64_t)(g.nq + g.nkv) * g.qk_units + (int64_t)g.nkv * g.v_units;
    g.units = (int32_t)units;
    const int block = rope_append_block(g.tokens, g.units);
    g.chunks = (int32_t)ceil_div(units, block);
    const unsigned grid = (unsigned)std::min<int64_t>(g.tokens * g.chunks, 1 << 30);
    if (d.block_table) {
        rope_append_kernel<Ti, Tc, V, W, VEC, INTERLEAVED, true><<<grid, block, 0, s>>>(
            qkv, g, f, seq_ids, positions, q_out, k_out, v_out, kc, vc, d, err);
    } else {
        rope_append_kernel<Ti, Tc, V, W, VEC, INTERLEAVED, false><<<grid, block, 0, s>>>(
            qkv, g, f, seq_ids, positions, q_out, k_out, v_out, kc, vc, d, err);
    }
    return launch_status();
}

template <typename Ti, typename Tc>
fl_status rope_append(const Ti *qkv, const RopeGeom &g, bool interleaved, const RopeFreq &f,
                      const int32_t *seq_ids, const int32_t *positions, Ti *q_out, Ti *k_out,
                      Ti *v_out, Tc *kc, Tc *vc, const Dest &d, int32_t *err, cudaStream_t s) {
    constexpr int V = sizeof(Ti) >= sizeof(Tc) ? vec16<Ti>() : vec16<Tc>();
    const auto ok = [](const void *p) { return p == nullptr || aligned16(p); };
    const bool vec = aligned16(qkv) && (g.nq == 0 || ok(q_out)) && ok(k_out) && ok(v_out) &&
                     aligned16(kc) && aligned16(vc) && g.qkv_stride % V == 0 && g.head_dim % V == 0 &&
                     (interleaved ? g.rotary_dim % V == 0 : g.half % V == 0);
    if (interleaved) {
        return vec ? rope_append_launch<Ti, Tc, V, V, true, true>(qkv, g, f, seq_ids, positions,
                                                                  q_out, k_out, v_out, kc, vc,
                                                                  d, err, s)
                   : rope_append_launch<Ti, Tc, 2, 1, false, true>(qkv, g, f, seq_ids, positions,
                                                                   q_out, k_out, v_out, kc, vc,
                                                                   d, err, s);
    }
    return vec ? rope_append_launch<Ti, Tc, V, V, true, false>(qkv, g, f, seq_ids, positions,
                                                               q_out, k_out, v_out, kc, vc, d,
                                                               err, s)
               : rope_append_launch<Ti, Tc, 1, 1, false, false>(qkv, g, f, seq_ids, positions,
                                                                q_out, k_out, v_out, kc, vc, d,
                                                                err, s);
}

// Checks shared by both fused launchers; fills g (all but the unit counts) and f.
inline bool rope_append_check(const void *qkv, int64_t qkv_stride, int64_t tokens,
                              int32_t q_heads, int32_t kv_heads, const fl_rope_params *p,
                              const int32_t *seq_ids, const int32_t *positions,
                              const void *q_out, const void *kc, const void *vc, int32_t batch,
                              RopeGeom *g, RopeFreq *f) {
    if (!rope_params_ok(p)) return false;
    if (tokens < 0 || q_heads < 0 || kv_heads < 1 || batch < 1) return false;
    const int64_t width = ((int64_t)q_heads + 2 * (int64_t)kv_heads) * p->head_dim;
    if (width > INT32_MAX || qkv_stride < width) return false;
    if (tokens > 0 && (!qkv || !seq_ids || !positions || !kc || !vc || (q_heads > 0 && !q_out)))
        return false;
    g->tokens = tokens;
    g->qkv_stride = qkv_stride;
    g->nq = q_heads;
    g->nkv = kv_heads;
    g->head_dim = p->head_dim;
    g->rotary_dim = p->rotary_dim;
    g->half = p->rotary_dim / 2;
    for (int i = 0; i < FL_ROPE_MAX_PAIRS; ++i) f->v[i] = i < g->half ? p->inv_freq[i] : 0.f;
    return true;
}

}  // namespace kv
}  // namespace fl

#define FL_KV_ROPE_DISPATCH(INTERLEAVED)                                                        \
    FL_DISPATCH_FLOAT(in_dtype, {                                                               \
        using in_t = scalar_t;                                                                  \
        FL_DISPATCH_FLOAT(cache_dtype,                                                          \
                          return fl::kv::rope_append<in_t, scalar_t>(                           \
                              static_cast<const in_t *>(qkv), g, INTERLEAVED, f, seq_ids,       \
                              positions, static_cast<in_t *>(q_out),                            \
                              static_cast<in_t *>(k_out), static_cast<in_t *>(v_out),           \
                              static_cast<scalar_t *>(k_cache),                                 \
                              static_cast<scalar_t *>(v_cache), d, err_flag,                    \
                              fl::as_stream(stream)));                                          \
    });                                                                                         \
    return FL_ERR_UNSUPPORTED_DTYPE;

extern "C" fl_status fl_kv_rope_append(fl_dtype in_dtype, const void *qkv, int64_t qkv_stride,
                                       int64_t tokens, int32_t q_heads, int32_t kv_heads,
                                       const fl_rope_params *params, const int32_t *seq_ids,
                                       const int32_t *positions, void *q_out, void *k_out,
                                       void *v_out, fl_dtype cache_dtype, void *k_cache,
                                       void *v_cache, int32_t batch, int64_t max_seq,
                                       int32_t *err_flag, fl_stream stream) {
    fl::kv::RopeGeom g{};
    fl::kv::RopeFreq f;
    if (!fl::kv::rope_append_check(qkv, qkv_stride, tokens, q_heads, kv_heads, params, seq_ids,
                                   positions, q_out, k_cache, v_cache, batch, &g, &f) ||
        max_seq < 1)
        return FL_ERR_INVALID_ARGUMENT;
    if (tokens == 0) return FL_OK;
    const fl::kv::Dest d{batch, max_seq, nullptr, 0, 0, 0};
    FL_KV_ROPE_DISPATCH(params->interleaved != 0)
}

extern "C" fl_status fl_kv_rope_append_paged(
    fl_dtype in_dtype, const void *qkv, int64_t qkv_stride, int64_t tokens, int32_t q_heads,
    int32_t kv_heads, const fl_rope_params *params, const int32_t *seq_ids,
    const int32_t *positions, void *q_out, void *k_out, void *v_out, const int32_t *block_table,
    int32_t batch, int32_t max_blocks_per_seq, fl_dtype cache_dtype, void *k_cache,
    void *v_cache, int64_t num_blocks, int32_t block_size, int32_t *err_flag, fl_stream stream) {
    fl::kv::RopeGeom g{};
    fl::kv::RopeFreq f;
    if (!fl::kv::rope_append_check(qkv, qkv_stride, tokens, q_heads, kv_heads, params, seq_ids,
                                   positions, q_out, k_cache, v_cache, batch, &g, &f) ||
        max_blocks_per_seq < 1 || num_blocks < 1 || block_size < 1 ||
        (tokens > 0 && !block_table))
        return FL_ERR_INVALID_ARGUMENT;
    if (tokens == 0) return FL_OK;
    const fl::kv::Dest d{batch, 0, block_table, max_blocks_per_seq, num_blocks, block_size};
    FL_KV_ROPE_DISPATCH(params->interleaved != 0)
}

// ---------------------------------------------------------------------------------------------
// Copy-on-write block copies (fl_kv_copy_blocks): whole blocks of a paged cache, raw words, one
// launch for all pairs of a step. A block is one row of row_words words; grid (pair, chunk, K or
// V) with fl::copy_row_chunk (4 words per thread, loads before stores), as embedding.cu's row
// gather. The dst-distinct / dst-not-a-src precondition is what makes CTAs independent.
// ---------------------------------------------------------------------------------------------
namespace fl {
namespace kv {

template <typename W>
__global__ void __launch_bounds__(256)
    copy_blocks_kernel(W *kc, W *vc, int64_t num_blocks, int64_t row_words,
                       const int32_t *__restrict__ pairs, int32_t *err) {
    const int64_t i = blockIdx.x;
    const int32_t src = __ldg(pairs + 2 * i);
    const int32_t dst = __ldg(pairs + 2 * i + 1);
    if (src < 0 || src >= num_blocks || dst < 0 || dst >= num_blocks) {
        if (err && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0)
            atomicOr(err, FL_KV_ERR_BLOCK);
        return;
    }
    W *cache = blockIdx.z == 0 ? kc : vc;
    copy_row_chunk<W>(cache + src * row_words, cache + dst * row_words, row_words);
}

}  // namespace kv
}  // namespace fl

extern "C" fl_status fl_kv_copy_blocks(fl_dtype dtype, void *k_cache, void *v_cache,
                                       int64_t num_blocks, int32_t kv_heads, int32_t block_size,
                                       int32_t head_dim, const int32_t *pairs, int32_t n,
                                       int32_t *err_flag, fl_stream stream) {
    int64_t elem = 0;
    switch (dtype) {
    case FL_DTYPE_F32:
    case FL_DTYPE_I32: elem = 4; break;
    case FL_DTYPE_F16:
    case FL_DTYPE_BF16: elem = 2; break;
    case FL_DTYPE_I8:
    case FL_DTYPE_U8: elem = 1; break;
    default: return FL_ERR_UNSUPPORTED_DTYPE;
    }
    if (num_blocks < 1 || kv_heads < 1 || block_size < 1 || head_dim < 1 || n < 0)
        return FL_ERR_INVALID_ARGUMENT;
    // kv_heads * block_size < 2^62, so only the last two products can overflow.
    const int64_t heads_slots = (int64_t)kv_heads * block_size;
    if (heads_slots > INT64_MAX / head_dim / elem) return FL_ERR_INVALID_ARGUMENT;
    const int64_t block_bytes = heads_slots * head_dim * elem;
    if (num_blocks > INT64_MAX / block_bytes) return FL_ERR_INVALID_ARGUMENT;
    if (n == 0) return FL_OK;
    if (!k_cache || !v_cache || !pairs) return FL_ERR_INVALID_ARGUMENT;
    const int wb = fl::row_word_bytes(k_cache, v_cache, block_bytes);
    const int64_t row_words = block_bytes / wb;
    dim3 grid, block;
    if (!fl::row_grid(n, row_words, &grid, &block)) return FL_ERR_INVALID_ARGUMENT;
    grid.z = 2;  // K and V
    cudaStream_t s = fl::as_stream(stream);
    FL_DISPATCH_WORD(wb, fl::kv::copy_blocks_kernel<word_t><<<grid, block, 0, s>>>(
                             static_cast<word_t *>(k_cache), static_cast<word_t *>(v_cache),
                             num_blocks, row_words, pairs, err_flag));
    return fl::launch_status();
}
