// GELU device functions, shared by fl_gelu (activation.cu) and the fused INT8 epilogue
// fl_dequant_bias_gelu_quant (quant.cu), so that both compute the same f32 values.
#pragma once

namespace fl {

// gelu_tanh(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as the
// equal x * sigmoid(2u) = x / (1 + e^(-2u)): no cancellation in 1 + tanh(u) for x < 0, and
// the same overflow behaviour as silu (x^3 = +-inf gives x or -0, never NaN).
__device__ __forceinline__ float gelu_tanh(float x) {
    constexpr float k0 = 1.5957691216057308f;      // 2 sqrt(2 / pi)
    constexpr float k1 = 0.0713548162726009f;      // 2 sqrt(2 / pi) * 0.044715
    const float two_u = x * fmaf(k1, x * x, k0);
    return __fdividef(x, 1.f + __expf(-two_u));
}

// erfc(a) for a >= 0, by the classic Chebyshev fit erfc(a) = t exp(-a^2 + P(t)),
// t = 1 / (1 + a / 2), P of degree 9: relative error 1.2e-7 in exact arithmetic; in f32
// (the rounding of the exp argument -a^2 + P dominates) under 5e-7 for a < 1.4, ~2e-6 at
// a = 3.5, up to ~2e-5 deep in the tail (a ~ 9, erfc ~ 1e-36). About 17 instructions, a
// third of erfcf/normcdff: gelu_erf on 2-byte types must stay under ~40 instructions per
// element to run at copy bandwidth.
__device__ __forceinline__ float erfc_nonneg(float a) {
    const float t = __fdividef(1.f, fmaf(0.5f, a, 1.f));
    float p = 0.17087277f;
    p = fmaf(p, t, -0.82215223f);
    p = fmaf(p, t, 1.48851587f);
    p = fmaf(p, t, -1.13520398f);
    p = fmaf(p, t, 0.27886807f);
    p = fmaf(p, t, -0.18628806f);
    p = fmaf(p, t, 0.09678418f);
    p = fmaf(p, t, 0.37409196f);
    p = fmaf(p, t, 1.00002368f);
    p = fmaf(p, t, -1.26551223f);
    return t * __expf(fmaf(-a, a, p));
}

// gelu_erf(x) = 0.5 x (1 + erf(x / sqrt 2)) = x Phi(x), with Phi(x) = erfc(|x| / sqrt 2) / 2
// for x < 0 and 1 - erfc(x / sqrt 2) / 2 for x >= 0: no cancellation in either tail (unlike
// 1 + erf). Infinite or huge |x|: erfc = 0, so gelu = x or -0 (NaN only for x = -inf, as
// in the textbook formula).
__device__ __forceinline__ float gelu_erf(float x) {
    const float e = 0.5f * erfc_nonneg(fabsf(x) * 0.70710678118654752f);
    return x * (x < 0.f ? e : 1.f - e);
}

}  // namespace fl
