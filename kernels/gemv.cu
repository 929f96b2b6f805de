// Weight-only quantised GEMV/GEMM for decode: y[m, n] = x[m, k] . W^T, W [n, k] stored
// quantised (int8 per channel, int4 group-wise symmetric or with zero point, llama.cpp Q8_0
// and Q4_0 blocks), x and y f16/bf16, m = 1..16, f32 accumulation, weights dequantised in
// registers only.
//
// Layout of the work: one warp per output row (4 warps per CTA). The warp walks its row in
// tiles of whole "units" (16 int8 values, 32 int4 values, one 32-value GGUF block); each
// tile's bytes are copied global -> shared memory with cp.async (16 bytes per lane per copy,
// fully coalesced, bypassing L1, no registers held while in flight: ~4 KB per warp in
// flight), then each lane dequantises whole units from shared memory and multiplies them with
// the m rows of x (read with 16-byte __ldg loads, L1-resident). GGUF blocks (34 and 18 bytes)
// are only 2-byte aligned: the tile is copied from the 16-byte word below its first byte and
// the lanes read their block through aligned 32-bit words and funnel shifts.
//
// Dequantisation uses exact float tricks instead of int->float conversions (which issue at
// 1/4 rate): a byte b placed in the mantissa of 2^23 (PRMT) is 2^23 + b; a nibble masked in
// place at bit 4c is 2^23 + q * 16^c as long as the nibble lies inside the 23-bit mantissa,
// i.e. c <= 4 (bits 0..19; a nibble at bits 20..23 would set bit 23, the exponent's low bit).
// Nibbles 0..4 of a word are masked in place, nibbles 5..7 from w >> 20 (c = 0..2). So one
// LOP3 + one FADD give (q - z) * 16^c exactly, and the 16^c is taken out once per unit (the
// products of each c go to their own accumulator). Per int4 value: LOP3 + FADD once, then one
// FFMA (+ the x conversion) per token. The unpacking is __host__ __device__ so that a host
// test runs the very same code (fl_gemv_unpack_unit_host).
#include <cstring>

#include "common/common.cuh"

namespace fl {
namespace gemv {

constexpr int kWarps = 4;               // warps (= output rows) per CTA
constexpr float kMagic = 8388608.0f;    // 2^23

enum Fmt : int { I8 = FL_GEMV_INT8, I4 = FL_GEMV_INT4, I4Z = FL_GEMV_INT4_ZP, Q80 = FL_GEMV_Q8_0, Q40 = FL_GEMV_Q4_0 };

// Values and bytes of one unit (the piece one lane dequantises at once).
__host__ __device__ constexpr int unit_values(int f) { return f == I8 ? 16 : 32; }
__host__ __device__ constexpr int unit_bytes(int f) { return f == Q80 ? 34 : f == Q40 ? 18 : 16; }
// Units per lane per tile: tiles of ~4 KB per warp.
__host__ __device__ constexpr int units_per_lane(int f) { return f == Q80 ? 4 : 8; }
__host__ __device__ constexpr int tile_units(int f) { return 32 * units_per_lane(f); }
// Tile bytes + 32: up to 15 bytes of lead-in (copy starts at the 16-byte word below) and the
// read-ahead of the last block's aligned words.
__host__ __device__ constexpr int tile_slot_bytes(int f) { return tile_units(f) * unit_bytes(f) + 32; }
// Per-unit (scale, zero) of int4, staged next to the tile.
__host__ __device__ constexpr int scale_slot_bytes(int f) {
    return (f == I4 || f == I4Z) ? tile_units(f) * 8 : 0;
}
__host__ __device__ constexpr int warp_slot_bytes(int f) { return tile_slot_bytes(f) + scale_slot_bytes(f); }
static_assert(tile_slot_bytes(I8) % 16 == 0 && tile_slot_bytes(I4) % 16 == 0 &&
                  tile_slot_bytes(Q80) % 16 == 0 && tile_slot_bytes(Q40) % 16 == 0,
              "warp slots must keep 16-byte alignment");

// Accumulator class of value e of a unit: nibble formats keep one accumulator per power
// 16^c (c = 0..kNibClasses-1) their values are scaled by; byte formats use 4 (for ILP only).
// Nibble i of a 32-bit word is read in place for i < 5 (bits 4i..4i+3 <= bit 19, inside the
// f32 mantissa) and from w >> 20 for i >= 5 (classes 0..2).
constexpr int kNibClasses = 5;
__host__ __device__ constexpr int nib_class(int bit_nibble) { return bit_nibble < 5 ? bit_nibble : bit_nibble - 5; }
template <int F> __host__ __device__ constexpr int value_class(int e) {
    return F == I8 || F == Q80 ? (e & 3)
         : (F == I4 || F == I4Z) ? nib_class(e & 7)
         : (e < 16 ? nib_class(2 * (e & 3)) : nib_class(2 * ((e - 16) & 3) + 1));
}
template <int F> __host__ __device__ constexpr bool is_nibble() { return F == I4 || F == I4Z || F == Q40; }

// ---------------------------------------------------------------- small device helpers
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Two 16-bit floats of a 32-bit word as f32 (low half first).
template <typename T> __device__ __forceinline__ float2 widen2(uint32_t w);
template <> __device__ __forceinline__ float2 widen2<__half>(uint32_t w) {
    __half2 h;
    memcpy(&h, &w, 4);
    return __half22float2(h);
}
template <> __device__ __forceinline__ float2 widen2<__nv_bfloat16>(uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// 8 consecutive x values (16 bytes, 16-byte aligned) as f32.
template <typename T> __device__ __forceinline__ void load_x8(const T *p, float *f) {
    const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 t = widen2<T>(w[j]);
        f[2 * j] = t.x;
        f[2 * j + 1] = t.y;
    }
}

// 2^23 + byte b of w (b compile-time), as a float: PRMT into the mantissa of 2^23.
template <int B> __device__ __forceinline__ float byte_magic(uint32_t w) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, B | (4 << 4) | (5 << 8) | (7 << 12)));
}
// The f32 with bit pattern u, on the device and on the host.
__host__ __device__ __forceinline__ float bits_to_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}
// 2^23 + q * 16^nib_class(I) for nibble I (bits 4I..4I+3) of w; hi = w >> 20. The masked
// nibble always lies in bits 0..19, inside the mantissa of 2^23 (exponent bits untouched).
template <int I> __host__ __device__ __forceinline__ float nib_magic(uint32_t w, uint32_t hi) {
    static_assert(I >= 0 && I < 8, "nibble index");
    return I < 5 ? bits_to_f32((w & (0xFu << (4 * I))) | 0x4B000000u)
                 : bits_to_f32((hi & (0xFu << (4 * (I - 5)))) | 0x4B000000u);
}

// The 32 values of a nibble unit (4 words: int4 or the quants of a Q4_0 block), in value
// order, as f[e] = (nib_e - z) * 16^value_class<F>(e), exactly; z = 8 for Q4_0.
//  int4: word c, nibble i -> value 8c + i (low nibble of a byte first).
//  Q4_0: word c, byte b: low nibble -> value 4c + b, high nibble -> value 16 + 4c + b.
template <int F>
__host__ __device__ __forceinline__ void deq_nibbles(const uint32_t *q, float z, float (&f)[32]) {
    float o[kNibClasses];
#pragma unroll
    for (int c = 0; c < kNibClasses; ++c) o[c] = z * (float)(1 << (4 * c)) + kMagic;  // exact
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const uint32_t w = q[c], hi = w >> 20;
        const float n0 = nib_magic<0>(w, hi) - o[nib_class(0)];
        const float n1 = nib_magic<1>(w, hi) - o[nib_class(1)];
        const float n2 = nib_magic<2>(w, hi) - o[nib_class(2)];
        const float n3 = nib_magic<3>(w, hi) - o[nib_class(3)];
        const float n4 = nib_magic<4>(w, hi) - o[nib_class(4)];
        const float n5 = nib_magic<5>(w, hi) - o[nib_class(5)];
        const float n6 = nib_magic<6>(w, hi) - o[nib_class(6)];
        const float n7 = nib_magic<7>(w, hi) - o[nib_class(7)];
        if constexpr (F == Q40) {
            f[4 * c + 0] = n0, f[16 + 4 * c + 0] = n1;
            f[4 * c + 1] = n2, f[16 + 4 * c + 1] = n3;
            f[4 * c + 2] = n4, f[16 + 4 * c + 2] = n5;
            f[4 * c + 3] = n6, f[16 + 4 * c + 3] = n7;
        } else {
            f[8 * c + 0] = n0, f[8 * c + 1] = n1, f[8 * c + 2] = n2, f[8 * c + 3] = n3;
            f[8 * c + 4] = n4, f[8 * c + 5] = n5, f[8 * c + 6] = n6, f[8 * c + 7] = n7;
        }
    }
}

// sum_c a[c] * 16^-c (c < kNibClasses): undoes the per-class scaling of deq_nibbles (the
// multiplications by 1/16 are exact).
__host__ __device__ __forceinline__ float combine_classes(const float *a) {
    float s = a[kNibClasses - 1];
#pragma unroll
    for (int c = kNibClasses - 2; c >= 0; --c) s = fmaf(s, 0.0625f, a[c]);
    return s;
}

// 16 signed bytes (4 words) -> 16 exact floats.
__device__ __forceinline__ void deq_bytes(const uint32_t *q, float *f, int nwords) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        if (c < nwords) {
            const uint32_t w = q[c] ^ 0x80808080u;  // signed -> offset binary
            f[4 * c + 0] = byte_magic<0>(w) - (kMagic + 128.f);
            f[4 * c + 1] = byte_magic<1>(w) - (kMagic + 128.f);
            f[4 * c + 2] = byte_magic<2>(w) - (kMagic + 128.f);
            f[4 * c + 3] = byte_magic<3>(w) - (kMagic + 128.f);
        }
    }
}

// ---------------------------------------------------------------- one unit
// acc[t] += us * sum_e f[e] * x[t][e] for t < m, f[e] scaled by 16^value_class(e) for
// nibble formats (undone here, exactly).
template <int F, typename T, int M, int NV>
__device__ __forceinline__ void dot_tokens(const float (&f)[NV], const T *__restrict__ xr,
                                           int64_t k, int m, float us, float (&acc)[M]) {
#pragma unroll
    for (int t = 0; t < M; ++t) {
        if (t < m) {
            float xf[NV];
#pragma unroll
            for (int v = 0; v < NV / 8; ++v) load_x8<T>(xr + (int64_t)t * k + 8 * v, xf + 8 * v);
            float a[kNibClasses] = {};
#pragma unroll
            for (int e = 0; e < NV; ++e) a[value_class<F>(e)] = fmaf(f[e], xf[e], a[value_class<F>(e)]);
            float s;
            if (is_nibble<F>()) {
                s = combine_classes(a);
            } else {
                s = (a[0] + a[1]) + (a[2] + a[3]);
            }
            acc[t] = fmaf(us, s, acc[t]);
        }
    }
}

// Unit j of the tile in shared memory (byte offset `off` from the slot start).
template <int F, typename T, int M>
__device__ __forceinline__ void unit(const uint8_t *slot, int off, const float2 *sz,
                                     int j, const T *__restrict__ xr, int64_t k, int m,
                                     float (&acc)[M]) {
    if constexpr (F == I8) {
        const uint4 v = *reinterpret_cast<const uint4 *>(slot + off);
        const uint32_t q[4] = {v.x, v.y, v.z, v.w};
        float f[16];
        deq_bytes(q, f, 4);
        dot_tokens<F, T, M, 16>(f, xr, k, m, 1.f, acc);
    } else if constexpr (F == I4 || F == I4Z) {
        const uint4 v = *reinterpret_cast<const uint4 *>(slot + off);
        const uint32_t q[4] = {v.x, v.y, v.z, v.w};
        const float2 s = sz[j];  // (scale, zero)
        float f[32];
        deq_nibbles<F>(q, s.y, f);
        dot_tokens<F, T, M, 32>(f, xr, k, m, s.x, acc);
    } else {
        // GGUF block at `off` (2-byte aligned): f16 d, then the quants.
        constexpr int QB = F == Q80 ? 32 : 16;      // quant bytes
        constexpr int NW = QB / 4;                  // quant words
        const float d = __half2float(*reinterpret_cast<const __half *>(slot + off));
        const int oq = off + 2;
        const uint32_t *sw = reinterpret_cast<const uint32_t *>(slot + (oq & ~3));
        const unsigned sh = (unsigned)(oq & 3) * 8u;  // 0 or 16
        uint32_t wd[NW + 1];
#pragma unroll
        for (int i = 0; i <= NW; ++i) wd[i] = sw[i];
        uint32_t q[NW];
#pragma unroll
        for (int i = 0; i < NW; ++i) q[i] = __funnelshift_r(wd[i], wd[i + 1], sh);
        float f[32];
        if constexpr (F == Q80) {
            deq_bytes(q, f, 8);
        } else {
            // Byte i of the quants: value i (low nibble) and value i + 16 (high nibble).
            deq_nibbles<F>(q, 8.f, f);
        }
        dot_tokens<F, T, M, 32>(f, xr, k, m, d, acc);
    }
}

// ---------------------------------------------------------------- the kernel
// grid.x = ceil(n / kWarps), block = 32 * kWarps, dynamic smem = kWarps * warp_slot_bytes(F).
template <int F, typename T, int M>
__global__ void __launch_bounds__(kWarps * 32)
gemv_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, const void *__restrict__ scales,
            const uint8_t *__restrict__ zeros, T *__restrict__ y, int m, int64_t n, int64_t k,
            int group) {
    extern __shared__ uint4 smem_raw[];
    constexpr int UV = unit_values(F), UB = unit_bytes(F), TU = tile_units(F), UPL = units_per_lane(F);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * kWarps + warp;
    if (row >= n) return;  // whole warps only; no block-wide barrier below
    uint8_t *slot = reinterpret_cast<uint8_t *>(smem_raw) + warp * warp_slot_bytes(F);
    float2 *sz = reinterpret_cast<float2 *>(slot + tile_slot_bytes(F));

    const int64_t units = k / UV;
    const int64_t row_bytes = units * UB;
    const int64_t total = n * row_bytes;
    const int64_t groups = (F == I4 || F == I4Z) ? k / group : 0;

    float acc[M];
#pragma unroll
    for (int t = 0; t < M; ++t) acc[t] = 0.f;

    for (int64_t u0 = 0; u0 < units; u0 += TU) {
        const int nu = (int)(units - u0 < TU ? units - u0 : TU);
        // Copy bytes [a, a + nu * UB) of w, from the 16-byte word below a.
        const int64_t a = row * row_bytes + u0 * UB;
        const int64_t wa = a >> 4, wb = (a + (int64_t)nu * UB + 15) >> 4;
        const int delta = (int)(a & 15);
        for (int64_t wi = wa + lane; wi < wb; wi += 32) {
            const int64_t left = total - 16 * wi;  // > 0: word wi starts inside w
            cp_async16(slot + 16 * (wi - wa), w + 16 * wi, left >= 16 ? 16 : (int)left);
        }
        if constexpr (F == I4 || F == I4Z) {
            // This lane's (scale, zero) per unit, in flight with the copies.
            float sc[UPL], zc[UPL];
            const __half *sh = static_cast<const __half *>(scales);
#pragma unroll
            for (int i = 0; i < UPL; ++i) {
                const int j = lane + 32 * i;
                sc[i] = 0.f;
                zc[i] = 8.f;
                if (j < nu) {
                    const int64_t g = row * groups + ((u0 + j) * UV) / group;
                    sc[i] = __half2float(__ldg(sh + g));
                    if (F == I4Z) zc[i] = (float)__ldg(zeros + g);
                }
            }
#pragma unroll
            for (int i = 0; i < UPL; ++i) {
                const int j = lane + 32 * i;
                if (j < nu) sz[j] = make_float2(sc[i], zc[i]);
            }
        }
        cp_async_wait_all();
        __syncwarp();
        for (int j = lane; j < nu; j += 32)
            unit<F, T, M>(slot, delta + j * UB, sz, j, x + (u0 + j) * UV, k, m, acc);
        __syncwarp();  // the next tile's copies overwrite the slot
    }

    float rs = 1.f;
    if constexpr (F == I8) rs = __ldg(static_cast<const float *>(scales) + row);
#pragma unroll
    for (int t = 0; t < M; ++t) {
        const float v = warp_sum(acc[t]);
        if (t < m && lane == t) y[(int64_t)t * n + row] = from_f32<T>(v * rs);
    }
}

template <int F, typename T, int M>
fl_status launch_m(const T *x, const uint8_t *w, const void *scales, const uint8_t *zeros, T *y,
                   int m, int64_t n, int64_t k, int group, cudaStream_t s) {
    const int64_t blocks = ceil_div(n, kWarps);
    const size_t smem = (size_t)kWarps * warp_slot_bytes(F);
    gemv_kernel<F, T, M><<<(unsigned)blocks, kWarps * 32, smem, s>>>(x, w, scales, zeros, y, m, n, k,
                                                                     group);
    return launch_status();
}

template <int F, typename T>
fl_status launch(const void *x, const void *w, const void *scales, const void *zeros, void *y,
                 int m, int64_t n, int64_t k, int group, cudaStream_t s) {
    const T *xt = static_cast<const T *>(x);
    const uint8_t *wt = static_cast<const uint8_t *>(w), *zt = static_cast<const uint8_t *>(zeros);
    T *yt = static_cast<T *>(y);
    if (m <= 1) return launch_m<F, T, 1>(xt, wt, scales, zt, yt, m, n, k, group, s);
    if (m <= 2) return launch_m<F, T, 2>(xt, wt, scales, zt, yt, m, n, k, group, s);
    if (m <= 4) return launch_m<F, T, 4>(xt, wt, scales, zt, yt, m, n, k, group, s);
    if (m <= 8) return launch_m<F, T, 8>(xt, wt, scales, zt, yt, m, n, k, group, s);
    return launch_m<F, T, 16>(xt, wt, scales, zt, yt, m, n, k, group, s);
}

// Host run of the nibble unpacking of one unit (see fl_gemv_unpack_unit_host).
template <int F> void unpack_unit_host(const uint8_t *quants, float z, float *out) {
    uint32_t q[4];
    std::memcpy(q, quants, 16);  // little-endian words, as the kernel reads them
    float f[32];
    deq_nibbles<F>(q, z, f);
    for (int e = 0; e < 32; ++e) out[e] = f[e] * (1.f / (float)(1 << (4 * value_class<F>(e))));
}

// ---------------------------------------------------------------- dequantise (prefill)
// Past FL_GEMV_MAX_M tokens the weight is dequantised once into a dense buffer and a tensor-core
// GEMM reads it. One thread per unit (16 int8 values, 32 int4 values, one 32-value GGUF block);
// units never straddle rows (k is a multiple of 32). The per-unit code is __host__ __device__:
// fl_gemv_dequantize_host runs the very same code on the CPU for the CPU tests.

// The 16 bytes at p (16-byte aligned on the device: int8 and int4 units).
__host__ __device__ __forceinline__ void load_unit16(const uint8_t *p, uint8_t (&b)[16]) {
#ifdef __CUDA_ARCH__
    const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 16; ++i) b[i] = (uint8_t)(w[i / 4] >> (8 * (i % 4)));
#else
    std::memcpy(b, p, 16);
#endif
}

// NB bytes at p, which is only 2-byte aligned (GGUF blocks): 16-bit loads on the device.
template <int NB>
__host__ __device__ __forceinline__ void load_unit_a2(const uint8_t *p, uint8_t (&b)[NB]) {
    static_assert(NB % 2 == 0, "GGUF blocks have an even size");
#ifdef __CUDA_ARCH__
    const unsigned short *h = reinterpret_cast<const unsigned short *>(p);
#pragma unroll
    for (int i = 0; i < NB / 2; ++i) {
        const unsigned short v = __ldg(h + i);
        b[2 * i] = (uint8_t)(v & 0xff);
        b[2 * i + 1] = (uint8_t)(v >> 8);
    }
#else
    std::memcpy(b, p, NB);
#endif
}

// The f16 with the little-endian bytes lo, hi, as f32 (host and device).
__host__ __device__ __forceinline__ float f16_bytes(uint8_t lo, uint8_t hi) {
    __half_raw r;
    r.x = (unsigned short)(lo | (hi << 8));
    return __half2float(__half(r));
}

// The values of unit u (row-major over the whole [n, k] weight) as f32, in value order:
// INT8 q * scale[row] (one rounded f32 product); INT4 (nib - zero) * scale[group], Q8_0
// d * qs, Q4_0 d * (nib - 8) (exact: a small integer times an f16).
template <int F>
__host__ __device__ __forceinline__ void dequant_unit(const uint8_t *w, const void *scales,
                                                      const uint8_t *zeros, int group, int64_t k,
                                                      int64_t u, float (&f)[unit_values(F)]) {
    constexpr int UV = unit_values(F), UB = unit_bytes(F);
    const int64_t per_row = k / UV;
    const int64_t row = u / per_row;
    const uint8_t *p = w + u * UB;
    if constexpr (F == I8) {
        uint8_t b[16];
        load_unit16(p, b);
        const float s = static_cast<const float *>(scales)[row];
#pragma unroll
        for (int e = 0; e < 16; ++e) f[e] = (float)(int8_t)b[e] * s;
    } else if constexpr (F == I4 || F == I4Z) {
        uint8_t b[16];
        load_unit16(p, b);
        const int64_t j0 = (u - row * per_row) * UV;
        const int64_t g = row * (k / group) + j0 / group;
        const float s = __half2float(static_cast<const __half *>(scales)[g]);
        const float z = F == I4Z ? (float)zeros[g] : 8.f;
#pragma unroll
        for (int e = 0; e < 32; ++e) f[e] = ((float)((b[e / 2] >> (4 * (e % 2))) & 15) - z) * s;
    } else if constexpr (F == Q80) {
        uint8_t b[34];
        load_unit_a2<34>(p, b);
        const float d = f16_bytes(b[0], b[1]);
#pragma unroll
        for (int e = 0; e < 32; ++e) f[e] = d * (float)(int8_t)b[2 + e];
    } else {
        uint8_t b[18];
        load_unit_a2<18>(p, b);
        const float d = f16_bytes(b[0], b[1]);
#pragma unroll
        for (int e = 0; e < 16; ++e) {
            f[e] = d * (float)((int)(b[2 + e] & 15) - 8);
            f[e + 16] = d * (float)((int)(b[2 + e] >> 4) - 8);
        }
    }
}

// out [n, k] = T(W): grid-stride over the n * k / UV units; 16-byte stores.
template <int F, typename T>
__global__ void __launch_bounds__(256)
dequant_kernel(const uint8_t *__restrict__ w, const void *__restrict__ scales,
               const uint8_t *__restrict__ zeros, int group, T *__restrict__ out, int64_t units,
               int64_t k) {
    constexpr int UV = unit_values(F), VW = 16 / (int)sizeof(T);
    using V = Vec<T, VW>;
    for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < units;
         u += (int64_t)gridDim.x * blockDim.x) {
        float f[UV];
        dequant_unit<F>(w, scales, zeros, group, k, u, f);
        V *o = reinterpret_cast<V *>(out + u * UV);
#pragma unroll
        for (int c = 0; c < UV / VW; ++c) {
            V v;
#pragma unroll
            for (int e = 0; e < VW; ++e) v.v[e] = from_f32<T>(f[c * VW + e]);
            o[c] = v;
        }
    }
}

template <int F, typename T>
fl_status dequant_launch(const void *w, const void *scales, const void *zeros, int group, void *out,
                         int64_t n, int64_t k, cudaStream_t s) {
    constexpr int threads = 256;
    const int64_t units = n * (k / unit_values(F));
    dequant_kernel<F, T><<<grid_for(units, threads), threads, 0, s>>>(
        static_cast<const uint8_t *>(w), scales, static_cast<const uint8_t *>(zeros), group,
        static_cast<T *>(out), units, k);
    return launch_status();
}

template <typename T>
fl_status dequant_dispatch(fl_gemv_format format, const void *w, const void *scales,
                           const void *zeros, int group, void *out, int64_t n, int64_t k,
                           cudaStream_t s) {
    switch (format) {
    case FL_GEMV_INT8: return dequant_launch<I8, T>(w, scales, zeros, group, out, n, k, s);
    case FL_GEMV_INT4: return dequant_launch<I4, T>(w, scales, zeros, group, out, n, k, s);
    case FL_GEMV_INT4_ZP: return dequant_launch<I4Z, T>(w, scales, zeros, group, out, n, k, s);
    case FL_GEMV_Q8_0: return dequant_launch<Q80, T>(w, scales, zeros, group, out, n, k, s);
    case FL_GEMV_Q4_0: return dequant_launch<Q40, T>(w, scales, zeros, group, out, n, k, s);
    }
    return FL_ERR_INVALID_ARGUMENT;
}

template <int F>
void dequant_host(const void *w, const void *scales, const void *zeros, int group, float *out,
                  int64_t n, int64_t k) {
    constexpr int UV = unit_values(F);
    const int64_t units = n * (k / UV);
    for (int64_t u = 0; u < units; ++u) {
        float f[UV];
        dequant_unit<F>(static_cast<const uint8_t *>(w), scales, static_cast<const uint8_t *>(zeros),
                        group, k, u, f);
        std::memcpy(out + u * UV, f, sizeof(f));
    }
}

// Argument checks shared by fl_gemv_dequantize and its host twin (dtype and alignment aside).
inline fl_status dequant_check(fl_gemv_format format, const void *w, const void *scales,
                               const void *zeros, int32_t group_size, const void *out, int64_t n,
                               int64_t k) {
    if (n < 0 || k <= 0 || k % 32 != 0) return FL_ERR_INVALID_ARGUMENT;
    const bool int4 = format == FL_GEMV_INT4 || format == FL_GEMV_INT4_ZP;
    if (int4 && ((group_size != 32 && group_size != 64 && group_size != 128) || k % group_size != 0))
        return FL_ERR_INVALID_ARGUMENT;
    if (fl_gemv_weight_bytes(format, n, k) < 0 || (n > 0 && k > INT64_MAX / n))
        return FL_ERR_INVALID_ARGUMENT;
    if (n == 0) return FL_OK;
    const bool need_scales = format == FL_GEMV_INT8 || int4;
    if (!w || !out || (need_scales && !scales) || (format == FL_GEMV_INT4_ZP && !zeros))
        return FL_ERR_INVALID_ARGUMENT;
    return FL_OK;
}

template <typename T>
fl_status dispatch_format(fl_gemv_format format, const void *x, const void *w, const void *scales,
                          const void *zeros, void *y, int m, int64_t n, int64_t k, int group,
                          cudaStream_t s) {
    switch (format) {
    case FL_GEMV_INT8: return launch<I8, T>(x, w, scales, zeros, y, m, n, k, group, s);
    case FL_GEMV_INT4: return launch<I4, T>(x, w, scales, zeros, y, m, n, k, group, s);
    case FL_GEMV_INT4_ZP: return launch<I4Z, T>(x, w, scales, zeros, y, m, n, k, group, s);
    case FL_GEMV_Q8_0: return launch<Q80, T>(x, w, scales, zeros, y, m, n, k, group, s);
    case FL_GEMV_Q4_0: return launch<Q40, T>(x, w, scales, zeros, y, m, n, k, group, s);
    }
    return FL_ERR_INVALID_ARGUMENT;
}

}  // namespace gemv
}  // namespace fl

extern "C" int64_t fl_gemv_weight_bytes(fl_gemv_format format, int64_t n, int64_t k) {
    if (n < 0 || k < 0 || k % 32 != 0) return -1;
    int64_t per_row;
    switch (format) {
    case FL_GEMV_INT8: per_row = k; break;
    case FL_GEMV_INT4:
    case FL_GEMV_INT4_ZP: per_row = k / 2; break;
    case FL_GEMV_Q8_0: per_row = k / 32 * 34; break;
    case FL_GEMV_Q4_0: per_row = k / 32 * 18; break;
    default: return -1;
    }
    if (per_row > 0 && n > INT64_MAX / per_row) return -1;
    return n * per_row;
}

extern "C" fl_status fl_gemv_quant(fl_dtype dtype, fl_gemv_format format, const void *x,
                                   const void *w, const void *scales, const void *zeros,
                                   int32_t group_size, void *y, int64_t m, int64_t n, int64_t k,
                                   fl_stream stream) {
    using namespace fl;
    if (m < 0 || m > FL_GEMV_MAX_M || n < 0 || k <= 0 || k % 32 != 0)
        return FL_ERR_INVALID_ARGUMENT;
    const bool int4 = format == FL_GEMV_INT4 || format == FL_GEMV_INT4_ZP;
    if (int4 && ((group_size != 32 && group_size != 64 && group_size != 128) || k % group_size != 0))
        return FL_ERR_INVALID_ARGUMENT;
    const int64_t wbytes = fl_gemv_weight_bytes(format, n, k);
    if (wbytes < 0 || (n > 0 && k > INT64_MAX / n)) return FL_ERR_INVALID_ARGUMENT;
    if (ceil_div(n, gemv::kWarps) > 0x7fffffffLL) return FL_ERR_INVALID_ARGUMENT;
    if (dtype != FL_DTYPE_F16 && dtype != FL_DTYPE_BF16) return FL_ERR_UNSUPPORTED_DTYPE;
    if (m == 0 || n == 0) return FL_OK;
    const bool need_scales = format == FL_GEMV_INT8 || int4;
    if (!x || !w || !y || (need_scales && !scales) || (format == FL_GEMV_INT4_ZP && !zeros))
        return FL_ERR_INVALID_ARGUMENT;
    if (!aligned16(x) || !aligned16(w)) return FL_ERR_MISALIGNED;
    if ((reinterpret_cast<uintptr_t>(y) & 1u) != 0) return FL_ERR_MISALIGNED;
    if (format == FL_GEMV_INT8 && (reinterpret_cast<uintptr_t>(scales) & 3u) != 0) return FL_ERR_MISALIGNED;
    if (int4 && (reinterpret_cast<uintptr_t>(scales) & 1u) != 0) return FL_ERR_MISALIGNED;
    const cudaStream_t s = as_stream(stream);
    if (dtype == FL_DTYPE_F16)
        return gemv::dispatch_format<__half>(format, x, w, scales, zeros, y, (int)m, n, k, group_size, s);
    return gemv::dispatch_format<__nv_bfloat16>(format, x, w, scales, zeros, y, (int)m, n, k, group_size, s);
}

extern "C" fl_status fl_gemv_unpack_unit_host(fl_gemv_format format, const uint8_t *quants,
                                              int32_t zero, float *out) {
    using namespace fl::gemv;
    if (!quants || !out) return FL_ERR_INVALID_ARGUMENT;
    switch (format) {
    case FL_GEMV_INT4: unpack_unit_host<I4>(quants, 8.f, out); return FL_OK;
    case FL_GEMV_INT4_ZP:
        if (zero < 0 || zero > 15) return FL_ERR_INVALID_ARGUMENT;
        unpack_unit_host<I4Z>(quants, (float)zero, out);
        return FL_OK;
    case FL_GEMV_Q4_0: unpack_unit_host<Q40>(quants, 8.f, out); return FL_OK;
    default: return FL_ERR_INVALID_ARGUMENT;
    }
}

extern "C" fl_status fl_gemv_dequantize(fl_dtype dtype, fl_gemv_format format, const void *w,
                                        const void *scales, const void *zeros, int32_t group_size,
                                        void *out, int64_t n, int64_t k, fl_stream stream) {
    using namespace fl;
    const fl_status st = gemv::dequant_check(format, w, scales, zeros, group_size, out, n, k);
    if (st != FL_OK) return st;
    if (dtype != FL_DTYPE_F32 && dtype != FL_DTYPE_F16 && dtype != FL_DTYPE_BF16)
        return FL_ERR_UNSUPPORTED_DTYPE;
    if (n == 0) return FL_OK;
    if (!aligned16(w) || !aligned16(out)) return FL_ERR_MISALIGNED;
    if (format == FL_GEMV_INT8 && (reinterpret_cast<uintptr_t>(scales) & 3u) != 0) return FL_ERR_MISALIGNED;
    if ((format == FL_GEMV_INT4 || format == FL_GEMV_INT4_ZP) &&
        (reinterpret_cast<uintptr_t>(scales) & 1u) != 0)
        return FL_ERR_MISALIGNED;
    const cudaStream_t s = as_stream(stream);
    FL_DISPATCH_FLOAT(dtype, return gemv::dequant_dispatch<scalar_t>(format, w, scales, zeros,
                                                                    group_size, out, n, k, s));
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_gemv_dequantize_host(fl_gemv_format format, const void *w,
                                             const void *scales, const void *zeros,
                                             int32_t group_size, float *out, int64_t n, int64_t k) {
    using namespace fl::gemv;
    const fl_status st = dequant_check(format, w, scales, zeros, group_size, out, n, k);
    if (st != FL_OK || n == 0) return st;
    switch (format) {
    case FL_GEMV_INT8: dequant_host<I8>(w, scales, zeros, group_size, out, n, k); return FL_OK;
    case FL_GEMV_INT4: dequant_host<I4>(w, scales, zeros, group_size, out, n, k); return FL_OK;
    case FL_GEMV_INT4_ZP: dequant_host<I4Z>(w, scales, zeros, group_size, out, n, k); return FL_OK;
    case FL_GEMV_Q8_0: dequant_host<Q80>(w, scales, zeros, group_size, out, n, k); return FL_OK;
    case FL_GEMV_Q4_0: dequant_host<Q40>(w, scales, zeros, group_size, out, n, k); return FL_OK;
    }
    return FL_ERR_INVALID_ARGUMENT;
}
