// Rotary position embedding (RoPE) of Q and K in place: angles computed on the fly or read
// from a precomputed cos/sin table; rotate-half (NeoX) or interleaved (GPT-J) pairing;
// partial rotary. Memory-bound.
//
// Work split: a thread owns one "unit" of a head (a fixed set of pairs: 16 bytes of the
// head's first half plus 16 bytes of its second half for rotate-half, 16 contiguous bytes for
// interleaved), so it loads its inverse frequencies once. Rows are (token, chunk of HPT heads):
// the thread computes the cos/sin of its pairs once per row and applies them to HPT heads,
// issuing all HPT heads' loads before any store. Q and K heads are one sequence of
// q_heads + kv_heads heads. blockDim = (units, rows per block); grid-stride over rows.
#include <algorithm>

#include "common/common.cuh"

namespace fl {
namespace rope {

struct Geometry {
    int64_t tokens;
    int64_t q_stride, k_stride;
    int32_t nq, nh;  // nh = q heads + kv heads
    int32_t head_dim, half;  // half = rotary_dim / 2
};

// Inverse frequencies, passed by value (kernel parameter space).
struct InvFreq {
    float v[FL_ROPE_MAX_PAIRS];
};

struct Table {
    const float *cos, *sin;
    int64_t max_pos;
};

// cos/sin of NP consecutive pairs starting at pair i0, computed: the f32 angle pos * inv
// (one rounded multiply, like Hugging Face), then accurate full-range sincosf.
template <int NP> struct ComputedAngles {
    float inv[NP];
    __device__ __forceinline__ ComputedAngles(const InvFreq &f, int i0, int /*half*/) {
#pragma unroll
        for (int m = 0; m < NP; ++m) inv[m] = f.v[i0 + m];
    }
    __device__ __forceinline__ bool valid(int pos) const { return pos >= 0; }
    __device__ __forceinline__ void get(int pos, float (&c)[NP], float (&s)[NP]) const {
        const float p = (float)pos;
#pragma unroll
        for (int m = 0; m < NP; ++m) sincosf(__fmul_rn(p, inv[m]), &s[m], &c[m]);
    }
};

// cos/sin of NP consecutive pairs read from the table (row pos, columns i0..i0+NP).
// The offset pos * half + i0 is a multiple of NP, so VEC loads are aligned when the table is.
template <int NP, bool VEC> struct TableAngles {
    const float *cos, *sin;
    int64_t max_pos;
    int half, i0;
    __device__ __forceinline__ TableAngles(const Table &t, int i0_, int half_)
        : cos(t.cos), sin(t.sin), max_pos(t.max_pos), half(half_), i0(i0_) {}
    __device__ __forceinline__ bool valid(int pos) const { return pos >= 0 && pos < max_pos; }
    __device__ __forceinline__ void get(int pos, float (&c)[NP], float (&s)[NP]) const {
        const int64_t off = (int64_t)pos * half + i0;
        if constexpr (VEC && NP % 4 == 0) {
#pragma unroll
            for (int m = 0; m < NP; m += 4) {
                const float4 a = __ldg(reinterpret_cast<const float4 *>(cos + off + m));
                const float4 b = __ldg(reinterpret_cast<const float4 *>(sin + off + m));
                c[m] = a.x; c[m + 1] = a.y; c[m + 2] = a.z; c[m + 3] = a.w;
                s[m] = b.x; s[m + 1] = b.y; s[m + 2] = b.z; s[m + 3] = b.w;
            }
        } else if constexpr (VEC && NP % 2 == 0) {
#pragma unroll
            for (int m = 0; m < NP; m += 2) {
                const float2 a = __ldg(reinterpret_cast<const float2 *>(cos + off + m));
                const float2 b = __ldg(reinterpret_cast<const float2 *>(sin + off + m));
                c[m] = a.x; c[m + 1] = a.y;
                s[m] = b.x; s[m + 1] = b.y;
            }
        } else {
#pragma unroll
            for (int m = 0; m < NP; ++m) {
                c[m] = __ldg(cos + off + m);
                s[m] = __ldg(sin + off + m);
            }
        }
    }
};

template <typename Src, int NP, bool VEC> struct AnglesOf;
template <int NP, bool VEC> struct AnglesOf<InvFreq, NP, VEC> { using type = ComputedAngles<NP>; };
template <int NP, bool VEC> struct AnglesOf<Table, NP, VEC> { using type = TableAngles<NP, VEC>; };

template <typename T, int V, bool VEC>
__device__ __forceinline__ Vec<T, V> load_unit(const T *p) {
    if constexpr (VEC) {
        return *reinterpret_cast<const Vec<T, V> *>(p);
    } else {
        Vec<T, V> r;
#pragma unroll
        for (int j = 0; j < V; ++j) r.v[j] = p[j];
        return r;
    }
}

template <typename T, int V, bool VEC>
__device__ __forceinline__ void store_unit(T *p, const Vec<T, V> &x) {
    if constexpr (VEC) {
        *reinterpret_cast<Vec<T, V> *>(p) = x;
    } else {
#pragma unroll
        for (int j = 0; j < V; ++j) p[j] = x.v[j];
    }
}

// One unit is V elements per half (rotate-half: pairs i0..i0+V, elements at i0 and half + i0)
// or V contiguous elements (interleaved: V / 2 pairs).
template <typename T, int V, bool VEC, bool INTERLEAVED, int HPT, typename Src>
__global__ void __launch_bounds__(256)
    rope_kernel(T *q, T *k, const int32_t *__restrict__ positions, const Geometry g,
                const Src src, int32_t *err) {
    constexpr int NP = INTERLEAVED ? V / 2 : V;
    using Angles = typename AnglesOf<Src, NP, VEC>::type;
    const int unit = threadIdx.x;
    const int e0 = unit * V;  // first element of the unit (the first half's, for rotate-half)
    const Angles angles(src, INTERLEAVED ? unit * NP : e0, g.half);

    const int64_t nchunks = (g.nh + HPT - 1) / HPT;
    const int64_t rows = g.tokens * nchunks;
    for (int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; row < rows;
         row += (int64_t)gridDim.x * blockDim.y) {
        const int64_t tok = row / nchunks;
        const int h0 = (int)(row - tok * nchunks) * HPT;
        T *ptr[HPT];
        Vec<T, V> a[HPT], b[HPT];
        // Loads first (they do not depend on the position), then the position.
#pragma unroll
        for (int j = 0; j < HPT; ++j) {
            const int h = h0 + j;
            ptr[j] = h >= g.nh ? nullptr
                     : h < g.nq ? q + tok * g.q_stride + (int64_t)h * g.head_dim + e0
                                : k + tok * g.k_stride + (int64_t)(h - g.nq) * g.head_dim + e0;
            if (ptr[j]) {
                a[j] = load_unit<T, V, VEC>(ptr[j]);
                if constexpr (!INTERLEAVED) b[j] = load_unit<T, V, VEC>(ptr[j] + g.half);
            }
        }
        const int pos = __ldg(positions + tok);
        if (!angles.valid(pos)) {
            if (err && unit == 0 && h0 == 0) atomicOr(err, FL_ROPE_ERR_POSITION);
            continue;
        }
        float c[NP], s[NP];
        angles.get(pos, c, s);
#pragma unroll
        for (int j = 0; j < HPT; ++j) {
            if (!ptr[j]) continue;
            if constexpr (INTERLEAVED) {
                Vec<T, V> r;
#pragma unroll
                for (int m = 0; m < NP; ++m) {
                    float y0, y1;
                    rope_rotate(to_f32(a[j].v[2 * m]), to_f32(a[j].v[2 * m + 1]), c[m], s[m], y0, y1);
                    r.v[2 * m] = from_f32<T>(y0);
                    r.v[2 * m + 1] = from_f32<T>(y1);
                }
                store_unit<T, V, VEC>(ptr[j], r);
            } else {
                Vec<T, V> ra, rb;
#pragma unroll
                for (int m = 0; m < NP; ++m) {
                    float y0, y1;
                    rope_rotate(to_f32(a[j].v[m]), to_f32(b[j].v[m]), c[m], s[m], y0, y1);
                    ra.v[m] = from_f32<T>(y0);
                    rb.v[m] = from_f32<T>(y1);
                }
                store_unit<T, V, VEC>(ptr[j], ra);
                store_unit<T, V, VEC>(ptr[j] + g.half, rb);
            }
        }
    }
}

template <typename T, int V, bool VEC, bool INTERLEAVED, typename Src>
fl_status launch_units(T *q, T *k, const int32_t *positions, const Geometry &g, const Src &src,
                       int32_t *err, cudaStream_t s) {
    const int units = INTERLEAVED ? 2 * g.half / V : g.half / V;
    const int rows_per_block = units >= 256 ? 1 : 256 / units;
    const dim3 block(units, rows_per_block);
    // Several heads per row once there are plenty of threads: cos/sin are then computed (or
    // read) once for HPT heads, and HPT heads' loads are in flight together.
    const int64_t threads1 = g.tokens * g.nh * (int64_t)units;
    if (threads1 >= (1 << 20)) {
        constexpr int HPT = 4;
        const int64_t rows = g.tokens * ((g.nh + HPT - 1) / HPT);
        const unsigned grid = (unsigned)std::min<int64_t>(ceil_div(rows, rows_per_block), 1 << 20);
        rope_kernel<T, V, VEC, INTERLEAVED, HPT, Src><<<grid, block, 0, s>>>(q, k, positions, g, src, err);
    } else {
        const int64_t rows = g.tokens * g.nh;
        const unsigned grid = (unsigned)std::min<int64_t>(ceil_div(rows, rows_per_block), 1 << 20);
        rope_kernel<T, V, VEC, INTERLEAVED, 1, Src><<<grid, block, 0, s>>>(q, k, positions, g, src, err);
    }
    return launch_status();
}

template <typename T, typename Src>
fl_status apply(T *q, T *k, const int32_t *positions, const Geometry &g, bool interleaved,
                const Src &src, bool table_aligned, int32_t *err, cudaStream_t s) {
    constexpr int V = vec16<T>();
    const int rotary_dim = 2 * g.half;
    const bool vec = table_aligned && (g.nq == 0 || aligned16(q)) && (g.nh == g.nq || aligned16(k)) &&
                     g.q_stride % V == 0 && g.k_stride % V == 0 && g.head_dim % V == 0 &&
                     (interleaved ? rotary_dim % V == 0 : g.half % V == 0);
    if (interleaved) {
        return vec ? launch_units<T, V, true, true>(q, k, positions, g, src, err, s)
                   : launch_units<T, 2, false, true>(q, k, positions, g, src, err, s);
    }
    return vec ? launch_units<T, V, true, false>(q, k, positions, g, src, err, s)
               : launch_units<T, 1, false, false>(q, k, positions, g, src, err, s);
}

__global__ void build_table_kernel(const InvFreq f, int half, int64_t max_pos, float *cos,
                                   float *sin) {
    __shared__ float inv[FL_ROPE_MAX_PAIRS];
    for (int i = threadIdx.x; i < half; i += blockDim.x) inv[i] = f.v[i];
    __syncthreads();
    const int64_t n = max_pos * half;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t p = idx / half;
        const int i = (int)(idx - p * half);
        float sv, cv;
        sincosf(__fmul_rn((float)p, inv[i]), &sv, &cv);
        cos[idx] = cv;
        sin[idx] = sv;
    }
}

// Checks the params and the sizes shared by both apply launchers; fills g.
inline bool check_args(const void *q, const void *k, const int32_t *positions, int64_t tokens,
                       int32_t q_heads, int32_t kv_heads, int64_t q_stride, int64_t k_stride,
                       const fl_rope_params *p, Geometry *g) {
    if (!rope_params_ok(p)) return false;
    if (tokens < 0 || q_heads < 0 || kv_heads < 0) return false;
    if (q_stride < (int64_t)q_heads * p->head_dim || k_stride < (int64_t)kv_heads * p->head_dim)
        return false;
    if (tokens > 0 && (!positions || (q_heads > 0 && !q) || (kv_heads > 0 && !k))) return false;
    if ((int64_t)q_heads + kv_heads > INT32_MAX) return false;
    g->tokens = tokens;
    g->q_stride = q_stride;
    g->k_stride = k_stride;
    g->nq = q_heads;
    g->nh = q_heads + kv_heads;
    g->head_dim = p->head_dim;
    g->half = p->rotary_dim / 2;
    return true;
}

inline InvFreq inv_freq_of(const fl_rope_params *p) {
    InvFreq f;
    for (int i = 0; i < FL_ROPE_MAX_PAIRS; ++i) f.v[i] = i < p->rotary_dim / 2 ? p->inv_freq[i] : 0.f;
    return f;
}

}  // namespace rope
}  // namespace fl

extern "C" fl_status fl_rope_apply(fl_dtype dtype, void *q, void *k, const int32_t *positions,
                                   int64_t tokens, int32_t q_heads, int32_t kv_heads,
                                   int64_t q_stride, int64_t k_stride,
                                   const fl_rope_params *params, int32_t *err_flag,
                                   fl_stream stream) {
    fl::rope::Geometry g;
    if (!fl::rope::check_args(q, k, positions, tokens, q_heads, kv_heads, q_stride, k_stride,
                              params, &g))
        return FL_ERR_INVALID_ARGUMENT;
    if (tokens == 0 || g.nh == 0) return FL_OK;
    const fl::rope::InvFreq f = fl::rope::inv_freq_of(params);
    FL_DISPATCH_FLOAT(dtype, return fl::rope::apply<scalar_t>(
                                 static_cast<scalar_t *>(q), static_cast<scalar_t *>(k),
                                 positions, g, params->interleaved != 0, f, true, err_flag,
                                 fl::as_stream(stream)));
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_rope_apply_table(fl_dtype dtype, void *q, void *k,
                                         const int32_t *positions, int64_t tokens,
                                         int32_t q_heads, int32_t kv_heads, int64_t q_stride,
                                         int64_t k_stride, const fl_rope_params *params,
                                         const float *cos_table, const float *sin_table,
                                         int64_t max_pos, int32_t *err_flag, fl_stream stream) {
    fl::rope::Geometry g;
    if (!fl::rope::check_args(q, k, positions, tokens, q_heads, kv_heads, q_stride, k_stride,
                              params, &g))
        return FL_ERR_INVALID_ARGUMENT;
    if (!cos_table || !sin_table || max_pos < 1) return FL_ERR_INVALID_ARGUMENT;
    if (tokens == 0 || g.nh == 0) return FL_OK;
    const fl::rope::Table t{cos_table, sin_table, max_pos};
    const bool aligned = fl::aligned16(cos_table) && fl::aligned16(sin_table);
    FL_DISPATCH_FLOAT(dtype, return fl::rope::apply<scalar_t>(
                                 static_cast<scalar_t *>(q), static_cast<scalar_t *>(k),
                                 positions, g, params->interleaved != 0, t, aligned, err_flag,
                                 fl::as_stream(stream)));
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_rope_build_table(const fl_rope_params *params, int64_t max_pos,
                                         float *cos_table, float *sin_table, fl_stream stream) {
    if (!params || params->rotary_dim < 2 || params->rotary_dim % 2 != 0 ||
        params->rotary_dim / 2 > FL_ROPE_MAX_PAIRS || max_pos < 1 || max_pos > (1LL << 31) ||
        !cos_table || !sin_table)
        return FL_ERR_INVALID_ARGUMENT;
    const int half = params->rotary_dim / 2;
    const fl::rope::InvFreq f = fl::rope::inv_freq_of(params);
    constexpr int threads = 256;
    fl::rope::build_table_kernel<<<fl::grid_for(max_pos * half, threads), threads, 0,
                                   fl::as_stream(stream)>>>(f, half, max_pos, cos_table,
                                                            sin_table);
    return fl::launch_status();
}
