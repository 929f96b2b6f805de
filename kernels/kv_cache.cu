// KV-cache append: this step's packed K and V rows scattered into a contiguous
// [batch, kv_heads, max_seq, head_dim] cache or a paged (vLLM-style) [num_blocks, kv_heads,
// block_size, head_dim] cache, with dtype conversion. Memory-bound copy.
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
