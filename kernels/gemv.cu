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
//
// The tensor-core path (namespace tc; fl_gemv_quant_path, FL_GEMV_PATH): the CUDA-core kernel
// above costs an f32 FMA per weight per token, so at 16 tokens it is compute-bound (5-14% of
// copy bandwidth on an H100). The tensor-core kernel computes the same
//   y[t, r] = sum_chunks scale(r, chunk) * sum_{j in chunk} x[t, j] * (q[r, j] - z(r, chunk))
// with mma.sync m16n8k16 (f32 accumulation), laid out like the dense GEMV (gemv_dense.cu):
// - The <= 16 tokens are the M side (A = x, token rows >= m zero; rows 8..15 only loaded when
//   m > 8), 8 weight rows the N side (B); a CTA owns NT = 1 or 2 tiles of 8 rows (x loads
//   shared by the tiles) and its W warps split k, warp w taking U consecutive 32-wide chunks
//   out of every W * U; partial tiles are summed in shared memory in warp order
//   (deterministic) and each output is rounded once.
// - Lane (g = lane / 4, t = lane % 4) owns weight row g and 8 values of each chunk: int8 k =
//   8t..8t+7 (one 8-byte load), int4 k = 8t..8t+7 (one 4-byte load), Q8_0 quants 8t..8t+7 of
//   the block (two or three aligned 4-byte loads + funnel shift: blocks are 2-byte aligned;
//   block i's quants start at 2 mod 4 for even i, so the third word is loaded only then),
//   Q4_0 quant bytes 4t..4t+3 = values 4t..4t+3 (low nibbles) and 16+4t..16+4t+3 (high).
//   Weights stream with ld.global.nc.L1::no_allocate + L2 evict_first, every load of a
//   batch (U chunks x NT tiles: 16-64 bytes of weights per lane, plus x and scales) issued
//   before any is used.
// - Dequantisation to the mma's type (f16 for f16 x, bf16 for bf16 x) is exact, two values
//   per instruction: f16: a nibble masked in place under 0x6400 is 1024 + q (1024 + 16 q for a
//   nibble at bits 4..7, scaled by 1/16 in the same fma); one fma2 subtracts 1024 + z (or
//   64 + z) giving q - z exactly (|q - z| <= 15). Bytes: (q ^ 0x80) under 0x64 (PRMT) is
//   1024 + q + 128, minus 1152. bf16 (7-bit mantissa): nibbles are shifted to bits 0..3, under
//   0x4300 = 128 + q, minus 128 + z; a signed byte is (128 + low 7 bits) - (128 or 256 by its
//   sign bit), both built with PRMT/LOP3. All these integers (|v| <= 128) are exact in f16
//   and bf16, and the fma's exact result is an integer, so no rounding happens.
// - The k order inside a lane's 8 values follows the cheap unpacking, and x is permuted to
//   match (PRMT of 16-bit halves; a dot product only needs A and B to agree): int8 / Q8_0 take
//   pairs (0,1),(2,3),(4,5),(6,7) as loaded; int4 pairs (v0,v4),(v1,v5),(v2,v6),(v3,v7) (v_i =
//   nibble i of the word: value 8t + i); Q4_0 (4t,4t+2),(16+4t,16+4t+2),(4t+1,4t+3),
//   (16+4t+1,16+4t+3). Mma 1 takes pairs 0, 1 as k-slots {2t,2t+1}, {2t+8,2t+9}; mma 2 pairs
//   2, 3.
// - Scales stay out of the mma (in f32): every 32-wide chunk lies inside one group (groups
//   are 32/64/128 and aligned) or one GGUF block, so the mmas of a run of R chunks sharing a
//   scale (R = min(group / 32, 4) for int4, 1 for GGUF) go to a temporary f32 accumulator
//   started at 0, then acc += tmp * scale(column) for the lane's columns 2t, 2t + 1. The
//   products x * (q - z) are exact in the mma (11-bit x 5/8-bit integers); the zero point is
//   applied as the integer q - z (exact), not as z * sum(x). int8's per-row scale multiplies
//   the final sum once.
// - Host: NT = 2 when n / 16 >= SMs, warps per CTA from occupancy (as the dense GEMV).
//   Automatic choice (FL_GEMV_PATH_AUTO): tensor cores at m >= 2 and for int4 at m = 1 (see
//   use_mma for the measurements); FL_GEMV_PATH=fma|mma (read once) or fl_gemv_quant_path
//   force a kernel.
// - At one token, int8 and int4 take a kernel of their own on the tensor-core side
//   (gemv_t1_kernel: whole 16-byte pieces per lane, a cp.async ring of loads per warp, the
//   weights on the mma's A side and the B columns that padding wasted at m = 1 used to keep
//   each piece's products apart for its group scale); FL_GEMV_T1=0 turns it off. On sm_90+
//   int8 takes a variant whose ring the TMA engine fills (gemv_t1t_kernel, FL_GEMV_T1T=0 off)
//   at most shapes. Q8_0 / Q4_0
//   with k % 256 == 0 likewise (gemv_t1g_kernel, FL_GEMV_T1G=0 off); on sm_90+ Q8_0, and Q4_0
//   at k >= 8192 or n <= 32 x SMs, take a variant whose rings the TMA engine fills
//   (gemv_t1b_kernel, FL_GEMV_T1B=0 off).
#include <cstring>
#include <type_traits>
#include <utility>

#include "common/common.cuh"
#include "common/tma_host.cuh"

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
// common.cuh's cp_async16 with a generic pointer to the shared-memory destination.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    fl::cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), gmem, src_bytes);
}

// The same with an L2 prefetch-size hint (PF = 128 or 256 bytes: on a miss the L2 fetches the
// aligned PF bytes around the 16), for the one-token rings' weight copies: t1 takes 256 (its 4
// or 8 warps copy adjacent 64-byte pieces of each row at once), t1g 128 (a warp's superchunk
// is 8 or 16 blocks of a row, 144-544 bytes). Measured on the H100
// (bench/RESULTS.md, session 21, f16, m = 1, two alternated rounds, us): int4 g128 11008 x 4096
// 12.40-12.55 -> 12.20-12.29, 4096 x 11008 12.23-12.38 -> 11.94-12.01, 32000 x 4096
// 29.81-30.04 -> 29.34-29.53, int4zp g128 1-2% likewise (4096 x 4096 within its noise); 128
// in t1 gained less (12.31-12.38 / 12.10-12.14 / 29.47-29.73); Q4_0 on t1g with 128: 11008 x
// 4096 14.60-14.62 -> 14.37-14.42, 32000 x 4096 32.46-32.55 -> 31.68-31.80, with 256 no gain
// (14.55-14.60, 32.75-32.85).
template <int PF> __device__ __forceinline__ void cp_async16_pf(void *smem, const void *gmem, int src_bytes) {
    static_assert(PF == 128 || PF == 256, "an L2 prefetch size the callers measured");
    const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    if constexpr (PF == 256)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem), "r"(src_bytes)
                     : "memory");
    else
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem), "r"(src_bytes)
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
            if (left >= 16) {
                cp_async16(slot + 16 * (wi - wa), w + 16 * wi, 16);
            } else {
                // The tensor's last word, partial (GGUF tensors end 2 bytes past a 16-byte
                // boundary, or more): byte loads. cp.async with a smaller source size compiles
                // to a whole 16-byte read (LDGSTS.ZFILL), past the tensor (compute-sanitizer,
                // session 10).
#pragma unroll 1
                for (int b = 0; b < 16; ++b) slot[16 * (wi - wa) + b] = b < left ? __ldg(w + 16 * wi + b) : 0;
            }
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

// ---------------------------------------------------------------- tensor-core kernel
// See the header comment ("The tensor-core path"). Lane (g = lane / 4, t = lane % 4) of a warp
// streams the bytes of weight row g of each tile that hold its 8 values of every 32-wide
// chunk, turns them into 4 registers of two exact f16 / bf16 integers (q - z) (the B
// fragments of two m16n8k16 mmas), loads the x values of the same k (the A fragments: token
// rows g and g + 8), and accumulates x . (q - z) in f32; the scale of columns 2t, 2t + 1 (the
// accumulator elements a lane holds) is applied outside the mma, once per run of chunks that
// share it.
namespace tc {

constexpr int kMaxWarps = 16;

// Weight loads (ld_stream32 / ld_stream64 with an evict-first policy) and the m16n8k16 mma are
// common.cuh's, shared with gemv_dense.cu.
template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    mma_m16n8k16<T>(d, a[0], a[1], a[2], a[3], b0, b1);
}

// a * b + c on two packed 16-bit floats (round to nearest; exact for every use below: the
// exact results are small integers).
template <typename T> __device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c);
template <> __device__ __forceinline__ uint32_t fma2<__half>(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
template <> __device__ __forceinline__ uint32_t fma2<__nv_bfloat16>(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// Bit patterns (both halves) of the constants below.
template <typename T> struct Bits;
template <> struct Bits<__half> {
    static constexpr uint32_t one = 0x3C003C00u;        // 1
    static constexpr uint32_t sixteenth = 0x2C002C00u;  // 1/16
    static constexpr uint32_t magic = 0x64006400u;      // 1024: 1024 + v for v < 1024 in the mantissa
};
template <> struct Bits<__nv_bfloat16> {
    static constexpr uint32_t one = 0x3F803F80u;
    static constexpr uint32_t sixteenth = 0x3D803D80u;
    static constexpr uint32_t magic = 0x43004300u;      // 128: 128 + v for v < 128 in the mantissa
};

// The per-(row, group) constants of the nibble conversion for zero point z (0..15), both
// halves: lo = -(magic + z) (nibble at bits 0..3 of a half), hi = the constant for a nibble
// at bits 4..7 (f16: (1024 + 16 q) / 16 - (64 + z); bf16: the nibble is shifted down first).
struct NibZ {
    uint32_t lo, hi;
};
template <typename T> __device__ __forceinline__ NibZ nib_z(uint32_t z) {
    const uint32_t zz = z * 0x00010001u;
    if constexpr (std::is_same<T, __half>::value) {
        return {zz | 0xE400E400u, (zz << 4) | 0xD400D400u};  // -(1024 + z), -(64 + z)
    } else {
        return {zz | 0xC300C300u, zz | 0xC300C300u};  // -(128 + z)
    }
}

// (a & MASK) | OR as one LOP3: written in C++, the compiler emits an AND and an OR (a LOP3
// instruction takes one immediate), and these two ops were a fifth of the int4 kernel's
// instructions.
template <uint32_t MASK, uint32_t OR> __host__ __device__ __forceinline__ uint32_t and_or(uint32_t a) {
#if defined(__CUDA_ARCH__)
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(MASK), "n"(OR));
    return d;
#else
    return (a & MASK) | OR;
#endif
}
// The 8 nibbles of word w as 4 pairs of raw 16-bit floats (no zero point subtracted):
//   b[0] = (nibble 0, nibble 4), b[1] = (nibble 1, nibble 5), b[2] = (nibble 2, nibble 6),
//   b[3] = (nibble 3, nibble 7),  nibble i = bits 4i..4i+3 of w.
// f16: (w & 0x000f000f) | 1024 = 1024 + q, exact (q < 1024 in the 10-bit mantissa); an odd
// nibble is left at bits 4..7: 1024 + 16 q (one LOP3 per pair, one shift per word). bf16
// (7-bit mantissa): bits 4..7 would reach the exponent, so every nibble is shifted to bits
// 0..3 first: 128 + q. nib_pairs below takes them to (q - z); t1_unit's MODE 2 multiplies them
// as they are (the odd chain scaled by 1/16 after the mma for f16) and subtracts the offsets.
// Pair P of them (w8 = w >> 8).
template <typename T, int P> __host__ __device__ __forceinline__ uint32_t nib_raw_pair(uint32_t w, uint32_t w8) {
    constexpr uint32_t mg = Bits<T>::magic;
    if constexpr (std::is_same<T, __half>::value) {
        return and_or<(P & 1) ? 0x00F000F0u : 0x000F000Fu, mg>(P < 2 ? w : w8);
    } else {
        return and_or<0x000F000Fu, mg>(P == 0 ? w : P == 1 ? w >> 4 : P == 2 ? w8 : w >> 12);
    }
}
template <typename T> __host__ __device__ __forceinline__ void nib_raw(uint32_t w, uint32_t (&b)[4]) {
    const uint32_t w8 = w >> 8;
    b[0] = nib_raw_pair<T, 0>(w, w8);
    b[1] = nib_raw_pair<T, 1>(w, w8);
    b[2] = nib_raw_pair<T, 2>(w, w8);
    b[3] = nib_raw_pair<T, 3>(w, w8);
}
// The same pairs as exact 16-bit floats (nib - z): one fma each, which for f16 also scales an
// odd nibble's 16 q by 1/16 (exact).
template <typename T> __device__ __forceinline__ void nib_pairs(uint32_t w, NibZ z, uint32_t (&b)[4]) {
    constexpr bool F16 = std::is_same<T, __half>::value;
    constexpr uint32_t one = Bits<T>::one, odd = F16 ? Bits<T>::sixteenth : one;
    const uint32_t zo = F16 ? z.hi : z.lo, w8 = w >> 8;
    b[0] = fma2<T>(nib_raw_pair<T, 0>(w, w8), one, z.lo);
    b[1] = fma2<T>(nib_raw_pair<T, 1>(w, w8), odd, zo);
    b[2] = fma2<T>(nib_raw_pair<T, 2>(w, w8), one, z.lo);
    b[3] = fma2<T>(nib_raw_pair<T, 3>(w, w8), odd, zo);
}

// The 4 signed bytes of word q as 2 pairs of exact 16-bit floats: b[0] = (byte 0, byte 1),
// b[1] = (byte 2, byte 3).
// f16: u = q ^ 0x80 (= q + 128 in 0..255) placed under 0x64 is 1024 + u; minus 1152 = q.
// bf16 (128 + v only for v < 128): the low 7 bits v under 0x43 give 128 + v, the sign bit under
// 0x43 gives 128 or 256 (0x4380), and q = (128 + v) - (128 + 128 s) exactly.
template <typename T> __device__ __forceinline__ void byte_pairs(uint32_t q, uint32_t &b0, uint32_t &b1) {
    constexpr uint32_t one = Bits<T>::one;
    if constexpr (std::is_same<T, __half>::value) {
        const uint32_t u = q ^ 0x80808080u;
        b0 = fma2<T>(__byte_perm(u, 0x64646464u, 0x4140), one, 0xE480E480u);  // - 1152
        b1 = fma2<T>(__byte_perm(u, 0x64646464u, 0x4342), one, 0xE480E480u);
    } else {
        const uint32_t p0 = __byte_perm(q, 0x43434343u, 0x4140);
        const uint32_t p1 = __byte_perm(q, 0x43434343u, 0x4342);
        b0 = fma2<T>(p0 & 0xFF7FFF7Fu, one, (p0 & 0xFF80FF80u) ^ 0x80008000u);
        b1 = fma2<T>(p1 & 0xFF7FFF7Fu, one, (p1 & 0xFF80FF80u) ^ 0x80008000u);
    }
}

// The 4 A-fragment words of one token row's 8 x values v (as loaded: 16-bit halves in k order)
// permuted into the k order of the B fragments (see nib_pairs / byte_pairs):
// int4 pairs (v0, v4), (v1, v5), (v2, v6), (v3, v7); Q4_0 (4t, 4t+2), (16+4t, 16+4t+2),
// (4t+1, 4t+3), (16+4t+1, 16+4t+3); int8 / Q8_0 as loaded.
template <int F> __device__ __forceinline__ void a_frags(const uint32_t (&v)[4], uint32_t (&f)[4]) {
    if constexpr (F == I4 || F == I4Z) {
        f[0] = __byte_perm(v[0], v[2], 0x5410);
        f[1] = __byte_perm(v[0], v[2], 0x7632);
        f[2] = __byte_perm(v[1], v[3], 0x5410);
        f[3] = __byte_perm(v[1], v[3], 0x7632);
    } else if constexpr (F == Q40) {
        f[0] = __byte_perm(v[0], v[1], 0x5410);
        f[1] = __byte_perm(v[2], v[3], 0x5410);
        f[2] = __byte_perm(v[0], v[1], 0x7632);
        f[3] = __byte_perm(v[2], v[3], 0x7632);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) f[i] = v[i];
    }
}

// Chunks (32 k values) per warp per batch: every load of a batch is issued before any is used.
// Weight bytes per lane in flight: U * NT * (4 int4 / Q4_0, 8 int8 / Q8_0). Chosen so that no
// instance spills under the 128-register cap (launch bounds 512 threads): per-chunk scales
// (R < 4: int4 with group 32 / 64, the GGUF formats) and 16 tokens take registers.
template <int F, int NT, bool M16, int R> __host__ __device__ constexpr int unroll() {
    return F == I8    ? (NT == 1 ? 8 : 4)
         : F == Q80   ? ((NT == 1 && !M16) ? 8 : 4)
         : R == 4     ? ((NT == 2 && M16) ? 4 : 8)
                      : ((NT == 1 && !M16) ? 8 : 4);
}
// Raw weight words per lane per chunk per tile.
template <int F> __host__ __device__ constexpr int wwords() {
    return F == I8 ? 2 : F == Q80 ? 3 : F == Q40 ? 2 : 1;
}
// Bytes per GGUF block, per row of chunks.
template <int F> __host__ __device__ constexpr int block_bytes() { return F == Q80 ? 34 : 18; }

// grid.x = ceil(n / (8 * NT)), block = 32 * W (W <= kMaxWarps). M16: some token >= 8.
// R: chunks per scale run (int4: min(group / 32, U); 1 for the GGUF formats, unused for int8).
template <int F, typename T, int NT, bool M16, int R>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
gemv_tc_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, const void *__restrict__ scales,
               const uint8_t *__restrict__ zeros, T *__restrict__ y, int m, int64_t n, int64_t k,
               int group) {
    constexpr int U = unroll<F, NT, M16, R>(), WQ = wwords<F>();
    constexpr bool kScaled = F != I8;  // per-chunk (group / block) scales
    constexpr int NR = kScaled ? U / R : 1;
    static_assert(U % R == 0 && U >= 4, "scale runs must tile a batch");
    __shared__ float red[kMaxWarps * NT * 128];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int64_t base = (int64_t)blockIdx.x * (8 * NT);
    const int64_t chunks = k >> 5;
    const int64_t groups = (F == I4 || F == I4Z) ? k / group : 0;
    // log2 of the chunks per group (group = 32, 64 or 128).
    const int gshift = (F == I4 || F == I4Z) ? __ffs(group >> 5) - 1 : 0;

    // This lane's weight row (g) and accumulator columns (2t, 2t + 1) in each tile.
    int64_t wrow[NT], col0[NT];
    bool vrow[NT], vc0[NT], vc1[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int64_t r = base + 8 * j + g;
        vrow[j] = r < n;
        wrow[j] = vrow[j] ? r : 0;
        col0[j] = base + 8 * j + 2 * t;
        vc0[j] = col0[j] < n;
        vc1[j] = col0[j] + 1 < n;
    }
    const T *xr0 = x + (int64_t)(g < m ? g : 0) * k;
    const T *xr1 = x + (int64_t)(g + 8 < m ? g + 8 : 0) * k;
    const bool vx0 = g < m, vx1 = M16 && g + 8 < m;
    const uint64_t policy = l2_evict_first_policy();
    const __half *sc16 = static_cast<const __half *>(scales);
    const NibZ zsym = nib_z<T>(8u);

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[j][c] = 0.f;

    // int8 / int4 loads: per-lane base pointers computed once, so a batch's loads are one
    // pointer step plus immediate offsets, predicated only on the chunk lying inside k (which
    // fails only in a warp's last batch). Rows past n and token rows past m read row 0 instead
    // (valid memory): what they produce lands only in outputs the epilogue drops (col >= n,
    // tok >= m); likewise the scale of a column past n is read from column col0. (The first
    // version checked every load against n, m and k with 64-bit index arithmetic: ~700 SASS
    // instructions per int4 batch of 16 chunk-tiles, which made int4 issue-bound at ~50% of
    // copy bandwidth; see bench/RESULTS.md, session 6.)
    constexpr bool kFast = F == I8 || F == I4 || F == I4Z;
    constexpr int64_t kCB = F == I8 ? 32 : 16;  // weight bytes per row per chunk
    const uint8_t *wb[NT];
    const __half *sb[NT];
    const uint8_t *zb[NT];
    int s1off[NT];  // column col0 + 1 (or col0 past n) relative to col0, in scales
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        wb[j] = w + wrow[j] * (chunks * kCB) + (F == I8 ? 8 : 4) * t;
        sb[j] = sc16 + (vc0[j] ? col0[j] : 0) * groups;
        s1off[j] = vc1[j] ? (int)groups : 0;
        zb[j] = F == I4Z ? zeros + wrow[j] * groups : zeros;
    }
    const T *xf0 = xr0 + 8 * t, *xf1 = xr1 + 8 * t;

    for (int64_t c0 = (int64_t)warp * U; c0 < chunks; c0 += (int64_t)nwarps * U) {
        uint32_t wq[U][NT][WQ];
        uint32_t xa[U][4], xb[U][4];
        float s0[NR][NT], s1[NR][NT];
        uint32_t zr[F == I4Z ? NR : 1][NT];
        if constexpr (kFast) {
            // 32-bit chunk indices (the host keeps k / 32 < 2^31); a batch wholly inside k
            // (every one but a warp's last) is loaded without any predicate.
            const int cc0 = (int)c0, ch = (int)chunks;
            auto load = [&](auto full_tag) {
                constexpr bool FULL = decltype(full_tag)::value;
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const uint8_t *p = wb[j] + c0 * kCB;
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        wq[u][j][0] = 0u, wq[u][j][WQ - 1] = 0u;
                        if (FULL || cc0 + u < ch) {
                            if constexpr (F == I8) {
                                const uint2 q = ld_stream64(p + u * kCB, policy);
                                wq[u][j][0] = q.x;
                                wq[u][j][WQ - 1] = q.y;
                            } else {
                                wq[u][j][0] = ld_stream32(p + u * kCB, policy);
                            }
                        }
                    }
                }
                const T *p0 = xf0 + c0 * 32;
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    uint4 va = make_uint4(0u, 0u, 0u, 0u), vb = va;
                    if (FULL || cc0 + u < ch) {
                        va = __ldg(reinterpret_cast<const uint4 *>(p0 + u * 32));
                        if constexpr (M16) vb = __ldg(reinterpret_cast<const uint4 *>(xf1 + c0 * 32 + u * 32));
                    }
                    xa[u][0] = va.x, xa[u][1] = va.y, xa[u][2] = va.z, xa[u][3] = va.w;
                    xb[u][0] = vb.x, xb[u][1] = vb.y, xb[u][2] = vb.z, xb[u][3] = vb.w;
                }
                if constexpr (F == I4 || F == I4Z) {
#pragma unroll
                    for (int r = 0; r < NR; ++r) {
                        const int c = cc0 + r * R;
                        const int gi = c >> gshift;
#pragma unroll
                        for (int j = 0; j < NT; ++j) {
                            s0[r][j] = 0.f, s1[r][j] = 0.f;
                            if constexpr (F == I4Z) zr[r][j] = 8u;
                            if (FULL || c < ch) {
                                s0[r][j] = __half2float(__ldg(sb[j] + gi));
                                s1[r][j] = __half2float(__ldg(sb[j] + s1off[j] + gi));
                                if constexpr (F == I4Z) zr[r][j] = (uint32_t)__ldg(zb[j] + gi);
                            }
                        }
                    }
                }
            };
            if (cc0 + U <= ch) load(std::true_type{});
            else load(std::false_type{});
        } else {
            // ---- every load of the batch (GGUF blocks: 2-byte aligned, per-block scales)
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int64_t c = c0 + u;
                const bool kin = c < chunks;
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const bool v = kin && vrow[j];
#pragma unroll
                    for (int i = 0; i < WQ; ++i) wq[u][j][i] = 0u;
                    if constexpr (F == I8) {
                        if (v) {
                            const uint2 q = ld_stream64(w + wrow[j] * k + c * 32 + 8 * t, policy);
                            wq[u][j][0] = q.x, wq[u][j][1] = q.y;
                        }
                    } else if constexpr (F == I4 || F == I4Z) {
                        if (v) wq[u][j][0] = ld_stream32(w + wrow[j] * (k >> 1) + c * 16 + 4 * t, policy);
                    } else {
                        // GGUF: this lane's quants start at an even byte a; read the aligned
                        // words covering them, and when a is not 4-byte aligned the 2 bytes
                        // after them as a 16-bit load (a 32-bit one would read 2 bytes past the
                        // tensor at its last block: compute-sanitizer, session 10).
                        constexpr int QB = F == Q80 ? 8 : 4;  // quant bytes per lane
                        const int64_t a = (wrow[j] * chunks + c) * block_bytes<F>() + 2 + QB * t;
                        const uint8_t *pa = w + (a & ~(int64_t)3);
                        if (v) {
#pragma unroll
                            for (int i = 0; i < WQ - 1; ++i) wq[u][j][i] = ld_stream32(pa + 4 * i, policy);
                            if (a & 2) wq[u][j][WQ - 1] = ld_stream16(pa + 4 * (WQ - 1), policy);
                        }
                    }
                }
                const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);
                uint4 va = zero4, vb = zero4;
                if constexpr (F == Q40) {
                    // k = 32c + 4t..4t+3 (low nibbles) and 32c + 16 + 4t..4t+3 (high nibbles).
                    if (kin && vx0) {
                        const uint2 lo = __ldg(reinterpret_cast<const uint2 *>(xr0 + c * 32 + 4 * t));
                        const uint2 hi = __ldg(reinterpret_cast<const uint2 *>(xr0 + c * 32 + 16 + 4 * t));
                        va = make_uint4(lo.x, lo.y, hi.x, hi.y);
                    }
                    if (M16 && kin && vx1) {
                        const uint2 lo = __ldg(reinterpret_cast<const uint2 *>(xr1 + c * 32 + 4 * t));
                        const uint2 hi = __ldg(reinterpret_cast<const uint2 *>(xr1 + c * 32 + 16 + 4 * t));
                        vb = make_uint4(lo.x, lo.y, hi.x, hi.y);
                    }
                } else {
                    // k = 32c + 8t..8t+7.
                    if (kin && vx0) va = __ldg(reinterpret_cast<const uint4 *>(xr0 + c * 32 + 8 * t));
                    if (M16 && kin && vx1) vb = __ldg(reinterpret_cast<const uint4 *>(xr1 + c * 32 + 8 * t));
                }
                xa[u][0] = va.x, xa[u][1] = va.y, xa[u][2] = va.z, xa[u][3] = va.w;
                xb[u][0] = vb.x, xb[u][1] = vb.y, xb[u][2] = vb.z, xb[u][3] = vb.w;
            }
            if constexpr (kScaled) {
#pragma unroll
                for (int r = 0; r < NR; ++r) {
                    const int64_t c = c0 + r * R;  // first chunk of the run
                    const bool kin = c < chunks;
#pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        s0[r][j] = 0.f, s1[r][j] = 0.f;
                        if constexpr (F == I4 || F == I4Z) {
                            const int64_t gi = c >> gshift;
                            if (kin && vc0[j]) s0[r][j] = __half2float(__ldg(sc16 + col0[j] * groups + gi));
                            if (kin && vc1[j]) s1[r][j] = __half2float(__ldg(sc16 + (col0[j] + 1) * groups + gi));
                            if constexpr (F == I4Z) zr[r][j] = (kin && vrow[j]) ? (uint32_t)__ldg(zeros + wrow[j] * groups + gi) : 8u;
                        } else {
                            const __half *d0 = reinterpret_cast<const __half *>(w + (col0[j] * chunks + c) * block_bytes<F>());
                            const __half *d1 = reinterpret_cast<const __half *>(w + ((col0[j] + 1) * chunks + c) * block_bytes<F>());
                            if (kin && vc0[j]) s0[r][j] = __half2float(__ldg(d0));
                            if (kin && vc1[j]) s1[r][j] = __half2float(__ldg(d1));
                        }
                    }
                }
            }
        }
        // ---- the products
        float tmp[NT][4];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            // A fragments in the k order of the B fragments (see nib_pairs / byte_pairs).
            uint32_t fa[4], fb[4];
            a_frags<F>(xa[u], fa);
            a_frags<F>(xb[u], fb);
            // mma A registers: (row g, slot 0), (row g + 8, slot 0), (row g, slot 1),
            // (row g + 8, slot 1); slot 0 = k-slots 2t, 2t + 1, slot 1 = 2t + 8, 2t + 9.
            const uint32_t a1[4] = {fa[0], fb[0], fa[1], fb[1]};
            const uint32_t a2[4] = {fa[2], fb[2], fa[3], fb[3]};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                uint32_t b[4];
                // GGUF: the quants of block index i start at 2 mod 4 for even i, 0 for odd i
                // (34 and 18 are 2 mod 4, 8t and 4t 0 mod 4).
                const unsigned sh = ((wrow[j] * chunks + c0 + u) & 1) ? 0u : 16u;
                if constexpr (F == I8 || F == Q80) {
                    uint32_t q0 = wq[u][j][0], q1 = wq[u][j][1];
                    if constexpr (F == Q80) {
                        q0 = __funnelshift_r(wq[u][j][0], wq[u][j][1], sh);
                        q1 = __funnelshift_r(wq[u][j][1], wq[u][j][2], sh);
                    }
                    byte_pairs<T>(q0, b[0], b[1]);
                    byte_pairs<T>(q1, b[2], b[3]);
                } else {
                    uint32_t q = wq[u][j][0];
                    if constexpr (F == Q40) q = __funnelshift_r(wq[u][j][0], wq[u][j][1], sh);
                    NibZ z = zsym;
                    if constexpr (F == I4Z) z = nib_z<T>(zr[u / R][j]);
                    nib_pairs<T>(q, z, b);
                }
                if constexpr (!kScaled) {
                    mma<T>(acc[j], a1, b[0], b[1]);
                    mma<T>(acc[j], a2, b[2], b[3]);
                } else {
                    // The products of one run of chunks (one scale per column) are summed
                    // apart, then scaled into the accumulator: acc += tmp * scale.
                    if (u % R == 0) {
#pragma unroll
                        for (int c = 0; c < 4; ++c) tmp[j][c] = 0.f;
                    }
                    mma<T>(tmp[j], a1, b[0], b[1]);
                    mma<T>(tmp[j], a2, b[2], b[3]);
                    if (u % R == R - 1) {
                        const float sa = s0[u / R][j], sb = s1[u / R][j];
                        acc[j][0] = fmaf(tmp[j][0], sa, acc[j][0]);
                        acc[j][1] = fmaf(tmp[j][1], sb, acc[j][1]);
                        acc[j][2] = fmaf(tmp[j][2], sa, acc[j][2]);
                        acc[j][3] = fmaf(tmp[j][3], sb, acc[j][3]);
                    }
                }
            }
        }
    }

    // acc[j][c] is (token g + 8 * (c >= 2), column 8j + 2t + (c & 1)) of this warp's partial
    // tile. Stored at red[warp][e] with e = (4j + c) * 32 + lane; summed over the warps in
    // warp order (deterministic), then rounded once.
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) red[warp * NT * 128 + (4 * j + c) * 32 + lane] = acc[j][c];
    __syncthreads();
    for (int e = threadIdx.x; e < NT * 128; e += blockDim.x) {
        const int ln = e & 31, c = (e >> 5) & 3, j = e >> 7;
        const int tok = (ln >> 2) + (c >= 2 ? 8 : 0);
        const int64_t col = base + 8 * j + 2 * (ln & 3) + (c & 1);
        if (tok >= m || col >= n) continue;
        float s = 0.f;
        for (int v = 0; v < nwarps; ++v) s += red[v * NT * 128 + e];
        if constexpr (F == I8) s *= __ldg(static_cast<const float *>(scales) + col);
        y[(int64_t)tok * n + col] = from_f32<T>(s);
    }
}

// ---------------------------------------------------------------- one token (t1): int8, int4
// The kernel above reads int4 weights 4 bytes per lane per chunk (16 bytes of each row per
// load instruction: half a 32-byte sector) and keeps one batch of loads in flight per warp
// (issued, waited for, then used); at one token that held int4 at 54-71% of the copy
// bandwidth, and int8 stayed on the CUDA-core kernel (68-96%; bench/RESULTS.md, session 6).
// This kernel, for m = 1 only (int8 and int4, both activation types):
// - Each lane loads 16 contiguous bytes of a row per tile (a "piece": 16 int8 or 32 int4
//   values). A superchunk is 4 pieces = 64 bytes of a row; lane (g, t) takes piece slot t of
//   weight row g of each tile of 8 rows, so a copy instruction covers 2 full sectors per row.
// - The pieces go global -> shared memory with cp.async into a ring of S superchunks per
//   warp, each lane copying (and later reading) only its own 16-byte slots, so no barrier is
//   needed: S - 1 superchunks (NT x 16 bytes per lane each) are always in flight, and no
//   registers hold them. (A first version kept the ring in registers; ptxas, at 128
//   registers, moved the loads down to their uses and int4 ran at 38-58% of copy.)
// - The mma is m16n8k16 with A = the weights and B = x split by piece slot. Tiles 2j and
//   2j + 1 are the A rows g and g + 8 of a 16-row mma tile: lane (g, t) supplies rows g and
//   g + 8 at the k-slots {2t, 2t+1, 2t+8, 2t+9}, all from its own piece slot t of each. B
//   column c holds x only at the k-slots of piece slot c (lane (g, t) holds x where g == t,
//   else 0; columns 4..7 are 0). So D column c is the dot product of piece slot c alone, for
//   each of the 16 weight rows: with int4 each column gets its own group's scale (groups of
//   32, 64 or 128 all work) before the slots are summed; int8's per-row scale multiplies the
//   final sum. The B columns this costs were zero padding at one token anyway.
//   (Sessions 10-11 had it the other way round, weights on B and x on A's rows 0..3: A's zero
//   rows 8..15 then cost four register moves per mma, and each mma covered 8 rows instead of
//   16; turning it round took int4 g128 at 4096 x 11008 from 13.5 to 12.6-12.8 us and at
//   11008 x 4096 from 15.1 to 13.8-14.5, bench/RESULTS.md, session 12.)
// - Staged once per CTA in shared memory by one batch of cp.async (one commit group ahead of
//   the ring's, so one round trip while the first weight copies are in flight): x, then put in
//   place in the k order of the weight pairs
//   (int4: nib_pairs' (v0, v4), (v1, v5), (v2, v6), (v3, v7) of each word; int8: as stored),
//   zero up to the last superchunk and followed by 64 zero bytes that the lanes with g != t
//   read; and, for int4, the scales (and zeros) of the CTA's 8 NT rows, one contiguous run
//   (stage_run; element loads when the tensor is not 16-byte aligned). Session 10 staged them
//   by register loads in a loop, one round trip per step and per 2-byte scale: int4 g128 at
//   4096 x 11008 went from 16.7 to 13.6 us with one batch (bench/RESULTS.md, session 11).
// - Dequantisation is nib_pairs / byte_pairs (exact); the (q - z) x products are exact in the
//   mma's f32 accumulation, as in the kernel above. int4 in the 4-warp CTAs of 4 tiles instead
//   multiplies the raw nibbles (nib_raw: 1024 + q, half the instructions) and subtracts the
//   offsets per row at the end (t1_unit's MODE 2, t1_int4_mode): f32 rounding of those sums
//   replaces the exact products there.
// The warps of a CTA take superchunks w, w + W, ... of its NT tiles (adjacent 64-byte pieces
// of each row at a time) and are summed in warp order at the end (deterministic).
// grid.x = ceil(n / (8 * NT)) (NT even), block = 32 * W (W warps: 8, or 4 for int4, see
// t1_config), dynamic shared memory t1_smem().
constexpr int kT1Warps = 8;
template <int F> __host__ __device__ constexpr int t1_piece_values() { return F == I8 ? 16 : 32; }
template <int F> __host__ __device__ inline int t1_superchunks(int64_t k) {
    return (int)((k + 4 * t1_piece_values<F>() - 1) / (4 * t1_piece_values<F>()));
}
__host__ __device__ constexpr int round16(int b) { return (b + 15) & ~15; }
// Shared-memory bytes: staged x, scales, zeros, the warps' rings (in this order).
template <int F> __host__ __device__ inline int t1_x_bytes(int64_t k) {
    return t1_superchunks<F>(k) * 8 * t1_piece_values<F>() + 64;
}
// Row strides of the staged int4 scales (halves) and zeros (bytes) in t1 / t1t / tmi: a row
// whose length is a multiple of 128 bytes is padded by 16, so that the 8 rows g that a warp's
// lanes read at once (row stride 4 mod 8 words) fall in 8 different groups of 4 banks instead
// of one bank (8-way conflicts: scales of g32 / g64 at k = 4096, rows of 256 / 128 bytes).
// Rows of 64 bytes (g128 at k = 4096: 4-way conflicts) stay unpadded: padded, they measured the
// same at one token and 1-10% slower at 16 tokens (bench/RESULTS.md, session 18).
__host__ __device__ inline int t1_srow(int groups) { return groups % 64 == 0 ? groups + 8 : groups; }
__host__ __device__ inline int t1_zrow(int groups) { return groups % 128 == 0 ? groups + 16 : groups; }
// (tmi stages its scales and zeros the same way.) Their bytes for nt tiles (8 nt rows):
template <int F> __host__ __device__ inline int t1_scale_bytes(int nt, int groups) {
    return (F == I4 || F == I4Z) ? round16(8 * nt * t1_srow(groups) * 2) : 0;
}
template <int F> __host__ __device__ inline int t1_zero_bytes(int nt, int groups) {
    return F == I4Z ? round16(8 * nt * t1_zrow(groups)) : 0;
}
template <int F, int NT> __host__ __device__ inline int t1_scale_bytes(int groups) {
    return t1_scale_bytes<F>(NT, groups);
}
template <int F, int NT> __host__ __device__ inline int t1_zero_bytes(int groups) { return t1_zero_bytes<F>(NT, groups); }
template <int NT, int S, int W = kT1Warps> __host__ __device__ constexpr int t1_ring_bytes() { return W * S * NT * 512; }
// int4 MODE 2 (t1_unit): per group the offset sums (and the x sums, with zero point), per row
// its offset.
template <int F, int NT> __host__ __device__ inline int t1_offset_bytes(int groups, bool off) {
    return off && (F == I4 || F == I4Z) ? round16(groups * 4 * (F == I4Z ? 2 : 1)) + 32 * NT : 0;
}
// off: MODE 2's offsets.
template <int F, int NT, int S, int W = kT1Warps> inline int64_t t1_smem(int64_t k, int group, bool off = false) {
    const int groups = (F == I4 || F == I4Z) ? (int)(k / group) : 0;
    return (int64_t)t1_x_bytes<F>(k) + t1_scale_bytes<F, NT>(groups) + t1_zero_bytes<F, NT>(groups) +
           t1_offset_bytes<F, NT>(groups, off) + t1_ring_bytes<NT, S, W>();
}

// Copies `valid` elements of E (2 or 1 bytes) from src to the shared run dst of `slots`
// elements (a multiple of 16 bytes), zeros after them: whole 16-byte words by cp.async (the
// caller commits), the word holding the end of the run by element loads (a cp.async of fewer
// than 16 source bytes still reads 16), all by element loads when src is not 16-byte aligned.
template <typename E> __device__ __forceinline__ void stage_run(E *dst, const E *src, int valid, int slots) {
    constexpr int PER = 16 / sizeof(E);
    if (aligned16(src)) {
        const int full = valid / PER;
        for (int c = threadIdx.x; c < slots / PER; c += blockDim.x)
            if (c != full) cp_async16(dst + c * PER, c < full ? src + c * PER : src, c < full ? 16 : 0);
        if (full < slots / PER)
            for (int e = full * PER + (int)threadIdx.x; e < (full + 1) * PER; e += blockDim.x)
                dst[e] = e < valid ? __ldg(src + e) : E(0);
    } else {
        for (int e = threadIdx.x; e < slots; e += blockDim.x) dst[e] = e < valid ? __ldg(src + e) : E(0);
    }
}
// `rows` rows of `cols` elements (row r at src + r cols) to dst at a row stride of `stride`
// elements, then zero rows up to `slots` rows: one run (stage_run, `bytes` of dst) when stride
// == cols; else (a padded stride, t1_srow / t1_zrow: cols a whole number of 16-byte words) by
// cp.async per 16-byte word when src is 16-byte aligned, by element loads otherwise.
template <typename E>
__device__ __forceinline__ void stage_rows(E *dst, const E *src, int rows, int cols, int stride, int slots, int bytes) {
    if (stride == cols) {
        stage_run(dst, src, rows * cols, bytes / (int)sizeof(E));
        return;
    }
    constexpr int PER = 16 / sizeof(E);
    if (aligned16(src)) {
        const int words = cols / PER;
        for (int c = threadIdx.x; c < slots * words; c += blockDim.x) {
            const int r = c / words, e = (c - r * words) * PER;
            cp_async16(dst + r * stride + e, r < rows ? src + r * cols + e : src, r < rows ? 16 : 0);
        }
    } else {
        for (int c = threadIdx.x; c < slots * cols; c += blockDim.x) {
            const int r = c / cols, e = c - r * cols;
            dst[r * stride + e] = r < rows ? __ldg(src + c) : E(0);
        }
    }
}

// Eight x values (16 bytes) in the k order of nib_pairs' weight pairs: (v0, v4), (v1, v5),
// (v2, v6), (v3, v7).
__device__ __forceinline__ uint4 nib_pair_order(uint4 v) {
    return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                      __byte_perm(v.y, v.w, 0x7632));
}
// The same pairs, even values first: (v0, v4), (v2, v6), (v1, v5), (v3, v7).
__device__ __forceinline__ uint4 nib_pair_order_eo(uint4 v) {
    return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.y, v.w, 0x5410), __byte_perm(v.x, v.z, 0x7632),
                      __byte_perm(v.y, v.w, 0x7632));
}

// The offsets nib_raw leaves in even and odd values: the products sum M_EVEN x (even k) +
// M_ODD x (odd k) over and above sum q x; t1's MODE 2 subtracts them per row at the end.
template <typename T> __host__ __device__ constexpr float nib_raw_even() {
    return std::is_same<T, __half>::value ? 1024.f : 128.f;
}
template <typename T> __host__ __device__ constexpr float nib_raw_odd() {
    return std::is_same<T, __half>::value ? 64.f : 128.f;
}
// The factor the odd chain's sums take (f16: the nibble sat at bits 4..7, 16 q).
template <typename T> __host__ __device__ constexpr float nib_raw_odd_scale() {
    return std::is_same<T, __half>::value ? 0.0625f : 1.f;
}
// One unit of the one-token kernels: NJ 16-row tiles (j0, j0 + 1, ...) of the superchunk whose
// piece this lane reads at `slot` (this lane's row g of 8-row tile 0; 8-row tile u at slot[TS
// u]: tiles 2j and 2j + 1 are the A rows g and g + 8 of 16-row tile j) against its staged x
// words `xp` (the B side); p4: the superchunk's first piece index (the int4 zero and scale
// groups of this lane's piece 4 sci + t and of the D columns' pieces).
// int4, MODE (t1_int4_mode): 0: each word's (q - z) pairs (nib_pairs) into one chain of 8
// mma per tile (x staged in nib_pair_order); 2: the raw pairs (nib_raw, no zero point: half
// the dequantisation instructions) in two chains of 4, even and odd nibbles (x staged in
// nib_pair_order_eo: each chain's B pair in adjacent registers), the odd chain scaled by 1/16
// (f16), the offsets (M + z) sum x left for the caller to subtract (t1_reorder_sums,
// t1_row_offsets).
template <int F, typename T, int NJ, int TS, int MODE = 0>
__device__ __forceinline__ void t1_unit(const uint4 *slot, const uint4 *xp, const unsigned short *ss,
                                        const uint8_t *zs, NibZ zsym, int groups, int p4, int pieces,
                                        int gshift, int g, int t, int j0, float (&acc)[NJ][4]) {
    constexpr bool I4S = F == I4 || F == I4Z;
    constexpr int XV = t1_piece_values<F>() / 8;
    uint4 xw[XV];
#pragma unroll
    for (int c = 0; c < XV; ++c) xw[c] = xp[c];
    auto group_of = [&](int p) { return I4S ? (p < pieces ? p : pieces - 1) >> gshift : 0; };
    const int gb = group_of(p4 + t);                                          // this lane's piece
    const int g0 = group_of(p4 + ((2 * t) & 3)), g1 = group_of(p4 + ((2 * t + 1) & 3));  // D columns
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const uint4 w0 = slot[TS * (2 * (j0 + j))], w1 = slot[TS * (2 * (j0 + j) + 1)];  // rows g, g + 8
        const uint32_t q0[4] = {w0.x, w0.y, w0.z, w0.w}, q1[4] = {w1.x, w1.y, w1.z, w1.w};
        const int r0 = 16 * (j0 + j) + g, r1 = r0 + 8;
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        if constexpr (I4S) {
            if constexpr (MODE == 0) {
                NibZ z0 = zsym, z1 = zsym;
                if constexpr (F == I4Z) {
                    z0 = nib_z<T>((uint32_t)zs[r0 * t1_zrow(groups) + gb]);
                    z1 = nib_z<T>((uint32_t)zs[r1 * t1_zrow(groups) + gb]);
                }
#pragma unroll
                for (int c = 0; c < 4; ++c) {  // word c: values 8c..8c+7 of the piece
                    uint32_t p0[4], p1[4];
                    nib_pairs<T>(q0[c], z0, p0);
                    nib_pairs<T>(q1[c], z1, p1);
                    const uint32_t a1[4] = {p0[0], p1[0], p0[1], p1[1]};
                    const uint32_t a2[4] = {p0[2], p1[2], p0[3], p1[3]};
                    mma<T>(d, a1, xw[c].x, xw[c].y);
                    mma<T>(d, a2, xw[c].z, xw[c].w);
                }
            } else {
                float dh[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    uint32_t p0[4], p1[4];
                    nib_raw<T>(q0[c], p0);
                    nib_raw<T>(q1[c], p1);
                    const uint32_t ae[4] = {p0[0], p1[0], p0[2], p1[2]};  // even nibbles: x (v0, v4), (v2, v6)
                    const uint32_t ao[4] = {p0[1], p1[1], p0[3], p1[3]};  // odd: (v1, v5), (v3, v7)
                    mma<T>(d, ae, xw[c].x, xw[c].y);  // (staged by t1_reorder_sums in this order)
                    mma<T>(dh, ao, xw[c].z, xw[c].w);
                }
                constexpr float H = nib_raw_odd_scale<T>();
#pragma unroll
                for (int e = 0; e < 4; ++e) d[e] = fmaf(dh[e], H, d[e]);
            }
            // d[0], d[1]: row g, piece slots 2t, 2t + 1 (0 for t >= 2); d[2], d[3]: row g + 8.
            auto sc = [&](int r, int gi) { return __half2float(__ushort_as_half(ss[r * t1_srow(groups) + gi])); };
            acc[j][0] = fmaf(d[0], sc(r0, g0), acc[j][0]);
            acc[j][1] = fmaf(d[1], sc(r0, g1), acc[j][1]);
            acc[j][2] = fmaf(d[2], sc(r1, g0), acc[j][2]);
            acc[j][3] = fmaf(d[3], sc(r1, g1), acc[j][3]);
        } else {
#pragma unroll
            for (int c = 0; c < 4; ++c) {  // word c: values 4c..4c+3 of the piece
                uint32_t p0a, p0b, p1a, p1b;
                byte_pairs<T>(q0[c], p0a, p0b);
                byte_pairs<T>(q1[c], p1a, p1b);
                const uint32_t a[4] = {p0a, p1a, p0b, p1b};
                mma<T>(d, a, c & 1 ? xw[c >> 1].z : xw[c >> 1].x, c & 1 ? xw[c >> 1].w : xw[c >> 1].y);
            }
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[j][c] += d[c];
        }
    }
}

// The one-token kernels' staging by cp.async (the caller commits): x (8 values = 16 bytes at a
// time, xwords words: zero past k) and, for int4, the scales (zeros) of rows base .. base + 8
// NT - 1 (0 past n: their outputs are dropped).
template <int F, typename T, int NT>
__device__ __forceinline__ void t1_stage_async(uint4 *xs, unsigned short *ss, uint8_t *zs, const T *x,
                                               const void *scales, const uint8_t *zeros, int64_t n, int64_t k,
                                               int64_t base, int groups, int xwords) {
    const int xdata = (int)(k / 8);  // uint4s of x (k % 32 == 0)
    const uint4 *x4 = reinterpret_cast<const uint4 *>(x);
    for (int i = threadIdx.x; i < xwords; i += blockDim.x) cp_async16(xs + i, i < xdata ? x4 + i : x4, i < xdata ? 16 : 0);
    if constexpr (F == I4 || F == I4Z) {
        const int rows = n - base < 8 * NT ? (int)(n - base) : 8 * NT;
        // The CTA's scales (zeros) are one contiguous run of rows * groups values, 16-byte
        // aligned when the tensor is (base is a multiple of 16 rows), staged at t1_srow
        // (t1_zrow) per row.
        stage_rows(ss, static_cast<const unsigned short *>(scales) + base * groups, rows, groups, t1_srow(groups),
                   8 * NT, t1_scale_bytes<F, NT>(groups));
        if constexpr (F == I4Z)
            stage_rows(zs, zeros + base * groups, rows, groups, t1_zrow(groups), 8 * NT, t1_zero_bytes<F, NT>(groups));
    }
}

// t1's int4 MODE 2, after x is staged (xwords words of 8 values, xdata of them x, the rest
// zero) and before its barrier: puts each word in nib_pair_order_eo in place and sums x per
// group of wpg = group / 8 words (4, 8 or 16, so a group's words are held by consecutive
// lanes of one warp: every lane takes part in each step's shuffles): gq[gi] =
// nib_raw_even * (sum of the even values) + nib_raw_odd * (odd values), plus 8 * (all) without
// zero point (the offsets (M + z) x of the group's raw products, for z = 8); gs[gi] = the sum
// of all (int4 with zero point, for the rows' z). f32 sums in a fixed order (deterministic).
template <int F, typename T>
__device__ __forceinline__ void t1_reorder_sums(uint4 *xs, int xwords, int xdata, int wpg, float *gq, float *gs) {
    // Per word: q = the offsets' sum (M_even + z0) even + (M_odd + z0) odd, z0 = 8 without
    // zero point, 0 with it; s = the sum of all (with zero point); then summed over the group.
    constexpr float Z0 = F == I4Z ? 0.f : 8.f;
    for (int b = 0; b < xwords; b += blockDim.x) {
        const int i = b + (int)threadIdx.x;
        float q = 0.f, sum = 0.f;
        if (i < xwords) {
            const uint4 v = xs[i];
            if (i < xdata) {
                const float2 a = widen2<T>(v.x), c = widen2<T>(v.y), e = widen2<T>(v.z), h = widen2<T>(v.w);
                const float se = (a.x + c.x) + (e.x + h.x), so = (a.y + c.y) + (e.y + h.y);
                q = fmaf(nib_raw_even<T>() + Z0, se, (nib_raw_odd<T>() + Z0) * so);
                sum = se + so;
            }
            xs[i] = nib_pair_order_eo(v);
        }
        for (int o = 1; o < wpg; o <<= 1) {
            q += __shfl_xor_sync(0xffffffffu, q, o);
            if constexpr (F == I4Z) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        }
        if (i < xdata && (i & (wpg - 1)) == 0) {
            gq[i / wpg] = q;
            if constexpr (F == I4Z) gs[i / wpg] = sum;
        }
    }
}
// ... and after that barrier: each row's offset, -sum over groups of scale * (gq + z gs), into
// corr[r] (R rows; blockDim.x / R consecutive lanes per row, a power of 2 <= 32), for the
// epilogue (after its barrier). Staged scales of rows past n are 0.
template <int F, int R>
__device__ __forceinline__ void t1_row_offsets(const unsigned short *ss, const uint8_t *zs, const float *gq,
                                               const float *gs, int groups, float *corr) {
    const int tpr = blockDim.x / R, r = threadIdx.x / tpr, sub = threadIdx.x % tpr;
    float v = 0.f;
#pragma unroll 4
    for (int gi = sub; gi < groups; gi += tpr) {
        float o = gq[gi];
        if constexpr (F == I4Z) o = fmaf((float)zs[r * t1_zrow(groups) + gi], gs[gi], o);
        v = fmaf(__half2float(__ushort_as_half(ss[r * t1_srow(groups) + gi])), o, v);
    }
    for (int o = 1; o < tpr; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (sub == 0) corr[r] = -v;
}

// The one-token kernels' epilogue. acc[j] holds this lane's sums of rows g and g + 8 of 16-row
// tile j0 + j in two D columns each (acc[j][0..1] and acc[j][2..3]): they are added, then
// summed over the 4 lanes t (xor 1, 2), into red[grp] (the CTA's R row sums of this warp's
// group; a group's warps hold disjoint rows). After one barrier, thread r < R adds the NG
// groups' row r in order (deterministic) and corr[r] when corr is given (t1's int4 MODE 2),
// applies int8's row scale (f32 `scales`), and writes y[base + r] when that row is < n.
template <int F, typename T, int NJ, int R, int NG>
__device__ __forceinline__ void t1_epilogue(const float (&acc)[NJ][4], float (&red)[NG][R], int grp, int j0, int g,
                                            int t, const void *scales, T *y, int64_t base, int64_t n,
                                            const float *corr = nullptr) {
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            float v = acc[j][2 * c] + acc[j][2 * c + 1];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            if (t == 0) red[grp][16 * (j0 + j) + 8 * c + g] = v;
        }
    __syncthreads();
    if (threadIdx.x < R) {
        const int64_t col = base + threadIdx.x;
        if (col < n) {
            float v = 0.f;
#pragma unroll
            for (int u = 0; u < NG; ++u) v += red[u][threadIdx.x];
            if (corr) v += corr[threadIdx.x];
            if constexpr (F == I8) v *= __ldg(static_cast<const float *>(scales) + col);
            y[col] = from_f32<T>(v);
        }
    }
}

template <int F, typename T, int NT, int S, bool ASYNC, int W = kT1Warps, int MODE = 0>
__global__ void __launch_bounds__(W * 32)
gemv_t1_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, const void *__restrict__ scales,
               const uint8_t *__restrict__ zeros, T *__restrict__ y, int64_t n, int64_t k, int group) {
    constexpr bool I4S = F == I4 || F == I4Z;  // group scales (int4) or one per row (int8)
    constexpr int PV = t1_piece_values<F>();   // values per piece (16 bytes)
    constexpr int XV = PV / 8;                 // uint4s of staged x per piece
    static_assert(S >= 2, "a ring of at least two superchunks");
    static_assert(MODE == 0 || (I4S && ASYNC && (32 * W) % (8 * NT) == 0 && (32 * W) / (8 * NT) <= 32),
                  "int4 mode 2: cp.async staging, a power-of-2 count of threads per row");
    constexpr bool OFF = MODE == 2;  // t1_unit's raw pairs: offsets subtracted per row
    extern __shared__ __align__(16) unsigned char t1_raw[];
    __shared__ float red[W][NT * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nsc = t1_superchunks<F>(k);
    const int pieces = (int)(k / PV);
    const int groups = I4S ? (int)(k / group) : 0;
    const int gshift = I4S ? __ffs(group / PV) - 1 : 0;  // log2(pieces per group)
    const int64_t base = (int64_t)blockIdx.x * (8 * NT);

    uint4 *xs = reinterpret_cast<uint4 *>(t1_raw);
    const int xwords = t1_x_bytes<F>(k) / 16;
    unsigned short *ss = reinterpret_cast<unsigned short *>(t1_raw + t1_x_bytes<F>(k));
    uint8_t *zs = reinterpret_cast<uint8_t *>(ss) + t1_scale_bytes<F, NT>(groups);
    unsigned char *off = zs + t1_zero_bytes<F, NT>(groups);  // MODE 2's offsets (else empty)
    const int off_bytes = t1_offset_bytes<F, NT>(groups, OFF);
    float *gq = reinterpret_cast<float *>(off);                     // per group: offsets,
    float *gs = gq + groups;                                        // x sums (int4zp);
    float *corr = reinterpret_cast<float *>(off + off_bytes - 32 * NT);  // per row: offsets
    uint4 *ring = reinterpret_cast<uint4 *>(zs + t1_zero_bytes<F, NT>(groups) + off_bytes) + warp * (S * NT * 32);

    // This lane's weight row in each tile (tiles 2j and 2j + 1: A rows g and g + 8); rows
    // past n read row n - 1 (valid memory), the epilogue drops them.
    const uint8_t *wp[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int64_t r = base + 8 * j + g;
        wp[j] = w + (r < n ? r : n - 1) * (PV == 16 ? k : k >> 1) + 16 * t;
    }
    const int mine = nsc > warp ? (nsc - warp + W - 1) / W : 0;  // this warp's superchunks
    // The copy of this warp's superchunk i (warp + i * W) into ring slot i % S, as one
    // commit group (empty past the warp's share, zero-filled past k; with the 256-byte L2
    // prefetch hint, cp_async16_pf): `issue` below.
    // Stage x (8 values = 16 bytes at a time; int4 in nib_pair_order); zero past k up to the
    // last superchunk, then 64 zero bytes. int4: the scales and zeros of rows base .. base +
    // 8 NT - 1 (rows past n: 0 with cp.async, row n - 1's with registers; their outputs are
    // dropped).
    // ASYNC: one batch of cp.async for all of it, committed as one group before the ring's
    // first copies (so one round trip, not one per loop step), then int4's pair order applied
    // in place; else register loads and stores in a loop (session 10; see t1_config).
    if constexpr (ASYNC) {
        t1_stage_async<F, T, NT>(xs, ss, zs, x, scales, zeros, n, k, base, groups, xwords);
        cp_async_commit();
    }
    auto issue = [&](int i) {
        const int sci = warp + i * W;
        const bool win = i < mine && 4 * sci + t < pieces;
        uint4 *slot = ring + (i % S) * (NT * 32) + lane;
#pragma unroll
        for (int j = 0; j < NT; ++j)
            cp_async16_pf<256>(slot + 32 * j, win ? wp[j] + (int64_t)sci * 64 : wp[j], win ? 16 : 0);
        cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < S - 1; ++i) issue(i);

    if constexpr (ASYNC) {
        cp_async_wait<S - 1>();  // the staging group (the S - 1 ring groups after it may be in flight)
        if constexpr (OFF) {  // each thread reorders the words it copied (and sums x per group)
            t1_reorder_sums<F, T>(xs, xwords, (int)(k / 8), group / 8, gq, gs);
        } else if constexpr (I4S) {  // each thread reorders the words it copied: no barrier needed
            for (int i = threadIdx.x; i < xwords; i += blockDim.x) xs[i] = nib_pair_order(xs[i]);
        }
    } else {
        for (int i = threadIdx.x; i < xwords; i += blockDim.x) {
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if ((int64_t)i * 8 < k) v = __ldg(reinterpret_cast<const uint4 *>(x) + i);
            xs[i] = I4S ? nib_pair_order(v) : v;
        }
        if constexpr (I4S) {
            const unsigned short *sc16 = static_cast<const unsigned short *>(scales);
            for (int e = threadIdx.x; e < 8 * NT * groups; e += blockDim.x) {
                const int r = e / groups, gi = e - r * groups;
                const int64_t row = base + r < n ? base + r : n - 1;
                ss[r * t1_srow(groups) + gi] = __ldg(sc16 + row * groups + gi);
                if constexpr (F == I4Z) zs[r * t1_zrow(groups) + gi] = __ldg(zeros + row * groups + gi);
            }
        }
    }
    __syncthreads();
    if constexpr (OFF) t1_row_offsets<F, 8 * NT>(ss, zs, gq, gs, groups, corr);
    // Lanes with g == t read their piece's x; the others the zero tail.
    const uint4 *xv = xs + (g == t ? XV * t : xwords - 4);
    const int xstep = g == t ? 4 * XV : 0;  // uint4s per superchunk
    const NibZ zsym = nib_z<T>(8u);

    static_assert(NT % 2 == 0, "16-row tiles");
    float acc[NT / 2][4];
#pragma unroll
    for (int j = 0; j < NT / 2; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int i = 0; i < mine; ++i) {
        issue(i + S - 1);    // into slot (i - 1) % S, which this lane read in step i - 1
        cp_async_wait<S - 1>();  // superchunk i is in (the S - 1 later ones may not be)
        const int sci = warp + i * W;
        const uint4 *slot = ring + (i % S) * (NT * 32) + lane;
        t1_unit<F, T, NT / 2, 32, MODE>(slot, xv + sci * xstep, ss, zs, zsym, groups, 4 * sci, pieces, gshift, g, t, 0,
                                        acc);
    }
    cp_async_wait<0>();  // no copy outlives the kernel (the tail's are empty)

    t1_epilogue<F, T, NT / 2, NT * 8, W>(acc, red, warp, 0, g, t, scales, y, base, n,
                                          OFF ? corr : nullptr);  // warps in order
}

// The one-token kernel's configuration: FL_GEMV_T1 (read once; A/B runs) = 0: off (int8 at
// m = 1 takes the CUDA-core kernel, int4 the kernel above); 1 (default): int4 without zero
// point: 4 tiles (32 rows) per CTA, staging by cp.async; CTAs of 8 warps and a ring of 3
// superchunks, except when the grid has between 2 and 4 CTAs per SM (then 4 warps and a ring
// of 4; session 16, below); int4 with zero point: the 8-warp CTAs only when the grid has at
// most 2 CTAs per SM and k >= 8192, else 4-warp CTAs (ring 4) of 4 tiles when n >= 64 x SMs,
// of 2 below; int8 (a ring of 4): 2 tiles, CTAs of 8 warps, staging
// by cp.async except with k <= 4096 (register staging), but CTAs of 4 warps (cp.async) when
// the grid has fewer than 2 CTAs per SM (n < 32 * SMs). Lab configurations: 2: register
// staging everywhere (session 10); 3: cp.async everywhere (both 8-warp CTAs of 2 tiles); 4:
// 4-warp CTAs of 2 tiles, cp.async everywhere; 5: the same with 4 tiles; 6: 4-warp CTAs of 6
// tiles; 7: 8-warp CTAs of 4 tiles, a ring of 3.
// Measured on the H100 (bench/RESULTS.md, session 11): cp.async staging took int4 g128 from
// 9.5 to 8.0 us at 4096 x 4096, 18.3 -> 15.9 at 11008 x 4096, 16.7 -> 13.5 at 4096 x 11008 and
// 40.0 -> 32.6 at 32000 x 4096, and int8 22.0 -> 20.3 at 4096 x 11008; but int8 at 11008 x 4096
// ran 20.6 us with register staging against 22.0-22.3 with cp.async (x through L1 or not; not
// understood), and tied at 4096 x 4096 and 32000 x 4096. CTAs of 4 warps (each warp twice the
// superchunks, 8 CTAs per SM) then took int4 to 15.1-15.4 us at 11008 x 4096 and 31.1 at
// 32000 x 4096 (int4zp 32.5 against 35.8), tied elsewhere, and were slower for int8 (52.8
// against 50.4 us at 32000 x 4096). 1 tile (rings of 4 or 6), 2 tiles with a ring of 5, a
// persistent grid and a k split over 2-CTA clusters were all slower. Session 12 (weights on
// the mma's A side): 4 tiles took int4 g128 at 11008 x 4096 from 13.8-14.5 to 13.2-13.3 us
// and tied at 4096 x 11008 and 32000 x 4096, but were slower at 4096 x 4096 (7.4 against
// 7.1 us: 128 CTAs for 132 SMs), hence the n rule; int8 was slower with them (53.0 against
// 49.7 us at 32000 x 4096). int8 in 4-warp CTAs of 2 tiles: 9.94-9.99 against 10.12-10.13 us
// at 4096 x 4096 (256 CTAs), slower at the other three shapes (21.1 against 20.5 us at
// 11008 x 4096, 51.8 against 49.7 at 32000 x 4096; call 6), hence the int8 n rule.
// Session 14 (call 1): 6 tiles (lab 6) slower everywhere (int4 g128 11008 x 4096 14.8 against
// 13.1 us, 4096 x 4096 7.9 against 7.2). Session 16 (call 6, two runs each): 8-warp CTAs of 4
// tiles with a ring of 3 (lab 7) took int4 g128 at 4096 x 11008 (128 CTAs) from 12.70-12.79
// to 12.28-12.37 us and at 32000 x 4096 from 30.22-30.31 to 29.71-29.75, tied at 4096 x 4096
// (6.89-6.90 against 6.88-7.22), but at 11008 x 4096 (344 CTAs: 2 per SM at 96 registers x
// 256 threads, so 1.3 waves) ran 14.40-14.49 against 13.10-13.29, hence the CTA-count rule;
// with a ring of 4 (8 warps) or of 6 (4 warps) it was slower at 11008 x 4096 and no faster
// elsewhere. int4 with zero point gained only at 4096 x 11008 (12.74-12.80 against 13.23-13.38,
// call 7) and lost 1-3% at 4096 x 4096 (7.41-7.46 against 7.16-7.28, call 6) and 32000 x 4096
// (31.12-31.17 against 30.62-30.84, calls 6-7), hence its own rule. Session 18: with MODE 2
// in variant 3 (session 17), int4 g128 at 32000 x 4096 (1000 CTAs) ran there in 29.02-29.04
// us against variant 5's 29.79-29.99 (call 1, alternated), but with variant 3 for every grid
// of more than 2 CTAs per SM llama-2-7b int4 decode fell from 469.4-470.0 to 451.7 tokens/s
// (call 3), presumably because its fused gate / up GEMV (22016 rows, 688 CTAs) then fills 5
// CTAs per SM and a sliver of a second wave (not profiled). The rule stays.
inline int t1_config() {
    static const EnvChoice choices[] = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3},
                                        {"4", 4}, {"5", 5}, {"6", 6}, {"7", 7}};
    static const int v = env_choice("FL_GEMV_T1", choices, 1);
    return v;
}
constexpr int kT1Ring = 4;
constexpr int64_t kT1MaxSmem = 160 << 10;
// int4's product in t1 (t1_unit's MODE): FL_GEMV_T1_INT4 (read once; A/B runs) = 0: one
// chain of (q - z) pairs (MODE 0) everywhere; 1 (default): raw pairs with the offsets per row
// (MODE 2) in t1_variant 3 (4-warp CTAs of 4 tiles, ring 4), MODE 0 in the others; 2 (lab):
// MODE 2 in variants 2, 3 and 5.
// Measured on the H100 (bench/RESULTS.md, session 17, quick bench, us at m = 1, two runs each):
// MODE 2 in variant 3 took int4 g128 at 11008 x 4096 from 13.17-13.18 to 12.43-12.61 and int4zp
// g128 from 13.61-13.66 to 13.11-13.35, and int4zp at 32000 x 4096 from 30.87-30.91 to
// 29.25-29.27; in the 8-warp CTAs of variant 5 it was slower (int4 g128 4096 x 11008 13.96-14.09
// against 12.35-12.36, 32000 x 4096 31.71-31.74 against 29.96-29.99), and in variant 2 (int4zp
// 4096 x 4096) 8.87-12.36 against 7.27-7.47. ncu (4096 x 11008, variant 5): 3.59 M instructions
// against 3.50 M, 116 registers against 94: the per-CTA sums of x cost more there (one CTA per
// SM, nothing to hide them) than the product saves. Two chains of (q - z) pairs alone (no raw
// pairs), offsets by mma (A = -(M + z), 8 more mma per superchunk) and offsets per superchunk
// (each warp summing its superchunk's x, then one FADD per D value; call 7: 11008 x 4096
// 13.51-13.78 against 12.47-12.67, 4096 x 11008 12.50-12.52 against 12.08-12.37) were slower
// everywhere.
inline int t1_int4_mode() {
    static const EnvChoice choices[] = {{"0", 0}, {"1", 1}, {"2", 2}};
    static const int v = env_choice("FL_GEMV_T1_INT4", choices, 1);
    return v;
}
template <int F> inline int t1_mode(int v) {
    if (!(F == I4 || F == I4Z)) return 0;
    switch (t1_int4_mode()) {
    case 1: return v == 3 ? 2 : 0;
    case 2: return v == 2 || v == 3 || v == 5 ? 2 : 0;
    default: return 0;
    }
}
// The kernel a call takes: 0: 2 tiles, 8 warps, register staging; 1: 2 tiles, 8 warps,
// cp.async; 2: 2 tiles, 4 warps, cp.async; 3: 4 tiles, 4 warps, cp.async; 4 (lab): 6 tiles,
// 4 warps, cp.async; 5: 4 tiles, 8 warps, a ring of 3, cp.async (the others: a ring of 4).
template <int F> inline int t1_variant(int64_t n, int64_t k) {
    switch (t1_config()) {
    case 2: return 0;
    case 3: return 1;
    case 4: return 2;
    case 5: return 3;
    case 6: return 4;
    case 7: return 5;
    default:
        if (F == I8) return ceil_div(n, 16) < 2 * (int64_t)sm_count() ? 2 : k <= 4096 ? 0 : 1;
        const int64_t ctas = ceil_div(n, 32), sms = sm_count();
        if (F == I4Z) return ctas <= 2 * sms && k >= 8192 ? 5 : ctas >= 2 * sms ? 3 : 2;
        return ctas > 2 * sms && ctas < 4 * sms ? 3 : 5;
    }
}
template <int F> inline int64_t t1_variant_smem(int v, int64_t k, int group) {
    const bool off = t1_mode<F>(v) == 2;
    return v == 5 ? t1_smem<F, 4, 3, 8>(k, group, off)
         : v == 4 ? t1_smem<F, 6, kT1Ring, 4>(k, group)
         : v == 3 ? t1_smem<F, 4, kT1Ring, 4>(k, group, off)
         : v == 2 ? t1_smem<F, 2, kT1Ring, 4>(k, group, off)
                  : t1_smem<F, 2, kT1Ring, 8>(k, group);
}
// Whether a call takes it: m = 1, int8 / int4, its shared memory (x, scales, rings) <= 160 KB
// (k up to ~64k values for int8, ~58k for int4 g128 with 2 tiles, ~43k for int4 g32, ~37k for
// int4zp g32; less with 4 tiles), and the 32-bit piece indices hold.
template <int F> inline bool t1_applies(int m, int64_t n, int64_t k, int group) {
    if (!(F == I8 || F == I4 || F == I4Z) || m != 1 || t1_config() == 0) return false;
    return k / 16 < 0x7fffffffLL / 4 && t1_variant_smem<F>(t1_variant<F>(n, k), k, group) <= kT1MaxSmem;
}

// Lets `kernel` launch with `smem` bytes of dynamic shared memory (above the 48 KB default).
// The limit is per function and process-wide, so it is always set to one value per kernel and
// device, never to this launch's size: the most the device allows a block beside the kernel's
// static shared memory. (Setting it to each launch's size raced between host threads launching
// one kernel with different k: a thread lowered it between another's set and launch, and that
// launch failed with "invalid argument"; seen in session 16 with the GEMV tests' two threads,
// and the test gemv_one_token_kernels_from_several_host_threads covers it.) One attribute
// lookup per launch; the set only when the value differs. False, with the error cleared, when
// `smem` is above what the device allows (e.g. 99 KB on sm_86 / sm_89): the caller then takes
// another kernel.
template <typename Kernel> bool t1_opt_in(Kernel kernel, int64_t smem) {
    if (smem <= (48 << 10)) return true;
    cudaFuncAttributes fa;
    const int optin = smem_optin();
    if (optin <= 0 || cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    const int most = optin - (int)fa.sharedSizeBytes;
    if (smem > most) return false;
    if (fa.maxDynamicSharedSizeBytes != most &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

// The launch that the ring kernels (t1, t1g, t1b, tmg, tmi) share: opts `kernel` into `smem`
// bytes of dynamic shared memory and launches ceil(n / rows) CTAs of `threads` with `args`.
// Returns true with the launch's status in `st` (FL_ERR_INVALID_ARGUMENT past 2^31 - 1 CTAs);
// false, with no error left behind, when the device refuses the shared memory: the caller then
// takes another kernel.
template <typename... P, typename... A>
bool launch_ring(void (*kernel)(P...), int64_t smem, int64_t n, int rows, int threads, cudaStream_t s,
                 fl_status &st, A... args) {
    if (!t1_opt_in(kernel, smem)) return false;
    const int64_t ctas = ceil_div(n, rows);
    if (ctas > 0x7fffffffLL) {
        st = FL_ERR_INVALID_ARGUMENT;
        return true;
    }
    kernel<<<(unsigned)ctas, threads, (size_t)smem, s>>>(args...);
    st = launch_status();
    return true;
}

// Launches the one-token kernel (launch_ring: false when the device refuses its shared memory,
// and the caller then takes the general kernels).
template <int F, typename T, int NT, int S, bool ASYNC, int W = kT1Warps, int MODE = 0>
bool launch_t1(const T *x, const uint8_t *w, const void *scales, const uint8_t *zeros, T *y, int64_t n,
               int64_t k, int group, cudaStream_t s, fl_status &st) {
    const auto kernel = gemv_t1_kernel<F, T, NT, S, ASYNC, W, MODE>;
    const int64_t smem = t1_smem<F, NT, S, W>(k, group, MODE == 2);
    return launch_ring(kernel, smem, n, 8 * NT, 32 * W, s, st, x, w, scales, zeros, y, n, k, group);
}
// launch_t1 in int4 MODE t1_mode(v) (0 for int8).
template <int F, typename T, int NT, int S, int W>
bool launch_t1_mode(int v, const T *x, const uint8_t *w, const void *scales, const uint8_t *zeros, T *y, int64_t n,
                    int64_t k, int group, cudaStream_t s, fl_status &st) {
    if constexpr (F == I4 || F == I4Z)
        if (t1_mode<F>(v) == 2) return launch_t1<F, T, NT, S, true, W, 2>(x, w, scales, zeros, y, n, k, group, s, st);
    return launch_t1<F, T, NT, S, true, W>(x, w, scales, zeros, y, n, k, group, s, st);
}
template <int F, typename T>
bool launch_t1_config(const T *x, const uint8_t *w, const void *scales, const uint8_t *zeros, T *y,
                      int64_t n, int64_t k, int group, cudaStream_t s, fl_status &st) {
    const int v = t1_variant<F>(n, k);
    switch (v) {
    case 0: return launch_t1<F, T, 2, kT1Ring, false, 8>(x, w, scales, zeros, y, n, k, group, s, st);
    case 1: return launch_t1<F, T, 2, kT1Ring, true, 8>(x, w, scales, zeros, y, n, k, group, s, st);
    case 2: return launch_t1_mode<F, T, 2, kT1Ring, 4>(v, x, w, scales, zeros, y, n, k, group, s, st);
    case 4: return launch_t1<F, T, 6, kT1Ring, true, 4>(x, w, scales, zeros, y, n, k, group, s, st);
    case 5: return launch_t1_mode<F, T, 4, 3, 8>(v, x, w, scales, zeros, y, n, k, group, s, st);
    default: return launch_t1_mode<F, T, 4, kT1Ring, 4>(v, x, w, scales, zeros, y, n, k, group, s, st);
    }
}

// The weights as n rows of rowb bytes, a 2-d tensor of 8-byte elements, with boxes of box_bytes /
// 8 x box_rows, zero-filled out of bounds: the map of the one-token TMA kernels (t1t, t1b).
// False when the driver's encoder is missing or refuses (w must be 16-byte aligned, rowb a
// multiple of 16).
inline bool rows_map(CUtensorMap *m, const uint8_t *w, int64_t n, int64_t rowb, int box_bytes, int box_rows) {
    const auto enc = encode_fn();
    if (!enc || !aligned16(w)) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)(rowb / 8), (cuuint64_t)n};
    const cuuint64_t strides[1] = {(cuuint64_t)rowb};
    const cuuint32_t box[2] = {(cuuint32_t)(box_bytes / 8), (cuuint32_t)box_rows};
    const cuuint32_t estr[2] = {1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, const_cast<uint8_t *>(w), dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
// f(std::integral_constant<size_t, v>{}) for the one v in 0..N-1 equal to `v` (how a launcher
// picks one kernel instance per entry of a shape table); false when v is out of range.
template <typename Fn, size_t... I> bool with_index(int v, Fn &&f, std::index_sequence<I...>) {
    bool taken = false;
    (void)((v == (int)I && (taken = f(std::integral_constant<size_t, I>{}), true)) || ...);
    return taken;
}
template <size_t N, typename Fn> bool with_index(int v, Fn &&f) {
    return with_index(v, f, std::make_index_sequence<N>{});
}

// ---------------------------------------------------------------- one token, TMA rings (t1t)
// gemv_t1_kernel's product (int8 / int4, weights on the mma's A side, lane (g, t) taking piece
// t of rows g and g + 8 of each 16-row tile) with the copies of gemv_t1b_kernel (sm_90+): the
// weights come in stages of SC superchunks (64 bytes of each of the CTA's 8 NT rows each), one
// TMA tensor copy per stage (the weights as a 2-d map of 8-byte elements, box = 8 NT rows x the
// run + 64 bytes; rows past n and bytes past a row's end read 0) into one ring of S stages per
// CTA, counted on a "full" mbarrier; the warps split a stage by superchunks (warp w takes
// superchunks w, w + WG, ...; when a stage has fewer superchunks than warps, WH warps share one
// and take NJ of its 16-row tiles each) and release it on an "empty" mbarrier (one arrival per
// warp), which thread 0 waits on before copying the stage S later into the slot. In place of
// t1's per-warp cp.async rings: one instruction per stage instead of NT 16-byte cp.async per
// lane per superchunk. The product and the staging are t1's (t1_unit, t1_stage_async) for every
// int format, but only int8 is instantiated: int4 was slower than t1 here (t1t_config).
// - The 64 bytes past a row's run (they belong to the next stage) make the row stride 4 SC + 4
//   16-byte words, 4 mod 8 for even SC: the 8 lanes of a quarter warp (rows g, g + 1, pieces t)
//   then read 32 distinct banks.
// - x, int4's scales and zeros are staged as in t1 (cp.async, int4's x in nib_pair_order) while
//   the first S - 1 stages are in flight. Past k the weights read 0 and x is 0.
// Requires k % 32 == 0 and a 16-byte aligned weight tensor (the map). grid.x = ceil(n / (8
// NT)), block = 32 W, dynamic shared memory t1t_smem().
template <int SC> __host__ __device__ constexpr int t1t_row_stride() { return 64 * SC + 64; }
// Bytes of shared memory for nt tiles, stages of sc superchunks, a ring of s: x, scales, zeros
// (t1's), 2 s mbarriers, up to 112 bytes to align the ring to 128, the ring.
template <int F> inline int64_t t1t_smem(int nt, int sc, int s, int64_t k, int group) {
    const int groups = (F == I4 || F == I4Z) ? (int)(k / group) : 0;
    return (int64_t)t1_x_bytes<F>(k) + t1_scale_bytes<F>(nt, groups) + t1_zero_bytes<F>(nt, groups) + 16 * s + 128 +
           (int64_t)s * 8 * nt * (64 * sc + 64);
}

template <int F, typename T, int NT, int SC, int S, int W>
__global__ void __launch_bounds__(W * 32)
gemv_t1t_kernel(const T *__restrict__ x, const void *__restrict__ scales, const uint8_t *__restrict__ zeros,
                T *__restrict__ y, int64_t n, int64_t k, int group, const __grid_constant__ CUtensorMap wmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr bool I4S = F == I4 || F == I4Z;
    constexpr int PV = t1_piece_values<F>(), XV = PV / 8;
    constexpr int RS = t1t_row_stride<SC>(), RSW = RS / 16, R = 8 * NT, SB = R * RS;
    constexpr int NP = NT / 2;                   // 16-row tiles
    constexpr int WH = W > SC ? W / SC : 1;      // warps per superchunk
    constexpr int WG = W / WH;                   // superchunk groups
    constexpr int NJ = NP / WH;                  // 16-row tiles per warp
    constexpr int HP = (SC + WG - 1) / WG;       // superchunks per warp per stage (at most)
    static_assert(S >= 2 && SC % 2 == 0 && NT % 2 == 0 && W % WH == 0 && NP % WH == 0 && NJ >= 1,
                  "a ring of at least two stages, 16-row tiles split evenly");
    static_assert(RS / 8 <= 256 && R <= 256, "a TMA box has at most 256 elements per dimension");
    extern __shared__ __align__(16) unsigned char t1_raw[];
    __shared__ float red[WG][R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int pg = warp / WH, hw = warp % WH;  // superchunk group, tile share
    const int nsc = t1_superchunks<F>(k);
    const int nst = (nsc + SC - 1) / SC;        // stages
    const int pieces = (int)(k / PV);
    const int groups = I4S ? (int)(k / group) : 0;
    const int gshift = I4S ? __ffs(group / PV) - 1 : 0;  // log2(pieces per group)
    const int64_t base = (int64_t)blockIdx.x * R;

    uint4 *xs = reinterpret_cast<uint4 *>(t1_raw);
    const int xwords = t1_x_bytes<F>(k) / 16;
    unsigned short *ss = reinterpret_cast<unsigned short *>(t1_raw + t1_x_bytes<F>(k));
    uint8_t *zs = reinterpret_cast<uint8_t *>(ss) + t1_scale_bytes<F, NT>(groups);
    const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(t1_raw));
    const uint32_t bars = raw_s + (uint32_t)(t1_x_bytes<F>(k) + t1_scale_bytes<F, NT>(groups) +
                                             t1_zero_bytes<F, NT>(groups));  // 16-byte aligned
    const uint32_t ring_s = (bars + 16 * S + 127) & ~127u;
    const unsigned char *ring = t1_raw + (ring_s - raw_s);
    auto full = [&](int s) { return bars + 8u * (uint32_t)s; };
    auto empty = [&](int s) { return bars + 8u * (uint32_t)(S + s); };
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), W);
        }
        fence_mbar_init();
    }
    __syncthreads();
    auto issue = [&](int i) {  // thread 0 only
        if (i >= nst) return;
        const int s = i % S;
        if (i >= S) mbar_wait(empty(s), ((i / S) + 1) & 1);  // step i - S released
        mbar_expect_tx(full(s), SB);
        tma_load_2d(ring_s + (uint32_t)(s * SB), &wmap, full(s), i * (SC * 8), (int)base);
    };
    if (threadIdx.x == 0)
        for (int i = 0; i < S - 1; ++i) issue(i);

    t1_stage_async<F, T, NT>(xs, ss, zs, x, scales, zeros, n, k, base, groups, xwords);
    cp_async_commit();
    cp_async_wait<0>();
    if constexpr (I4S) {  // each thread reorders the words it copied
        for (int i = threadIdx.x; i < xwords; i += blockDim.x) xs[i] = nib_pair_order(xs[i]);
    }
    __syncthreads();
    // Lanes with g == t read their piece's x; the others the zero tail.
    const uint4 *xv = xs + (g == t ? XV * t : xwords - 4);
    const int xstep = g == t ? 4 * XV : 0;  // uint4s per superchunk
    const NibZ zsym = nib_z<T>(8u);

    float acc[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int i = 0; i < nst; ++i) {
        if (threadIdx.x == 0) issue(i + S - 1);
        const int s = i % S;
        mbar_wait(full(s), (i / S) & 1);
        const uint4 *stage = reinterpret_cast<const uint4 *>(ring + s * SB) + g * RSW + t;
#pragma unroll
        for (int hh = 0; hh < HP; ++hh) {
            const int q = pg + hh * WG, sci = i * SC + q;
            if (q < SC && sci < nsc)
                t1_unit<F, T, NJ, 8 * RSW>(stage + 4 * q, xv + sci * xstep, ss, zs, zsym, groups, 4 * sci, pieces,
                                           gshift, g, t, hw * NJ, acc);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty(s));  // this warp is done with the slot
    }

    // The superchunk groups' row sums in order.
    t1_epilogue<F, T, NJ, R, WG>(acc, red, pg, hw * NJ, g, t, scales, y, base, n);
#endif
}

// Its configuration: FL_GEMV_T1T (read once; A/B runs) = 0: off (t1); 1 (default): int8 takes
// kT1tShapes[0] (4 tiles, stages of 16 superchunks, a ring of 3, 8 warps) unless the grid of
// 32-row CTAs is between 2 and 4 per SM (n = 11008: 344 CTAs on 132 SMs; there t1); int4 never
// (t1); lab 2..5: kT1tShapes[v - 2] for int8.
// Measured on the H100 (bench/RESULTS.md, session 16, quick bench, us at m = 1, two runs):
// int8 with kT1tShapes[0] against t1: 4096 x 4096 9.51-9.56 against 9.85-9.98, 4096 x 11008
// 19.43-19.55 against 20.08-20.16, 32000 x 4096 48.16-48.28 against 49.43-49.59, but 11008 x
// 4096 20.81-20.87 against 20.56-20.63 (hence the rule). int4 (g128, with and without zero
// point) was slower than t1 at every shape under all nine shapes tried (11008 x 4096: 15.5-17.9
// against 13.1-13.3 us; 32000 x 4096: 31.8-39.0 against 30.1-30.3), 16-warp CTAs included: t1's
// 4-warp CTAs keep more warps per SM, and int4's dequantisation (twice int8's work per byte)
// is what waits. So only int8 is instantiated.
inline int t1t_config() {
    static const EnvChoice choices[] = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}, {"4", 4}, {"5", 5}};
    static const int v = env_choice("FL_GEMV_T1T", choices, 1);
    return v;
}
// A kernel: 8-row tiles NT, superchunks per stage SC, ring S, warps W.
struct T1tShape {
    int nt, sc, s, w;
};
// The kernels, in the order of FL_GEMV_T1T 2..5 (index 0: the default's; stage bytes 8 NT (64
// SC + 64)).
constexpr T1tShape kT1tShapes[] = {{4, 16, 3, 8}, {4, 8, 4, 16}, {4, 8, 4, 8}, {4, 4, 8, 8}};
// The kernel a call takes: an index into kT1tShapes, or -1 (t1).
template <int F> inline int t1t_variant(int64_t n, int64_t k) {
    (void)k;
    const int c = t1t_config();
    if (F != I8 || c == 0) return -1;
    if (c >= 2) return c - 2;
    const int64_t ctas = ceil_div(n, 32), sms = sm_count();
    return ctas > 2 * sms && ctas < 4 * sms ? -1 : 0;
}
template <int F> inline int64_t t1t_variant_smem(int v, int64_t k, int group) {
    const T1tShape &c = kT1tShapes[v];
    return t1t_smem<F>(c.nt, c.sc, c.s, k, group);
}
// Whether a call takes it: m = 1, int8, a variant for the call, an sm_90+ device, its
// shared memory <= 160 KB (x, scales and the ring), n < 2^31, the 32-bit piece indices hold,
// and the driver's tensor-map encoder (a weight tensor the map refuses, e.g. not 16-byte
// aligned, makes the launch fall back to t1).
template <int F> inline bool t1t_applies(int m, int64_t n, int64_t k, int group) {
    if (F != I8 || m != 1) return false;
    const int v = t1t_variant<F>(n, k);
    if (v < 0 || cc_major() < 9 || t1t_variant_smem<F>(v, k, group) > kT1MaxSmem) return false;
    return n < 0x7fffffffLL && k / 16 < 0x7fffffffLL / 4 && encode_fn() != nullptr;
}
template <int F, typename T, int NT, int SC, int S, int W>
bool launch_t1t(const T *x, const uint8_t *w, const void *scales, const uint8_t *zeros, T *y, int64_t n, int64_t k,
                int group, cudaStream_t s, fl_status &st) {
    const auto kernel = gemv_t1t_kernel<F, T, NT, SC, S, W>;
    CUtensorMap map;
    std::memset(&map, 0, sizeof(map));
    if (!rows_map(&map, w, n, F == I8 ? k : k / 2, t1t_row_stride<SC>(), 8 * NT)) return false;
    static_assert(t1t_row_stride<SC>() == 64 * SC + 64, "t1t_smem's row stride");
    return launch_ring(kernel, t1t_smem<F>(NT, SC, S, k, group), n, 8 * NT, 32 * W, s, st, x, scales, zeros, y, n, k,
                       group, map);
}
template <int F, typename T>
bool launch_t1t_config(const T *x, const uint8_t *w, const void *scales, const uint8_t *zeros, T *y, int64_t n,
                       int64_t k, int group, cudaStream_t s, fl_status &st) {
    if constexpr (F != I8) {
        return false;  // (t1t_applies already refused it)
    } else {
        constexpr size_t kShapes = sizeof(kT1tShapes) / sizeof(kT1tShapes[0]);
        return with_index<kShapes>(t1t_variant<F>(n, k), [&](auto i) {
            constexpr T1tShape c = kT1tShapes[decltype(i)::value];
            return launch_t1t<F, T, c.nt, c.sc, c.s, c.w>(x, w, scales, zeros, y, n, k, group, s, st);
        });
    }
}

// ---------------------------------------------------------------- one token, GGUF (t1g)
// The one-token kernel above for llama.cpp's Q8_0 and Q4_0 blocks (34 and 18 bytes: an f16
// scale d and 32 quants), which at m = 1 took the CUDA-core kernel at 47-78% of copy bandwidth
// (bench/RESULTS.md, session 11). The blocks are only 2-byte aligned, so a lane cannot copy
// "its" block with 16-byte cp.async; instead:
// - A superchunk is BPS = 8 blocks of each row (144 / 272 bytes: a whole number of 16-byte
//   words when k % 256 == 0, which the kernel requires, so that every row starts on a 16-byte
//   boundary; or 16 blocks, whole 32-byte sectors, when k % 512 == 0, see t1g_config) of the
//   CTA's 8 NT rows. The warp copies it as one contiguous run of words per
//   row (lane l copies words l, l + 32, ... of the slot: fully coalesced) into a ring of S
//   slots; a __syncwarp after cp.async.wait_group makes the other lanes' words visible (and
//   one before each copy keeps a slot from being overwritten while a lane still reads it).
// - The weights are the mma's A side (16 rows x 16 k) and x its B side (16 k x 8 columns),
//   the other way round from the kernel above: A needs no zero registers then (there, rows
//   8..15 of A were zero and cost four register moves per mma) and each mma covers 16 weight
//   rows instead of 8. Lane (g, t) supplies weight rows g and g + 8 of each 16-row tile at the
//   k-slots {2t, 2t+1, 2t+8, 2t+9}, all from its own block (4h + t in pass h of the
//   superchunk's BPS / 4); B column c holds x of block slot c alone (lanes with
//   g == t supply it, the others the zero tail), so D column c is block slot c's dot product
//   for each of the 16 rows (columns 4..7 are 0) and gets that block's d, read from the slot,
//   before the slots are summed.
// - Quants are read through aligned 32-bit shared loads and funnel shifts (block b's quants
//   start at 2 mod 4 for even b), dequantised by nib_pairs (Q4_0, zero 8) or byte_pairs
//   (Q8_0), exact as above.
// - x is staged once per CTA by cp.async; Q4_0 (value j in the low nibble of byte j, value
//   16 + j in the high one) in the k order of nib_pairs' pairs per quant word c: (4c, 4c+2),
//   (16+4c, 18+4c), (4c+1, 4c+3), (17+4c, 19+4c) (a_frags<Q40>), each thread reordering the
//   blocks it copied; Q8_0 as stored.
// grid.x = ceil(n / (8 * NT)) (NT even), block = 32 * W, dynamic shared memory t1g_smem().
// BPS: blocks per row per superchunk (8; lab: 16).
template <int F, int BPS = 8> __host__ __device__ constexpr int t1g_row_bytes() { return BPS * block_bytes<F>(); }
template <int F, int NT, int BPS = 8> __host__ __device__ constexpr int t1g_slot_words() { return NT * 8 * t1g_row_bytes<F, BPS>() / 16; }
// Staged x (k values and 64 zero bytes), the warps' rings, 16 bytes that the last block's
// shared loads may read past its slot.
template <int F, int NT, int S, int W, int BPS = 8> inline int64_t t1g_smem(int64_t k) {
    return 2 * k + 64 + (int64_t)W * S * t1g_slot_words<F, NT, BPS>() * 16 + 16;
}

// The sync of a ring shared by PW warps (see gemv_tmi_kernel): __syncwarp for one warp, else
// named barrier 1 + grp over the ring's 32 PW threads (barrier 0 is __syncthreads').
template <int PW> __device__ __forceinline__ void ring_sync(int grp) {
    if constexpr (PW == 1) __syncwarp();
    else asm volatile("bar.sync %0, %1;" ::"r"(1 + grp), "n"(32 * PW) : "memory");
}

// The one-token GGUF kernels' (t1g, t1b) x staging: x's xdata uint4s by cp.async (the caller
// commits and waits), whole blocks (4 uint4s) per thread so that q40_x_order can reorder the
// blocks each thread copied, then 64 zero bytes (what the lanes with g != t read).
template <typename T> __device__ __forceinline__ void gguf_stage_x(uint4 *xs, const T *x, int xdata) {
    const uint4 *x4 = reinterpret_cast<const uint4 *>(x);
    for (int b = threadIdx.x; b < xdata / 4; b += blockDim.x)
#pragma unroll
        for (int q = 0; q < 4; ++q) cp_async16(xs + 4 * b + q, x4 + 4 * b + q, 16);
    if (threadIdx.x < 4) xs[xdata + threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
}
// Q4_0: each block's staged x (the thread's own copies) in the k order of a_frags<Q40>.
__device__ __forceinline__ void q40_x_order(uint4 *xs, int xdata) {
    for (int b = threadIdx.x; b < xdata / 4; b += blockDim.x) {
        uint4 *p = xs + 4 * b;
        const uint4 v0 = p[0], v1 = p[1], v2 = p[2], v3 = p[3];
        // Quant word c: x[4c..4c+3] (half of v[c / 2]) and x[16+4c..19+4c] (of v[2 + c / 2]).
        const uint32_t lo[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        const uint32_t hi[8] = {v2.x, v2.y, v2.z, v2.w, v3.x, v3.y, v3.z, v3.w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const uint32_t v[4] = {lo[2 * c], lo[2 * c + 1], hi[2 * c], hi[2 * c + 1]};
            uint32_t f[4];
            a_frags<Q40>(v, f);
            p[c] = make_uint4(f[0], f[1], f[2], f[3]);
        }
    }
}
// Pass h of a slot (4 blocks; lane t takes block 4h + t, whose quants start at byte a of the
// row, sh = 16 when a % 4 == 2) for rows g and g + 8 of one 16-row tile: r0 is row g's run in
// the slot (rows RS bytes apart), xw the block's staged x (zeros for lanes with g != t). The
// 16 x 8 product D's column c is block slot c's dot product, scaled by that block's d of each
// row into acc: d[0], d[1]: row g, block slots c0 = 2t % 4, c1 = (2t + 1) % 4 (t >= 2: columns
// 4..7, always 0; any valid slot's d is read for them); d[2], d[3]: row g + 8.
template <int F, typename T, int RS>
__device__ __forceinline__ void gguf_pass(const unsigned char *r0, const uint4 (&xw)[4], int a, unsigned sh, int h,
                                          int c0, int c1, NibZ zsym, float (&acc)[4]) {
    constexpr int BB = block_bytes<F>(), QW = F == Q80 ? 8 : 4;  // quant words per block
    const uint32_t *w0 = reinterpret_cast<const uint32_t *>(r0 + (a & ~3));
    const uint32_t *w1 = reinterpret_cast<const uint32_t *>(r0 + 8 * RS + (a & ~3));
    uint32_t raw0[QW + 1], raw1[QW + 1];
#pragma unroll
    for (int c = 0; c <= QW; ++c) raw0[c] = w0[c], raw1[c] = w1[c];
    float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int c = 0; c < QW; ++c) {
        const uint32_t q0 = __funnelshift_r(raw0[c], raw0[c + 1], sh);
        const uint32_t q1 = __funnelshift_r(raw1[c], raw1[c + 1], sh);
        if constexpr (F == Q40) {  // word c: values 4c..4c+3 and 16+4c..19+4c
            uint32_t p0[4], p1[4];
            nib_pairs<T>(q0, zsym, p0);
            nib_pairs<T>(q1, zsym, p1);
            const uint32_t a1[4] = {p0[0], p1[0], p0[1], p1[1]};
            const uint32_t a2[4] = {p0[2], p1[2], p0[3], p1[3]};
            mma<T>(d, a1, xw[c].x, xw[c].y);
            mma<T>(d, a2, xw[c].z, xw[c].w);
        } else {  // word c: values 4c..4c+3
            uint32_t p0a, p0b, p1a, p1b;
            byte_pairs<T>(q0, p0a, p0b);
            byte_pairs<T>(q1, p1a, p1b);
            const uint32_t aa[4] = {p0a, p1a, p0b, p1b};
            mma<T>(d, aa, c & 1 ? xw[c >> 1].z : xw[c >> 1].x, c & 1 ? xw[c >> 1].w : xw[c >> 1].y);
        }
    }
    const unsigned char *s0 = r0 + (4 * h + c0) * BB, *s1 = r0 + (4 * h + c1) * BB;
    acc[0] = fmaf(d[0], __half2float(*reinterpret_cast<const __half *>(s0)), acc[0]);
    acc[1] = fmaf(d[1], __half2float(*reinterpret_cast<const __half *>(s1)), acc[1]);
    acc[2] = fmaf(d[2], __half2float(*reinterpret_cast<const __half *>(s0 + 8 * RS)), acc[2]);
    acc[3] = fmaf(d[3], __half2float(*reinterpret_cast<const __half *>(s1 + 8 * RS)), acc[3]);
}

template <int F, typename T, int NT, int S, int W, int BPS = 8, int PW = 1>
__global__ void __launch_bounds__(W * 32)
gemv_t1g_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, T *__restrict__ y, int64_t n,
                int64_t k) {
    constexpr int BB = block_bytes<F>(), RB = t1g_row_bytes<F, BPS>(), RW = RB / 16;
    constexpr int SW = t1g_slot_words<F, NT, BPS>();  // uint4s per slot: row r's at r * RW
    constexpr int G = W / PW, GT = 32 * PW;      // rings, threads per ring
    constexpr int CP = (SW + GT - 1) / GT;       // copies per thread per superchunk
    constexpr int NP = NT / 2, NJ = NP / PW;     // 16-row tiles: per CTA, per warp
    // (S = 1: a single slot, refilled only after it is consumed; for rings of one superchunk.)
    static_assert(S >= 1 && RB % 16 == 0 && NT % 2 == 0 && W % PW == 0 && NP % PW == 0,
                  "a ring of superchunks of whole words, 16-row tiles, whole rings");
    extern __shared__ __align__(16) unsigned char t1_raw[];
    __shared__ float red[G][NT * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    // PW warps share a ring (grp): they copy its superchunks together and take NJ of its 16-row
    // tiles each (hw).
    const int grp = warp / PW, hw = warp % PW, tl = threadIdx.x % GT;
    const int nsc = (int)(k / (32 * BPS));      // superchunks per row
    const int64_t rowb = (k >> 5) * BB;         // bytes per row
    const int64_t base = (int64_t)blockIdx.x * (8 * NT);
    const int xdata = (int)(k >> 3);            // uint4s of x
    uint4 *xs = reinterpret_cast<uint4 *>(t1_raw);
    uint4 *ring = xs + xdata + 4 + grp * (S * SW);

    // This thread's copies: word c = tl + GT e of a slot is word c % RW of row c / RW, at
    // byte src[e] from the CTA's first row (32-bit: 8 NT rows); rows past n copy row n - 1
    // (valid memory; their outputs are dropped).
    const uint8_t *wcta = w + base * rowb;
    uint32_t src[CP];
#pragma unroll
    for (int e = 0; e < CP; ++e) {
        const int c = tl + GT * e;
        const int64_t r = c / RW < n - base ? c / RW : n - 1 - base;
        src[e] = (uint32_t)(r * rowb) + 16u * (uint32_t)(c % RW);
    }
    const int mine = nsc > grp ? (nsc - grp + G - 1) / G : 0;  // this ring's superchunks

    // Stage x, one commit group ahead of the ring's.
    gguf_stage_x(xs, x, xdata);
    cp_async_commit();
    auto issue = [&](int i) {
        if (i < mine) {
            const uint8_t *wsc = wcta + (int64_t)(grp + i * G) * RB;
            uint4 *slot = ring + (i % S) * SW + tl;
#pragma unroll
            for (int e = 0; e < CP; ++e)
                if (CP * GT == SW || tl + GT * e < SW) cp_async16_pf<128>(slot + GT * e, wsc + src[e], 16);
        }
        cp_async_commit();  // (an empty group past the ring's share)
    };
    constexpr int PRE = S > 1 ? S - 1 : 1;  // superchunks issued before the loop
#pragma unroll
    for (int i = 0; i < PRE; ++i) issue(i);
    cp_async_wait<PRE>();  // the staging group
    if constexpr (F == Q40) q40_x_order(xs, xdata);
    __syncthreads();
    const NibZ zsym = nib_z<T>(8u);
    const int c0 = (2 * t) & 3, c1 = (2 * t + 1) & 3;  // block slots of this lane's D columns

    float acc[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int i = 0; i < mine; ++i) {
        if (S > 1 || i > 0) {
            ring_sync<PW>(grp);  // every thread is done with slot (i - 1) % S (step i - 1)
            issue(i + S - 1);    // into that slot (S = 1: superchunk i, into the only slot)
        }
        cp_async_wait<S - 1>();  // this thread's words of superchunk i are in ...
        ring_sync<PW>(grp);      // ... and every thread's are visible
        const int sci = grp + i * G;
        const unsigned char *slot = reinterpret_cast<const unsigned char *>(ring + (i % S) * SW);
#pragma unroll
        for (int h = 0; h < BPS / 4; ++h) {
            const int b = 4 * h + t;  // this lane's block
            const uint4 *xv = g == t ? xs + 4 * (BPS * sci + b) : xs + xdata;
            const uint4 xw[4] = {xv[0], xv[1], xv[2], xv[3]};
            const int a = b * BB + 2;  // its quants' first byte in the row
            const unsigned sh = (a & 2) ? 16u : 0u;
#pragma unroll
            for (int j = 0; j < NJ; ++j)  // rows g and g + 8 of tile hw NJ + j
                gguf_pass<F, T, RB>(slot + (16 * (hw * NJ + j) + g) * RB, xw, a, sh, h, c0, c1, zsym, acc[j]);
        }
    }
    cp_async_wait<0>();  // no copy outlives the kernel (the tail's groups are empty)

    // The rings' row sums in order.
    t1_epilogue<F, T, NJ, NT * 8, G>(acc, red, grp, hw * NJ, g, t, nullptr, y, base, n);
}

// Its configuration: FL_GEMV_T1G (read once; A/B runs) = 0: off (Q8_0 and Q4_0 at m = 1 take
// the CUDA-core kernel, as before session 12); 1 (default): 4 tiles of 8 rows per CTA, a ring
// of 2 superchunks, 4 warps; superchunks of 16 blocks per row when k % 512 == 0 and n >= 64 x
// SMs (Q4_0) / 128 x SMs (Q8_0), else 8; lab: 2: ring 3; 3: 2 tiles, ring 3; 4: 16 blocks
// whenever k % 512 == 0.
// Measured on the H100 (bench/RESULTS.md, session 12): 4 tiles against 2 (ring 3): Q4_0 at
// 4096 x 4096 8.6 against 9.7-9.9 us, 11008 x 4096 18.1-18.3 against 19.7-19.9, 32000 x 4096
// 39.4-39.8 against 45.4-45.7; Q8_0 11.5 against 12.5-12.8 at 4096 x 4096, 60.2 against
// 64.0-64.4 at 32000 x 4096. Ring 2 against 3 with 4 tiles: Q4_0 17.4-17.5 against 18.1-18.3
// us at 11008 x 4096, the rest tied. 2 tiles with a ring of 4, 1 tile (rings 3 and 4, 4 or
// 8 warps) and CTAs of 2 warps were slower; so was 4 tiles with 2 warps and a ring of 3
// (call 6: Q4_0 18.4-18.5 against 17.4-17.6 us at 11008 x 4096). 4 tiles of 8 warps (ring
// 2) were mixed: Q4_0 at 32000 x 4096 38.0 against 40.3 us and Q8_0 at 11008 x 4096 25.5
// against 26.1, but both 4096 x 4096 rows 3-5% slower and Q8_0 at 32000 x 4096 1.5%.
// Superchunks of 16 blocks (288 / 544 bytes: whole 32-byte sectors, where 8 blocks straddle
// sectors that the next warp's superchunk shares) at k = 4096 (call 8): Q4_0 32000 x 4096
// 32.7-32.8 against 40.1-40.4 us, 11008 x 4096 15.6-15.7 against 17.3; Q8_0 32000 x 4096
// 56.3-56.6 against 60.0-60.1, 11008 x 4096 26.1 against 25.8; both 4096 x 4096 rows slower
// (Q4_0 8.5-8.8 against 8.2-8.3, Q8_0 12.9-13.0 against 11.3: half the pipeline steps per
// warp), hence the n rules. 16 blocks with 2 warps were slower than with 4.
// Session 14 (calls 1, 4): 6 and 8 tiles per CTA (lab 5, 6) slower at every shape (Q4_0
// 11008 x 4096 17.1 / 18.6 against 15.6 us, Q8_0 only 25.2 against 25.7 there); pairs of warps
// per ring (lab 7, 8 warps) tied at 4096 x 4096 and 32000 x 4096, Q4_0 at 4096 x 11008
// 14.8-14.9 against 15.2-15.3 but at 11008 x 4096 16.7-16.8 against 15.8-16.0: not taken.
// Session 19 (calls 2-3): Q4_0 at k = 4096, where the 16-block superchunks are 8 per row, takes
// 8 warps with a ring of one slot each (variant 8): every warp copies one superchunk, waits,
// computes it; the same 82 KB per CTA as 4 warps with two slots, but twice the warps per
// scheduler and half the serial work per warp. 11008 x 4096 14.4-14.6 against 15.7-15.8 us,
// 32000 x 4096 32.3-32.5 against 32.9; lab 8 keeps session 18's rule (variant 3) for A/B. Not
// taken for other k: a ring of one slot serialises a warp's second superchunk. (Call 1: x read
// from global memory instead of staged, 3 CTAs per SM, was slower: removed.)
inline int t1g_config() {
    static const EnvChoice choices[] = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}, {"4", 4},
                                        {"5", 5}, {"6", 6}, {"7", 7}, {"8", 8}};
    static const int v = env_choice("FL_GEMV_T1G", choices, 1);
    return v;
}
// The kernel a call takes: 0: 4 tiles, ring 2, 4 warps, 8 blocks; 1: the same with ring 3;
// 2: 2 tiles, ring 3; 3: 4 tiles, ring 2, 4 warps, 16 blocks; 8: 4 tiles, 8 warps, a ring of
// one 16-block slot each (Q4_0 at k = 4096 where 3 would apply); lab: 4: 6 tiles, ring 2, 4
// warps, 8 blocks; 5: 8 tiles, the same; 6 / 7: 0 / 3 with 8 warps in pairs per ring.
template <int F> inline int t1g_variant(int64_t n, int64_t k) {
    const int c = t1g_config();
    if (c == 2) return 1;
    if (c == 3) return 2;
    if (c == 5) return 4;
    if (c == 6) return 5;
    // (16 blocks only where their larger ring fits: see t1g_applies.)
    if (k % 512 == 0 && (c == 4 || n >= (F == Q40 ? 64 : 128) * (int64_t)sm_count()) &&
        t1g_smem<F, 4, 2, 4, 16>(k) <= kT1MaxSmem)
        return c == 7 ? 7 : (c == 1 && F == Q40 && k == 16 * 32 * 8) ? 8 : 3;
    return c == 7 ? 6 : 0;
}
// (The W of t1g_smem is the number of rings: warps / warps per ring.)
template <int F> inline int64_t t1g_variant_smem(int v, int64_t k) {
    return v == 8 ? t1g_smem<F, 4, 1, 8, 16>(k)
         : v == 4 ? t1g_smem<F, 6, 2, 4>(k) : v == 5 ? t1g_smem<F, 8, 2, 4>(k)
         : v == 1 ? t1g_smem<F, 4, 3, 4>(k) : v == 2 ? t1g_smem<F, 2, 3, 4>(k)
         : v == 3 || v == 7 ? t1g_smem<F, 4, 2, 4, 16>(k) : t1g_smem<F, 4, 2, 4>(k);
}
// Whether a call takes it: m = 1, Q8_0 / Q4_0, k % 256 == 0 (rows on 16-byte boundaries), its
// shared memory <= 160 KB (k up to ~63k values for Q4_0, ~47k for Q8_0 with 8 blocks; 16
// blocks fit up to ~44k / ~12k, past that the call takes 8).
template <int F> inline bool t1g_applies(int m, int64_t n, int64_t k) {
    if (!(F == Q80 || F == Q40) || m != 1 || k % 256 != 0 || t1g_config() == 0) return false;
    return t1g_variant_smem<F>(t1g_variant<F>(n, k), k) <= kT1MaxSmem;
}
template <int F, typename T, int NT, int S, int W, int BPS = 8, int PW = 1>
bool launch_t1g(const T *x, const uint8_t *w, T *y, int64_t n, int64_t k, cudaStream_t s, fl_status &st) {
    const auto kernel = gemv_t1g_kernel<F, T, NT, S, W, BPS, PW>;
    const int64_t smem = t1g_smem<F, NT, S, W / PW, BPS>(k);
    return launch_ring(kernel, smem, n, 8 * NT, 32 * W, s, st, x, w, y, n, k);
}
template <int F, typename T>
bool launch_t1g_config(const T *x, const uint8_t *w, T *y, int64_t n, int64_t k, cudaStream_t s, fl_status &st) {
    switch (t1g_variant<F>(n, k)) {
    case 1: return launch_t1g<F, T, 4, 3, 4>(x, w, y, n, k, s, st);
    case 2: return launch_t1g<F, T, 2, 3, 4>(x, w, y, n, k, s, st);
    case 3: return launch_t1g<F, T, 4, 2, 4, 16>(x, w, y, n, k, s, st);
    case 4: return launch_t1g<F, T, 6, 2, 4>(x, w, y, n, k, s, st);
    case 5: return launch_t1g<F, T, 8, 2, 4>(x, w, y, n, k, s, st);
    case 6: return launch_t1g<F, T, 4, 2, 8, 8, 2>(x, w, y, n, k, s, st);
    case 7: return launch_t1g<F, T, 4, 2, 8, 16, 2>(x, w, y, n, k, s, st);
    case 8: return launch_t1g<F, T, 4, 1, 8, 16>(x, w, y, n, k, s, st);
    default: return launch_t1g<F, T, 4, 2, 4>(x, w, y, n, k, s, st);
    }
}

// ---------------------------------------------------------------- one token, GGUF, copy engine (t1b)
// gemv_t1g_kernel with its per-warp cp.async rings replaced by rings that the copy engine
// fills (sm_90+): the default for Q8_0, and for Q4_0 at k >= 8192 or n <= 32 x SMs (see
// t1b_config). Session 14's ncu had t1g latency-bound (long-scoreboard stalls, 1.9 warps per
// scheduler, 18 cp.async per lane per superchunk of 16 blocks); here:
// - A stage is BPS blocks of each of the CTA's R = 8 NT rows. TM (the default): thread 0 of
//   the ring copies it with one TMA tensor copy (a box of R rows, see below); else thread r < R
//   copies row r's run (BPS x 18 / 34 bytes, fewer in the last stage) with one bulk copy
//   (cp.async.bulk). The stage's "full" mbarrier counts the bytes (one expect_tx). Rows sit at
//   a stride of an odd number of 16-byte words (the run, + 16 bytes when it is even), which
//   keeps the lanes' 32-bit reads at two-way bank conflicts (a row stride of 0 mod 128 bytes
//   gives eight).
// - One ring per CTA (WR = false): warps split a stage by passes of 4 blocks (lane t takes
//   block 4h + t of pass h, rows g and g + 8 of each 16-row tile, exactly t1g's product); when
//   a stage has fewer passes than warps, WH warps share a pass and take NP / WH of its tiles
//   each. A warp done with a stage arrives on its "empty" mbarrier (one arrival per warp of
//   the ring); the producer waits for it before copying the stage S later into the slot. WR:
//   a ring per warp, which takes stages w, w + W, ... whole (t1g's split).
// - The producers are consumers too: at the start of step i they copy the ring's stage of step
//   i + S - 1 (after every warp of the ring is done with step i - 1), then wait for step i's.
// - x is staged as in t1g (cp.async, Q4_0 reordered), while the first S - 1 stages are in
//   flight; the warps' sums are added in a fixed order (deterministic).
// Requires k % 256 == 0 (every run of 8 blocks a whole number of 16-byte words, rows on 16-byte
// boundaries). grid.x = ceil(n / R), block = 32 W, dynamic shared memory t1b_smem().
// A row's run of `run` bytes (a multiple of 16) padded to an odd number of 16-byte words.
__host__ __device__ constexpr int odd_words(int run) { return (run / 16) % 2 ? run : run + 16; }
template <int F, int BPS> __host__ __device__ constexpr int t1b_row_stride() {
    return odd_words(t1g_row_bytes<F, BPS>());
}
// Bytes of a stage of NT tiles (8 NT rows) of BPS blocks of BB bytes.
__host__ __device__ constexpr int t1b_stage_bytes(int bb, int nt, int bps) { return nt * 8 * odd_words(bps * bb); }
// Bytes of shared memory: staged x (k values and 64 zero bytes), 2 S mbarriers per ring (nr
// rings), the rings of s stages (128-byte aligned: up to 112 bytes of padding), 16 bytes that
// the last block's shared loads may read past them.
inline int64_t t1b_smem(int stage_bytes, int s, int nr, int64_t k) {
    return 2 * k + 64 + 16 * s * nr + 128 + (int64_t)nr * s * stage_bytes + 16;
}

// TM: one TMA tensor copy per stage (the box of R rows x t1b_row_stride bytes at the stage's
// first block, `wmap` from rows_map: the 16 bytes past a row's run belong to the next stage
// and are copied too, rows past n and bytes past a row's end read 0) in place of R bulk
// copies. WR (lab): a ring per warp, as in t1g (warp w takes stages w, w + W, ... whole, no
// other warp waits for it), in place of one per CTA.
template <int F, typename T, int NT, int BPS, int S, int W, bool TM = false, bool WR = false>
__global__ void __launch_bounds__(W * 32)
gemv_t1b_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, T *__restrict__ y, int64_t n,
                int64_t k, const __grid_constant__ CUtensorMap wmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int BB = block_bytes<F>(), RS = t1b_row_stride<F, BPS>(), R = 8 * NT;
    constexpr int SB = t1b_stage_bytes(BB, NT, BPS);
    constexpr int NP = NT / 2;              // 16-row tiles
    constexpr int PS = BPS / 4;             // passes of a whole stage
    constexpr int NR = WR ? W : 1;          // rings
    constexpr int WPR = W / NR;             // warps per ring
    constexpr int WH = WPR > PS ? WPR / PS : 1;  // warps per pass
    constexpr int WG = WPR / WH;            // pass groups
    constexpr int NJ = NP / WH;             // tiles per warp
    constexpr int HP = (PS + WG - 1) / WG;  // passes per warp per stage (at most)
    static_assert(S >= 2 && BPS % 8 == 0 && NT % 2 == 0 && WPR % WH == 0 && NP % WH == 0 && R <= 32 * WPR,
                  "a ring of at least two stages of whole words, 16-row tiles split evenly");
    static_assert(!TM || (RS / 8 <= 256 && R <= 256), "a TMA box has at most 256 elements (8 bytes) per dimension");
    extern __shared__ __align__(16) unsigned char t1_raw[];
    __shared__ float red[NR * WG][NT * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int rg = warp / WPR, lt = threadIdx.x % (32 * WPR);  // ring, thread in the ring
    const int pg = (warp % WPR) / WH, hw = (warp % WPR) % WH;  // pass group, tile share
    const int nb = (int)(k >> 5);               // blocks per row
    const int nst = (nb + BPS - 1) / BPS;       // stages
    const int64_t rowb = (int64_t)nb * BB;      // bytes per row
    const int64_t base = (int64_t)blockIdx.x * R;
    const int xdata = (int)(k >> 3);            // uint4s of x
    uint4 *xs = reinterpret_cast<uint4 *>(t1_raw);
    const uint32_t bars = static_cast<uint32_t>(__cvta_generic_to_shared(xs + xdata + 4));
    const uint32_t ring_s = ((bars + 16 * S * NR + 127) & ~127u) + (uint32_t)(rg * S * SB);  // this ring's
    const unsigned char *ring = t1_raw + (ring_s - static_cast<uint32_t>(__cvta_generic_to_shared(t1_raw)));
    auto full = [&](int s) { return bars + 8u * (uint32_t)(rg * S + s); };
    auto empty = [&](int s) { return bars + 8u * (uint32_t)(NR * S + rg * S + s); };
    if (threadIdx.x == 0) {
        for (int s = 0; s < S * NR; ++s) {
            mbar_init(bars + 8u * s, 1);
            mbar_init(bars + 8u * (NR * S + s), WPR);
        }
        fence_mbar_init();
    }
    __syncthreads();

    // The ring's stages: rg, rg + NR, ... (step i: stage rg + i NR). Producer thread lt < R of
    // the ring: row base + lt (row n - 1 past n: valid memory, output dropped); with TM, thread
    // lt = 0 alone.
    const int mine = nst > rg ? (nst - rg + NR - 1) / NR : 0;
    const bool producer = (warp % WPR) * 32 < R;
    const int64_t prow = base + (lt < R ? lt : 0);
    const uint8_t *wrow = w + (prow < n ? prow : n - 1) * rowb;
    auto issue = [&](int i) {  // producer warps only
        if (i >= mine) return;
        const int s = i % S, st = rg + i * NR;
        if (i >= S) mbar_wait(empty(s), ((i / S) + 1) & 1);  // step i - S released
        if constexpr (TM) {
            if (lt == 0) {
                mbar_expect_tx(full(s), SB);
                tma_load_2d(ring_s + (uint32_t)(s * SB), &wmap, full(s), st * (BPS * BB / 8), (int)base);
            }
        } else {
            const uint32_t run = (uint32_t)((nb - st * BPS < BPS ? nb - st * BPS : BPS) * BB);
            if (lt == 0) mbar_expect_tx(full(s), R * run);
            if (lt < R)
                bulk_copy(ring_s + (uint32_t)(s * SB + lt * RS), wrow + (int64_t)st * (BPS * BB), run, full(s));
        }
    };
    if (producer)
        for (int i = 0; i < S - 1; ++i) issue(i);

    // Stage x while they are in flight (as in t1g).
    gguf_stage_x(xs, x, xdata);
    cp_async_commit();
    cp_async_wait<0>();
    if constexpr (F == Q40) q40_x_order(xs, xdata);
    __syncthreads();
    const NibZ zsym = nib_z<T>(8u);
    const int c0 = (2 * t) & 3, c1 = (2 * t + 1) & 3;  // block slots of this lane's D columns

    float acc[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int i = 0; i < mine; ++i) {
        if (producer) issue(i + S - 1);
        const int s = i % S, st = rg + i * NR;
        mbar_wait(full(s), (i / S) & 1);
        const int passes = (nb - st * BPS < BPS ? nb - st * BPS : BPS) / 4;
        const unsigned char *slot = ring + s * SB;
#pragma unroll
        for (int hh = 0; hh < HP; ++hh) {
            const int h = pg + hh * WG;
            if (h < passes) {
                const int b = 4 * h + t;  // this lane's block in the stage
                const uint4 *xv = g == t ? xs + 4 * (BPS * st + b) : xs + xdata;
                const uint4 xw[4] = {xv[0], xv[1], xv[2], xv[3]};
                const int a = b * BB + 2;  // its quants' first byte in the row
                const unsigned sh = (a & 2) ? 16u : 0u;
#pragma unroll
                for (int j = 0; j < NJ; ++j)
                    gguf_pass<F, T, RS>(slot + (16 * (hw * NJ + j) + g) * RS, xw, a, sh, h, c0, c1, zsym, acc[j]);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty(s));  // this warp is done with the slot
    }

    // The pass groups' row sums, ring by ring, in order.
    t1_epilogue<F, T, NJ, R, NR * WG>(acc, red, rg * WG + pg, hw * NJ, g, t, nullptr, y, base, n);
#endif
}

// Its configuration: FL_GEMV_T1B (read once; A/B runs) = 0: off (both formats take t1g); 1
// (default): one TMA tensor copy per stage, CTAs of 4 tiles (32 rows), stages of 32 blocks, a
// ring of 4, 8 warps, for Q8_0, and for Q4_0 when k >= 8192; when the grid has at most one CTA
// per SM (n <= 32 x SMs), Q8_0 takes lab 13's kernel and Q4_0 with k < 8192 lab 10's; other
// Q4_0 calls t1g; lab: 2:
// that kernel for both formats at every k; 3 / 4: a bulk copy per row (4 tiles x 64 blocks,
// ring 2, 8 warps / 4 tiles x 16 blocks, ring 4, 4 warps); 5 / 6: TMA, 4 tiles x 64 blocks,
// ring 2, 8 warps (Q4_0 only: Q8_0's box would be too wide) / 4 tiles x 32 blocks, ring 3, 8
// warps; 7-10: TMA into a ring per warp (as t1g), 4 warps, 4 tiles x 16 blocks ring 2, x 8
// blocks ring 4, x 16 blocks ring 3, x 8 blocks ring 2 with 8 warps; 11-13: TMA, 8 warps, 4
// tiles x 32 blocks ring 2, x 16 blocks ring 4, x 16 blocks ring 3.
// Measured on the H100 (bench/RESULTS.md, session 15, calls 3-6), us at m = 1: Q8_0 with the
// default against t1g: 11008 x 4096 23.5-23.8 against 25.8-26.0, 4096 x 11008 21.8-22.1
// against 23.3-23.5, 32000 x 4096 54.0-54.5 against 56.1-56.4, 4096 x 4096 tied (11.2-11.5;
// 79-92% of copy over the four); Q4_0 at 4096 x 11008 13.6-13.8 against 15.0-15.2, but slower
// than t1g at k = 4096 (11008 x 4096 16.8-17.1 against 15.6-15.9: with k = 4096 a CTA's 4
// stages are the whole ring, they land together and its compute overlaps no copy of its own). A bulk copy per row (3) was 1-3% slower than
// TMA for Q8_0 and much slower with short runs (4: 16 blocks, 34.5 us for Q8_0 at 4096 x 11008:
// per-copy costs). Rings per warp (lab 10: 8 warps, stages of 8 blocks, ring 2) took Q4_0 at
// 4096 x 4096 (128 CTAs for 132 SMs) to 7.5-7.7 us against t1g's 8.1-8.4 (three runs, calls 4
// and 5) but were slower at 11008 x 4096 (16.1-16.3 against 15.7-15.9) and 32000 x 4096. At
// one CTA per SM, shorter stages pipeline more of a CTA's k: Q8_0 at 4096 x 4096 took 10.4-10.6
// us with 16 blocks and a ring of 3 (lab 13) against 11.4-11.5 (call 8), but 57.9-58.2 against
// 54.1-54.2 at 32000 x 4096.
inline int t1b_config() {
    static const EnvChoice choices[] = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}, {"4", 4}, {"5", 5},
                                        {"6", 6}, {"7", 7}, {"8", 8}, {"9", 9}, {"10", 10},
                                        {"11", 11}, {"12", 12}, {"13", 13}};
    static const int v = env_choice("FL_GEMV_T1B", choices, 1);
    return v;
}
// A kernel: tiles NT, blocks per stage BPS, ring S, warps W, TMA tensor copies, a ring per warp.
struct T1bShape {
    int nt, bps, s, w;
    bool tm, wr;
};
// The kernels, in the order of FL_GEMV_T1B 2..13 (index 0: the default's).
constexpr T1bShape kT1bShapes[] = {{4, 32, 4, 8, true, false}, {4, 64, 2, 8, false, false}, {4, 16, 4, 4, false, false},
                                   {4, 64, 2, 8, true, false}, {4, 32, 3, 8, true, false},  {4, 16, 2, 4, true, true},
                                   {4, 8, 4, 4, true, true},   {4, 16, 3, 4, true, true},   {4, 8, 2, 8, true, true},
                                   {4, 32, 2, 8, true, false}, {4, 16, 4, 8, true, false},  {4, 16, 3, 8, true, false}};
// The kernel a call takes: an index into kT1bShapes, or -1 (t1g).
template <int F> inline int t1b_variant(int64_t n, int64_t k) {
    const int c = t1b_config();
    if (c == 0) return -1;
    if (c >= 2) return c - 2;
    const bool one_wave = ceil_div(n, 32) <= (int64_t)sm_count();  // at most one CTA per SM
    if (F == Q80) return one_wave ? 11 : 0;
    if (k >= 8192) return 0;
    return one_wave ? 8 : -1;
}
// t1b_smem of kT1bShapes[v].
template <int F> inline int64_t t1b_variant_smem(int v, int64_t k) {
    const T1bShape &c = kT1bShapes[v];
    return t1b_smem(t1b_stage_bytes(block_bytes<F>(), c.nt, c.bps), c.s, c.wr ? c.w : 1, k);
}
// Whether a call takes it: m = 1, Q8_0 / Q4_0, a variant for the format and k, k % 256 == 0,
// an sm_90+ device, its shared memory <= 160 KB (the default: k up to ~11.1k values for Q8_0,
// ~43k for Q4_0; past that the call takes t1g); TMA: n < 2^31, a box of at most 256 8-byte
// elements per row (Q8_0: stages of 32 blocks or fewer) and the driver's encoder.
template <int F> inline bool t1b_applies(int m, int64_t n, int64_t k) {
    if (!(F == Q80 || F == Q40) || m != 1 || k % 256 != 0) return false;
    const int v = t1b_variant<F>(n, k);
    if (v < 0 || cc_major() < 9 || t1b_variant_smem<F>(v, k) > kT1MaxSmem) return false;
    const T1bShape &c = kT1bShapes[v];
    if (!c.tm) return true;
    return n < 0x7fffffffLL && odd_words(c.bps * block_bytes<F>()) / 8 <= 256 && encode_fn() != nullptr;
}
template <int F, typename T, int NT, int BPS, int S, int W, bool TM = false, bool WR = false>
bool launch_t1b(const T *x, const uint8_t *w, T *y, int64_t n, int64_t k, cudaStream_t s, fl_status &st) {
    if constexpr (TM && t1b_row_stride<F, BPS>() / 8 > 256) {
        return false;  // (t1b_applies already refused it)
    } else {
        const auto kernel = gemv_t1b_kernel<F, T, NT, BPS, S, W, TM, WR>;
        const int64_t smem = t1b_smem(t1b_stage_bytes(block_bytes<F>(), NT, BPS), S, WR ? W : 1, k);
        CUtensorMap map;
        std::memset(&map, 0, sizeof(map));
        // (The box: the stage's run and, when the row stride is longer, the next 16 bytes.)
        if (TM && !rows_map(&map, w, n, (k / 32) * block_bytes<F>(), t1b_row_stride<F, BPS>(), 8 * NT)) return false;
        return launch_ring(kernel, smem, n, 8 * NT, 32 * W, s, st, x, w, y, n, k, map);
    }
}
template <int F, typename T>
bool launch_t1b_config(const T *x, const uint8_t *w, T *y, int64_t n, int64_t k, cudaStream_t s, fl_status &st) {
    constexpr size_t kShapes = sizeof(kT1bShapes) / sizeof(kT1bShapes[0]);
    return with_index<kShapes>(t1b_variant<F>(n, k), [&](auto i) {
        constexpr T1bShape c = kT1bShapes[decltype(i)::value];
        return launch_t1b<F, T, c.nt, c.bps, c.s, c.w, c.tm, c.wr>(x, w, y, n, k, s, st);
    });
}

// ---------------------------------------------------------------- 2..16 tokens, GGUF (tmg)
// At m = 2..16 the GGUF formats took the general kernel above, whose per-lane loads of
// 2-byte-aligned blocks (two or three 32-bit loads, a 16-bit one, the scale's 16-bit load, one
// batch in flight per warp) held Q8_0 at 25-31% and Q4_0 at 21-29% of copy bandwidth, 0.5-0.85x
// cuBLAS f16 on the same matrix (bench/RESULTS.md, session 11). This kernel keeps t1g's copy
// scheme and changes the product:
// - Superchunks (BPS blocks of each of the CTA's 8 NT rows) are copied into a per-warp ring of
//   S slots exactly as in t1g (k % 256 == 0). Each slot also holds x of the same BPS blocks
//   for every token (cp.async from global, where x stays in L2: m k 2 bytes, read once per CTA);
//   tokens m..MT-1 are zero-filled once (plain stores before the first copy) and never copied.
//   A token's x run is padded (64 bytes for Q8_0, 32 for Q4_0) so that the 8 tokens g a
//   quarter / half warp reads fall on distinct banks.
// - The weights are again the mma's A side (rows g and g + 8 of each 16-row tile) but the quad
//   t = 0..3 now splits one block: lane t supplies quants 8t..8t+7 (Q8_0: two words; k-slots
//   {2t, 2t+1, 2t+8, 2t+9} of mma 0 are values 8t..8t+3, of mma 1 values 8t+4..8t+7) or quant
//   bytes 4t..4t+3 (Q4_0, reordered by one byte_perm so that mma 0 gets values 4t..4t+3 and
//   mma 1 values 16+4t..19+4t). B column c is token c (+ 8 in the second group of 8 tokens)
//   with its x as stored (two 16-byte or four 8-byte shared loads per block). So D is (row,
//   token) for one block, scaled by the block's d of each row, then accumulated.
// - Warps take superchunks w, w + W, ... of the CTA's rows and are summed in warp order.
// grid.x = ceil(n / (8 * NT)), block = 32 * W, dynamic shared memory tmg_smem() (independent of
// k: x is not staged whole). MT = 8 (m <= 8) or 16.
template <int F, int BPS> __host__ __device__ constexpr int tmg_tok_bytes() { return BPS * 64 + (F == Q80 ? 64 : 32); }
template <int F, int NT, int MT, int BPS> __host__ __device__ constexpr int tmg_slot_words() {
    return t1g_slot_words<F, NT, BPS>() + MT * tmg_tok_bytes<F, BPS>() / 16;
}
// The warps' rings and 16 bytes that the last block's shared loads may read past its slot.
template <int F, int NT, int MT, int S, int W, int BPS> constexpr int64_t tmg_smem() {
    return (int64_t)W * S * tmg_slot_words<F, NT, MT, BPS>() * 16 + 16;
}

// One 16-row tile pair of one block (GGUF) or int4 unit in both multi-token kernels: the two
// mmas of A fragments a0, a1 against each 8-token group q of B fragments xb[q], summed apart in
// d and scaled by the block's / group's scale of rows g (s0) and g + 8 (s1) into acc[q]:
// d = (row g, tokens 2t, 2t + 1), (row g + 8, the same tokens), + 8 q.
template <typename T, int NG>
__device__ __forceinline__ void tm_scaled_pair(float (&acc)[NG][4], const uint32_t (&a0)[4], const uint32_t (&a1)[4],
                                               const uint32_t (&xb)[NG][4], float s0, float s1) {
#pragma unroll
    for (int q = 0; q < NG; ++q) {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        mma<T>(d, a0, xb[q][0], xb[q][1]);
        mma<T>(d, a1, xb[q][2], xb[q][3]);
        acc[q][0] = fmaf(d[0], s0, acc[q][0]);
        acc[q][1] = fmaf(d[1], s0, acc[q][1]);
        acc[q][2] = fmaf(d[2], s1, acc[q][2]);
        acc[q][3] = fmaf(d[3], s1, acc[q][3]);
    }
}

// The end of both multi-token kernels: acc[j][q][c] (rows 16 (j0 + j) + g (+ 8 for c >= 2),
// tokens 8 q + 2 t + (c & 1)) of every warp to red[grp][token * 8 NT + row] (the G rings'
// warps hold disjoint rows), summed over the rings in order (deterministic), times int8's row
// scale, rounded once into y.
template <int F, typename T, int NT, int MT, int G, int NJ>
__device__ __forceinline__ void tm_store(const float (&acc)[NJ][MT / 8][4], float (&red)[G][MT * NT * 8],
                                         const void *scales, T *y, int m, int64_t n, int64_t base, int grp,
                                         int j0, int g, int t) {
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int q = 0; q < MT / 8; ++q)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int row = 16 * (j0 + j) + g + (c >= 2 ? 8 : 0), tok = 8 * q + 2 * t + (c & 1);
                red[grp][tok * (NT * 8) + row] = acc[j][q][c];
            }
    __syncthreads();
    for (int e = threadIdx.x; e < MT * NT * 8; e += blockDim.x) {
        const int tok = e / (NT * 8);
        const int64_t col = base + e % (NT * 8);
        if (tok >= m || col >= n) continue;
        float v = 0.f;
#pragma unroll
        for (int u = 0; u < G; ++u) v += red[u][e];
        if constexpr (F == I8) v *= __ldg(static_cast<const float *>(scales) + col);
        y[(int64_t)tok * n + col] = from_f32<T>(v);
    }
}

template <int F, typename T, int NT, int MT, int S, int W, int BPS, int UB = BPS, int PW = 1>
__global__ void __launch_bounds__(W * 32)
gemv_tmg_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, T *__restrict__ y, int m, int64_t n,
                int64_t k) {
    constexpr int BB = block_bytes<F>(), RB = t1g_row_bytes<F, BPS>(), RW = RB / 16;
    constexpr int SW = t1g_slot_words<F, NT, BPS>();  // weight uint4s per slot: row r's at r * RW
    constexpr int TB = tmg_tok_bytes<F, BPS>();       // bytes per token of a slot's x part
    constexpr int SLOT = tmg_slot_words<F, NT, MT, BPS>();
    constexpr int G = W / PW, GT = 32 * PW;  // rings, threads per ring
    constexpr int CP = (SW + GT - 1) / GT;   // weight copies per thread per superchunk
    constexpr int XC = BPS * 4 / 32;      // x copies per lane per token per superchunk
    constexpr int QW = F == Q80 ? 2 : 1;  // quant words per lane per block
    constexpr int NP = NT / 2, NG = MT / 8, NJ = NP / PW;  // 16-row tiles: per CTA, per warp
    static_assert(S >= 2 && RB % 16 == 0 && NT % 2 == 0 && (MT == 8 || MT == 16) && BPS % 8 == 0 &&
                      W % PW == 0 && NP % PW == 0 && MT % PW == 0,
                  "a ring of at least two superchunks of whole words, 16-row tiles, 8 or 16 tokens, whole rings");
    extern __shared__ __align__(16) unsigned char t1_raw[];
    __shared__ float red[G][MT * NT * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    // PW warps share a ring (grp): they copy its superchunks together (the x of tokens h, h +
    // PW, ... each) and take NJ of its 16-row tiles each (h).
    const int grp = warp / PW, h = warp % PW, tl = threadIdx.x % GT;
    const int nsc = (int)(k / (32 * BPS));  // superchunks per row
    const int64_t rowb = (k >> 5) * BB;     // bytes per row
    const int64_t base = (int64_t)blockIdx.x * (8 * NT);
    uint4 *ring = reinterpret_cast<uint4 *>(t1_raw) + grp * (S * SLOT);

    // Weight copies as in t1g: word c = tl + GT e of a slot is word c % RW of row c / RW,
    // at byte src[e] from the CTA's first row; rows past n copy row n - 1.
    const uint8_t *wcta = w + base * rowb;
    uint32_t src[CP];
#pragma unroll
    for (int e = 0; e < CP; ++e) {
        const int c = tl + GT * e;
        const int64_t r = c / RW < n - base ? c / RW : n - 1 - base;
        src[e] = (uint32_t)(r * rowb) + 16u * (uint32_t)(c % RW);
    }
    const int mine = nsc > grp ? (nsc - grp + G - 1) / G : 0;  // this ring's superchunks

    // Tokens m.. of every slot: zero, once (the copies below never touch them).
    for (int sl = 0; sl < S; ++sl)
        for (int e = m; e < MT; ++e)
            if (e % PW == h)
#pragma unroll
                for (int c = 0; c < XC; ++c)
                    ring[sl * SLOT + SW + e * (TB / 16) + lane + 32 * c] = make_uint4(0u, 0u, 0u, 0u);
    // x copies: token e's uint4 lane + 32 c of superchunk s is x[e][256 BPS/8 s + 8 (lane + 32 c)].
    const T *xl = x + 8 * lane;
    auto issue = [&](int i) {
        if (i < mine) {
            const int sci = grp + i * G;
            const uint8_t *wsc = wcta + (int64_t)sci * RB;
            uint4 *slot = ring + (i % S) * SLOT;
#pragma unroll
            for (int e = 0; e < CP; ++e)
                if (CP * GT == SW || tl + GT * e < SW) cp_async16(slot + tl + GT * e, wsc + src[e], 16);
            const T *xs = xl + (int64_t)sci * (BPS * 32);
#pragma unroll
            for (int e = 0; e < MT / PW; ++e) {
                const int tok = PW * e + h;
                if (tok < m)
#pragma unroll
                    for (int c = 0; c < XC; ++c)
                        cp_async16(slot + lane + SW + tok * (TB / 16) + 32 * c, xs + (int64_t)tok * k + 256 * c, 16);
            }
        }
        cp_async_commit();  // (an empty group past the ring's share)
    };
#pragma unroll
    for (int i = 0; i < S - 1; ++i) issue(i);
    const NibZ zsym = nib_z<T>(8u);

    float acc[NJ][NG][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int q = 0; q < NG; ++q) acc[j][q][0] = acc[j][q][1] = acc[j][q][2] = acc[j][q][3] = 0.f;
    for (int i = 0; i < mine; ++i) {
        ring_sync<PW>(grp);      // every thread is done with slot (i - 1) % S (step i - 1)
        issue(i + S - 1);        // into that slot
        cp_async_wait<S - 1>();  // this thread's words of superchunk i are in ...
        ring_sync<PW>(grp);      // ... and every thread's are visible
        const unsigned char *slot = reinterpret_cast<const unsigned char *>(ring + (i % S) * SLOT);
        const unsigned char *xsl = slot + SW * 16;
#pragma unroll UB
        for (int b = 0; b < BPS; ++b) {
            // B fragments: tokens g (+ 8 q), quants 8t..8t+7 (Q8_0) / 4t..4t+3 and 16+4t..19+4t
            // (Q4_0) of block b.
            uint32_t xb[NG][4];
#pragma unroll
            for (int q = 0; q < NG; ++q) {
                const unsigned char *xp = xsl + (8 * q + g) * TB + 64 * b;
                if constexpr (F == Q80) {
                    const uint4 v = *reinterpret_cast<const uint4 *>(xp + 16 * t);
                    xb[q][0] = v.x, xb[q][1] = v.y, xb[q][2] = v.z, xb[q][3] = v.w;
                } else {
                    const uint2 lo = *reinterpret_cast<const uint2 *>(xp + 8 * t);
                    const uint2 hi = *reinterpret_cast<const uint2 *>(xp + 32 + 8 * t);
                    xb[q][0] = lo.x, xb[q][1] = lo.y, xb[q][2] = hi.x, xb[q][3] = hi.y;
                }
            }
            const int a = b * BB + 2 + 4 * QW * t;  // this lane's first quant byte in the row
            const unsigned sh = (a & 2) ? 16u : 0u;
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                // rows g and g + 8 of tile h NJ + j
                const unsigned char *r0 = slot + (16 * (h * NJ + j) + g) * RB;
                const uint32_t *w0 = reinterpret_cast<const uint32_t *>(r0 + (a & ~3));
                const uint32_t *w1 = reinterpret_cast<const uint32_t *>(r0 + 8 * RB + (a & ~3));
                uint32_t raw0[QW + 1], raw1[QW + 1];
#pragma unroll
                for (int c = 0; c <= QW; ++c) raw0[c] = w0[c], raw1[c] = w1[c];
                uint32_t a0[4], a1[4];  // the A fragments of mma 0 and mma 1
                if constexpr (F == Q80) {
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        uint32_t p0a, p0b, p1a, p1b;
                        byte_pairs<T>(__funnelshift_r(raw0[c], raw0[c + 1], sh), p0a, p0b);
                        byte_pairs<T>(__funnelshift_r(raw1[c], raw1[c + 1], sh), p1a, p1b);
                        uint32_t(&f)[4] = c ? a1 : a0;
                        f[0] = p0a, f[1] = p1a, f[2] = p0b, f[3] = p1b;
                    }
                } else {
                    // Quant bytes B0..B3 (= the funnel shift's) as B0 B2 B1 B3, so that
                    // nib_pairs' pairs are (4t, 4t+1), (16+4t, 17+4t), (4t+2, 4t+3), (18+4t,
                    // 19+4t): x's own order, no permutation of the B side.
                    const uint32_t sel = sh ? 0x5342u : 0x3120u;
                    uint32_t p0[4], p1[4];
                    nib_pairs<T>(__byte_perm(raw0[0], raw0[1], sel), zsym, p0);
                    nib_pairs<T>(__byte_perm(raw1[0], raw1[1], sel), zsym, p1);
                    a0[0] = p0[0], a0[1] = p1[0], a0[2] = p0[2], a0[3] = p1[2];
                    a1[0] = p0[1], a1[1] = p1[1], a1[2] = p0[3], a1[3] = p1[3];
                }
                const float s0 = __half2float(*reinterpret_cast<const __half *>(r0 + b * BB));
                const float s1 = __half2float(*reinterpret_cast<const __half *>(r0 + 8 * RB + b * BB));
                tm_scaled_pair<T, NG>(acc[j], a0, a1, xb, s0, s1);
            }
        }
    }
    cp_async_wait<0>();  // no copy outlives the kernel (the tail's groups are empty)
    tm_store<F, T, NT, MT, G, NJ>(acc, red, nullptr, y, m, n, base, grp, h * NJ, g, t);
}

// Its configuration: FL_GEMV_TMG (read once; A/B runs) = 0: off (the general kernel above, as
// before session 13); 1 (default): 4 tiles of 8 rows per CTA, 4 rings of 2 superchunks of 8
// blocks, each ring shared by a pair of warps (8 warps); for 9..16 tokens and n >= 64 x SMs
// (Q4_0) / 128 x SMs (Q8_0) 8 tiles and 2 rings (4 warps in pairs) instead; but Q4_0 at 2..8
// tokens one warp per ring (4 warps); lab (one warp per ring unless said): 2: 4 tiles, ring 3;
// 3: 8 tiles, 2 warps whenever m > 8; 4: 16 blocks (k % 512 == 0); 5: the block loop unrolled
// by 2 instead of 8; 6: pairs everywhere (the default rule without the Q4_0 exception); 7:
// session 13's default, one warp per ring everywhere.
// Measured on the H100 (bench/RESULTS.md, session 13; us at m = 4 / m = 16, 4 tiles and 4
// warps unless said): the general kernel took 25.1 / 28.8 (Q8_0) and 17.8 / 21.6 (Q4_0) at
// 4096 x 4096, 64.5 / 75.6 and 44.7 / 55.7 at 11008 x 4096; this one 10.7 / 11.5 and 8.1 /
// 10.0, 25.2 / 26.6 and 15.7 / 23.0. The full unroll against 2: Q4_0 m = 16 at 11008 x 4096
// 23.0 against 24.6, Q8_0 26.6 against 27.7, the rest tied or better. 8 tiles with 2 warps
// (half the x copies per weight byte): Q4_0 m = 16 at 11008 x 4096 21.9-22.2 against 23.0, at
// 32000 x 4096 43.2 against 48.4, Q8_0 at 32000 x 4096 63.5-64.0 against 66.1, but Q8_0 at
// 11008 x 4096 28.3-28.5 against 26.6, every n = 4096 row twice as slow (64 CTAs), and every
// m = 4 row slower; hence the n rules. Ring 3 was mixed (Q8_0 m = 4 at 11008 x 4096 24.4-24.6
// against 25.2, Q4_0 18.8-19.6 against 15.7); 16 blocks, and 2 tiles with a ring of 3, slower.
// Session 14 (calls 3-4), pairs of warps per ring against one warp per ring: Q4_0 at m = 16
// 9.5-9.8 against 9.8-10.1 us (4096 x 4096), 19.5-19.7 against 21.5-21.9 (11008 x 4096),
// 19.4-20.0 against 20.1-20.7 (4096 x 11008), 40.4-40.5 against 43.3-43.4 (32000 x 4096); Q8_0
// at m = 16 26.5-27.0 against 26.9-27.5 and 61.1-61.5 against 63.4-63.9; Q8_0 at m = 4 tied or
// faster (24.4-24.6 against 25.1-25.8 at 11008 x 4096); but Q4_0 at m = 4, 11008 x 4096
// 17.3-17.8 against 15.7-15.9, hence its exception.
inline int tmg_config() {
    static const EnvChoice choices[] = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}, {"4", 4}, {"5", 5}, {"6", 6}, {"7", 7}};
    static const int v = env_choice("FL_GEMV_TMG", choices, 1);
    return v;
}
// The kernel a call takes: 0: 4 tiles, 4 warps, ring 2, 8 blocks; 1: 8 tiles, 2 warps; 2: 4
// tiles, ring 3; 3: 16 blocks; 4: unrolled by 2; 5 / 6: 0 / 1 with 8 / 4 warps in pairs per
// ring.
template <int F> inline int tmg_variant(int m, int64_t n, int64_t k) {
    const bool wide = m > 8 && n >= (F == Q40 ? 64 : 128) * (int64_t)sm_count();
    switch (tmg_config()) {
    case 2: return 2;
    case 3: return m > 8 ? 1 : 0;
    case 4: return k % 512 == 0 ? 3 : 0;
    case 5: return 4;
    case 6: return wide ? 6 : 5;
    case 7: return wide ? 1 : 0;
    default: return wide ? 6 : F == Q40 && m <= 8 ? 0 : 5;
    }
}
template <int F, typename T, int NT, int MT, int S, int W, int BPS, int UB = BPS, int PW = 1>
bool launch_tmg(const T *x, const uint8_t *w, T *y, int m, int64_t n, int64_t k, cudaStream_t s, fl_status &st) {
    const auto kernel = gemv_tmg_kernel<F, T, NT, MT, S, W, BPS, UB, PW>;
    constexpr int64_t smem = tmg_smem<F, NT, MT, S, W / PW, BPS>();  // (its W: rings)
    return launch_ring(kernel, smem, n, 8 * NT, 32 * W, s, st, x, w, y, m, n, k);
}
template <int F, typename T, int MT>
bool launch_tmg_mt(const T *x, const uint8_t *w, T *y, int m, int64_t n, int64_t k, cudaStream_t s, fl_status &st) {
    switch (tmg_variant<F>(m, n, k)) {
    case 1: return launch_tmg<F, T, 8, MT, 2, 2, 8>(x, w, y, m, n, k, s, st);
    case 2: return launch_tmg<F, T, 4, MT, 3, 4, 8>(x, w, y, m, n, k, s, st);
    case 3: return launch_tmg<F, T, 4, MT, 2, 4, 16, 8>(x, w, y, m, n, k, s, st);
    case 4: return launch_tmg<F, T, 4, MT, 2, 4, 8, 2>(x, w, y, m, n, k, s, st);
    case 5: return launch_tmg<F, T, 4, MT, 2, 8, 8, 8, 2>(x, w, y, m, n, k, s, st);
    case 6: return launch_tmg<F, T, 8, MT, 2, 4, 8, 8, 2>(x, w, y, m, n, k, s, st);
    default: return launch_tmg<F, T, 4, MT, 2, 4, 8>(x, w, y, m, n, k, s, st);
    }
}
// Whether a call takes it: Q8_0 / Q4_0, m = 2..16, k % 256 == 0 (rows on 16-byte boundaries;
// its shared memory does not depend on k, and a device that refuses it, or a lab variant whose
// ring does not fit, sends the call to the general kernel).
inline bool tmg_applies(int m, int64_t k) { return m >= 2 && m <= 16 && k % 256 == 0 && tmg_config() != 0; }
template <int F, typename T>
bool launch_tmg_config(const T *x, const uint8_t *w, T *y, int m, int64_t n, int64_t k, cudaStream_t s, fl_status &st) {
    if (m <= 8) return launch_tmg_mt<F, T, 8>(x, w, y, m, n, k, s, st);
    return launch_tmg_mt<F, T, 16>(x, w, y, m, n, k, s, st);
}

// ---------------------------------------------------------------- 2..16 tokens, int8 / int4 (tmi)
// The multi-token kernel above for int8 (per-row f32 scale) and int4 (f16 scale, and u8 zero,
// per group of 32, 64 or 128 along k), where the general kernel held int4 g128 at 41-53% and
// int8 at 61-81% of copy bandwidth at 16 tokens (bench/RESULTS.md, session 11). The same
// scheme with 16-byte units in place of blocks:
// - A superchunk is 256 values of each of the CTA's 8 NT rows (256 / 128 bytes: k % 256 ==
//   0, which the kernel requires), copied as one run of words per row into a ring slot whose
//   rows are padded by one word (lane (g, t) reads word t of a unit of rows g and g + 8: with
//   row strides of 17 / 9 words the 32 lanes hit 32 banks), followed by every token's x of the
//   same 256 values (tokens m.. zero-filled once).
// - A unit is 16 bytes of a row (16 int8 or 32 int4 values); the quad t = 0..3 splits it, lane
//   t taking word t: int8 values 4t..4t+3 (one mma, x as stored), int4 values 8t..8t+7
//   (nib_pairs' pairs (v0, v4), (v1, v5) in mma 0 and (v2, v6), (v3, v7) in mma 1, x put in
//   that order by a_frags<I4>). A unit lies inside one int4 group, so its D gets the group's
//   scale of each row (staged once per CTA, with the zeros, as in the one-token kernel); int8's
//   row scale multiplies the final sum.
// grid.x = ceil(n / (8 * NT)), block = 32 * W, dynamic shared memory tmi_smem(). UB: units of
// a superchunk unrolled.
template <int F> __host__ __device__ constexpr int tmi_row_bytes() { return F == I8 ? 256 : 128; }
template <int F> __host__ __device__ constexpr int tmi_tok_bytes() { return 512 + (F == I8 ? 32 : 64); }
template <int F, int NT> __host__ __device__ constexpr int tmi_wslot_words() { return NT * 8 * (tmi_row_bytes<F>() / 16 + 1); }
template <int F, int NT, int MT> __host__ __device__ constexpr int tmi_slot_words() {
    return tmi_wslot_words<F, NT>() + MT * tmi_tok_bytes<F>() / 16;
}
// int4's staged scales and zeros, then the warps' rings.
template <int F, int NT, int MT, int S, int W> inline int64_t tmi_smem(int64_t k, int group) {
    const int groups = (F == I4 || F == I4Z) ? (int)(k / group) : 0;
    return (int64_t)t1_scale_bytes<F, NT>(groups) + t1_zero_bytes<F, NT>(groups) +
           (int64_t)W * S * tmi_slot_words<F, NT, MT>() * 16;
}

template <int F, typename T, int NT, int MT, int S, int W, int UB, int PW = 1>
__global__ void __launch_bounds__(W * 32)
gemv_tmi_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, const void *__restrict__ scales,
                const uint8_t *__restrict__ zeros, T *__restrict__ y, int m, int64_t n, int64_t k, int group) {
    constexpr bool I4S = F == I4 || F == I4Z;
    constexpr int RB = tmi_row_bytes<F>(), RW = RB / 16, RWP = RW + 1;  // words per row, padded
    constexpr int SW = tmi_wslot_words<F, NT>();     // weight uint4s per slot: row r's at r * RWP
    constexpr int G = W / PW, GT = 32 * PW;          // rings, threads per ring
    constexpr int CP = NT * 8 * RW / GT;             // weight copies per thread per superchunk
    constexpr int TB = tmi_tok_bytes<F>();           // bytes per token of a slot's x part
    constexpr int SLOT = tmi_slot_words<F, NT, MT>();
    constexpr int UPS = RW;                          // units per superchunk (16 / 8)
    constexpr int NP = NT / 2, NG = MT / 8, NJ = NP / PW;  // 16-row tiles: per CTA, per warp
    static_assert(S >= 2 && NT % 2 == 0 && (MT == 8 || MT == 16) && (NT * 8 * RW) % GT == 0 &&
                      W % PW == 0 && NP % PW == 0 && MT % PW == 0,
                  "a ring of at least two superchunks, 16-row tiles, 8 or 16 tokens, whole rings");
    extern __shared__ __align__(16) unsigned char t1_raw[];
    __shared__ float red[G][MT * NT * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    // PW warps share a ring (grp): they copy its superchunks together and take NJ of its 16-row
    // tiles each (h), synced by a named barrier of the ring's threads (a __syncwarp for PW = 1).
    const int grp = warp / PW, h = warp % PW, tl = threadIdx.x % GT;
    const int nsc = (int)(k >> 8);                   // superchunks per row
    const int groups = I4S ? (int)(k / group) : 0;
    const int gshift = I4S ? __ffs(group) - 1 : 0;   // log2(group)
    const int64_t rowb = F == I8 ? k : k >> 1;       // bytes per row
    const int64_t base = (int64_t)blockIdx.x * (8 * NT);
    unsigned short *ss = reinterpret_cast<unsigned short *>(t1_raw);
    uint8_t *zs = reinterpret_cast<uint8_t *>(ss) + t1_scale_bytes<F, NT>(groups);
    uint4 *ring = reinterpret_cast<uint4 *>(zs + t1_zero_bytes<F, NT>(groups)) + grp * (S * SLOT);

    // Weight copies: word c = lane + 32 e of a superchunk is word c % RW of row c / RW, at byte
    // src[e] from the CTA's first row (rows past n copy row n - 1), into slot word
    // (c / RW) * RWP + c % RW.
    const uint8_t *wcta = w + base * rowb;
    uint32_t src[CP];
#pragma unroll
    for (int e = 0; e < CP; ++e) {
        const int c = tl + GT * e;
        const int64_t r = c / RW < n - base ? c / RW : n - 1 - base;
        src[e] = (uint32_t)(r * rowb) + 16u * (uint32_t)(c % RW);
    }
    const int mine = nsc > grp ? (nsc - grp + G - 1) / G : 0;  // this ring's superchunks

    // int4: the scales (and zeros) of the CTA's rows, one commit group ahead of the ring's.
    if constexpr (I4S) {
        const int rows = n - base < 8 * NT ? (int)(n - base) : 8 * NT;
        stage_rows(ss, static_cast<const unsigned short *>(scales) + base * groups, rows, groups, t1_srow(groups),
                   8 * NT, t1_scale_bytes<F, NT>(groups));
        if constexpr (F == I4Z)
            stage_rows(zs, zeros + base * groups, rows, groups, t1_zrow(groups), 8 * NT, t1_zero_bytes<F, NT>(groups));
    }
    cp_async_commit();
    // Tokens m.. of every slot: zero, once.
    for (int sl = 0; sl < S; ++sl)
        for (int e = m; e < MT; ++e)
            if (e % PW == h) ring[sl * SLOT + SW + e * (TB / 16) + lane] = make_uint4(0u, 0u, 0u, 0u);
    const T *xl = x + 8 * lane;
    auto issue = [&](int i) {
        if (i < mine) {
            const int sci = grp + i * G;
            const uint8_t *wsc = wcta + (int64_t)sci * RB;
            uint4 *slot = ring + (i % S) * SLOT;
#pragma unroll
            for (int e = 0; e < CP; ++e) {
                const int c = tl + GT * e;
                cp_async16(slot + (c / RW) * RWP + c % RW, wsc + src[e], 16);
            }
            const T *xs = xl + (int64_t)sci * 256;
#pragma unroll
            for (int e = 0; e < MT / PW; ++e) {
                const int tok = PW * e + h;
                if (tok < m) cp_async16(slot + SW + tok * (TB / 16) + lane, xs + (int64_t)tok * k, 16);
            }
        }
        cp_async_commit();  // (an empty group past the warp's share)
    };
#pragma unroll
    for (int i = 0; i < S - 1; ++i) issue(i);
    cp_async_wait<S - 1>();  // the scale group
    __syncthreads();
    const NibZ zsym = nib_z<T>(8u);

    float acc[NJ][NG][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int q = 0; q < NG; ++q) acc[j][q][0] = acc[j][q][1] = acc[j][q][2] = acc[j][q][3] = 0.f;
    for (int i = 0; i < mine; ++i) {
        ring_sync<PW>(grp);      // every thread is done with slot (i - 1) % S (step i - 1)
        issue(i + S - 1);        // into that slot
        cp_async_wait<S - 1>();  // this thread's words of superchunk i are in ...
        ring_sync<PW>(grp);      // ... and every thread's are visible
        const int sci = grp + i * G;
        const uint32_t *sw = reinterpret_cast<const uint32_t *>(ring + (i % S) * SLOT);
        const unsigned char *xsl = reinterpret_cast<const unsigned char *>(ring + (i % S) * SLOT + SW);
#pragma unroll UB
        for (int u = 0; u < UPS; ++u) {
            uint32_t xb[NG][4];
#pragma unroll
            for (int q = 0; q < NG; ++q) {
                const unsigned char *xp = xsl + (8 * q + g) * TB;
                if constexpr (F == I8) {  // values 4t..4t+3 of unit u
                    const uint2 v = *reinterpret_cast<const uint2 *>(xp + 32 * u + 8 * t);
                    xb[q][0] = v.x, xb[q][1] = v.y;
                } else {                  // values 8t..8t+7 of unit u, in nib_pairs' order
                    const uint4 v = *reinterpret_cast<const uint4 *>(xp + 64 * u + 16 * t);
                    const uint32_t vv[4] = {v.x, v.y, v.z, v.w};
                    a_frags<I4>(vv, xb[q]);
                }
            }
            const int gi = I4S ? (sci * 256 + (F == I8 ? 16 : 32) * u) >> gshift : 0;  // this unit's group
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const int r0 = 16 * (h * NJ + j) + g, r1 = r0 + 8;
                const uint32_t q0 = sw[(r0 * RWP + u) * 4 + t], q1 = sw[(r1 * RWP + u) * 4 + t];
                if constexpr (F == I8) {
                    uint32_t p0a, p0b, p1a, p1b;
                    byte_pairs<T>(q0, p0a, p0b);
                    byte_pairs<T>(q1, p1a, p1b);
                    const uint32_t a[4] = {p0a, p1a, p0b, p1b};
#pragma unroll
                    for (int q = 0; q < NG; ++q) mma<T>(acc[j][q], a, xb[q][0], xb[q][1]);
                } else {
                    NibZ z0 = zsym, z1 = zsym;
                    if constexpr (F == I4Z) {
                        z0 = nib_z<T>((uint32_t)zs[r0 * t1_zrow(groups) + gi]);
                        z1 = nib_z<T>((uint32_t)zs[r1 * t1_zrow(groups) + gi]);
                    }
                    uint32_t p0[4], p1[4];
                    nib_pairs<T>(q0, z0, p0);
                    nib_pairs<T>(q1, z1, p1);
                    const uint32_t a0[4] = {p0[0], p1[0], p0[1], p1[1]};
                    const uint32_t a1[4] = {p0[2], p1[2], p0[3], p1[3]};
                    const float s0 = __half2float(__ushort_as_half(ss[r0 * t1_srow(groups) + gi]));
                    const float s1 = __half2float(__ushort_as_half(ss[r1 * t1_srow(groups) + gi]));
                    tm_scaled_pair<T, NG>(acc[j], a0, a1, xb, s0, s1);
                }
            }
        }
    }
    cp_async_wait<0>();  // no copy outlives the kernel (the tail's groups are empty)
    tm_store<F, T, NT, MT, G, NJ>(acc, red, scales, y, m, n, base, grp, h * NJ, g, t);
}

// Its configuration: FL_GEMV_TMI (read once; A/B runs) = 0: off (the general kernel above, as
// before session 13); 1 (default): 4 tiles of 8 rows per CTA, 8 warps in pairs (4 rings of 2
// superchunks); for 9..16 tokens and n >= 64 x SMs 8 tiles and 4 warps in pairs instead (half
// the x copies per weight byte); lab: 2: one warp per ring (4 warps), ring 3; 3: one warp per
// ring, 8 tiles and 2 warps whenever m > 8; 4: one warp per ring, units unrolled by 2 instead
// of 8; 5: 4 tiles, 8 warps in pairs everywhere; 6: one warp per ring (session 13's default:
// 4 tiles and 4 warps, or 8 tiles and 2 warps by the n rule above).
// Measured on the H100 (bench/RESULTS.md, session 13; us, general kernel -> this one with 4
// tiles): int4 g128 at m = 4: 8.9 -> 7.8 (4096 x 4096), 20.4 -> 16.7 (11008 x 4096), 20.4 ->
// 13.7 (4096 x 11008), 45.3 -> 33.6 (32000 x 4096); at m = 16: 10.9 -> 8.8, 25.7 -> 20.1,
// 25.2 -> 17.6, 54.5 -> 48.8; int8 at m = 16: 13.8 -> 11.8, 25.0 -> 27.8, 29.6 -> 24.3, 67.9
// -> 67.3. 8 tiles and 2 warps at m = 16: int4 g128 11008 x 4096 19.7, 32000 x 4096 38.5;
// int8 25.3 and 57.9; both n = 4096 rows 1.5-2x slower (64 CTAs), hence the n rule. Ring 3
// was slower or tied; units unrolled by 2 slower except int4 at m = 16, 11008 x 4096.
// Session 14 (call 2): pairs of warps per ring (the ring's slot, and its copy of x, shared by
// two warps that take half the tiles each, synced by a named barrier; twice the warps per SM
// at the same shared memory) against one warp per ring: int4 g128 at m = 16 17.7 against 19.6
// us (11008 x 4096), 35.0 against 38.3 (32000 x 4096); int4zp 20.1 / 38.6 against 22.8 / 44.1;
// int8 25.3 / 55.1 against 26.4 / 57.6; the n = 4096 rows and m = 8 0-5% faster or tied (one
// row 1% slower).
inline int tmi_config() {
    static const EnvChoice choices[] = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}, {"4", 4}, {"5", 5}, {"6", 6}};
    static const int v = env_choice("FL_GEMV_TMI", choices, 1);
    return v;
}
// The kernel a call takes: 0: 4 tiles, 4 warps, ring 2; 1: 8 tiles, 2 warps; 2: ring 3; 3:
// unrolled by 2; 4: 4 tiles, 8 warps in pairs per ring; 5: 8 tiles, 4 warps in pairs.
template <int F> inline int tmi_variant(int m, int64_t n) {
    switch (tmi_config()) {
    case 2: return 2;
    case 3: return m > 8 ? 1 : 0;
    case 4: return 3;
    case 5: return 4;
    case 6: return m > 8 && n >= 64 * (int64_t)sm_count() ? 1 : 0;
    default: return m > 8 && n >= 64 * (int64_t)sm_count() ? 5 : 4;
    }
}
// (The last parameter of tmi_smem is the number of rings: warps / warps per ring.)
template <int F, int MT> inline int64_t tmi_variant_smem(int v, int64_t k, int group) {
    return v == 1 || v == 5 ? tmi_smem<F, 8, MT, 2, 2>(k, group)
         : v == 2           ? tmi_smem<F, 4, MT, 3, 4>(k, group)
                            : tmi_smem<F, 4, MT, 2, 4>(k, group);
}
// Whether a call takes it: int8 / int4, m = 2..16, k % 256 == 0 (whole superchunks), its
// shared memory (int4's staged scales and zeros grow with k / group) <= 160 KB.
template <int F> inline bool tmi_applies(int m, int64_t n, int64_t k, int group) {
    if (!(F == I8 || F == I4 || F == I4Z) || m < 2 || m > 16 || k % 256 != 0 || tmi_config() == 0) return false;
    const int v = tmi_variant<F>(m, n);
    return (m <= 8 ? tmi_variant_smem<F, 8>(v, k, group) : tmi_variant_smem<F, 16>(v, k, group)) <= kT1MaxSmem;
}
template <int F, typename T, int NT, int MT, int S, int W, int UB, int PW = 1>
bool launch_tmi(const T *x, const uint8_t *w, const void *scales, const uint8_t *zeros, T *y, int m, int64_t n,
                int64_t k, int group, cudaStream_t s, fl_status &st) {
    const auto kernel = gemv_tmi_kernel<F, T, NT, MT, S, W, UB, PW>;
    const int64_t smem = tmi_smem<F, NT, MT, S, W / PW>(k, group);
    return launch_ring(kernel, smem, n, 8 * NT, 32 * W, s, st, x, w, scales, zeros, y, m, n, k, group);
}
template <int F, typename T, int MT>
bool launch_tmi_mt(const T *x, const uint8_t *w, const void *scales, const uint8_t *zeros, T *y, int m, int64_t n,
                   int64_t k, int group, cudaStream_t s, fl_status &st) {
    constexpr int U = 8;  // units unrolled (of 16 for int8, 8 for int4)
    switch (tmi_variant<F>(m, n)) {
    case 1: return launch_tmi<F, T, 8, MT, 2, 2, U>(x, w, scales, zeros, y, m, n, k, group, s, st);
    case 2: return launch_tmi<F, T, 4, MT, 3, 4, U>(x, w, scales, zeros, y, m, n, k, group, s, st);
    case 3: return launch_tmi<F, T, 4, MT, 2, 4, 2>(x, w, scales, zeros, y, m, n, k, group, s, st);
    case 4: return launch_tmi<F, T, 4, MT, 2, 8, U, 2>(x, w, scales, zeros, y, m, n, k, group, s, st);
    case 5: return launch_tmi<F, T, 8, MT, 2, 4, U, 2>(x, w, scales, zeros, y, m, n, k, group, s, st);
    default: return launch_tmi<F, T, 4, MT, 2, 4, U>(x, w, scales, zeros, y, m, n, k, group, s, st);
    }
}
template <int F, typename T>
bool launch_tmi_config(const T *x, const uint8_t *w, const void *scales, const uint8_t *zeros, T *y, int m,
                       int64_t n, int64_t k, int group, cudaStream_t s, fl_status &st) {
    if (m <= 8) return launch_tmi_mt<F, T, 8>(x, w, scales, zeros, y, m, n, k, group, s, st);
    return launch_tmi_mt<F, T, 16>(x, w, scales, zeros, y, m, n, k, group, s, st);
}

// Warps per CTA: pick_gemv_warps (common.cuh), as the dense GEMV picks them.
template <int F, typename T, int NT, bool M16, int R>
int pick_warps(int64_t ctas, int64_t batches, int sms) {
    static std::atomic<int> occupancy[3];
    return pick_gemv_warps(gemv_tc_kernel<F, T, NT, M16, R>, occupancy, ctas, batches, sms);
}

template <int F, typename T, int NT, bool M16, int R>
fl_status launch_r(const T *x, const uint8_t *w, const void *scales, const uint8_t *zeros, T *y,
                   int m, int64_t n, int64_t k, int group, int sms, cudaStream_t s) {
    const int64_t ctas = ceil_div(n, 8 * NT);
    if (ctas > 0x7fffffffLL || (k >> 5) > 0x7fffffffLL - 64) return FL_ERR_INVALID_ARGUMENT;
    const int wps = pick_warps<F, T, NT, M16, R>(ctas, ceil_div(k / 32, unroll<F, NT, M16, R>()), sms);
    gemv_tc_kernel<F, T, NT, M16, R><<<(unsigned)ctas, 32 * wps, 0, s>>>(x, w, scales, zeros, y, m,
                                                                       n, k, group);
    return launch_status();
}

template <int F, typename T, int NT, bool M16>
fl_status launch_nt(const T *x, const uint8_t *w, const void *scales, const uint8_t *zeros, T *y,
                    int m, int64_t n, int64_t k, int group, int sms, cudaStream_t s) {
    if constexpr (F == I4 || F == I4Z) {
        // Chunks per scale run: group / 32 (every batch holds at least 4 chunks).
        if (group >= 128) return launch_r<F, T, NT, M16, 4>(x, w, scales, zeros, y, m, n, k, group, sms, s);
        if (group == 64) return launch_r<F, T, NT, M16, 2>(x, w, scales, zeros, y, m, n, k, group, sms, s);
    }
    return launch_r<F, T, NT, M16, 1>(x, w, scales, zeros, y, m, n, k, group, sms, s);
}

template <int F, typename T>
fl_status launch(const void *x, const void *w, const void *scales, const void *zeros, void *y,
                 int m, int64_t n, int64_t k, int group, cudaStream_t s) {
    const T *xt = static_cast<const T *>(x);
    const uint8_t *wt = static_cast<const uint8_t *>(w), *zt = static_cast<const uint8_t *>(zeros);
    T *yt = static_cast<T *>(y);
    const int sms = sm_count();
    // Two tiles of 8 rows per CTA (x loads shared by both, more weight bytes in flight) when
    // that still gives a CTA per SM; one (twice the CTAs) for small n.
    const bool nt2 = ceil_div(n, 16) >= sms;
    if constexpr (F == I8 || F == I4 || F == I4Z) {
        fl_status st = FL_OK;
        if (t1t_applies<F>(m, n, k, group) && launch_t1t_config<F, T>(xt, wt, scales, zt, yt, n, k, group, s, st))
            return st;
        if (t1_applies<F>(m, n, k, group) && launch_t1_config<F, T>(xt, wt, scales, zt, yt, n, k, group, s, st))
            return st;
        if (tmi_applies<F>(m, n, k, group) && launch_tmi_config<F, T>(xt, wt, scales, zt, yt, m, n, k, group, s, st))
            return st;
    } else {
        fl_status st = FL_OK;
        if (t1b_applies<F>(m, n, k) && launch_t1b_config<F, T>(xt, wt, yt, n, k, s, st)) return st;
        if (t1g_applies<F>(m, n, k) && launch_t1g_config<F, T>(xt, wt, yt, n, k, s, st)) return st;
        if (tmg_applies(m, k) && launch_tmg_config<F, T>(xt, wt, yt, m, n, k, s, st)) return st;
    }
    if (m > 8) {
        if (nt2) return launch_nt<F, T, 2, true>(xt, wt, scales, zt, yt, m, n, k, group, sms, s);
        return launch_nt<F, T, 1, true>(xt, wt, scales, zt, yt, m, n, k, group, sms, s);
    }
    if (nt2) return launch_nt<F, T, 2, false>(xt, wt, scales, zt, yt, m, n, k, group, sms, s);
    return launch_nt<F, T, 1, false>(xt, wt, scales, zt, yt, m, n, k, group, sms, s);
}

}  // namespace tc

// Host run of the nibble unpacking of one unit (see fl_gemv_unpack_unit_host).
template <int F> void unpack_unit_host(const uint8_t *quants, float z, float *out) {
    uint32_t q[4];
    std::memcpy(q, quants, 16);  // little-endian words, as the kernel reads them
    float f[32];
    deq_nibbles<F>(q, z, f);
    for (int e = 0; e < 32; ++e) out[e] = f[e] * (1.f / (float)(1 << (4 * value_class<F>(e))));
}

// Host run of nib_raw on one word (see fl_gemv_raw_nibbles_host): out[i] = nibble i's 16-bit
// value, times nib_raw_odd_scale for odd nibbles, less nib_raw_even / nib_raw_odd.
template <typename T> void raw_nibbles_host(uint32_t w, float *out) {
    uint32_t b[4];
    tc::nib_raw<T>(w, b);
    auto value = [](uint32_t h) {  // a 16-bit float's bits as f32 (host conversions, as f16_bytes)
        if constexpr (std::is_same<T, __half>::value) {
            __half_raw r;
            r.x = (unsigned short)h;
            return __half2float(__half(r));
        } else {
            __nv_bfloat16_raw r;
            r.x = (unsigned short)h;
            return __bfloat162float(__nv_bfloat16(r));
        }
    };
    for (int p = 0; p < 4; ++p)  // pair p = (nibble p, nibble p + 4)
        for (int half = 0; half < 2; ++half) {
            const int i = p + 4 * half;
            const bool odd = p & 1;
            const float v = value((b[p] >> (16 * half)) & 0xFFFFu);
            out[i] = odd ? v * tc::nib_raw_odd_scale<T>() - tc::nib_raw_odd<T>() : v - tc::nib_raw_even<T>();
        }
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
                          bool mma, cudaStream_t s) {
    if (mma) {
        switch (format) {
        case FL_GEMV_INT8: return tc::launch<I8, T>(x, w, scales, zeros, y, m, n, k, group, s);
        case FL_GEMV_INT4: return tc::launch<I4, T>(x, w, scales, zeros, y, m, n, k, group, s);
        case FL_GEMV_INT4_ZP: return tc::launch<I4Z, T>(x, w, scales, zeros, y, m, n, k, group, s);
        case FL_GEMV_Q8_0: return tc::launch<Q80, T>(x, w, scales, zeros, y, m, n, k, group, s);
        case FL_GEMV_Q4_0: return tc::launch<Q40, T>(x, w, scales, zeros, y, m, n, k, group, s);
        }
        return FL_ERR_INVALID_ARGUMENT;
    }
    switch (format) {
    case FL_GEMV_INT8: return launch<I8, T>(x, w, scales, zeros, y, m, n, k, group, s);
    case FL_GEMV_INT4: return launch<I4, T>(x, w, scales, zeros, y, m, n, k, group, s);
    case FL_GEMV_INT4_ZP: return launch<I4Z, T>(x, w, scales, zeros, y, m, n, k, group, s);
    case FL_GEMV_Q8_0: return launch<Q80, T>(x, w, scales, zeros, y, m, n, k, group, s);
    case FL_GEMV_Q4_0: return launch<Q40, T>(x, w, scales, zeros, y, m, n, k, group, s);
    }
    return FL_ERR_INVALID_ARGUMENT;
}

// The path forced by FL_GEMV_PATH (fma | mma; read once; FL_GEMV_PATH_AUTO when unset or
// anything else).
inline int env_path() {
    static const EnvChoice choices[] = {{"fma", FL_GEMV_PATH_FMA}, {"mma", FL_GEMV_PATH_MMA}};
    static const int v = env_choice("FL_GEMV_PATH", choices, FL_GEMV_PATH_AUTO);
    return v;
}

// Whether a launch takes the tensor-core kernel: forced by `path` or FL_GEMV_PATH, else for
// m >= 2 (the CUDA-core kernel is compute-bound there: measured on the H100 at m = 16 the
// tensor-core kernel is 5.2-8.4x faster) and for int4 at m = 1 (2.16x at 4096 x 4096, 1.30x
// at 11008 x 4096, session 6). Not for Q4_0 at m = 1 (slower than the CUDA-core kernel there).
// Both activation types: bf16 was kept off it until session 6, because the engine's bf16 test
// of every --quant mode against the dense model on dequantised weights failed once with it;
// re-run with the tensor-core kernel forced (H100, bench/RESULTS.md, session 6) it passes with
// a worst rel L2 of 8.1e-3 against 9.2e-3 for the CUDA-core kernel (bound 1e-2: bf16 logits
// sit close to it on either kernel).
// int8 at m = 1 takes the tensor-core launcher when its one-token kernel applies (tc::t1_applies,
// session 10), else the CUDA-core kernel.
inline bool use_mma(int path, fl_gemv_format format, int64_t m, int64_t n, int64_t k) {
    if (path == FL_GEMV_PATH_AUTO) path = env_path();
    if (path == FL_GEMV_PATH_MMA) return true;
    if (path == FL_GEMV_PATH_FMA) return false;
    return m >= 2 || format == FL_GEMV_INT4 || format == FL_GEMV_INT4_ZP ||
           (format == FL_GEMV_INT8 && (tc::t1t_applies<I8>((int)m, n, k, 32) || tc::t1_applies<I8>((int)m, n, k, 32))) ||
           (format == FL_GEMV_Q8_0 && (tc::t1b_applies<Q80>((int)m, n, k) || tc::t1g_applies<Q80>((int)m, n, k))) ||
           (format == FL_GEMV_Q4_0 && (tc::t1b_applies<Q40>((int)m, n, k) || tc::t1g_applies<Q40>((int)m, n, k)));
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
    return fl_gemv_quant_path(dtype, format, x, w, scales, zeros, group_size, y, m, n, k,
                              FL_GEMV_PATH_AUTO, stream);
}

extern "C" fl_status fl_gemv_quant_path(fl_dtype dtype, fl_gemv_format format, const void *x,
                                        const void *w, const void *scales, const void *zeros,
                                        int32_t group_size, void *y, int64_t m, int64_t n,
                                        int64_t k, int32_t path, fl_stream stream) {
    using namespace fl;
    if (path < FL_GEMV_PATH_AUTO || path > FL_GEMV_PATH_MMA) return FL_ERR_INVALID_ARGUMENT;
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
    const bool mma = gemv::use_mma(path, format, m, n, k);
    if (dtype == FL_DTYPE_F16)
        return gemv::dispatch_format<__half>(format, x, w, scales, zeros, y, (int)m, n, k, group_size, mma, s);
    return gemv::dispatch_format<__nv_bfloat16>(format, x, w, scales, zeros, y, (int)m, n, k, group_size, mma, s);
}

extern "C" fl_status fl_gemv_raw_nibbles_host(fl_dtype dtype, uint32_t word, float *out) {
    if (!out) return FL_ERR_INVALID_ARGUMENT;
    switch (dtype) {
    case FL_DTYPE_F16: fl::gemv::raw_nibbles_host<__half>(word, out); return FL_OK;
    case FL_DTYPE_BF16: fl::gemv::raw_nibbles_host<__nv_bfloat16>(word, out); return FL_OK;
    default: return FL_ERR_INVALID_ARGUMENT;
    }
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
