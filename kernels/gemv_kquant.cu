// The quantised GEMV (m = 1..16) and the dequantisation for llama.cpp's K-quants, as stored in
// GGUF files (ggml-common.h): super-blocks of 256 values, 8 sub-blocks of 32 with a 6-bit
// scale and min each (Q4_K: 144 bytes, Q5_K: 176 bytes with a fifth bit per value), or 16
// sub-blocks of 16 with a signed 8-bit scale (Q6_K: 210 bytes, 6-bit values).
//
// A "unit" is 64 values of one super-block whose quants sit together (unit i = 0..3):
//   Q4_K / Q5_K: qs[32 i .. 32 i + 32): low nibbles are values 64 i + b (sub-block 2 i), high
//                nibbles 64 i + 32 + b (sub-block 2 i + 1); Q5_K's fifth bits are bits 2 i and
//                2 i + 1 of qh[b]: two runs of 32 values, each with its (scale, min).
//   Q6_K:        half h = i / 2, l0 = 16 (i % 2): ql[64 h + l0 + j], ql[64 h + 32 + l0 + j],
//                qh[32 h + l0 + j] for j < 16 give values 128 h + l0 + j + 32 r, r = 0..3: four
//                runs of 16 values, each with its scale.
// kq_unit decodes a unit (bytes placed in the mantissa of 2^23, as gemv_unpack.cuh does) into
// the exact integer quants and per-run f32 scale s and min mn
// formed as ggml forms them (d * sc and dmin * m, products exact in f32), so value = s * q - mn
// is ggml's dequantize_row_* bit for bit (one rounding, the subtraction). The same code runs on
// the host (fl_gemv_dequantize_host) for the CPU tests.
//
// The GEMV (m = 1..16): on tensor cores (gemv_kquant_kernel, one run of a scale per mma; how,
// beside the kernel), except Q6_K at one token on CUDA cores (gemv_q6k_fma_kernel, one warp per
// row, kq_unit per lane). The dequantisation (kq_unit) is CUDA-core code that also serves the
// host reference.
#include "gemv_kquant.cuh"

namespace fl {
namespace gemv {
namespace {

constexpr int kUnitValues = 64;   // values per unit
constexpr int kUnitsPerSuper = 4; // units per 256-value super-block

// Per format: super-block bytes, runs per unit (of kq_unit), values per run.
template <int F> struct KQuant;
template <> struct KQuant<FL_GEMV_Q4_K> {
    static constexpr int bytes = 144, runs = 2, len = 32;
};
template <> struct KQuant<FL_GEMV_Q5_K> {
    static constexpr int bytes = 176, runs = 2, len = 32;
};
template <> struct KQuant<FL_GEMV_Q6_K> {
    static constexpr int bytes = 210, runs = 4, len = 16;
};

// The 16 bytes at p (16-byte aligned on the device) as 4 little-endian words.
__host__ __device__ __forceinline__ void load16(const uint8_t *p, uint32_t (&w)[4]) {
#ifdef __CUDA_ARCH__
    const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
    std::memcpy(w, p, 16);
#endif
}
// NW little-endian words at p, which is only 2-byte aligned: on the device, the aligned words
// around them and funnel shifts (the word past them only when p % 4 == 2, so nothing past
// their last byte's word is read).
template <int NW> __host__ __device__ __forceinline__ void load_words_a2(const uint8_t *p, uint32_t (&w)[NW]) {
#ifdef __CUDA_ARCH__
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t *b = reinterpret_cast<const uint32_t *>(a & ~uintptr_t(3));
    const unsigned sh = (unsigned)(a & 2u) * 8u;  // 0 or 16
    uint32_t r[NW + 1];
#pragma unroll
    for (int i = 0; i < NW; ++i) r[i] = __ldg(b + i);
    r[NW] = sh ? __ldg(b + NW) : 0u;
#pragma unroll
    for (int i = 0; i < NW; ++i) w[i] = __funnelshift_r(r[i], r[i + 1], sh);
#else
    std::memcpy(w, p, 4 * NW);
#endif
}
// The f16 in bits 0..15 of h as f32 (host and device).
__host__ __device__ __forceinline__ float half_bits(uint32_t h) {
    __half_raw r;
    r.x = (unsigned short)(h & 0xffffu);
    return __half2float(__half(r));
}
// Byte B of w (at most 2^23 - 1 apart from 2^23) as the float 2^23 + byte: PRMT into the
// mantissa of 2^23 on the device (int->float conversions issue at 1/4 rate).
template <int B> __host__ __device__ __forceinline__ float magic_byte(uint32_t w) {
#ifdef __CUDA_ARCH__
    return byte_magic<B>(w);
#else
    return bits_to_f32(0x4B000000u | ((w >> (8 * B)) & 0xffu));
#endif
}
// The 4 bytes of w as exact floats, less `bias` (bias + 2^23 is exact: a small integer).
__host__ __device__ __forceinline__ void bytes_to_floats(uint32_t w, float bias, float *f) {
    const float b = kMagic + bias;
    f[0] = magic_byte<0>(w) - b;
    f[1] = magic_byte<1>(w) - b;
    f[2] = magic_byte<2>(w) - b;
    f[3] = magic_byte<3>(w) - b;
}

// Sub-block j's (scale, min) of a Q4_K / Q5_K super-block, from its 12 packed bytes in words
// s[0..2] (ggml's get_scale_min_k4).
__host__ __device__ __forceinline__ void scale_min_k4(int j, const uint32_t (&s)[3], uint32_t &sc, uint32_t &m) {
    if (j < 4) {
        sc = (s[0] >> (8 * j)) & 63u;
        m = (s[1] >> (8 * j)) & 63u;
    } else {
        const int jj = 8 * (j - 4);
        sc = ((s[2] >> jj) & 15u) | (((s[0] >> jj) >> 6 & 3u) << 4);
        m = ((s[2] >> jj) >> 4 & 15u) | (((s[1] >> jj) >> 6 & 3u) << 4);
    }
}

// Unit i (0..3) of the super-block at blk: q[r * len + j] = the integer quant of run r's value
// j (Q6_K: less 32), s[r] and mn[r] its scale and min (mn = 0 for Q6_K); value = s * q - mn.
template <int F>
__host__ __device__ __forceinline__ void kq_unit(const uint8_t *blk, int i, float (&q)[kUnitValues],
                                                 float (&s)[KQuant<F>::runs], float (&mn)[KQuant<F>::runs]) {
    if constexpr (F == FL_GEMV_Q4_K || F == FL_GEMV_Q5_K) {
        uint32_t h[4];
        load16(blk, h);  // d, dmin, scales[12]
        const float d = half_bits(h[0]), dmin = half_bits(h[0] >> 16);
        const uint32_t sw[3] = {h[1], h[2], h[3]};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            uint32_t sc, m;
            scale_min_k4(2 * i + r, sw, sc, m);
            s[r] = d * (float)sc;
            mn[r] = dmin * (float)m;
        }
        constexpr int QS = F == FL_GEMV_Q4_K ? 16 : 48;  // qs's offset
        uint32_t qa[4], qb[4];
        load16(blk + QS + 32 * i, qa);
        load16(blk + QS + 32 * i + 16, qb);
        const uint32_t qw[8] = {qa[0], qa[1], qa[2], qa[3], qb[0], qb[1], qb[2], qb[3]};
        uint32_t hw[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
        if constexpr (F == FL_GEMV_Q5_K) {
            uint32_t ha[4], hb[4];
            load16(blk + 16, ha);
            load16(blk + 32, hb);
#pragma unroll
            for (int c = 0; c < 4; ++c) hw[c] = ha[c], hw[4 + c] = hb[c];
        }
        // Word c holds bytes 4c..4c+3: their low nibbles (values 4c.., run 0) and high nibbles
        // (run 1), four at a time; Q5_K's fifth bits are bits 2i, 2i + 1 of the qh bytes.
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            uint32_t lo = qw[c] & 0x0F0F0F0Fu, hi = (qw[c] >> 4) & 0x0F0F0F0Fu;
            if constexpr (F == FL_GEMV_Q5_K) {
                const uint32_t e = hw[c] >> (2 * i);
                lo |= (e & 0x01010101u) << 4;
                hi |= (e & 0x02020202u) << 3;
            }
            bytes_to_floats(lo, 0.f, q + 4 * c);
            bytes_to_floats(hi, 0.f, q + 32 + 4 * c);
        }
    } else {
        const int half = i >> 1, l0 = 16 * (i & 1), is = i & 1;
        uint32_t la[4], lb[4], hq[4], sw[2], dw[1];
        load_words_a2<4>(blk + 64 * half + l0, la);
        load_words_a2<4>(blk + 64 * half + 32 + l0, lb);
        load_words_a2<4>(blk + 128 + 32 * half + l0, hq);
        load_words_a2<2>(blk + 192 + 8 * half, sw);
#ifdef __CUDA_ARCH__
        dw[0] = __ldg(reinterpret_cast<const unsigned short *>(blk + 208));
#else
        unsigned short dv;
        std::memcpy(&dv, blk + 208, 2);
        dw[0] = dv;
#endif
        const float d = half_bits(dw[0]);
        // Run r's scale: scales[8 h + is + 2 r] (signed), as ggml's d * sc (exact).
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            s[r] = d * (float)(int8_t)(uint8_t)((sw[r >> 1] >> (8 * (is + 2 * (r & 1)))) & 0xffu);
            mn[r] = 0.f;
        }
        // Word c: values l0 + 4c .. l0 + 4c + 3 of each run (6-bit, less 32), four at a time.
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const uint32_t a = la[c], b = lb[c], e = hq[c];
            constexpr uint32_t lo4 = 0x0F0F0F0Fu, lo2 = 0x03030303u;
            bytes_to_floats((a & lo4) | (e & lo2) << 4, 32.f, q + 4 * c);
            bytes_to_floats((b & lo4) | (e >> 2 & lo2) << 4, 32.f, q + 16 + 4 * c);
            bytes_to_floats((a >> 4 & lo4) | (e >> 4 & lo2) << 4, 32.f, q + 32 + 4 * c);
            bytes_to_floats((b >> 4 & lo4) | (e >> 6 & lo2) << 4, 32.f, q + 48 + 4 * c);
        }
    }
}

// The offset of run r of unit i in its super-block's 256 values.
template <int F> __host__ __device__ __forceinline__ int run_offset(int i, int r) {
    if constexpr (F == FL_GEMV_Q6_K) return 128 * (i >> 1) + 16 * (i & 1) + 32 * r;
    return 64 * i + 32 * r;
}

// The value s * q - mn as ggml computes it (an exact product, one rounding).
__host__ __device__ __forceinline__ float kq_value(float s, float q, float mn) { return s * q - mn; }

// 8 consecutive x values (16 bytes, 16-byte aligned) as f32.
template <typename T> __device__ __forceinline__ void load_x8(const T *p, float (&f)[8]) {
    const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 t = widen2<T>(w[j]);
        f[2 * j] = t.x;
        f[2 * j + 1] = t.y;
    }
}

// ---------------------------------------------------------------- the GEMV, on tensor cores
// Q4_K, Q5_K, and Q6_K from 2 tokens (at one: gemv_q6k_fma_kernel below). One CTA per 16
// output rows; its kKqWarps warps split the rows' super-blocks (warp w takes w, w + kKqWarps,
// ...) and add their sums through shared memory at the end. Each super-block is a series of
// m16n8k16 mmas, A = 16 weight rows x 16 k (one run: all 16 values share a scale), B = 16 k x
// 8 tokens of x (a second n-tile for m > 8), f32 accumulation:
// - lane (g, t) supplies weight rows g and g + 8 at the k-slots {2t, 2t + 1, 2t + 8, 2t + 9},
//   from one 32-bit word of each row's quants: 4 bytes (Q4_K: nibbles, run 2i in the low ones
//   and 2i + 1 in the high ones; Q5_K / Q6_K: the assembled 5- / 6-bit values) at positions
//   p..p + 3 of the run. Slots (2t, 2t + 1) take bytes (0, 2), slots (2t + 8, 2t + 9) bytes
//   (1, 3): one LOP3 each puts a pair under the 16-bit magic (f16 1024 + q, bf16 128 + q,
//   exact), with no shift of the bytes; x's B pairs are permuted to match, (x[p], x[p + 2]) and
//   (x[p + 1], x[p + 3]): a dot product only needs A and B to agree.
// - the mma sums (magic + q) x exactly per product; a second mma with an all-ones A gives the
//   run's sum of x per token, so per run value = s * (D - magic * D1) - mn * D1 =
//   s * sum(q x) - mn * sum(x).
// - Q4_K / Q5_K super-blocks are 16-byte aligned: each lane reads 8 bytes of each unit's
//   quants per row (positions 8t..8t + 7 of both runs' 32), the 16-byte header, Q5_K's 8 qh
//   bytes. Q6_K's 210-byte ones are 2-byte aligned: kq_super_q6k, 16-value runs, one word a
//   run per lane.
constexpr int kKqWarps = 8;  // warps per CTA, splitting the super-blocks of its 16 rows

// The magic of the 16-bit pairs (the value a zero quant takes in the mma).
template <typename T> __device__ __forceinline__ float kq_magic() {
    return std::is_same<T, __half>::value ? 1024.f : 128.f;
}
// Bytes (0, 2) and (1, 3) of v, each masked by MASK (per byte: 0x0F for nibbles, 0xFF for
// assembled 5-bit values), under the magic: the A fragment's even and odd pairs.
template <typename T, uint32_t MASK> __device__ __forceinline__ uint32_t kq_even(uint32_t v) {
    return and_or<MASK * 0x00010001u, Bits<T>::magic>(v);
}
template <typename T, uint32_t MASK> __device__ __forceinline__ uint32_t kq_odd(uint32_t v) {
    return and_or<MASK * 0x00010001u, Bits<T>::magic>(v >> 8);
}
// x at positions p..p + 3 (two words of 16-bit pairs, as loaded) as the B fragment's pairs.
__device__ __forceinline__ void kq_b(uint32_t u0, uint32_t u1, uint32_t &b0, uint32_t &b1) {
    b0 = __byte_perm(u0, u1, 0x5410);  // (x[p], x[p + 2])
    b1 = __byte_perm(u0, u1, 0x7632);  // (x[p + 1], x[p + 3])
}
__device__ __forceinline__ uint4 ldg16_or0(const void *p, bool valid) {
    return valid ? __ldg(reinterpret_cast<const uint4 *>(p)) : make_uint4(0u, 0u, 0u, 0u);
}

// One run: rows (g, g + 8) quant words va, vb over the NC words of the run that this lane
// holds, x pairs b[j][c] per n-tile; acc += sa|sb * D - ca|cb * D1 (D1: the run's x sums).
template <typename T, int NT, int NC, uint32_t MASK>
__device__ __forceinline__ void kq_run(float (&acc)[NT][4], const uint32_t (&va)[NC], const uint32_t (&vb)[NC],
                                       const uint32_t (&b)[NT][NC][2], float sa, float ca, float sb, float cb) {
    float d[NT][4], d1[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) d[j][e] = 0.f, d1[j][e] = 0.f;
    constexpr uint32_t one = Bits<T>::one;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        const uint32_t a[4] = {kq_even<T, MASK>(va[c]), kq_even<T, MASK>(vb[c]), kq_odd<T, MASK>(va[c]),
                               kq_odd<T, MASK>(vb[c])};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            mma_m16n8k16<T>(d[j], a[0], a[1], a[2], a[3], b[j][c][0], b[j][c][1]);
            mma_m16n8k16<T>(d1[j], one, one, one, one, b[j][c][0], b[j][c][1]);
        }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        acc[j][0] = fmaf(-ca, d1[j][0], fmaf(sa, d[j][0], acc[j][0]));
        acc[j][1] = fmaf(-ca, d1[j][1], fmaf(sa, d[j][1], acc[j][1]));
        acc[j][2] = fmaf(-cb, d1[j][2], fmaf(sb, d[j][2], acc[j][2]));
        acc[j][3] = fmaf(-cb, d1[j][3], fmaf(sb, d[j][3], acc[j][3]));
    }
}

// A Q6_K super-block of rows (g, g + 8) at ba, bb: 16 runs of 16 values, each with a signed
// 8-bit scale (d * sc); lane t takes positions 4t..4t + 3 of every run, so one 4-byte word of
// each row's ql and qh per unit and half (2-byte aligned: load_words_a2), and 8 bytes of x per
// run and token (x0: the super-block's first value). Value = s (q - 32): with the magic,
// acc += s D - s (magic + 32) D1.
template <typename T, int NT>
__device__ __forceinline__ void kq_super_q6k(float (&acc)[NT][4], const uint8_t *ba, const uint8_t *bb,
                                             const T *const (&xr)[NT], const bool (&xv)[NT], int64_t x0, int t,
                                             float magic) {
    uint32_t sca[4], scb[4];
    load_words_a2<4>(ba + 192, sca);
    load_words_a2<4>(bb + 192, scb);
    const float da = half_bits(__ldg(reinterpret_cast<const unsigned short *>(ba + 208)));
    const float db = half_bits(__ldg(reinterpret_cast<const unsigned short *>(bb + 208)));
    const int t4 = 4 * t;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int h = i >> 1, l0 = 16 * (i & 1);
        uint32_t la[1], lb[1], ha[1], ma[1], mb[1], hb[1];
        load_words_a2<1>(ba + 64 * h + l0 + t4, la);
        load_words_a2<1>(ba + 64 * h + 32 + l0 + t4, ma);
        load_words_a2<1>(ba + 128 + 32 * h + l0 + t4, ha);
        load_words_a2<1>(bb + 64 * h + l0 + t4, lb);
        load_words_a2<1>(bb + 64 * h + 32 + l0 + t4, mb);
        load_words_a2<1>(bb + 128 + 32 * h + l0 + t4, hb);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            // Run r's 6-bit quants: ql's low (r = 0, 1) or high (2, 3) nibbles of the first
            // (r even) or second 32 bytes of the half, qh's bits 2r, 2r + 1 as bits 4, 5.
            constexpr uint32_t lo4 = 0x0F0F0F0Fu, lo2 = 0x03030303u;
            const int ns = 4 * (r >> 1), hs = 2 * r;
            const uint32_t qa = ((r & 1 ? ma[0] : la[0]) >> ns & lo4) | (ha[0] >> hs & lo2) << 4;
            const uint32_t qb = ((r & 1 ? mb[0] : lb[0]) >> ns & lo4) | (hb[0] >> hs & lo2) << 4;
            const uint32_t va[1] = {qa}, vb[1] = {qb};
            // Its scale: scales[8 h + (i & 1) + 2 r], signed.
            const int si = 8 * h + (i & 1) + 2 * r;
            const float s_a = da * (float)(int8_t)(uint8_t)(sca[si >> 2] >> (8 * (si & 3)));
            const float s_b = db * (float)(int8_t)(uint8_t)(scb[si >> 2] >> (8 * (si & 3)));
            uint32_t b[NT][1][2];
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const T *xs = xr[j] + x0 + run_offset<FL_GEMV_Q6_K>(i, r) + t4;
                const uint2 v = xv[j] ? __ldg(reinterpret_cast<const uint2 *>(xs)) : make_uint2(0u, 0u);
                kq_b(v.x, v.y, b[j][0][0], b[j][0][1]);
            }
            kq_run<T, NT, 1, 0xFFu>(acc, va, vb, b, s_a, s_a * (magic + 32.f), s_b, s_b * (magic + 32.f));
        }
    }
}

}  // namespace

// grid.x = ceil(n / 16), block = 32 kKqWarps. NT: n-tiles of 8 tokens (1: m <= 8, 2: m <= 16).
template <int F, typename T, int NT>
__global__ void __launch_bounds__(kKqWarps * 32)
gemv_kquant_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, T *__restrict__ y, int m, int64_t n,
                   int64_t k) {
    using Q = KQuant<F>;
    __shared__ float red[kKqWarps][NT][16][8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t row0 = (int64_t)blockIdx.x * 16;
    const int64_t supers = k >> 8;
    // Rows past n read row n - 1 (their sums are dropped).
    const uint8_t *wa = w + min(row0 + g, n - 1) * supers * Q::bytes;
    const uint8_t *wb = w + min(row0 + g + 8, n - 1) * supers * Q::bytes;
    // This lane's B column in n-tile j: token 8 j + g (zeros past m).
    const T *xr[NT];
    bool xv[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        xv[j] = 8 * j + g < m;
        xr[j] = x + (int64_t)(xv[j] ? 8 * j + g : 0) * k;
    }
    const float magic = kq_magic<T>();
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

    for (int64_t sb = warp; sb < supers; sb += kKqWarps) {
        const uint8_t *ba = wa + sb * Q::bytes, *bb = wb + sb * Q::bytes;
        if constexpr (F == FL_GEMV_Q6_K) {
            kq_super_q6k<T, NT>(acc, ba, bb, xr, xv, sb << 8, t, magic);
            continue;
        }
        constexpr int QS = F == FL_GEMV_Q4_K ? 16 : 48;  // qs's offset
        const uint4 ha = __ldg(reinterpret_cast<const uint4 *>(ba));
        const uint4 hb = __ldg(reinterpret_cast<const uint4 *>(bb));
        uint2 qa[4], qb[4], ea = make_uint2(0u, 0u), eb = make_uint2(0u, 0u);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            qa[i] = __ldg(reinterpret_cast<const uint2 *>(ba + QS + 32 * i + 8 * t));
            qb[i] = __ldg(reinterpret_cast<const uint2 *>(bb + QS + 32 * i + 8 * t));
        }
        if constexpr (F == FL_GEMV_Q5_K) {
            ea = __ldg(reinterpret_cast<const uint2 *>(ba + 16 + 8 * t));
            eb = __ldg(reinterpret_cast<const uint2 *>(bb + 16 + 8 * t));
        }
        const float da = half_bits(ha.x), dma = half_bits(ha.x >> 16);
        const float db = half_bits(hb.x), dmb = half_bits(hb.x >> 16);
        const uint32_t sa3[3] = {ha.y, ha.z, ha.w}, sb3[3] = {hb.y, hb.z, hb.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            // x of runs 2i (positions 64 i + 8t..) and 2i + 1 (64 i + 32 + 8t..): words
            // c = 0 (positions +0..3) and c = 1 (+4..7) of each.
            uint32_t bl[NT][2][2], bh[NT][2][2];
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const T *xs = xr[j] + (sb << 8) + 64 * i + 8 * t;
                const uint4 lo = ldg16_or0(xs, xv[j]), hi = ldg16_or0(xs + 32, xv[j]);
                kq_b(lo.x, lo.y, bl[j][0][0], bl[j][0][1]);
                kq_b(lo.z, lo.w, bl[j][1][0], bl[j][1][1]);
                kq_b(hi.x, hi.y, bh[j][0][0], bh[j][0][1]);
                kq_b(hi.z, hi.w, bh[j][1][0], bh[j][1][1]);
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                uint32_t sca, mna, scb, mnb;
                scale_min_k4(2 * i + r, sa3, sca, mna);
                scale_min_k4(2 * i + r, sb3, scb, mnb);
                const float s_a = da * (float)sca, s_b = db * (float)scb;
                const float c_a = fmaf(s_a, magic, dma * (float)mna), c_b = fmaf(s_b, magic, dmb * (float)mnb);
                uint32_t va[2], vb[2];
                if constexpr (F == FL_GEMV_Q4_K) {
                    // Low nibbles (run 2i) in place, high nibbles (2i + 1) shifted down.
                    va[0] = qa[i].x >> (4 * r), va[1] = qa[i].y >> (4 * r);
                    vb[0] = qb[i].x >> (4 * r), vb[1] = qb[i].y >> (4 * r);
                    kq_run<T, NT, 2, 0x0Fu>(acc, va, vb, r ? bh : bl, s_a, c_a, s_b, c_b);
                } else {
                    // Q5_K: the nibble plus bit 2i + r of the qh byte as bit 4.
                    const int hs = 2 * i + r;
                    va[0] = ((qa[i].x >> (4 * r)) & 0x0F0F0F0Fu) | (((ea.x >> hs) & 0x01010101u) << 4);
                    va[1] = ((qa[i].y >> (4 * r)) & 0x0F0F0F0Fu) | (((ea.y >> hs) & 0x01010101u) << 4);
                    vb[0] = ((qb[i].x >> (4 * r)) & 0x0F0F0F0Fu) | (((eb.x >> hs) & 0x01010101u) << 4);
                    vb[1] = ((qb[i].y >> (4 * r)) & 0x0F0F0F0Fu) | (((eb.y >> hs) & 0x01010101u) << 4);
                    kq_run<T, NT, 2, 0xFFu>(acc, va, vb, r ? bh : bl, s_a, c_a, s_b, c_b);
                }
            }
        }
    }
    // Sum the warps' partial sums: lane (g, t) holds rows (g, g + 8) x tokens (2t, 2t + 1).
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        red[warp][j][g][2 * t] = acc[j][0];
        red[warp][j][g][2 * t + 1] = acc[j][1];
        red[warp][j][g + 8][2 * t] = acc[j][2];
        red[warp][j][g + 8][2 * t + 1] = acc[j][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NT * 128; i += blockDim.x) {
        const int j = i >> 7, row = (i >> 3) & 15, col = i & 7, tok = 8 * j + col;
        if (tok >= m || row0 + row >= n) continue;
        float v = 0.f;
#pragma unroll
        for (int wp = 0; wp < kKqWarps; ++wp) v += red[wp][j][row][col];
        y[(int64_t)tok * n + row0 + row] = from_f32<T>(v);
    }
}

// Q6_K at one token on CUDA cores (it reads faster there than on the tensor-core kernel, whose
// 2-byte aligned 4-byte pieces per lane cost two loads and a funnel shift each: 45-51% of copy
// against 57-60% here, kernels/experiments/gemv.md; from 2 tokens on the tensor-core kernel
// wins, its mmas serving 8 tokens for the price of one). grid.x = ceil(n / kFmaWarps), block =
// 32 kFmaWarps; one warp per output row, lane l takes units l, l + 32, ... (kq_unit) and adds
// s * sum(q x) per run of 16 (f32 FMAs; x by 16-byte loads).
constexpr int kFmaWarps = 4;
template <typename T>
__global__ void __launch_bounds__(kFmaWarps * 32)
gemv_q6k_fma_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, T *__restrict__ y, int m, int64_t n,
                    int64_t k) {
    constexpr int F = FL_GEMV_Q6_K;
    using Q = KQuant<F>;
    (void)m;  // one token
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * kFmaWarps + warp;
    if (row >= n) return;  // whole warps only; no block-wide barrier below
    const int64_t supers = k >> 8, units = supers * kUnitsPerSuper;
    const uint8_t *wr = w + row * supers * Q::bytes;

    float acc = 0.f;
    for (int64_t u = lane; u < units; u += 32) {
        const int64_t sb = u >> 2;
        const int i = (int)(u & 3);
        float q[kUnitValues], s[Q::runs], mn[Q::runs];
        kq_unit<F>(wr + sb * Q::bytes, i, q, s, mn);
        const T *xs = x + (sb << 8);
#pragma unroll
        for (int r = 0; r < Q::runs; ++r) {
            const T *xr = xs + run_offset<F>(i, r);
            float qx = 0.f;
#pragma unroll
            for (int v = 0; v < Q::len / 8; ++v) {
                float xf[8];
                load_x8<T>(xr + 8 * v, xf);
#pragma unroll
                for (int e = 0; e < 8; ++e) qx = fmaf(q[r * Q::len + 8 * v + e], xf[e], qx);
            }
            acc = fmaf(s[r], qx, acc);
        }
    }
    const float v = warp_sum(acc);
    if (lane == 0) y[row] = from_f32<T>(v);
}

// out [n, k] = T(W) (with a row map: T(W[rows]), RowMap): grid-stride over the n k / 64 output
// units; 16-byte stores.
template <int F, typename T>
__global__ void __launch_bounds__(256)
gemv_kquant_dequantize_kernel(const uint8_t *__restrict__ w, T *__restrict__ out, int64_t units, int64_t k,
                              RowMap map) {
    using Q = KQuant<F>;
    constexpr int VW = 16 / (int)sizeof(T);
    using V = Vec<T, VW>;
    static_assert(Q::len % VW == 0, "whole 16-byte stores per run");
    const int64_t per_row = k / kUnitValues;
    for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < units;
         u += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = u / per_row, ur = u - row * per_row;
        const int64_t sb = ur >> 2;
        const int i = (int)(ur & 3);
        const int64_t src = map.rows ? map_row(map, row, ur == 0) : row;
        float q[kUnitValues], s[Q::runs], mn[Q::runs];
        if (src >= 0) {
            kq_unit<F>(w + (src * (k >> 8) + sb) * Q::bytes, i, q, s, mn);
        } else {  // an id outside the table: a zero row
#pragma unroll
            for (int e = 0; e < kUnitValues; ++e) q[e] = 0.f;
#pragma unroll
            for (int r = 0; r < Q::runs; ++r) s[r] = 0.f, mn[r] = 0.f;
        }
        T *o = out + row * k + (sb << 8);
#pragma unroll
        for (int r = 0; r < Q::runs; ++r) {
            V *ov = reinterpret_cast<V *>(o + run_offset<F>(i, r));
#pragma unroll
            for (int c = 0; c < Q::len / VW; ++c) {
                V v;
#pragma unroll
                for (int e = 0; e < VW; ++e) v.v[e] = from_f32<T>(kq_value(s[r], q[r * Q::len + c * VW + e], mn[r]));
                ov[c] = v;
            }
        }
    }
}

namespace {

// `kernel` over ceil(n / rows) CTAs of `warps` warps (FL_ERR_INVALID_ARGUMENT past 2^31 - 1).
template <typename T>
fl_status launch_gemv(void (*kernel)(const T *, const uint8_t *, T *, int, int64_t, int64_t), int rows,
                      int warps, const GemvArgs &a) {
    const int64_t blocks = ceil_div(a.n, rows);
    if (blocks > 0x7fffffffLL) return FL_ERR_INVALID_ARGUMENT;
    kernel<<<(unsigned)blocks, warps * 32, 0, a.stream>>>(static_cast<const T *>(a.x),
                                                         static_cast<const uint8_t *>(a.w),
                                                         static_cast<T *>(a.y), a.m, a.n, a.k);
    return launch_status();
}

template <int F, typename T> fl_status launch_kquant_format(const GemvArgs &a) {
    if constexpr (F == FL_GEMV_Q6_K) {
        // One token on CUDA cores; more on tensor cores, where up to 8 (16) tokens cost one
        // (two) n-tiles of the same mmas.
        if (a.m <= 1) return launch_gemv<T>(gemv_q6k_fma_kernel<T>, kFmaWarps, kFmaWarps, a);
    }
    if (a.m <= 8) return launch_gemv<T>(gemv_kquant_kernel<F, T, 1>, 16, kKqWarps, a);
    return launch_gemv<T>(gemv_kquant_kernel<F, T, 2>, 16, kKqWarps, a);
}

template <int F, typename T>
fl_status launch_kquant_dequantize_format(const void *w, void *out, int64_t n, int64_t k, cudaStream_t s,
                                          const RowMap &map) {
    constexpr int threads = 256;
    const int64_t units = n * (k / kUnitValues);
    gemv_kquant_dequantize_kernel<F, T><<<grid_for(units, threads), threads, 0, s>>>(
        static_cast<const uint8_t *>(w), static_cast<T *>(out), units, k, map);
    return launch_status();
}

template <typename T>
fl_status launch_kquant_dequantize_type(fl_gemv_format format, const void *w, void *out, int64_t n, int64_t k,
                                        cudaStream_t s, const RowMap &map) {
    switch (format) {
    case FL_GEMV_Q4_K: return launch_kquant_dequantize_format<FL_GEMV_Q4_K, T>(w, out, n, k, s, map);
    case FL_GEMV_Q5_K: return launch_kquant_dequantize_format<FL_GEMV_Q5_K, T>(w, out, n, k, s, map);
    case FL_GEMV_Q6_K: return launch_kquant_dequantize_format<FL_GEMV_Q6_K, T>(w, out, n, k, s, map);
    default: return FL_ERR_INVALID_ARGUMENT;
    }
}

template <int F> void dequantize_host_format(const uint8_t *w, float *out, int64_t n, int64_t k) {
    using Q = KQuant<F>;
    const int64_t supers = k >> 8;
    for (int64_t row = 0; row < n; ++row)
        for (int64_t sb = 0; sb < supers; ++sb)
            for (int i = 0; i < kUnitsPerSuper; ++i) {
                float q[kUnitValues], s[Q::runs], mn[Q::runs];
                kq_unit<F>(w + (row * supers + sb) * Q::bytes, i, q, s, mn);
                float *o = out + row * k + (sb << 8);
                for (int r = 0; r < Q::runs; ++r)
                    for (int j = 0; j < Q::len; ++j)
                        o[run_offset<F>(i, r) + j] = kq_value(s[r], q[r * Q::len + j], mn[r]);
            }
}

}  // namespace

fl_status launch_kquant(const GemvArgs &a) {
    return with_act_type(a, [&](auto t) {
        using T = typename decltype(t)::type;
        switch ((int)a.format) {
        case FL_GEMV_Q4_K: return launch_kquant_format<FL_GEMV_Q4_K, T>(a);
        case FL_GEMV_Q5_K: return launch_kquant_format<FL_GEMV_Q5_K, T>(a);
        case FL_GEMV_Q6_K: return launch_kquant_format<FL_GEMV_Q6_K, T>(a);
        default: return FL_ERR_INVALID_ARGUMENT;
        }
    });
}

fl_status launch_kquant_dequantize(fl_dtype dtype, fl_gemv_format format, const void *w, void *out, int64_t n,
                                   int64_t k, cudaStream_t s, const RowMap &map) {
    switch (dtype) {
    case FL_DTYPE_F32: return launch_kquant_dequantize_type<float>(format, w, out, n, k, s, map);
    case FL_DTYPE_F16: return launch_kquant_dequantize_type<__half>(format, w, out, n, k, s, map);
    case FL_DTYPE_BF16: return launch_kquant_dequantize_type<__nv_bfloat16>(format, w, out, n, k, s, map);
    default: return FL_ERR_UNSUPPORTED_DTYPE;
    }
}

void kquant_dequantize_host(fl_gemv_format format, const void *w, float *out, int64_t n, int64_t k) {
    const uint8_t *b = static_cast<const uint8_t *>(w);
    switch (format) {
    case FL_GEMV_Q4_K: dequantize_host_format<FL_GEMV_Q4_K>(b, out, n, k); break;
    case FL_GEMV_Q5_K: dequantize_host_format<FL_GEMV_Q5_K>(b, out, n, k); break;
    case FL_GEMV_Q6_K: dequantize_host_format<FL_GEMV_Q6_K>(b, out, n, k); break;
    default: break;
    }
}

}  // namespace gemv
}  // namespace fl
