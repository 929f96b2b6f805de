// The quantised GEMV on CUDA cores (GemvPath::Fma; the automatic choice where no tensor-core
// kernel takes the call at m = 1, see gemv.cu): every format, m = 1..16, f32 FMAs.
//
// One warp per output row (4 warps per CTA). The warp walks its row in tiles of whole "units"
// (16 int8 values, 32 int4 values, one 32-value GGUF block); each tile's bytes are copied
// global -> shared memory with cp.async (16 bytes per lane per copy, fully coalesced, bypassing
// L1, no registers held while in flight: ~4 KB per warp in flight), then each lane dequantises
// whole units from shared memory (deq_bytes / deq_nibbles, gemv_unpack.cuh) and multiplies them
// with the m rows of x (read with 16-byte __ldg loads, L1-resident). GGUF blocks (34 and 18
// bytes) are only 2-byte aligned: the tile is copied from the 16-byte word below its first byte
// and the lanes read their block through aligned 32-bit words and funnel shifts. Per int4
// value: LOP3 + FADD once, then one FFMA (+ the x conversion) per token, so at 16 tokens the
// kernel is compute-bound; the tensor-core kernels take m >= 2 by default.
#include "gemv_common.cuh"

namespace fl {
namespace gemv {
namespace {

constexpr int kWarps = kFmaRowsPerCta;  // warps (= output rows) per CTA

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

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

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

}  // namespace

// grid.x = ceil(n / kWarps), block = 32 * kWarps, dynamic smem = kWarps * warp_slot_bytes(F).
// M: the token count rounded up to 1, 2, 4, 8 or 16.
template <int F, typename T, int M>
__global__ void __launch_bounds__(kWarps * 32)
gemv_fma_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, const void *__restrict__ scales,
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
                // to a whole 16-byte read (LDGSTS.ZFILL), past the tensor (compute-sanitizer).
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

namespace {

template <int F, typename T, int M> fl_status launch_tokens(const GemvArgs &a) {
    const int64_t blocks = ceil_div(a.n, kWarps);
    const size_t smem = (size_t)kWarps * warp_slot_bytes(F);
    gemv_fma_kernel<F, T, M><<<(unsigned)blocks, kWarps * 32, smem, a.stream>>>(
        static_cast<const T *>(a.x), static_cast<const uint8_t *>(a.w), a.scales, a.zeros, static_cast<T *>(a.y),
        a.m, a.n, a.k, a.group);
    return launch_status();
}

template <int F, typename T> fl_status launch_format(const GemvArgs &a) {
    if (a.m <= 1) return launch_tokens<F, T, 1>(a);
    if (a.m <= 2) return launch_tokens<F, T, 2>(a);
    if (a.m <= 4) return launch_tokens<F, T, 4>(a);
    if (a.m <= 8) return launch_tokens<F, T, 8>(a);
    return launch_tokens<F, T, 16>(a);
}

}  // namespace

fl_status launch_fma(const GemvArgs &a) {
    return with_act_type(a, [&](auto t) {
        using T = typename decltype(t)::type;
        switch (a.format) {
        case I8: return launch_format<I8, T>(a);
        case I4: return launch_format<I4, T>(a);
        case I4Z: return launch_format<I4Z, T>(a);
        case Q80: return launch_format<Q80, T>(a);
        case Q40: return launch_format<Q40, T>(a);
        }
        return FL_ERR_INVALID_ARGUMENT;
    });
}

}  // namespace gemv
}  // namespace fl
