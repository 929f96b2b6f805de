// INT8 W8A8 (FasterLLaMA v1.0 / FasterTransformer 3.0): per-token activation quantisation
// fused into the kernels that produce the activations, and the int32 outputs of the int8
// GEMMs dequantised inside the kernels that consume them. Activations f16 / bf16, math in f32.
//
// The quantisation rule (every *_quant launcher; fl_quant.h, "Quantisation rule"):
//     amax = max_i |v_i|,  scale = amax / 127,  inv = amax > 0 ? min(127 / amax, FLT_MAX) : 0,
//     q_i = rint(clamp(v_i * inv, -127, 127))        (round half to even, __float2int_rn)
// or, with a calibrated per-tensor amax A (FasterTransformer 3.0's static scales), the same
// formulas with amax = A for every row: no absmax reduction, values beyond A saturate.
// Dequantisation of a GEMM output: deq = (f32(acc) * act_scale[token]) * weight_scale[channel],
// two rounded f32 multiplies in that order.
//
// Row kernels (every *_quant launcher: the LLaMA decoder's RMSNorm / SwiGLU ones and the BERT
// encoder's LayerNorm / GELU ones): one CTA per token row; the whole row's values live in
// registers between the reductions (sum or sum of squares, variance, absmax) and the int8
// write when the row length is a multiple of 8 and the pointers are 16-byte aligned (8
// elements per access: 16 B of f16/bf16, 32 B of int32, 8 B of int8), up to 512 threads x 8
// chunks x 8 = 32768 elements per row. Otherwise a scalar path re-reads the row (from L1/L2)
// for each pass, with the same arithmetic.
#include <cfloat>
#include <cmath>

#include "common/common.cuh"
#include "common/gelu.cuh"

namespace fl {
namespace quant {

constexpr float kQMax = 127.f;
constexpr int kChunk = 8;  // elements per vector access of the row kernels

struct RowScale {
    float scale, inv;
};

__device__ __forceinline__ RowScale row_scale(float amax) {
    RowScale r;
    r.scale = amax / kQMax;  // IEEE division (the build does not use fast math)
    r.inv = amax > 0.f ? fminf(kQMax / amax, FLT_MAX) : 0.f;
    return r;
}

__device__ __forceinline__ int8_t quantize(float v, float inv) {
    const float x = fminf(fmaxf(__fmul_rn(v, inv), -kQMax), kQMax);
    return (int8_t)__float2int_rn(x);
}

__device__ __forceinline__ float deq(int32_t acc, float sa, float sw) {
    return __fmul_rn(__fmul_rn(__int2float_rn(acc), sa), sw);
}

// silu(g) * u, accurate expf and IEEE division; e^-g = inf for g << 0 gives -0 (never NaN).
__device__ __forceinline__ float silu_mul(float g, float u) {
    return __fmul_rn(g / (1.f + expf(-g)), u);
}

// Host and device: the launchers call it. (A __device__-only function called from host code
// in a template compiles without a diagnostic, and cudafe gives its host copy the body
// `exit(1)`: the process would end silently at the first launch that reached it.)
__host__ __device__ __forceinline__ bool aligned8(const void *p) {
    return (reinterpret_cast<uintptr_t>(p) & 7u) == 0;
}

// ------------------------------------------------------------------ row kernels
// What a row kernel quantises (v, f32) and which dtype tensor it also writes.
enum class RowKind {
    Quant,                 // v = f32(x)
    RmsQuant,              // v = RMSNorm(f32(x))
    DeqAddRmsQuant,        // residual = T(residual + deq), v = RMSNorm(f32(residual))
    DeqSiluQuant,          // v = silu(deq(gate)) * deq(up)
    LnQuant,               // v = LayerNorm(f32(x)), y = T(v) when y is given
    DeqBiasAddLnQuant,     // v = LayerNorm(f32(residual) + (deq + bias)), residual = T(v)
    DeqBiasGeluTanhQuant,  // v = gelu_tanh(deq + bias)
    DeqBiasGeluErfQuant,   // v = gelu_erf(deq + bias)
};

template <RowKind K> constexpr bool is_rms() {
    return K == RowKind::RmsQuant || K == RowKind::DeqAddRmsQuant;
}
template <RowKind K> constexpr bool is_ln() {
    return K == RowKind::LnQuant || K == RowKind::DeqBiasAddLnQuant;
}
template <RowKind K> constexpr bool is_norm() { return is_rms<K>() || is_ln<K>(); }
template <RowKind K> constexpr bool is_gelu() {
    return K == RowKind::DeqBiasGeluTanhQuant || K == RowKind::DeqBiasGeluErfQuant;
}
template <RowKind K> constexpr bool reads_x() {
    return K == RowKind::Quant || K == RowKind::RmsQuant || K == RowKind::LnQuant;
}
template <RowKind K> constexpr bool is_deq() { return !reads_x<K>(); }
// Kinds with a calibrated-amax launcher (the encoder's); the others compile only CAL = false.
template <RowKind K> constexpr bool has_calibrated() {
    return K == RowKind::Quant || is_ln<K>() || is_gelu<K>();
}
// Kinds whose dtype row (residual) is read and overwritten.
template <RowKind K> constexpr bool has_residual() {
    return K == RowKind::DeqAddRmsQuant || K == RowKind::DeqBiasAddLnQuant;
}

template <typename T> struct RowArgs {
    const T *x;              // Quant, RmsQuant, LnQuant: [rows, width]
    const int32_t *acc;      // Deq*: [rows, width] (DeqSilu: [rows, 2 * width], gate | up)
    const float *act_scale;  // Deq*: [rows]
    const float *w_scale;    // Deq*: [width] (DeqSilu: [2 * width])
    const T *bias;           // DeqBiasAddLn, DeqBiasGelu*: GEMM bias [width], may be null
    T *residual;             // DeqAddRms, DeqBiasAddLn: [rows, width], read and overwritten
    const T *w;              // norm kinds: [width]
    const T *b;              // Ln kinds: LayerNorm bias [width], may be null
    T *y;                    // LnQuant: [rows, width], may be null
    const float *amax;       // calibrated per-tensor amax (one f32); null: per-token scales
    int8_t *q;               // [rows, width]
    float *scale;            // [rows]
    int64_t rows, width;
    float eps;
};

// The dtype row an Ln kind writes its normalised values to (LnQuant: y, may be null).
template <RowKind K, typename T> __device__ __forceinline__ T *ln_out(const RowArgs<T> &a) {
    return K == RowKind::LnQuant ? a.y : a.residual;
}

using I4 = Vec<int32_t, 4>;
using F4 = Vec<float, 4>;

// Loads 8 int32 and their 8 weight scales (two 16-byte accesses each) and dequantises.
__device__ __forceinline__ void deq8(const int32_t *acc, const float *sw, float sa, float (&d)[8]) {
    const I4 a0 = reinterpret_cast<const I4 *>(acc)[0], a1 = reinterpret_cast<const I4 *>(acc)[1];
    const F4 s0 = reinterpret_cast<const F4 *>(sw)[0], s1 = reinterpret_cast<const F4 *>(sw)[1];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        d[j] = deq(a0.v[j], sa, s0.v[j]);
        d[4 + j] = deq(a1.v[j], sa, s1.v[j]);
    }
}

template <RowKind K> __device__ __forceinline__ float gelu_of(float x) {
    if constexpr (K == RowKind::DeqBiasGeluTanhQuant) return gelu_tanh(x);
    else return gelu_erf(x);
}

// The pre-norm values of chunk c (elements 8c..8c+7) of a row; DeqAddRms writes the new
// residual T(residual + deq) and returns it as f32.
template <RowKind K, typename T>
__device__ __forceinline__ void load_chunk(const RowArgs<T> &a, int64_t row, int64_t c, float sa,
                                           float (&v)[kChunk]) {
    using V = Vec<T, kChunk>;
    const int64_t off = row * a.width + c * kChunk;
    if constexpr (reads_x<K>()) {
        const V x = *reinterpret_cast<const V *>(a.x + off);
#pragma unroll
        for (int j = 0; j < kChunk; ++j) v[j] = to_f32(x.v[j]);
    } else if constexpr (K == RowKind::DeqAddRmsQuant) {
        float d[8];
        deq8(a.acc + off, a.w_scale + c * kChunk, sa, d);
        V *rp = reinterpret_cast<V *>(a.residual + off);
        const V r = *rp;
        V o;
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
            o.v[j] = from_f32<T>(to_f32(r.v[j]) + d[j]);
            v[j] = to_f32(o.v[j]);
        }
        *rp = o;
    } else if constexpr (K == RowKind::DeqSiluQuant) {
        const int64_t goff = row * 2 * a.width + c * kChunk;
        float g[8], u[8];
        deq8(a.acc + goff, a.w_scale + c * kChunk, sa, g);
        deq8(a.acc + goff + a.width, a.w_scale + a.width + c * kChunk, sa, u);
#pragma unroll
        for (int j = 0; j < kChunk; ++j) v[j] = silu_mul(g[j], u[j]);
    } else {  // DeqBiasAddLn, DeqBiasGelu*: deq + bias first
        deq8(a.acc + off, a.w_scale + c * kChunk, sa, v);
        if (a.bias) {
            const V bv = reinterpret_cast<const V *>(a.bias)[c];
#pragma unroll
            for (int j = 0; j < kChunk; ++j) v[j] = __fadd_rn(v[j], to_f32(bv.v[j]));
        }
        if constexpr (K == RowKind::DeqBiasAddLnQuant) {
            const V r = *reinterpret_cast<const V *>(a.residual + off);
#pragma unroll
            for (int j = 0; j < kChunk; ++j) v[j] = __fadd_rn(to_f32(r.v[j]), v[j]);
        } else {
#pragma unroll
            for (int j = 0; j < kChunk; ++j) v[j] = gelu_of<K>(v[j]);
        }
    }
}

// The normalised values: RMSNorm (x * rstd) * w; LayerNorm fma((x - mean) * rstd, w, b)
// (b = 0 without a bias), each step one rounded f32 operation.
__device__ __forceinline__ float rms_apply(float x, float rstd, float w) {
    return __fmul_rn(__fmul_rn(x, rstd), w);
}
__device__ __forceinline__ float ln_apply(float x, float mean, float rstd, float w, float b) {
    return __fmaf_rn(__fmul_rn(__fsub_rn(x, mean), rstd), w, b);
}

// Largest block of the register path with VPT chunks per thread: 1024 threads (64 registers)
// up to 2 chunks, 512 (128 registers) for 4 and 8 chunks, so that the row never spills.
template <int VPT> constexpr int max_threads() { return VPT <= 2 ? 1024 : 512; }
constexpr int kMaxVpt = 8;

// Register path: VPT chunks of 8 per thread, one block per row (grid-stride over rows).
// CAL: scales from the calibrated amax (no absmax reduction).
template <RowKind K, typename T, int VPT, bool CAL>
__global__ void __launch_bounds__(max_threads<VPT>()) row_vec_kernel(RowArgs<T> a) {
    using V = Vec<T, kChunk>;
    using Q = Vec<int8_t, kChunk>;
    __shared__ float scratch[32];
    const int64_t nvec = a.width / kChunk;
    const float inv_w = 1.f / (float)a.width;
    float amax_cal = 0.f;
    if constexpr (CAL) amax_cal = *a.amax;
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        float sa = 0.f;
        if constexpr (is_deq<K>()) sa = a.act_scale[row];
        float v[VPT][kChunk];
        float s1 = 0.f;  // RMSNorm: sum of squares; LayerNorm: sum
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int64_t c = threadIdx.x + (int64_t)k * blockDim.x;
            if (c < nvec) {
                load_chunk<K, T>(a, row, c, sa, v[k]);
#pragma unroll
                for (int j = 0; j < kChunk; ++j) {
                    if constexpr (is_rms<K>()) s1 += v[k][j] * v[k][j];
                    if constexpr (is_ln<K>()) s1 += v[k][j];
                }
            }
        }
        if constexpr (is_rms<K>()) {
            const float rstd = rsqrtf(block_sum(s1, scratch) * inv_w + a.eps);
#pragma unroll
            for (int k = 0; k < VPT; ++k) {
                const int64_t c = threadIdx.x + (int64_t)k * blockDim.x;
                if (c < nvec) {
                    const V wk = reinterpret_cast<const V *>(a.w)[c];
#pragma unroll
                    for (int j = 0; j < kChunk; ++j)
                        v[k][j] = rms_apply(v[k][j], rstd, to_f32(wk.v[j]));
                }
            }
        }
        if constexpr (is_ln<K>()) {
            const float mean = block_sum(s1, scratch) * inv_w;
            float s2 = 0.f;
#pragma unroll
            for (int k = 0; k < VPT; ++k) {
                if (threadIdx.x + (int64_t)k * blockDim.x < nvec) {
#pragma unroll
                    for (int j = 0; j < kChunk; ++j) {
                        const float d = __fsub_rn(v[k][j], mean);
                        s2 += d * d;
                    }
                }
            }
            const float rstd = rsqrtf(block_sum(s2, scratch) * inv_w + a.eps);
            T *out = ln_out<K, T>(a);
#pragma unroll
            for (int k = 0; k < VPT; ++k) {
                const int64_t c = threadIdx.x + (int64_t)k * blockDim.x;
                if (c < nvec) {
                    const V wk = reinterpret_cast<const V *>(a.w)[c];
                    float bk[kChunk];
                    if (a.b) {
                        const V bv = reinterpret_cast<const V *>(a.b)[c];
#pragma unroll
                        for (int j = 0; j < kChunk; ++j) bk[j] = to_f32(bv.v[j]);
                    } else {
#pragma unroll
                        for (int j = 0; j < kChunk; ++j) bk[j] = 0.f;
                    }
                    V o;
#pragma unroll
                    for (int j = 0; j < kChunk; ++j) {
                        v[k][j] = ln_apply(v[k][j], mean, rstd, to_f32(wk.v[j]), bk[j]);
                        o.v[j] = from_f32<T>(v[k][j]);
                    }
                    if (out) reinterpret_cast<V *>(out + row * a.width)[c] = o;
                }
            }
        }
        float m = amax_cal;
        if constexpr (!CAL) {
#pragma unroll
            for (int k = 0; k < VPT; ++k) {
                if (threadIdx.x + (int64_t)k * blockDim.x < nvec) {
#pragma unroll
                    for (int j = 0; j < kChunk; ++j) m = fmaxf(m, fabsf(v[k][j]));
                }
            }
            m = block_max(m, scratch);
        }
        const RowScale rs = row_scale(m);
        Q *qrow = reinterpret_cast<Q *>(a.q + row * a.width);
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int64_t c = threadIdx.x + (int64_t)k * blockDim.x;
            if (c < nvec) {
                Q o;
#pragma unroll
                for (int j = 0; j < kChunk; ++j) o.v[j] = quantize(v[k][j], rs.inv);
                qrow[c] = o;
            }
        }
        if (threadIdx.x == 0) a.scale[row] = rs.scale;
    }
}

// Scalar path: element i of a row, first pass (DeqAddRms writes the new residual).
template <RowKind K, typename T>
__device__ __forceinline__ float value_first(const RowArgs<T> &a, int64_t row, int64_t i, float sa) {
    const int64_t off = row * a.width + i;
    if constexpr (reads_x<K>()) {
        return to_f32(a.x[off]);
    } else if constexpr (K == RowKind::DeqAddRmsQuant) {
        const T r = from_f32<T>(to_f32(a.residual[off]) + deq(a.acc[off], sa, a.w_scale[i]));
        a.residual[off] = r;
        return to_f32(r);
    } else if constexpr (K == RowKind::DeqSiluQuant) {
        const int64_t g = row * 2 * a.width + i;
        return silu_mul(deq(a.acc[g], sa, a.w_scale[i]),
                        deq(a.acc[g + a.width], sa, a.w_scale[a.width + i]));
    } else {
        float d = deq(a.acc[off], sa, a.w_scale[i]);
        if (a.bias) d = __fadd_rn(d, to_f32(a.bias[i]));
        if constexpr (K == RowKind::DeqBiasAddLnQuant) return __fadd_rn(to_f32(a.residual[off]), d);
        else return gelu_of<K>(d);
    }
}

// Scalar path: element i again in a later pass (the same value, nothing written). Each
// element is revisited by the thread that wrote it, so no barrier is needed.
template <RowKind K, typename T>
__device__ __forceinline__ float value_again(const RowArgs<T> &a, int64_t row, int64_t i, float sa) {
    if constexpr (K == RowKind::DeqAddRmsQuant) {
        return to_f32(a.residual[row * a.width + i]);
    } else {
        return value_first<K, T>(a, row, i, sa);
    }
}

// Scalar path: the value element i is quantised from (normalised for the norm kinds).
template <RowKind K, typename T>
__device__ __forceinline__ float value_final(const RowArgs<T> &a, int64_t row, int64_t i, float sa,
                                             float mean, float rstd) {
    const float x = value_again<K, T>(a, row, i, sa);
    if constexpr (is_rms<K>()) return rms_apply(x, rstd, to_f32(a.w[i]));
    else if constexpr (is_ln<K>())
        return ln_apply(x, mean, rstd, to_f32(a.w[i]), a.b ? to_f32(a.b[i]) : 0.f);
    else return x;
}

template <RowKind K, typename T, bool CAL> __global__ void row_generic_kernel(RowArgs<T> a) {
    __shared__ float scratch[32];
    const int64_t W = a.width;
    const float inv_w = 1.f / (float)W;
    float amax_cal = 0.f;
    if constexpr (CAL) amax_cal = *a.amax;
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        float sa = 0.f;
        if constexpr (is_deq<K>()) sa = a.act_scale[row];
        float mean = 0.f, rstd = 1.f;
        if constexpr (is_norm<K>()) {
            float s1 = 0.f;
            for (int64_t i = threadIdx.x; i < W; i += blockDim.x) {
                const float v = value_first<K, T>(a, row, i, sa);
                s1 += is_rms<K>() ? v * v : v;
            }
            if constexpr (is_rms<K>()) {
                rstd = rsqrtf(block_sum(s1, scratch) * inv_w + a.eps);
            } else {
                mean = block_sum(s1, scratch) * inv_w;
                float s2 = 0.f;
                for (int64_t i = threadIdx.x; i < W; i += blockDim.x) {
                    const float d = __fsub_rn(value_again<K, T>(a, row, i, sa), mean);
                    s2 += d * d;
                }
                rstd = rsqrtf(block_sum(s2, scratch) * inv_w + a.eps);
            }
        }
        float m = amax_cal;
        if constexpr (!CAL) {
            for (int64_t i = threadIdx.x; i < W; i += blockDim.x)
                m = fmaxf(m, fabsf(value_final<K, T>(a, row, i, sa, mean, rstd)));
            m = block_max(m, scratch);
        }
        const RowScale rs = row_scale(m);
        for (int64_t i = threadIdx.x; i < W; i += blockDim.x) {
            const float v = value_final<K, T>(a, row, i, sa, mean, rstd);
            a.q[row * W + i] = quantize(v, rs.inv);
            if constexpr (is_ln<K>()) {
                // Written last: the passes above re-read the residual.
                T *out = ln_out<K, T>(a);
                if (out) out[row * W + i] = from_f32<T>(v);
            }
        }
        if (threadIdx.x == 0) a.scale[row] = rs.scale;
    }
}

inline unsigned rows_grid(int64_t rows) {
    const int64_t cap = 65535LL * 32;  // a grid-stride loop covers the rest
    return (unsigned)(rows < 1 ? 1 : (rows > cap ? cap : rows));
}

template <RowKind K, typename T, bool CAL>
fl_status row_launch_cal(const RowArgs<T> &a, cudaStream_t s) {
    auto ok16 = [](const void *p) { return !p || aligned16(p); };
    const bool vec_ok = a.width % kChunk == 0 && ok16(a.x) && ok16(a.acc) && ok16(a.w_scale) &&
                        ok16(a.bias) && ok16(a.residual) && ok16(a.w) && ok16(a.b) &&
                        ok16(a.y) && aligned8(a.q);
    const int64_t nvec = a.width / kChunk;
    if (vec_ok && nvec <= (int64_t)kMaxVpt * max_threads<kMaxVpt>()) {
        // Few rows: spread a row over up to 1024 threads (latency). Many rows: about 256
        // threads per row and more chunks each, so that several blocks share an SM.
        const int64_t target = a.rows >= 1024 ? 256 : 1024;
        auto cap = [](int v) -> int64_t { return v <= 2 ? 1024 : 512; };
        int vpt = 1;
        while (vpt < kMaxVpt && (ceil_div(nvec, vpt) > target || ceil_div(nvec, vpt) > cap(vpt)))
            vpt *= 2;
        const int threads = (int)(ceil_div(ceil_div(nvec, vpt), 32) * 32);
        const unsigned grid = rows_grid(a.rows);
        switch (vpt) {
        case 1: row_vec_kernel<K, T, 1, CAL><<<grid, threads, 0, s>>>(a); break;
        case 2: row_vec_kernel<K, T, 2, CAL><<<grid, threads, 0, s>>>(a); break;
        case 4: row_vec_kernel<K, T, 4, CAL><<<grid, threads, 0, s>>>(a); break;
        default: row_vec_kernel<K, T, 8, CAL><<<grid, threads, 0, s>>>(a); break;
        }
        return launch_status();
    }
    const int64_t want = ceil_div(ceil_div(a.width, 8), 32) * 32;
    const int threads = (int)(want < 64 ? 64 : (want > 1024 ? 1024 : want));
    row_generic_kernel<K, T, CAL><<<rows_grid(a.rows), threads, 0, s>>>(a);
    return launch_status();
}

template <RowKind K, typename T> fl_status row_launch(const RowArgs<T> &a, cudaStream_t s) {
    if constexpr (has_calibrated<K>()) {
        if (a.amax) return row_launch_cal<K, T, true>(a, s);
    } else {
        if (a.amax) return FL_ERR_INVALID_ARGUMENT;
    }
    return row_launch_cal<K, T, false>(a, s);
}

// ------------------------------------------------------------------ dequant + add
// residual[t, j] = T(residual[t, j] + deq(acc[t, j], act_scale[t], w_scale[j])).
template <typename T>
__global__ void deq_add_vec_kernel(const int32_t *__restrict__ acc, const float *__restrict__ sa,
                                   const float *__restrict__ sw, T *__restrict__ res, int64_t rows,
                                   int64_t width) {
    using V = Vec<T, kChunk>;
    const int64_t per_row = width / kChunk, total = rows * per_row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / per_row, c = i - row * per_row;
        const int64_t off = row * width + c * kChunk;
        float d[8];
        deq8(acc + off, sw + c * kChunk, sa[row], d);
        V *rp = reinterpret_cast<V *>(res + off);
        const V r = *rp;
        V o;
#pragma unroll
        for (int j = 0; j < kChunk; ++j) o.v[j] = from_f32<T>(to_f32(r.v[j]) + d[j]);
        *rp = o;
    }
}

template <typename T>
__global__ void deq_add_scalar_kernel(const int32_t *__restrict__ acc, const float *__restrict__ sa,
                                      const float *__restrict__ sw, T *__restrict__ res,
                                      int64_t rows, int64_t width) {
    const int64_t total = rows * width;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / width, j = i - row * width;
        res[i] = from_f32<T>(to_f32(res[i]) + deq(acc[i], sa[row], sw[j]));
    }
}

template <typename T>
fl_status deq_add(const int32_t *acc, const float *sa, const float *sw, T *res, int64_t rows,
                  int64_t width, cudaStream_t s) {
    constexpr int threads = 256;
    if (width % kChunk == 0 && aligned16(acc) && aligned16(sw) && aligned16(res)) {
        deq_add_vec_kernel<T><<<grid_for(rows * (width / kChunk), threads), threads, 0, s>>>(
            acc, sa, sw, res, rows, width);
    } else {
        deq_add_scalar_kernel<T><<<grid_for(rows * width, threads), threads, 0, s>>>(
            acc, sa, sw, res, rows, width);
    }
    return launch_status();
}

// ------------------------------------------------------------------ dequantise (+ bias)
// out[t, j] = T(deq(acc[t, j], act_scale[t], w_scale[j]) + f32(bias[j])) (no bias: T(deq)).
// deq ends in __fmul_rn, so the add is never contracted into an FMA.
template <typename T, bool B>
__global__ void deq_vec_kernel(const int32_t *__restrict__ acc, const float *__restrict__ sa,
                               const float *__restrict__ sw, const T *__restrict__ bias,
                               T *__restrict__ out, int64_t rows, int64_t width) {
    using V = Vec<T, kChunk>;
    const int64_t per_row = width / kChunk, total = rows * per_row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / per_row, c = i - row * per_row;
        const int64_t off = row * width + c * kChunk;
        float d[8];
        deq8(acc + off, sw + c * kChunk, sa[row], d);
        V o;
        if constexpr (B) {
            const V b = reinterpret_cast<const V *>(bias)[c];
#pragma unroll
            for (int j = 0; j < kChunk; ++j) o.v[j] = from_f32<T>(d[j] + to_f32(b.v[j]));
        } else {
#pragma unroll
            for (int j = 0; j < kChunk; ++j) o.v[j] = from_f32<T>(d[j]);
        }
        *reinterpret_cast<V *>(out + off) = o;
    }
}

template <typename T, bool B>
__global__ void deq_scalar_kernel(const int32_t *__restrict__ acc, const float *__restrict__ sa,
                                  const float *__restrict__ sw, const T *__restrict__ bias,
                                  T *__restrict__ out, int64_t rows, int64_t width) {
    const int64_t total = rows * width;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / width, j = i - row * width;
        const float d = deq(acc[i], sa[row], sw[j]);
        out[i] = from_f32<T>(B ? d + to_f32(bias[j]) : d);
    }
}

template <typename T, bool B>
fl_status dequantize_launch(const int32_t *acc, const float *sa, const float *sw, const T *bias,
                            T *out, int64_t rows, int64_t width, cudaStream_t s) {
    constexpr int threads = 256;
    if (width % kChunk == 0 && aligned16(acc) && aligned16(sw) && aligned16(out) &&
        (!B || aligned16(bias))) {
        deq_vec_kernel<T, B><<<grid_for(rows * (width / kChunk), threads), threads, 0, s>>>(
            acc, sa, sw, bias, out, rows, width);
    } else {
        deq_scalar_kernel<T, B><<<grid_for(rows * width, threads), threads, 0, s>>>(
            acc, sa, sw, bias, out, rows, width);
    }
    return launch_status();
}

template <typename T>
fl_status dequantize(const int32_t *acc, const float *sa, const float *sw, const T *bias, T *out,
                     int64_t rows, int64_t width, cudaStream_t s) {
    return bias ? dequantize_launch<T, true>(acc, sa, sw, bias, out, rows, width, s)
                : dequantize_launch<T, false>(acc, sa, sw, bias, out, rows, width, s);
}

// ------------------------------------------------------------------ dequant + RoPE
// The input row of a token is (q_heads + 2 kv_heads) heads of head_dim: q heads, k heads, v
// heads. A thread owns VP consecutive "slots" of one head: in a q or k head, slot s < half is
// the rotated pair (s, s + half) and slot s >= half the unrotated element s + half (partial
// rotary); in a v head slot s is element s. VP = 4 (16-byte int32 / f32 accesses, 8-byte
// output) when half and head_dim are multiples of 4 and the pointers allow, else 1.
struct RopeGeo {
    int64_t tokens;
    int64_t row_w;  // (nrot + nv) * d
    int32_t nrot;   // q_heads + kv_heads (rotated heads)
    int32_t nv;     // kv_heads (v heads)
    int32_t d, half;
};

struct InvFreqArg {
    float v[FL_ROPE_MAX_PAIRS];
};

template <typename T, int VP>
__global__ void __launch_bounds__(256)
    deq_rope_kernel(const int32_t *__restrict__ acc, const float *__restrict__ sa,
                    const float *__restrict__ sw, const int32_t *__restrict__ pos,
                    T *__restrict__ out, const RopeGeo g, const InvFreqArg f) {
    __shared__ float inv[FL_ROPE_MAX_PAIRS];
    for (int i = threadIdx.x; i < g.half; i += blockDim.x) inv[i] = f.v[i];
    __syncthreads();
    using IV = Vec<int32_t, VP>;
    using FV = Vec<float, VP>;
    using OV = Vec<T, VP>;
    const int sr = (g.d - g.half) / VP;  // units of a rotated head
    const int sv = g.d / VP;             // units of a v head
    const int64_t rot_units = (int64_t)g.nrot * sr;
    const int64_t per_tok = rot_units + (int64_t)g.nv * sv;
    const int64_t total = g.tokens * per_tok;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / per_tok;
        int64_t r = idx - t * per_tok;
        const int64_t base = t * g.row_w;
        const float s_a = sa[t];
        int64_t col;  // first column of this unit (of its first half, for a pair)
        bool pair = false;
        int s = 0;
        if (r < rot_units) {
            const int h = (int)(r / sr);
            s = (int)(r - (int64_t)h * sr) * VP;
            pair = s < g.half;
            col = (int64_t)h * g.d + (pair ? s : s + g.half);
        } else {
            r -= rot_units;
            const int h = (int)(r / sv);
            col = (int64_t)g.nrot * g.d + (int64_t)h * g.d + (int64_t)(r - (int64_t)h * sv) * VP;
        }
        const IV a0 = *reinterpret_cast<const IV *>(acc + base + col);
        const FV w0 = *reinterpret_cast<const FV *>(sw + col);
        if (pair) {
            const int64_t col1 = col + g.half;
            const IV a1 = *reinterpret_cast<const IV *>(acc + base + col1);
            const FV w1 = *reinterpret_cast<const FV *>(sw + col1);
            const float p = (float)pos[t];
            OV o0, o1;
#pragma unroll
            for (int m = 0; m < VP; ++m) {
                float sn, cs;
                sincosf(__fmul_rn(p, inv[s + m]), &sn, &cs);
                const float x0 = deq(a0.v[m], s_a, w0.v[m]), x1 = deq(a1.v[m], s_a, w1.v[m]);
                float y0, y1;
                rope_rotate(x0, x1, cs, sn, y0, y1);
                o0.v[m] = from_f32<T>(y0);
                o1.v[m] = from_f32<T>(y1);
            }
            *reinterpret_cast<OV *>(out + base + col) = o0;
            *reinterpret_cast<OV *>(out + base + col1) = o1;
        } else {
            OV o;
#pragma unroll
            for (int m = 0; m < VP; ++m) o.v[m] = from_f32<T>(deq(a0.v[m], s_a, w0.v[m]));
            *reinterpret_cast<OV *>(out + base + col) = o;
        }
    }
}

template <typename T>
fl_status deq_rope(const int32_t *acc, const float *sa, const float *sw, const int32_t *pos, T *out,
                   const RopeGeo &g, const InvFreqArg &f, cudaStream_t s) {
    constexpr int threads = 256;
    const bool vec = g.half % 4 == 0 && g.d % 4 == 0 && aligned16(acc) && aligned16(sw) &&
                     aligned8(out);
    const int vp = vec ? 4 : 1;
    const int64_t units = g.tokens * ((int64_t)g.nrot * ((g.d - g.half) / vp) + (int64_t)g.nv * (g.d / vp));
    if (units == 0) return FL_OK;
    if (vec) {
        deq_rope_kernel<T, 4><<<grid_for(units, threads), threads, 0, s>>>(acc, sa, sw, pos, out, g, f);
    } else {
        deq_rope_kernel<T, 1><<<grid_for(units, threads), threads, 0, s>>>(acc, sa, sw, pos, out, g, f);
    }
    return launch_status();
}

}  // namespace quant
}  // namespace fl

// Dispatch on a 16-bit float dtype (the W8A8 activations): runs BODY with `scalar_t`.
#define FL_DISPATCH_HALF(DTYPE, ...)                                                           \
    switch (DTYPE) {                                                                           \
    case FL_DTYPE_F16: { using scalar_t = __half; __VA_ARGS__; break; }                        \
    case FL_DTYPE_BF16: { using scalar_t = __nv_bfloat16; __VA_ARGS__; break; }                \
    default: return FL_ERR_UNSUPPORTED_DTYPE;                                                  \
    }

namespace {

bool bad_eps(float eps) { return !(eps > 0.f) || !std::isfinite(eps); }

// The pointers of one row-kernel launch (those a kind does not use stay null).
struct RowPtrs {
    const void *x = nullptr;
    const int32_t *acc = nullptr;
    const float *act_scale = nullptr;
    const float *w_scale = nullptr;
    const void *bias = nullptr;
    void *residual = nullptr;
    const void *w = nullptr;
    const void *b = nullptr;
    void *y = nullptr;
    const float *amax = nullptr;
    int8_t *q = nullptr;
    float *scale = nullptr;
};

template <fl::quant::RowKind K>
fl_status row_entry(fl_dtype dtype, const RowPtrs &p, int64_t rows, int64_t width, float eps,
                    fl_stream stream) {
    namespace fq = fl::quant;
    if (rows < 0 || width < 1) return FL_ERR_INVALID_ARGUMENT;
    if (rows > 0 && width > INT64_MAX / rows) return FL_ERR_INVALID_ARGUMENT;
    if (fq::is_norm<K>() && bad_eps(eps)) return FL_ERR_INVALID_ARGUMENT;
    if (rows == 0) return FL_OK;
    if (!p.q || !p.scale) return FL_ERR_INVALID_ARGUMENT;
    if (fq::reads_x<K>() && !p.x) return FL_ERR_INVALID_ARGUMENT;
    if (fq::is_norm<K>() && !p.w) return FL_ERR_INVALID_ARGUMENT;
    if (fq::is_deq<K>() && (!p.acc || !p.act_scale || !p.w_scale)) return FL_ERR_INVALID_ARGUMENT;
    if (fq::has_residual<K>() && !p.residual) return FL_ERR_INVALID_ARGUMENT;
    FL_DISPATCH_HALF(dtype, {
        fq::RowArgs<scalar_t> a;
        a.x = static_cast<const scalar_t *>(p.x);
        a.acc = p.acc;
        a.act_scale = p.act_scale;
        a.w_scale = p.w_scale;
        a.bias = static_cast<const scalar_t *>(p.bias);
        a.residual = static_cast<scalar_t *>(p.residual);
        a.w = static_cast<const scalar_t *>(p.w);
        a.b = static_cast<const scalar_t *>(p.b);
        a.y = static_cast<scalar_t *>(p.y);
        a.amax = p.amax;
        a.q = p.q;
        a.scale = p.scale;
        a.rows = rows;
        a.width = width;
        a.eps = eps;
        return fq::row_launch<K, scalar_t>(a, fl::as_stream(stream));
    });
    return FL_ERR_UNSUPPORTED_DTYPE;
}

}  // namespace

extern "C" fl_status fl_quantize_per_token(fl_dtype dtype, const void *x, int8_t *q, float *scale,
                                           int64_t tokens, int64_t width, fl_stream stream) {
    RowPtrs p;
    p.x = x;
    p.q = q;
    p.scale = scale;
    return row_entry<fl::quant::RowKind::Quant>(dtype, p, tokens, width, 1.f, stream);
}

extern "C" fl_status fl_quantize_calibrated(fl_dtype dtype, const void *x, const float *amax,
                                            int8_t *q, float *scale, int64_t tokens,
                                            int64_t width, fl_stream stream) {
    if (tokens != 0 && !amax) return FL_ERR_INVALID_ARGUMENT;
    RowPtrs p;
    p.x = x;
    p.amax = amax;
    p.q = q;
    p.scale = scale;
    return row_entry<fl::quant::RowKind::Quant>(dtype, p, tokens, width, 1.f, stream);
}

extern "C" fl_status fl_rms_norm_quant(fl_dtype dtype, const void *x, const void *weight, int8_t *q,
                                       float *scale, int64_t tokens, int64_t hidden, float eps,
                                       fl_stream stream) {
    RowPtrs p;
    p.x = x;
    p.w = weight;
    p.q = q;
    p.scale = scale;
    return row_entry<fl::quant::RowKind::RmsQuant>(dtype, p, tokens, hidden, eps, stream);
}

extern "C" fl_status fl_dequant_add_rms_norm_quant(fl_dtype dtype, const int32_t *acc,
                                                   const float *act_scale,
                                                   const float *weight_scale, void *residual,
                                                   const void *weight, int8_t *q, float *scale,
                                                   int64_t tokens, int64_t hidden, float eps,
                                                   fl_stream stream) {
    RowPtrs p;
    p.acc = acc;
    p.act_scale = act_scale;
    p.w_scale = weight_scale;
    p.residual = residual;
    p.w = weight;
    p.q = q;
    p.scale = scale;
    return row_entry<fl::quant::RowKind::DeqAddRmsQuant>(dtype, p, tokens, hidden, eps, stream);
}

extern "C" fl_status fl_dequant_silu_mul_quant(const int32_t *acc, const float *act_scale,
                                               const float *weight_scale, int8_t *q, float *scale,
                                               int64_t tokens, int64_t inter, fl_stream stream) {
    if (inter > INT64_MAX / 2) return FL_ERR_INVALID_ARGUMENT;
    RowPtrs p;
    p.acc = acc;
    p.act_scale = act_scale;
    p.w_scale = weight_scale;
    p.q = q;
    p.scale = scale;
    // No activation dtype is involved (int32 in, int8 out); the f16 instantiation is used.
    return row_entry<fl::quant::RowKind::DeqSiluQuant>(FL_DTYPE_F16, p, tokens, inter, 1.f,
                                                       stream);
}

extern "C" fl_status fl_layer_norm_quant(fl_dtype dtype, const void *x, const void *weight,
                                         const void *bias, void *y, int8_t *q, float *scale,
                                         const float *amax, int64_t tokens, int64_t hidden,
                                         float eps, fl_stream stream) {
    RowPtrs p;
    p.x = x;
    p.w = weight;
    p.b = bias;
    p.y = y;
    p.amax = amax;
    p.q = q;
    p.scale = scale;
    return row_entry<fl::quant::RowKind::LnQuant>(dtype, p, tokens, hidden, eps, stream);
}

extern "C" fl_status fl_dequant_bias_add_layer_norm_quant(
    fl_dtype dtype, const int32_t *acc, const float *act_scale, const float *weight_scale,
    const void *bias, void *residual, const void *ln_weight, const void *ln_bias, int8_t *q,
    float *scale, const float *amax, int64_t tokens, int64_t hidden, float eps, fl_stream stream) {
    RowPtrs p;
    p.acc = acc;
    p.act_scale = act_scale;
    p.w_scale = weight_scale;
    p.bias = bias;
    p.residual = residual;
    p.w = ln_weight;
    p.b = ln_bias;
    p.amax = amax;
    p.q = q;
    p.scale = scale;
    return row_entry<fl::quant::RowKind::DeqBiasAddLnQuant>(dtype, p, tokens, hidden, eps,
                                                            stream);
}

extern "C" fl_status fl_dequant_bias_gelu_quant(fl_dtype dtype, const int32_t *acc,
                                                const float *act_scale, const float *weight_scale,
                                                const void *bias, fl_gelu_kind kind, int8_t *q,
                                                float *scale, const float *amax, int64_t tokens,
                                                int64_t width, fl_stream stream) {
    using fl::quant::RowKind;
    RowPtrs p;
    p.acc = acc;
    p.act_scale = act_scale;
    p.w_scale = weight_scale;
    p.bias = bias;
    p.amax = amax;
    p.q = q;
    p.scale = scale;
    switch (kind) {
    case FL_GELU_TANH:
        return row_entry<RowKind::DeqBiasGeluTanhQuant>(dtype, p, tokens, width, 1.f, stream);
    case FL_GELU_ERF:
        return row_entry<RowKind::DeqBiasGeluErfQuant>(dtype, p, tokens, width, 1.f, stream);
    default: return FL_ERR_INVALID_ARGUMENT;
    }
}

extern "C" fl_status fl_dequant_add(fl_dtype dtype, const int32_t *acc, const float *act_scale,
                                    const float *weight_scale, void *residual, int64_t tokens,
                                    int64_t width, fl_stream stream) {
    if (tokens < 0 || width < 1) return FL_ERR_INVALID_ARGUMENT;
    if (tokens == 0) return FL_OK;
    if (!acc || !act_scale || !weight_scale || !residual) return FL_ERR_INVALID_ARGUMENT;
    FL_DISPATCH_HALF(dtype, return fl::quant::deq_add<scalar_t>(
                                acc, act_scale, weight_scale, static_cast<scalar_t *>(residual),
                                tokens, width, fl::as_stream(stream)));
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_dequant_rope(fl_dtype dtype, const int32_t *acc, const float *act_scale,
                                     const float *weight_scale, const int32_t *positions,
                                     void *out, int64_t tokens, int32_t q_heads, int32_t kv_heads,
                                     const fl_rope_params *params, fl_stream stream) {
    if (tokens < 0 || q_heads < 0 || kv_heads < 0 || !params) return FL_ERR_INVALID_ARGUMENT;
    const int32_t d = params->head_dim, rot = params->rotary_dim;
    if (d < 1 || rot < 2 || rot % 2 != 0 || rot > d || rot / 2 > FL_ROPE_MAX_PAIRS ||
        params->interleaved != 0)
        return FL_ERR_INVALID_ARGUMENT;
    const int64_t heads = (int64_t)q_heads + 2 * (int64_t)kv_heads;
    if ((int64_t)q_heads + kv_heads > INT32_MAX) return FL_ERR_INVALID_ARGUMENT;
    if (heads < 1 || heads * d > INT64_MAX / (tokens > 0 ? tokens : 1)) return FL_ERR_INVALID_ARGUMENT;
    if (tokens == 0) return FL_OK;
    if (!acc || !act_scale || !weight_scale || !positions || !out) return FL_ERR_INVALID_ARGUMENT;
    fl::quant::RopeGeo g;
    g.tokens = tokens;
    g.row_w = heads * d;
    g.nrot = q_heads + kv_heads;
    g.nv = kv_heads;
    g.d = d;
    g.half = rot / 2;
    fl::quant::InvFreqArg f;
    for (int i = 0; i < FL_ROPE_MAX_PAIRS; ++i) f.v[i] = i < g.half ? params->inv_freq[i] : 0.f;
    FL_DISPATCH_HALF(dtype, return fl::quant::deq_rope<scalar_t>(
                                acc, act_scale, weight_scale, positions,
                                static_cast<scalar_t *>(out), g, f, fl::as_stream(stream)));
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_dequantize(fl_dtype dtype, const int32_t *acc, const float *act_scale,
                                   const float *weight_scale, const void *bias, void *out,
                                   int64_t tokens, int64_t width, fl_stream stream) {
    if (tokens < 0 || width < 1) return FL_ERR_INVALID_ARGUMENT;
    if (tokens > 0 && width > INT64_MAX / tokens) return FL_ERR_INVALID_ARGUMENT;
    if (tokens == 0) return FL_OK;
    if (!acc || !act_scale || !weight_scale || !out) return FL_ERR_INVALID_ARGUMENT;
    FL_DISPATCH_HALF(dtype, return fl::quant::dequantize<scalar_t>(
                                acc, act_scale, weight_scale, static_cast<const scalar_t *>(bias),
                                static_cast<scalar_t *>(out), tokens, width, fl::as_stream(stream)));
    return FL_ERR_UNSUPPORTED_DTYPE;
}
