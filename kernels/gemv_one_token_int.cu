// The quantised GEMV at one token (m = 1) for int8 and int4 (with or without zero point), on
// tensor cores: the decode step's weight-bandwidth-bound case. Two kernels share one product:
// - gemv_one_token_int_kernel: each warp fills a ring of its own with cp.async;
// - gemv_one_token_int8_tma_kernel (int8, sm_90+): one ring per CTA that the TMA engine fills.
// gemv.cu tries the TMA kernel, then the cp.async one, then the general tensor-core kernel.
//
// The product (one_token_unit):
// - Each lane takes 16 contiguous bytes of a row per tile (a "piece": 16 int8 or 32 int4
//   values). A superchunk is 4 pieces = 64 bytes of a row; lane (g, t) takes piece slot t of
//   weight row g of each tile of 8 rows, so a copy instruction covers 2 full sectors per row.
// - The mma is m16n8k16 with A = the weights and B = x split by piece slot. Tiles 2j and
//   2j + 1 are the A rows g and g + 8 of a 16-row mma tile: lane (g, t) supplies rows g and
//   g + 8 at the k-slots {2t, 2t+1, 2t+8, 2t+9}, all from its own piece slot t of each. B
//   column c holds x only at the k-slots of piece slot c (lane (g, t) holds x where g == t,
//   else 0; columns 4..7 are 0). So D column c is the dot product of piece slot c alone, for
//   each of the 16 weight rows: with int4 each column gets its own group's scale (groups of
//   32, 64 or 128 all work) before the slots are summed; int8's per-row scale multiplies the
//   final sum. The B columns this costs were zero padding at one token anyway.
// - Staged once per CTA in shared memory by one batch of cp.async (one commit group ahead of
//   the ring's, so one round trip while the first weight copies are in flight): x, put in
//   place in the k order of the weight pairs (int4: nib_pairs' (v0, v4), (v1, v5), (v2, v6),
//   (v3, v7) of each word; int8: as stored), zero up to the last superchunk and followed by 64
//   zero bytes that the lanes with g != t read; and, for int4, the scales (and zeros) of the
//   CTA's 8 NT rows, one contiguous run (stage_rows).
// - Dequantisation is nib_pairs / byte_pairs (exact); the (q - z) x products are exact in the
//   mma's f32 accumulation. int4 in the CTAs of Rows32Warps4Raw instead multiplies the raw
//   nibbles (nib_raw: 1024 + q, half the instructions) and subtracts the offsets per row at
//   the end: f32 rounding of those sums replaces the exact products there.
#include "gemv_common.cuh"

namespace fl {
namespace gemv {

// CTA shapes of gemv_one_token_int_kernel: `tiles` of 8 rows, `warps`, a `ring` of superchunks
// per warp, x and the scales staged by cp.async (`async_staging`) or by register loads, and the
// int4 product on raw nibbles with the offsets subtracted per row (`raw_nibbles`). Which call
// takes which: one_token_int_shape below.
struct Rows16Warps4 {
    static constexpr int tiles = 2, warps = 4, ring = 4;
    static constexpr bool async_staging = true, raw_nibbles = false;
};
struct Rows16Warps8 {
    static constexpr int tiles = 2, warps = 8, ring = 4;
    static constexpr bool async_staging = true, raw_nibbles = false;
};
struct Rows16Warps8RegStaged {
    static constexpr int tiles = 2, warps = 8, ring = 4;
    static constexpr bool async_staging = false, raw_nibbles = false;
};
struct Rows32Warps4Raw {
    static constexpr int tiles = 4, warps = 4, ring = 4;
    static constexpr bool async_staging = true, raw_nibbles = true;
};
struct Rows32Warps8Ring3 {
    static constexpr int tiles = 4, warps = 8, ring = 3;
    static constexpr bool async_staging = true, raw_nibbles = false;
};

namespace {

// Values per piece (16 bytes) and superchunks (4 pieces) per row.
template <int F> __host__ __device__ constexpr int piece_values() { return F == I8 ? 16 : 32; }
template <int F> __host__ __device__ inline int superchunks(int64_t k) {
    return (int)((k + 4 * piece_values<F>() - 1) / (4 * piece_values<F>()));
}
// Shared-memory bytes of the staged x (zero to the last superchunk, then 64 zero bytes).
template <int F> __host__ __device__ inline int staged_x_bytes(int64_t k) {
    return superchunks<F>(k) * 8 * piece_values<F>() + 64;
}
// The raw product's per-group sums of x (and, with zero point, of x alone) and per-row
// offsets, for nt tiles.
template <int F> __host__ __device__ inline int raw_offset_bytes(int nt, int groups, bool raw) {
    return raw && (F == I4 || F == I4Z) ? round16(groups * 4 * (F == I4Z ? 2 : 1)) + 32 * nt : 0;
}

// Shared memory of shape C: staged x, scales, zeros, the raw product's offsets, the rings.
template <int F, typename C> inline int64_t one_token_int_smem(int64_t k, int group) {
    const int groups = (F == I4 || F == I4Z) ? (int)(k / group) : 0;
    return (int64_t)staged_x_bytes<F>(k) + staged_scale_bytes<F>(C::tiles, groups) +
           staged_zero_bytes<F>(C::tiles, groups) + raw_offset_bytes<F>(C::tiles, groups, C::raw_nibbles) +
           C::warps * C::ring * C::tiles * 512;
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

// One superchunk of both kernels: NJ 16-row tiles (j0, j0 + 1, ...) of the superchunk whose
// piece this lane reads at `slot` (this lane's row g of 8-row tile 0; 8-row tile u at slot[TS
// u]: tiles 2j and 2j + 1 are the A rows g and g + 8 of 16-row tile j) against its staged x
// words `xp` (the B side); p4: the superchunk's first piece index (the int4 zero and scale
// groups of this lane's piece 4 sci + t and of the D columns' pieces).
// int4 without RAW: each word's (q - z) pairs (nib_pairs) into one chain of 8 mma per tile (x
// staged in nib_pair_order); RAW: the raw pairs (nib_raw, no zero point: half the
// dequantisation instructions) in two chains of 4, even and odd nibbles (x staged in
// nib_pair_order_eo: each chain's B pair in adjacent registers), the odd chain scaled by 1/16
// (f16), the offsets (M + z) sum x left for the caller to subtract (raw_group_sums,
// raw_row_offsets).
template <int F, typename T, int NJ, int TS, bool RAW>
__device__ __forceinline__ void one_token_unit(const uint4 *slot, const uint4 *xp, const unsigned short *ss,
                                               const uint8_t *zs, NibZ zsym, int groups, int p4, int pieces,
                                               int gshift, int g, int t, int j0, float (&acc)[NJ][4]) {
    constexpr bool I4S = F == I4 || F == I4Z;
    constexpr int XV = piece_values<F>() / 8;
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
            if constexpr (!RAW) {
                NibZ z0 = zsym, z1 = zsym;
                if constexpr (F == I4Z) {
                    z0 = nib_z<T>((uint32_t)zs[r0 * zero_row_stride(groups) + gb]);
                    z1 = nib_z<T>((uint32_t)zs[r1 * zero_row_stride(groups) + gb]);
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
                    mma<T>(d, ae, xw[c].x, xw[c].y);  // (staged by raw_group_sums in this order)
                    mma<T>(dh, ao, xw[c].z, xw[c].w);
                }
                constexpr float H = nib_raw_odd_scale<T>();
#pragma unroll
                for (int e = 0; e < 4; ++e) d[e] = fmaf(dh[e], H, d[e]);
            }
            // d[0], d[1]: row g, piece slots 2t, 2t + 1 (0 for t >= 2); d[2], d[3]: row g + 8.
            auto sc = [&](int r, int gi) {
                return __half2float(__ushort_as_half(ss[r * scale_row_stride(groups) + gi]));
            };
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

// Both kernels' staging by cp.async (the caller commits): x (8 values = 16 bytes at a time,
// xwords words: zero past k) and, for int4, the scales (zeros) of rows base .. base + 8 NT - 1
// (0 past n: their outputs are dropped).
template <int F, typename T, int NT>
__device__ __forceinline__ void stage_x_and_scales(uint4 *xs, unsigned short *ss, uint8_t *zs, const T *x,
                                                   const void *scales, const uint8_t *zeros, int64_t n, int64_t k,
                                                   int64_t base, int groups, int xwords) {
    const int xdata = (int)(k / 8);  // uint4s of x (k % 32 == 0)
    const uint4 *x4 = reinterpret_cast<const uint4 *>(x);
    for (int i = threadIdx.x; i < xwords; i += blockDim.x)
        cp_async16(xs + i, i < xdata ? x4 + i : x4, i < xdata ? 16 : 0);
    if constexpr (F == I4 || F == I4Z) {
        const int rows = n - base < 8 * NT ? (int)(n - base) : 8 * NT;
        // The CTA's scales (zeros) are one contiguous run of rows * groups values, 16-byte
        // aligned when the tensor is (base is a multiple of 16 rows), staged at
        // scale_row_stride (zero_row_stride) per row.
        stage_rows(ss, static_cast<const unsigned short *>(scales) + base * groups, rows, groups,
                   scale_row_stride(groups), 8 * NT, staged_scale_bytes<F>(NT, groups));
        if constexpr (F == I4Z)
            stage_rows(zs, zeros + base * groups, rows, groups, zero_row_stride(groups), 8 * NT,
                       staged_zero_bytes<F>(NT, groups));
    }
}

// The raw product, after x is staged (xwords words of 8 values, xdata of them x, the rest
// zero) and before the kernel's barrier: puts each word in nib_pair_order_eo in place and sums
// x per group of wpg = group / 8 words (4, 8 or 16, so a group's words are held by consecutive
// lanes of one warp: every lane takes part in each step's shuffles): gq[gi] = nib_raw_even *
// (sum of the even values) + nib_raw_odd * (odd values), plus 8 * (all) without zero point
// (the offsets (M + z) x of the group's raw products, for z = 8); gs[gi] = the sum of all
// (int4 with zero point, for the rows' z). f32 sums in a fixed order (deterministic).
template <int F, typename T>
__device__ __forceinline__ void raw_group_sums(uint4 *xs, int xwords, int xdata, int wpg, float *gq, float *gs) {
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
__device__ __forceinline__ void raw_row_offsets(const unsigned short *ss, const uint8_t *zs, const float *gq,
                                                const float *gs, int groups, float *corr) {
    const int tpr = blockDim.x / R, r = threadIdx.x / tpr, sub = threadIdx.x % tpr;
    float v = 0.f;
#pragma unroll 4
    for (int gi = sub; gi < groups; gi += tpr) {
        float o = gq[gi];
        if constexpr (F == I4Z) o = fmaf((float)zs[r * zero_row_stride(groups) + gi], gs[gi], o);
        v = fmaf(__half2float(__ushort_as_half(ss[r * scale_row_stride(groups) + gi])), o, v);
    }
    for (int o = 1; o < tpr; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (sub == 0) corr[r] = -v;
}

}  // namespace

// ---------------------------------------------------------------- cp.async rings per warp
// The pieces go global -> shared memory with cp.async into a ring of C::ring superchunks per
// warp, each lane copying (and later reading) only its own 16-byte slots, so no barrier is
// needed: ring - 1 superchunks (tiles x 16 bytes per lane each) are always in flight, and no
// registers hold them (a ring in registers had ptxas move the loads down to their uses). The
// warps of a CTA take superchunks w, w + W, ... of its tiles (adjacent 64-byte pieces of each
// row at a time) and are summed in warp order at the end (deterministic).
// grid.x = ceil(n / (8 tiles)), block = 32 warps, dynamic shared memory one_token_int_smem().
template <int F, typename T, typename C>
__global__ void __launch_bounds__(C::warps * 32)
gemv_one_token_int_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, const void *__restrict__ scales,
                          const uint8_t *__restrict__ zeros, T *__restrict__ y, int64_t n, int64_t k, int group) {
    constexpr int NT = C::tiles, S = C::ring, W = C::warps;
    constexpr bool ASYNC = C::async_staging, RAW = C::raw_nibbles;
    constexpr bool I4S = F == I4 || F == I4Z;  // group scales (int4) or one per row (int8)
    constexpr int PV = piece_values<F>();      // values per piece (16 bytes)
    constexpr int XV = PV / 8;                 // uint4s of staged x per piece
    static_assert(S >= 2, "a ring of at least two superchunks");
    static_assert(!RAW || (I4S && ASYNC && (32 * W) % (8 * NT) == 0 && (32 * W) / (8 * NT) <= 32),
                  "int4 raw product: cp.async staging, a power-of-2 count of threads per row");
    extern __shared__ __align__(16) unsigned char ring_smem[];
    __shared__ float red[W][NT * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nsc = superchunks<F>(k);
    const int pieces = (int)(k / PV);
    const int groups = I4S ? (int)(k / group) : 0;
    const int gshift = I4S ? __ffs(group / PV) - 1 : 0;  // log2(pieces per group)
    const int64_t base = (int64_t)blockIdx.x * (8 * NT);

    uint4 *xs = reinterpret_cast<uint4 *>(ring_smem);
    const int xwords = staged_x_bytes<F>(k) / 16;
    unsigned short *ss = reinterpret_cast<unsigned short *>(ring_smem + staged_x_bytes<F>(k));
    uint8_t *zs = reinterpret_cast<uint8_t *>(ss) + staged_scale_bytes<F>(NT, groups);
    unsigned char *off = zs + staged_zero_bytes<F>(NT, groups);  // the raw product's offsets (else empty)
    const int off_bytes = raw_offset_bytes<F>(NT, groups, RAW);
    float *gq = reinterpret_cast<float *>(off);                     // per group: offsets,
    float *gs = gq + groups;                                        // x sums (int4zp);
    float *corr = reinterpret_cast<float *>(off + off_bytes - 32 * NT);  // per row: offsets
    uint4 *ring = reinterpret_cast<uint4 *>(zs + staged_zero_bytes<F>(NT, groups) + off_bytes) + warp * (S * NT * 32);

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
    // prefetch hint): `issue` below.
    // Stage x (8 values = 16 bytes at a time; int4 in nib_pair_order); zero past k up to the
    // last superchunk, then 64 zero bytes. int4: the scales and zeros of rows base .. base +
    // 8 NT - 1 (rows past n: 0 with cp.async, row n - 1's with registers; their outputs are
    // dropped).
    // ASYNC: one batch of cp.async for all of it, committed as one group before the ring's
    // first copies (so one round trip, not one per loop step), then int4's pair order applied
    // in place; else register loads and stores in a loop.
    if constexpr (ASYNC) {
        stage_x_and_scales<F, T, NT>(xs, ss, zs, x, scales, zeros, n, k, base, groups, xwords);
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
        if constexpr (RAW) {  // each thread reorders the words it copied (and sums x per group)
            raw_group_sums<F, T>(xs, xwords, (int)(k / 8), group / 8, gq, gs);
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
                ss[r * scale_row_stride(groups) + gi] = __ldg(sc16 + row * groups + gi);
                if constexpr (F == I4Z) zs[r * zero_row_stride(groups) + gi] = __ldg(zeros + row * groups + gi);
            }
        }
    }
    __syncthreads();
    if constexpr (RAW) raw_row_offsets<F, 8 * NT>(ss, zs, gq, gs, groups, corr);
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
        one_token_unit<F, T, NT / 2, 32, RAW>(slot, xv + sci * xstep, ss, zs, zsym, groups, 4 * sci, pieces, gshift,
                                              g, t, 0, acc);
    }
    cp_async_wait<0>();  // no copy outlives the kernel (the tail's are empty)

    one_token_epilogue<F, T, NT / 2, NT * 8, W>(acc, red, warp, 0, g, t, scales, y, base, n,
                                                RAW ? corr : nullptr);  // warps in order
}

// ---------------------------------------------------------------- int8, a TMA ring per CTA
// The product above with the weights coming in stages of SC superchunks (64 bytes of each of
// the CTA's 8 NT rows each), one TMA tensor copy per stage (the weights as a 2-d map of 8-byte
// elements, box = 8 NT rows x the run + 64 bytes; rows past n and bytes past a row's end read
// 0) into one ring of S stages per CTA, counted on a "full" mbarrier; the warps split a stage
// by superchunks (warp w takes superchunks w, w + WG, ...; when a stage has fewer superchunks
// than warps, WH warps share one and take NJ of its 16-row tiles each) and release it on an
// "empty" mbarrier (one arrival per warp), which thread 0 waits on before copying the stage S
// later into the slot: one instruction per stage instead of NT 16-byte cp.async per lane per
// superchunk. int4 on it was slower than the cp.async rings (its dequantisation, twice int8's
// work per byte, is what waits): int8 only.
// - The 64 bytes past a row's run (they belong to the next stage) make the row stride 4 SC + 4
//   16-byte words, 4 mod 8 for even SC: the 8 lanes of a quarter warp (rows g, g + 1, pieces t)
//   then read 32 distinct banks.
// - x is staged as above (cp.async) while the first S - 1 stages are in flight. Past k the
//   weights read 0 and x is 0.
// Requires k % 32 == 0 and a 16-byte aligned weight tensor (the map). grid.x = ceil(n / (8
// NT)), block = 32 W, dynamic shared memory int8_tma_smem().
struct Int8TmaShape {
    static constexpr int tiles = 4, superchunks_per_stage = 16, ring = 3, warps = 8;
};
template <int SC> __host__ __device__ constexpr int int8_tma_row_stride() { return 64 * SC + 64; }
// Bytes of shared memory: staged x, 2 S mbarriers, up to 112 bytes to align the ring to 128,
// the ring.
template <typename C> inline int64_t int8_tma_smem(int64_t k) {
    return (int64_t)staged_x_bytes<I8>(k) + 16 * C::ring + 128 +
           (int64_t)C::ring * 8 * C::tiles * int8_tma_row_stride<C::superchunks_per_stage>();
}

template <typename T, typename C>
__global__ void __launch_bounds__(C::warps * 32)
gemv_one_token_int8_tma_kernel(const T *__restrict__ x, const void *__restrict__ scales, T *__restrict__ y,
                               int64_t n, int64_t k, const __grid_constant__ CUtensorMap wmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int F = I8;
    constexpr int NT = C::tiles, SC = C::superchunks_per_stage, S = C::ring, W = C::warps;
    constexpr int PV = piece_values<F>(), XV = PV / 8;
    constexpr int RS = int8_tma_row_stride<SC>(), RSW = RS / 16, R = 8 * NT, SB = R * RS;
    constexpr int NP = NT / 2;                   // 16-row tiles
    constexpr int WH = W > SC ? W / SC : 1;      // warps per superchunk
    constexpr int WG = W / WH;                   // superchunk groups
    constexpr int NJ = NP / WH;                  // 16-row tiles per warp
    constexpr int HP = (SC + WG - 1) / WG;       // superchunks per warp per stage (at most)
    static_assert(S >= 2 && SC % 2 == 0 && NT % 2 == 0 && W % WH == 0 && NP % WH == 0 && NJ >= 1,
                  "a ring of at least two stages, 16-row tiles split evenly");
    static_assert(RS / 8 <= 256 && R <= 256, "a TMA box has at most 256 elements per dimension");
    extern __shared__ __align__(16) unsigned char ring_smem[];
    __shared__ float red[WG][R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int pg = warp / WH, hw = warp % WH;  // superchunk group, tile share
    const int nsc = superchunks<F>(k);
    const int nst = (nsc + SC - 1) / SC;        // stages
    const int pieces = (int)(k / PV);
    const int64_t base = (int64_t)blockIdx.x * R;

    uint4 *xs = reinterpret_cast<uint4 *>(ring_smem);
    const int xwords = staged_x_bytes<F>(k) / 16;
    const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring_smem));
    const uint32_t bars = raw_s + (uint32_t)staged_x_bytes<F>(k);  // 16-byte aligned
    const uint32_t ring_s = (bars + 16 * S + 127) & ~127u;
    const unsigned char *ring = ring_smem + (ring_s - raw_s);
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

    stage_x_and_scales<F, T, NT>(xs, nullptr, nullptr, x, scales, nullptr, n, k, base, 0, xwords);
    cp_async_commit();
    cp_async_wait<0>();
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
                one_token_unit<F, T, NJ, 8 * RSW, false>(stage + 4 * q, xv + sci * xstep, nullptr, nullptr, zsym, 0,
                                                         4 * sci, pieces, 0, g, t, hw * NJ, acc);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty(s));  // this warp is done with the slot
    }

    // The superchunk groups' row sums in order.
    one_token_epilogue<F, T, NJ, R, WG>(acc, red, pg, hw * NJ, g, t, scales, y, base, n);
#endif
}

namespace {

// The CTA shape of gemv_one_token_int_kernel a call takes: f(Type<shape>{}).
template <int F, typename Fn> decltype(auto) one_token_int_shape(int64_t n, int64_t k, Fn &&f) {
    const int64_t sms = sm_count();
    if constexpr (F == I8) {
        // Below 2 CTAs of 16 rows per SM, 4-warp CTAs (more of them); register staging at
        // k <= 4096, where it measured faster for int8 than cp.async staging.
        if (ceil_div(n, 16) < 2 * sms) return f(Type<Rows16Warps4>{});
        if (k <= 4096) return f(Type<Rows16Warps8RegStaged>{});
        return f(Type<Rows16Warps8>{});
    } else {
        const int64_t ctas = ceil_div(n, 32);
        if constexpr (F == I4Z) {
            // 8-warp CTAs of 32 rows only for a grid of at most 2 per SM with long rows; 32-row
            // CTAs of 4 warps from 2 per SM, 16-row CTAs below.
            if (ctas <= 2 * sms && k >= 8192) return f(Type<Rows32Warps8Ring3>{});
            if (ctas >= 2 * sms) return f(Type<Rows32Warps4Raw>{});
            return f(Type<Rows16Warps4>{});
        } else {
            // 4-warp CTAs where 8-warp ones would leave a partial second wave (2-4 CTAs per SM).
            if (ctas > 2 * sms && ctas < 4 * sms) return f(Type<Rows32Warps4Raw>{});
            return f(Type<Rows32Warps8Ring3>{});
        }
    }
}

template <int F, typename T, typename C> bool launch_int_shape(const GemvArgs &a, fl_status &st) {
    const auto kernel = gemv_one_token_int_kernel<F, T, C>;
    return launch_ring(kernel, one_token_int_smem<F, C>(a.k, a.group), a.n, 8 * C::tiles, 32 * C::warps, a.stream,
                       st, static_cast<const T *>(a.x), static_cast<const uint8_t *>(a.w), a.scales, a.zeros,
                       static_cast<T *>(a.y), a.n, a.k, a.group);
}

template <int F> bool int_applies(int64_t n, int64_t k, int group) {
    return k / 16 < 0x7fffffffLL / 4 && one_token_int_shape<F>(n, k, [&](auto c) {
               return one_token_int_smem<F, typename decltype(c)::type>(k, group) <= kMaxRingSmem;
           });
}

// Whether int8 takes the TMA kernel: not where the grid of 32-row CTAs holds between 2 and 4
// per SM (there the cp.async rings measured faster).
bool int8_tma_shape_applies(int64_t n) {
    const int64_t ctas = ceil_div(n, 32), sms = sm_count();
    return !(ctas > 2 * sms && ctas < 4 * sms);
}

}  // namespace

// m = 1, int8 / int4, its shared memory (x, scales, rings) <= kMaxRingSmem (k up to ~64k
// values for int8, ~58k for int4 g128 with 2 tiles, ~43k for int4 g32, ~37k for int4zp g32;
// less with 4 tiles), and the 32-bit piece indices hold.
bool one_token_int_applies(Fmt f, int m, int64_t n, int64_t k, int group) {
    if (m != 1) return false;
    switch (f) {
    case I8: return int_applies<I8>(n, k, group);
    case I4: return int_applies<I4>(n, k, group);
    case I4Z: return int_applies<I4Z>(n, k, group);
    default: return false;
    }
}

bool launch_one_token_int(const GemvArgs &a, fl_status &st) {
    return with_act_type(a, [&](auto t) {
        using T = typename decltype(t)::type;
        switch (a.format) {
        case I8:
            return one_token_int_shape<I8>(a.n, a.k, [&](auto c) {
                return launch_int_shape<I8, T, typename decltype(c)::type>(a, st);
            });
        case I4:
            return one_token_int_shape<I4>(a.n, a.k, [&](auto c) {
                return launch_int_shape<I4, T, typename decltype(c)::type>(a, st);
            });
        case I4Z:
            return one_token_int_shape<I4Z>(a.n, a.k, [&](auto c) {
                return launch_int_shape<I4Z, T, typename decltype(c)::type>(a, st);
            });
        default: return false;
        }
    });
}

// m = 1, the shape rule, an sm_90+ device, its shared memory <= kMaxRingSmem (x and the ring),
// n < 2^31, the 32-bit piece indices hold, and the driver's tensor-map encoder (a weight
// tensor the map refuses, e.g. not 16-byte aligned, makes the launch fall back to the cp.async
// kernel).
bool one_token_int8_tma_applies(int m, int64_t n, int64_t k) {
    if (m != 1) return false;
    if (!int8_tma_shape_applies(n) || cc_major() < 9 || int8_tma_smem<Int8TmaShape>(k) > kMaxRingSmem) return false;
    return n < 0x7fffffffLL && k / 16 < 0x7fffffffLL / 4 && encode_fn() != nullptr;
}

bool launch_one_token_int8_tma(const GemvArgs &a, fl_status &st) {
    using C = Int8TmaShape;
    CUtensorMap map;
    std::memset(&map, 0, sizeof(map));
    const uint8_t *w = static_cast<const uint8_t *>(a.w);
    if (!rows_map(&map, w, a.n, a.k, int8_tma_row_stride<C::superchunks_per_stage>(), 8 * C::tiles)) return false;
    return with_act_type(a, [&](auto t) {
        using T = typename decltype(t)::type;
        const auto kernel = gemv_one_token_int8_tma_kernel<T, C>;
        return launch_ring(kernel, int8_tma_smem<C>(a.k), a.n, 8 * C::tiles, 32 * C::warps, a.stream, st,
                           static_cast<const T *>(a.x), a.scales, static_cast<T *>(a.y), a.n, a.k, map);
    });
}

}  // namespace gemv
}  // namespace fl
