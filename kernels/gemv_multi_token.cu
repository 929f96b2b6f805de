// The quantised GEMV at 2..16 tokens with k % 256 == 0, on tensor cores: one kernel for
// llama.cpp's Q8_0 / Q4_0 blocks and one for int8 / int4 (gemv.cu takes them before the
// general tensor-core kernel, which keeps every other k). Both copy the CTA's weights and
// every token's x of the same k range into cp.async rings:
// - A superchunk (a run of k of each of the CTA's 8 NT rows) is copied as one contiguous run
//   of 16-byte words per row into a ring slot, followed by every token's x of the same k
//   (cp.async from global, where x stays in L2: m k 2 bytes, read once per CTA); tokens
//   m..MT-1 are zero-filled once (plain stores before the first copy) and never copied. A
//   token's x run is padded so that the 8 tokens g a quarter / half warp reads fall on
//   distinct banks.
// - PW warps share a ring (a pair, or one warp): they copy its superchunks together and take
//   half its 16-row tiles each, synced by a named barrier of the ring's threads (ring_sync);
//   twice the warps per SM at the same shared memory.
// - The weights are the mma's A side (rows g and g + 8 of each 16-row tile); the quad t =
//   0..3 splits one block / unit; B column c is token c (+ 8 in the second group of 8 tokens)
//   with its x as stored, so D is (row, token) for one block / unit, scaled by its scale of
//   each row, then accumulated. Rings are summed in order at the end (deterministic).
#include "gemv_common.cuh"

namespace fl {
namespace gemv {
namespace {

// The sync of a ring shared by PW warps: __syncwarp for one warp, else named barrier 1 + grp
// over the ring's 32 PW threads (barrier 0 is __syncthreads').
template <int PW> __device__ __forceinline__ void ring_sync(int grp) {
    if constexpr (PW == 1) __syncwarp();
    else asm volatile("bar.sync %0, %1;" ::"r"(1 + grp), "n"(32 * PW) : "memory");
}

// One 16-row tile pair of one block (GGUF) or int4 unit in both multi-token kernels: the two
// mmas of A fragments a0, a1 against each 8-token group q of B fragments xb[q], summed apart in
// d and scaled by the block's / group's scale of rows g (s0) and g + 8 (s1) into acc[q]:
// d = (row g, tokens 2t, 2t + 1), (row g + 8, the same tokens), + 8 q.
template <typename T, int NG>
__device__ __forceinline__ void scaled_mma_pair(float (&acc)[NG][4], const uint32_t (&a0)[4], const uint32_t (&a1)[4],
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
__device__ __forceinline__ void multi_token_store(const float (&acc)[NJ][MT / 8][4], float (&red)[G][MT * NT * 8],
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

}  // namespace

// ---------------------------------------------------------------- Q8_0 / Q4_0
// Superchunks of C::blocks blocks of each of the CTA's rows, copied as in the one-token GGUF
// kernel (k % 256 == 0), in place of the general kernel's per-lane loads of 2-byte-aligned
// blocks (one batch in flight per warp). A token's x run is padded by 64 bytes (Q8_0) or 32
// (Q4_0). The quad t = 0..3 splits one block: lane t supplies quants 8t..8t+7 (Q8_0: two words;
// k-slots {2t, 2t+1, 2t+8, 2t+9} of mma 0 are values 8t..8t+3, of mma 1 values 8t+4..8t+7) or
// quant bytes 4t..4t+3 (Q4_0, reordered by one byte_perm so that mma 0 gets values 4t..4t+3 and
// mma 1 values 16+4t..19+4t); x is read as stored (two 16-byte or four 8-byte shared loads per
// block). grid.x = ceil(n / (8 tiles)), block = 32 warps, dynamic shared memory
// multi_token_gguf_smem() (independent of k: x is not staged whole). MT = 8 (m <= 8) or 16.

// CTA shapes: `tiles` of 8 rows, `warps`, `warps_per_ring` (1 or a pair), a `ring` of
// superchunks of `blocks` blocks per row. Which call takes which: multi_token_gguf_shape below.
struct GgufTiles4Warps4 {
    static constexpr int tiles = 4, warps = 4, warps_per_ring = 1, ring = 2, blocks = 8;
};
struct GgufTiles4WarpPairs {
    static constexpr int tiles = 4, warps = 8, warps_per_ring = 2, ring = 2, blocks = 8;
};
// Half the x copies per weight byte, for wide grids at 9..16 tokens.
struct GgufTiles8WarpPairs {
    static constexpr int tiles = 8, warps = 4, warps_per_ring = 2, ring = 2, blocks = 8;
};

namespace {

template <int F, int BPS> __host__ __device__ constexpr int gguf_token_bytes() {
    return BPS * 64 + (F == Q80 ? 64 : 32);
}
template <int F, int NT, int MT, int BPS> __host__ __device__ constexpr int multi_token_gguf_slot_words() {
    return gguf_slot_words<F, NT, BPS>() + MT * gguf_token_bytes<F, BPS>() / 16;
}
// The rings and 16 bytes that the last block's shared loads may read past its slot.
template <int F, typename C, int MT> constexpr int64_t multi_token_gguf_smem() {
    constexpr int rings = C::warps / C::warps_per_ring;
    return (int64_t)rings * C::ring * multi_token_gguf_slot_words<F, C::tiles, MT, C::blocks>() * 16 + 16;
}

}  // namespace

template <int F, typename T, typename C, int MT>
__global__ void __launch_bounds__(C::warps * 32)
gemv_multi_token_gguf_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, T *__restrict__ y, int m,
                             int64_t n, int64_t k) {
    constexpr int NT = C::tiles, S = C::ring, W = C::warps, BPS = C::blocks, PW = C::warps_per_ring;
    constexpr int BB = block_bytes<F>(), RB = gguf_run_bytes<F, BPS>(), RW = RB / 16;
    constexpr int SW = gguf_slot_words<F, NT, BPS>();  // weight uint4s per slot: row r's at r * RW
    constexpr int TB = gguf_token_bytes<F, BPS>();     // bytes per token of a slot's x part
    constexpr int SLOT = multi_token_gguf_slot_words<F, NT, MT, BPS>();
    constexpr int G = W / PW, GT = 32 * PW;  // rings, threads per ring
    constexpr int CP = (SW + GT - 1) / GT;   // weight copies per thread per superchunk
    constexpr int XC = BPS * 4 / 32;      // x copies per lane per token per superchunk
    constexpr int QW = F == Q80 ? 2 : 1;  // quant words per lane per block
    constexpr int NP = NT / 2, NG = MT / 8, NJ = NP / PW;  // 16-row tiles: per CTA, per warp
    static_assert(S >= 2 && RB % 16 == 0 && NT % 2 == 0 && (MT == 8 || MT == 16) && BPS % 8 == 0 &&
                      W % PW == 0 && NP % PW == 0 && MT % PW == 0,
                  "a ring of at least two superchunks of whole words, 16-row tiles, 8 or 16 tokens, whole rings");
    extern __shared__ __align__(16) unsigned char ring_smem[];
    __shared__ float red[G][MT * NT * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    // PW warps share a ring (grp): they copy its superchunks together (the x of tokens h, h +
    // PW, ... each) and take NJ of its 16-row tiles each (h).
    const int grp = warp / PW, h = warp % PW, tl = threadIdx.x % GT;
    const int nsc = (int)(k / (32 * BPS));  // superchunks per row
    const int64_t rowb = (k >> 5) * BB;     // bytes per row
    const int64_t base = (int64_t)blockIdx.x * (8 * NT);
    uint4 *ring = reinterpret_cast<uint4 *>(ring_smem) + grp * (S * SLOT);

    // Weight copies: word c = tl + GT e of a slot is word c % RW of row c / RW, at byte src[e]
    // from the CTA's first row; rows past n copy row n - 1 (their outputs are dropped).
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
#pragma unroll BPS
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
                scaled_mma_pair<T, NG>(acc[j], a0, a1, xb, s0, s1);
            }
        }
    }
    cp_async_wait<0>();  // no copy outlives the kernel (the tail's groups are empty)
    multi_token_store<F, T, NT, MT, G, NJ>(acc, red, nullptr, y, m, n, base, grp, h * NJ, g, t);
}

// ---------------------------------------------------------------- int8 / int4
// The same scheme with 16-byte units in place of blocks, for int8 (per-row f32 scale) and int4
// (f16 scale, and u8 zero, per group of 32, 64 or 128 along k):
// - A superchunk is 256 values of each of the CTA's 8 NT rows (256 / 128 bytes: k % 256 ==
//   0), copied as one run of words per row into a ring slot whose rows are padded by one word
//   (lane (g, t) reads word t of a unit of rows g and g + 8: with row strides of 17 / 9 words
//   the 32 lanes hit 32 banks), followed by every token's x of the same 256 values.
// - A unit is 16 bytes of a row (16 int8 or 32 int4 values); the quad t = 0..3 splits it, lane
//   t taking word t: int8 values 4t..4t+3 (one mma, x as stored), int4 values 8t..8t+7
//   (nib_pairs' pairs (v0, v4), (v1, v5) in mma 0 and (v2, v6), (v3, v7) in mma 1, x put in
//   that order by a_frags<I4>). A unit lies inside one int4 group, so its D gets the group's
//   scale of each row (staged once per CTA, with the zeros, as in the one-token kernel); int8's
//   row scale multiplies the final sum.
// grid.x = ceil(n / (8 tiles)), block = 32 warps, dynamic shared memory multi_token_int_smem().

// CTA shapes: `tiles` of 8 rows, `warps` in pairs per ring, a `ring` of superchunks, `unroll`
// units of a superchunk unrolled. Which call takes which: multi_token_int_shape below.
struct IntTiles4WarpPairs {
    static constexpr int tiles = 4, warps = 8, warps_per_ring = 2, ring = 2, unroll = 8;
};
// Half the x copies per weight byte, for wide grids at 9..16 tokens.
struct IntTiles8WarpPairs {
    static constexpr int tiles = 8, warps = 4, warps_per_ring = 2, ring = 2, unroll = 8;
};

namespace {

template <int F> __host__ __device__ constexpr int int_row_bytes() { return F == I8 ? 256 : 128; }
template <int F> __host__ __device__ constexpr int int_token_bytes() { return 512 + (F == I8 ? 32 : 64); }
template <int F, int NT> __host__ __device__ constexpr int int_weight_slot_words() {
    return NT * 8 * (int_row_bytes<F>() / 16 + 1);
}
template <int F, int NT, int MT> __host__ __device__ constexpr int multi_token_int_slot_words() {
    return int_weight_slot_words<F, NT>() + MT * int_token_bytes<F>() / 16;
}
// int4's staged scales and zeros, then the rings.
template <int F, typename C, int MT> inline int64_t multi_token_int_smem(int64_t k, int group) {
    constexpr int rings = C::warps / C::warps_per_ring;
    const int groups = (F == I4 || F == I4Z) ? (int)(k / group) : 0;
    return (int64_t)staged_scale_bytes<F>(C::tiles, groups) + staged_zero_bytes<F>(C::tiles, groups) +
           (int64_t)rings * C::ring * multi_token_int_slot_words<F, C::tiles, MT>() * 16;
}

}  // namespace

template <int F, typename T, typename C, int MT>
__global__ void __launch_bounds__(C::warps * 32)
gemv_multi_token_int_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, const void *__restrict__ scales,
                            const uint8_t *__restrict__ zeros, T *__restrict__ y, int m, int64_t n, int64_t k,
                            int group) {
    constexpr int NT = C::tiles, S = C::ring, W = C::warps, PW = C::warps_per_ring;
    constexpr bool I4S = F == I4 || F == I4Z;
    constexpr int RB = int_row_bytes<F>(), RW = RB / 16, RWP = RW + 1;  // words per row, padded
    constexpr int SW = int_weight_slot_words<F, NT>();  // weight uint4s per slot: row r's at r * RWP
    constexpr int G = W / PW, GT = 32 * PW;          // rings, threads per ring
    constexpr int CP = NT * 8 * RW / GT;             // weight copies per thread per superchunk
    constexpr int TB = int_token_bytes<F>();         // bytes per token of a slot's x part
    constexpr int SLOT = multi_token_int_slot_words<F, NT, MT>();
    constexpr int UPS = RW;                          // units per superchunk (16 / 8)
    constexpr int NP = NT / 2, NG = MT / 8, NJ = NP / PW;  // 16-row tiles: per CTA, per warp
    static_assert(S >= 2 && NT % 2 == 0 && (MT == 8 || MT == 16) && (NT * 8 * RW) % GT == 0 &&
                      W % PW == 0 && NP % PW == 0 && MT % PW == 0,
                  "a ring of at least two superchunks, 16-row tiles, 8 or 16 tokens, whole rings");
    extern __shared__ __align__(16) unsigned char ring_smem[];
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
    unsigned short *ss = reinterpret_cast<unsigned short *>(ring_smem);
    uint8_t *zs = reinterpret_cast<uint8_t *>(ss) + staged_scale_bytes<F>(NT, groups);
    uint4 *ring = reinterpret_cast<uint4 *>(zs + staged_zero_bytes<F>(NT, groups)) + grp * (S * SLOT);

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
        stage_rows(ss, static_cast<const unsigned short *>(scales) + base * groups, rows, groups,
                   scale_row_stride(groups), 8 * NT, staged_scale_bytes<F>(NT, groups));
        if constexpr (F == I4Z)
            stage_rows(zs, zeros + base * groups, rows, groups, zero_row_stride(groups), 8 * NT,
                       staged_zero_bytes<F>(NT, groups));
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
#pragma unroll C::unroll
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
                        z0 = nib_z<T>((uint32_t)zs[r0 * zero_row_stride(groups) + gi]);
                        z1 = nib_z<T>((uint32_t)zs[r1 * zero_row_stride(groups) + gi]);
                    }
                    uint32_t p0[4], p1[4];
                    nib_pairs<T>(q0, z0, p0);
                    nib_pairs<T>(q1, z1, p1);
                    const uint32_t a0[4] = {p0[0], p1[0], p0[1], p1[1]};
                    const uint32_t a1[4] = {p0[2], p1[2], p0[3], p1[3]};
                    const float s0 = __half2float(__ushort_as_half(ss[r0 * scale_row_stride(groups) + gi]));
                    const float s1 = __half2float(__ushort_as_half(ss[r1 * scale_row_stride(groups) + gi]));
                    scaled_mma_pair<T, NG>(acc[j], a0, a1, xb, s0, s1);
                }
            }
        }
    }
    cp_async_wait<0>();  // no copy outlives the kernel (the tail's groups are empty)
    multi_token_store<F, T, NT, MT, G, NJ>(acc, red, scales, y, m, n, base, grp, h * NJ, g, t);
}

namespace {

// The CTA shape a call takes: f(Type<shape>{}). Q4_0 at 2..8 tokens keeps one warp per ring
// (pairs were slower there); 8-tile CTAs only at 9..16 tokens on grids of several CTAs per SM.
template <int F, int MT, typename Fn> decltype(auto) multi_token_gguf_shape(int64_t n, Fn &&f) {
    if constexpr (MT == 16) {
        if (n >= (F == Q40 ? 64 : 128) * (int64_t)sm_count()) return f(Type<GgufTiles8WarpPairs>{});
        return f(Type<GgufTiles4WarpPairs>{});
    } else if constexpr (F == Q40) {
        return f(Type<GgufTiles4Warps4>{});
    } else {
        return f(Type<GgufTiles4WarpPairs>{});
    }
}
template <int F, int MT, typename Fn> decltype(auto) multi_token_int_shape(int64_t n, Fn &&f) {
    if constexpr (MT == 16)
        if (n >= 64 * (int64_t)sm_count()) return f(Type<IntTiles8WarpPairs>{});
    return f(Type<IntTiles4WarpPairs>{});
}

template <int F, typename T, int MT> bool launch_gguf_tokens(const GemvArgs &a, fl_status &st) {
    return multi_token_gguf_shape<F, MT>(a.n, [&](auto c) {
        using C = typename decltype(c)::type;
        const auto kernel = gemv_multi_token_gguf_kernel<F, T, C, MT>;
        return launch_ring(kernel, multi_token_gguf_smem<F, C, MT>(), a.n, 8 * C::tiles, 32 * C::warps, a.stream, st,
                           static_cast<const T *>(a.x), static_cast<const uint8_t *>(a.w), static_cast<T *>(a.y), a.m,
                           a.n, a.k);
    });
}

template <int F, typename T, int MT> bool launch_int_tokens(const GemvArgs &a, fl_status &st) {
    return multi_token_int_shape<F, MT>(a.n, [&](auto c) {
        using C = typename decltype(c)::type;
        const auto kernel = gemv_multi_token_int_kernel<F, T, C, MT>;
        return launch_ring(kernel, multi_token_int_smem<F, C, MT>(a.k, a.group), a.n, 8 * C::tiles, 32 * C::warps,
                           a.stream, st, static_cast<const T *>(a.x), static_cast<const uint8_t *>(a.w), a.scales,
                           a.zeros, static_cast<T *>(a.y), a.m, a.n, a.k, a.group);
    });
}

template <int F, typename T> bool launch_gguf_format(const GemvArgs &a, fl_status &st) {
    if (a.m <= 8) return launch_gguf_tokens<F, T, 8>(a, st);
    return launch_gguf_tokens<F, T, 16>(a, st);
}
template <int F, typename T> bool launch_int_format(const GemvArgs &a, fl_status &st) {
    if (a.m <= 8) return launch_int_tokens<F, T, 8>(a, st);
    return launch_int_tokens<F, T, 16>(a, st);
}

template <int F> bool int_applies(int m, int64_t n, int64_t k, int group) {
    auto fits8 = [&](auto c) {
        return multi_token_int_smem<F, typename decltype(c)::type, 8>(k, group) <= kMaxRingSmem;
    };
    auto fits16 = [&](auto c) {
        return multi_token_int_smem<F, typename decltype(c)::type, 16>(k, group) <= kMaxRingSmem;
    };
    return m <= 8 ? multi_token_int_shape<F, 8>(n, fits8) : multi_token_int_shape<F, 16>(n, fits16);
}

}  // namespace

// Q8_0 / Q4_0, m = 2..16, k % 256 == 0 (rows on 16-byte boundaries; its shared memory does not
// depend on k, and a device that refuses it sends the call to the general kernel).
bool multi_token_gguf_applies(int m, int64_t k) { return m >= 2 && m <= 16 && k % 256 == 0; }

bool launch_multi_token_gguf(const GemvArgs &a, fl_status &st) {
    return with_act_type(a, [&](auto t) {
        using T = typename decltype(t)::type;
        if (a.format == Q80) return launch_gguf_format<Q80, T>(a, st);
        if (a.format == Q40) return launch_gguf_format<Q40, T>(a, st);
        return false;
    });
}

// int8 / int4, m = 2..16, k % 256 == 0 (whole superchunks), its shared memory (int4's staged
// scales and zeros grow with k / group) <= kMaxRingSmem.
bool multi_token_int_applies(Fmt f, int m, int64_t n, int64_t k, int group) {
    if (m < 2 || m > 16 || k % 256 != 0) return false;
    switch (f) {
    case I8: return int_applies<I8>(m, n, k, group);
    case I4: return int_applies<I4>(m, n, k, group);
    case I4Z: return int_applies<I4Z>(m, n, k, group);
    default: return false;
    }
}

bool launch_multi_token_int(const GemvArgs &a, fl_status &st) {
    return with_act_type(a, [&](auto t) {
        using T = typename decltype(t)::type;
        switch (a.format) {
        case I8: return launch_int_format<I8, T>(a, st);
        case I4: return launch_int_format<I4, T>(a, st);
        case I4Z: return launch_int_format<I4Z, T>(a, st);
        default: return false;
        }
    });
}

}  // namespace gemv
}  // namespace fl
