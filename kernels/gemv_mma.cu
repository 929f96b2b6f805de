// The general quantised GEMV on tensor cores (GemvPath::Mma; the automatic choice at m >= 2
// and for int4 at m = 1 wherever no ring kernel takes the call, e.g. k % 256 != 0, see
// gemv.cu): every format, m = 1..16. It computes
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
// - Dequantisation to the mma's type is exact (nib_pairs / byte_pairs, gemv_unpack.cuh). The
//   k order inside a lane's 8 values follows the cheap unpacking and x is permuted to match
//   (a_frags): int8 / Q8_0 take pairs (0,1),(2,3),(4,5),(6,7) as loaded; int4 pairs
//   (v0,v4),(v1,v5),(v2,v6),(v3,v7) (v_i = nibble i of the word: value 8t + i); Q4_0
//   (4t,4t+2),(16+4t,16+4t+2),(4t+1,4t+3),(16+4t+1,16+4t+3). Mma 1 takes pairs 0, 1 as k-slots
//   {2t,2t+1}, {2t+8,2t+9}; mma 2 pairs 2, 3.
// - Scales stay out of the mma (in f32): every 32-wide chunk lies inside one group (groups
//   are 32/64/128 and aligned) or one GGUF block, so the mmas of a run of R chunks sharing a
//   scale (R = min(group / 32, 4) for int4, 1 for GGUF) go to a temporary f32 accumulator
//   started at 0, then acc += tmp * scale(column) for the lane's columns 2t, 2t + 1. The
//   products x * (q - z) are exact in the mma (11-bit x 5/8-bit integers); the zero point is
//   applied as the integer q - z (exact), not as z * sum(x). int8's per-row scale multiplies
//   the final sum once.
// - Host: NT = 2 when n / 16 >= SMs, warps per CTA from occupancy (as the dense GEMV).
#include "gemv_common.cuh"

namespace fl {
namespace gemv {
namespace {

constexpr int kMaxWarps = 16;

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

}  // namespace

// grid.x = ceil(n / (8 * NT)), block = 32 * W (W <= kMaxWarps). M16: some token >= 8.
// R: chunks per scale run (int4: min(group / 32, U); 1 for the GGUF formats, unused for int8).
template <int F, typename T, int NT, bool M16, int R>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
gemv_mma_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, const void *__restrict__ scales,
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
    // fails only in a warp's last batch): checking every load against n, m and k made int4
    // issue-bound. Rows past n and token rows past m read row 0 instead (valid memory): what
    // they produce lands only in outputs the epilogue drops (col >= n, tok >= m); likewise the
    // scale of a column past n is read from column col0.
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
                        // tensor at its last block: compute-sanitizer).
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

namespace {

// Warps per CTA: pick_gemv_warps (common.cuh), as the dense GEMV picks them.
template <int F, typename T, int NT, bool M16, int R>
int pick_warps(int64_t ctas, int64_t batches, int sms) {
    static std::atomic<int> occupancy[3];
    return pick_gemv_warps(gemv_mma_kernel<F, T, NT, M16, R>, occupancy, ctas, batches, sms);
}

template <int F, typename T, int NT, bool M16, int R>
fl_status launch_r(const T *x, const uint8_t *w, const void *scales, const uint8_t *zeros, T *y,
                   int m, int64_t n, int64_t k, int group, int sms, cudaStream_t s) {
    const int64_t ctas = ceil_div(n, 8 * NT);
    if (ctas > 0x7fffffffLL || (k >> 5) > 0x7fffffffLL - 64) return FL_ERR_INVALID_ARGUMENT;
    const int wps = pick_warps<F, T, NT, M16, R>(ctas, ceil_div(k / 32, unroll<F, NT, M16, R>()), sms);
    gemv_mma_kernel<F, T, NT, M16, R><<<(unsigned)ctas, 32 * wps, 0, s>>>(x, w, scales, zeros, y, m,
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

template <int F, typename T> fl_status launch_format(const GemvArgs &a) {
    const T *x = static_cast<const T *>(a.x);
    const uint8_t *w = static_cast<const uint8_t *>(a.w);
    T *y = static_cast<T *>(a.y);
    const int sms = sm_count();
    const int m = a.m;
    const int64_t n = a.n, k = a.k;
    // Two tiles of 8 rows per CTA (x loads shared by both, more weight bytes in flight) when
    // that still gives a CTA per SM; one (twice the CTAs) for small n.
    const bool nt2 = ceil_div(n, 16) >= sms;
    if (m > 8) {
        if (nt2) return launch_nt<F, T, 2, true>(x, w, a.scales, a.zeros, y, m, n, k, a.group, sms, a.stream);
        return launch_nt<F, T, 1, true>(x, w, a.scales, a.zeros, y, m, n, k, a.group, sms, a.stream);
    }
    if (nt2) return launch_nt<F, T, 2, false>(x, w, a.scales, a.zeros, y, m, n, k, a.group, sms, a.stream);
    return launch_nt<F, T, 1, false>(x, w, a.scales, a.zeros, y, m, n, k, a.group, sms, a.stream);
}

}  // namespace

fl_status launch_mma(const GemvArgs &a) {
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
