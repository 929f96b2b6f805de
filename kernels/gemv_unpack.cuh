// The weight formats of the quantised GEMV (kernels/gemv*.cu) and their exact dequantisation,
// shared by every kernel of the family and by the host test hooks (fl_gemv_unpack_unit_host,
// fl_gemv_raw_nibbles_host run the very same code on the CPU).
//
// CUDA-core side (f32): a byte b placed in the mantissa of 2^23 (PRMT) is 2^23 + b; a nibble
// masked in place at bit 4c is 2^23 + q * 16^c as long as the nibble lies inside the 23-bit
// mantissa, i.e. c <= 4. Nibbles 0..4 of a word are masked in place, nibbles 5..7 from w >> 20
// (c = 0..2). So one LOP3 + one FADD give (q - z) * 16^c exactly (int->float conversions issue
// at 1/4 rate), and the 16^c is taken out once per unit (each c has its own accumulator).
//
// Tensor-core side (the mma's f16 / bf16, the activations' type), two values per instruction:
// f16: a nibble masked in place under 0x6400 is 1024 + q (1024 + 16 q for a nibble at bits
// 4..7, scaled by 1/16 in the same fma); one fma2 subtracts 1024 + z (or 64 + z), giving q - z
// exactly (|q - z| <= 15). Bytes: (q ^ 0x80) under 0x64 (PRMT) is 1024 + q + 128, minus 1152.
// bf16 (7-bit mantissa): nibbles are shifted to bits 0..3, under 0x4300 = 128 + q, minus
// 128 + z; a signed byte is (128 + low 7 bits) - (128 or 256 by its sign bit). All these
// integers (|v| <= 128) are exact in f16 and bf16 and the fma's exact result is an integer, so
// nothing rounds; the k order inside a lane's values follows the cheap unpacking and x is
// permuted to match (a_frags: a dot product only needs A and B to agree).
#pragma once

#include <cstring>
#include <type_traits>

#include "common/common.cuh"

namespace fl {
namespace gemv {

enum Fmt : int { I8 = FL_GEMV_INT8, I4 = FL_GEMV_INT4, I4Z = FL_GEMV_INT4_ZP, Q80 = FL_GEMV_Q8_0, Q40 = FL_GEMV_Q4_0 };

constexpr float kMagic = 8388608.0f;  // 2^23

// Values and bytes of one unit (the piece one CUDA-core lane or one dequantise thread takes).
__host__ __device__ constexpr int unit_values(int f) { return f == I8 ? 16 : 32; }
__host__ __device__ constexpr int unit_bytes(int f) { return f == Q80 ? 34 : f == Q40 ? 18 : 16; }
// Bytes per GGUF block (an f16 d and 32 quants).
template <int F> __host__ __device__ constexpr int block_bytes() { return F == Q80 ? 34 : 18; }

// ---------------------------------------------------------------- CUDA-core unpacking (f32)
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

// 4 nwords signed bytes -> exact floats.
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

// ---------------------------------------------------------------- tensor-core unpacking (16-bit pairs)
// The m16n8k16 mma (common.cuh's, shared with gemv_dense.cu) on a 4-register A fragment.
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
// 0..3 first: 128 + q. nib_pairs below takes them to (q - z); the one-token int kernel's raw
// product multiplies them as they are (the odd chain scaled by 1/16 after the mma for f16) and
// subtracts the offsets. Pair P of them (w8 = w >> 8).
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

// The offsets nib_raw leaves in even and odd values: the products sum M_EVEN x (even k) +
// M_ODD x (odd k) over and above sum q x, which the raw product subtracts per row.
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

}  // namespace gemv
}  // namespace fl
