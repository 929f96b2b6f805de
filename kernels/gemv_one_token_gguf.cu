// The quantised GEMV at one token (m = 1) for llama.cpp's Q8_0 and Q4_0 blocks (34 and 18
// bytes: an f16 scale d and 32 quants) with k % 256 == 0, on tensor cores. Two kernels share
// one product (gguf_pass):
// - gemv_one_token_gguf_kernel: each warp fills a ring of its own with cp.async;
// - gemv_one_token_gguf_tma_kernel (sm_90+): rings that the TMA engine fills.
// gemv.cu tries the TMA kernel, then the cp.async one, then the CUDA-core kernel (which takes
// every other k). The blocks are only 2-byte aligned, so a lane cannot copy "its" block with
// 16-byte copies; instead the CTA copies runs of whole blocks per row (BPS blocks: a whole
// number of 16-byte words when k % 256 == 0, so that every row starts on a 16-byte boundary).
//
// The product:
// - The weights are the mma's A side (16 rows x 16 k) and x its B side (16 k x 8 columns):
//   lane (g, t) supplies weight rows g and g + 8 of each 16-row tile at the k-slots {2t, 2t+1,
//   2t+8, 2t+9}, all from its own block (4h + t in pass h of the run's BPS / 4); B column c
//   holds x of block slot c alone (lanes with g == t supply it, the others the zero tail), so
//   D column c is block slot c's dot product for each of the 16 rows (columns 4..7 are 0) and
//   gets that block's d, read from the slot, before the slots are summed.
// - Quants are read through aligned 32-bit shared loads and funnel shifts (block b's quants
//   start at 2 mod 4 for even b), dequantised by nib_pairs (Q4_0, zero 8) or byte_pairs
//   (Q8_0), exactly.
// - x is staged once per CTA by cp.async; Q4_0 (value j in the low nibble of byte j, value
//   16 + j in the high one) in the k order of nib_pairs' pairs per quant word c: (4c, 4c+2),
//   (16+4c, 18+4c), (4c+1, 4c+3), (17+4c, 19+4c) (a_frags<Q40>), each thread reordering the
//   blocks it copied; Q8_0 as stored.
#include "gemv_common.cuh"

namespace fl {
namespace gemv {

// CTA shapes of gemv_one_token_gguf_kernel: `tiles` of 8 rows, `warps` (a ring each), a
// `ring` of slots per warp, `blocks` per row per superchunk (8, or 16: whole 32-byte sectors,
// where 8 blocks straddle sectors that the next warp's superchunk shares). Which call takes
// which: gguf_shape below.
struct Blocks8Ring2 {
    static constexpr int tiles = 4, warps = 4, ring = 2, blocks = 8;
};
struct Blocks16Ring2 {
    static constexpr int tiles = 4, warps = 4, ring = 2, blocks = 16;
};
// Every warp copies one superchunk, waits, computes it: twice the warps of Blocks16Ring2 at
// the same shared memory, half the serial work per warp (Q4_0 at k = 4096: 8 superchunks per
// row, one per warp).
struct Blocks16Warps8Slot1 {
    static constexpr int tiles = 4, warps = 8, ring = 1, blocks = 16;
};

namespace {

// Both kernels' x staging: x's xdata uint4s by cp.async (the caller commits and waits), whole
// blocks (4 uint4s) per thread so that q40_x_order can reorder the blocks each thread copied,
// then 64 zero bytes (what the lanes with g != t read).
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

// Shared memory: staged x (k values and 64 zero bytes), the warps' rings, 16 bytes that the
// last block's shared loads may read past its slot.
template <int F, typename C> inline int64_t gguf_smem(int64_t k) {
    return 2 * k + 64 + (int64_t)C::warps * C::ring * gguf_slot_words<F, C::tiles, C::blocks>() * 16 + 16;
}

}  // namespace

// ---------------------------------------------------------------- cp.async rings per warp
// A superchunk is C::blocks blocks of each of the CTA's 8 tiles rows. The warp copies it as
// one contiguous run of words per row (lane l copies words l, l + 32, ... of the slot: fully
// coalesced, with the 128-byte L2 prefetch hint) into a ring of C::ring slots; a __syncwarp
// after cp.async.wait_group makes the other lanes' words visible (and one before each copy
// keeps a slot from being overwritten while a lane still reads it). The warps take
// superchunks w, w + W, ... of the CTA's rows and are summed in warp order (deterministic).
// grid.x = ceil(n / (8 tiles)), block = 32 warps, dynamic shared memory gguf_smem().
template <int F, typename T, typename C>
__global__ void __launch_bounds__(C::warps * 32)
gemv_one_token_gguf_kernel(const T *__restrict__ x, const uint8_t *__restrict__ w, T *__restrict__ y, int64_t n,
                           int64_t k) {
    constexpr int NT = C::tiles, S = C::ring, W = C::warps, BPS = C::blocks;
    constexpr int BB = block_bytes<F>(), RB = gguf_run_bytes<F, BPS>(), RW = RB / 16;
    constexpr int SW = gguf_slot_words<F, NT, BPS>();  // uint4s per slot: row r's at r * RW
    constexpr int CP = (SW + 31) / 32;                 // copies per lane per superchunk
    constexpr int NJ = NT / 2;                         // 16-row tiles
    // (S = 1: a single slot, refilled only after it is consumed.)
    static_assert(S >= 1 && RB % 16 == 0 && NT % 2 == 0, "a ring of superchunks of whole words, 16-row tiles");
    extern __shared__ __align__(16) unsigned char ring_smem[];
    __shared__ float red[W][NT * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nsc = (int)(k / (32 * BPS));      // superchunks per row
    const int64_t rowb = (k >> 5) * BB;         // bytes per row
    const int64_t base = (int64_t)blockIdx.x * (8 * NT);
    const int xdata = (int)(k >> 3);            // uint4s of x
    uint4 *xs = reinterpret_cast<uint4 *>(ring_smem);
    uint4 *ring = xs + xdata + 4 + warp * (S * SW);

    // This lane's copies: word c = lane + 32 e of a slot is word c % RW of row c / RW, at byte
    // src[e] from the CTA's first row (32-bit: 8 NT rows); rows past n copy row n - 1 (valid
    // memory; their outputs are dropped).
    const uint8_t *wcta = w + base * rowb;
    uint32_t src[CP];
#pragma unroll
    for (int e = 0; e < CP; ++e) {
        const int c = lane + 32 * e;
        const int64_t r = c / RW < n - base ? c / RW : n - 1 - base;
        src[e] = (uint32_t)(r * rowb) + 16u * (uint32_t)(c % RW);
    }
    const int mine = nsc > warp ? (nsc - warp + W - 1) / W : 0;  // this warp's superchunks

    // Stage x, one commit group ahead of the ring's.
    gguf_stage_x(xs, x, xdata);
    cp_async_commit();
    auto issue = [&](int i) {
        if (i < mine) {
            const uint8_t *wsc = wcta + (int64_t)(warp + i * W) * RB;
            uint4 *slot = ring + (i % S) * SW + lane;
#pragma unroll
            for (int e = 0; e < CP; ++e)
                if (CP * 32 == SW || lane + 32 * e < SW) cp_async16_pf<128>(slot + 32 * e, wsc + src[e], 16);
        }
        cp_async_commit();  // (an empty group past the warp's share)
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
            __syncwarp();      // every lane is done with slot (i - 1) % S (step i - 1)
            issue(i + S - 1);  // into that slot (S = 1: superchunk i, into the only slot)
        }
        cp_async_wait<S - 1>();  // this lane's words of superchunk i are in ...
        __syncwarp();            // ... and every lane's are visible
        const int sci = warp + i * W;
        const unsigned char *slot = reinterpret_cast<const unsigned char *>(ring + (i % S) * SW);
#pragma unroll
        for (int h = 0; h < BPS / 4; ++h) {
            const int b = 4 * h + t;  // this lane's block
            const uint4 *xv = g == t ? xs + 4 * (BPS * sci + b) : xs + xdata;
            const uint4 xw[4] = {xv[0], xv[1], xv[2], xv[3]};
            const int a = b * BB + 2;  // its quants' first byte in the row
            const unsigned sh = (a & 2) ? 16u : 0u;
#pragma unroll
            for (int j = 0; j < NJ; ++j)  // rows g and g + 8 of tile j
                gguf_pass<F, T, RB>(slot + (16 * j + g) * RB, xw, a, sh, h, c0, c1, zsym, acc[j]);
        }
    }
    cp_async_wait<0>();  // no copy outlives the kernel (the tail's groups are empty)

    // The warps' row sums in order.
    one_token_epilogue<F, T, NJ, NT * 8, W>(acc, red, warp, 0, g, t, nullptr, y, base, n);
}

// ---------------------------------------------------------------- TMA rings
// The product above with rings that the TMA engine fills (sm_90+; the cp.async kernel was
// latency-bound: long-scoreboard stalls, ~2 warps per scheduler):
// - A stage is BPS blocks of each of the CTA's R = 8 NT rows, copied by thread 0 of its ring
//   with one TMA tensor copy (a box of R rows x the row stride: the 16 bytes past a row's run
//   belong to the next stage and are copied too; rows past n and bytes past a row's end read
//   0). The stage's "full" mbarrier counts the bytes (one expect_tx). Rows sit at a stride of
//   an odd number of 16-byte words (the run, + 16 bytes when it is even), which keeps the
//   lanes' 32-bit reads at two-way bank conflicts (a row stride of 0 mod 128 bytes gives
//   eight).
// - One ring per CTA (C::ring_per_warp false): warps split a stage by passes of 4 blocks (lane
//   t takes block 4h + t of pass h, rows g and g + 8 of each 16-row tile); when a stage has
//   fewer passes than warps, WH warps share a pass and take NP / WH of its tiles each. A warp
//   done with a stage arrives on its "empty" mbarrier (one arrival per warp of the ring); the
//   producer waits for it before copying the stage S later into the slot. With
//   ring_per_warp: a ring per warp, which takes stages w, w + W, ... whole.
// - The producers are consumers too: at the start of step i they copy the ring's stage of step
//   i + S - 1 (after every warp of the ring is done with step i - 1), then wait for step i's.
// - x is staged as above (cp.async, Q4_0 reordered) while the first S - 1 stages are in
//   flight; the warps' sums are added in a fixed order (deterministic).
// grid.x = ceil(n / R), block = 32 W, dynamic shared memory gguf_tma_smem().

// CTA shapes of gemv_one_token_gguf_tma_kernel: `tiles` of 8 rows, `blocks` per row per stage,
// a `ring` of stages, `warps`, and one ring per CTA or one per warp. Which call takes which:
// gguf_tma_shape below.
struct Tma32Blocks {
    static constexpr int tiles = 4, blocks = 32, ring = 4, warps = 8;
    static constexpr bool ring_per_warp = false;
};
// At most one CTA per SM: shorter stages pipeline more of a CTA's k.
struct Tma16BlocksRing3 {
    static constexpr int tiles = 4, blocks = 16, ring = 3, warps = 8;
    static constexpr bool ring_per_warp = false;
};
struct Tma8BlocksRingPerWarp {
    static constexpr int tiles = 4, blocks = 8, ring = 2, warps = 8;
    static constexpr bool ring_per_warp = true;
};

namespace {

// A row's run of `run` bytes (a multiple of 16) padded to an odd number of 16-byte words.
__host__ __device__ constexpr int odd_words(int run) { return (run / 16) % 2 ? run : run + 16; }
template <int F, int BPS> __host__ __device__ constexpr int gguf_tma_row_stride() {
    return odd_words(gguf_run_bytes<F, BPS>());
}
// Bytes of a stage of nt tiles (8 nt rows) of bps blocks of bb bytes.
__host__ __device__ constexpr int gguf_tma_stage_bytes(int bb, int nt, int bps) { return nt * 8 * odd_words(bps * bb); }

// Shared memory: staged x (k values and 64 zero bytes), 2 ring mbarriers per ring, the rings
// (128-byte aligned: up to 112 bytes of padding), 16 bytes that the last block's shared loads
// may read past them.
template <int F, typename C> inline int64_t gguf_tma_smem(int64_t k) {
    constexpr int nr = C::ring_per_warp ? C::warps : 1;
    constexpr int stage = gguf_tma_stage_bytes(block_bytes<F>(), C::tiles, C::blocks);
    return 2 * k + 64 + 16 * C::ring * nr + 128 + (int64_t)nr * C::ring * stage + 16;
}

}  // namespace

template <int F, typename T, typename C>
__global__ void __launch_bounds__(C::warps * 32)
gemv_one_token_gguf_tma_kernel(const T *__restrict__ x, T *__restrict__ y, int64_t n, int64_t k,
                               const __grid_constant__ CUtensorMap wmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int NT = C::tiles, BPS = C::blocks, S = C::ring, W = C::warps;
    constexpr bool WR = C::ring_per_warp;
    constexpr int BB = block_bytes<F>(), RS = gguf_tma_row_stride<F, BPS>(), R = 8 * NT;
    constexpr int SB = gguf_tma_stage_bytes(BB, NT, BPS);
    constexpr int NP = NT / 2;              // 16-row tiles
    constexpr int PS = BPS / 4;             // passes of a whole stage
    constexpr int NR = WR ? W : 1;          // rings
    constexpr int WPR = W / NR;             // warps per ring
    constexpr int WH = WPR > PS ? WPR / PS : 1;  // warps per pass
    constexpr int WG = WPR / WH;            // pass groups
    constexpr int NJ = NP / WH;             // tiles per warp
    constexpr int HP = (PS + WG - 1) / WG;  // passes per warp per stage (at most)
    static_assert(S >= 2 && BPS % 8 == 0 && NT % 2 == 0 && WPR % WH == 0 && NP % WH == 0,
                  "a ring of at least two stages of whole words, 16-row tiles split evenly");
    static_assert(RS / 8 <= 256 && R <= 256, "a TMA box has at most 256 elements (8 bytes) per dimension");
    extern __shared__ __align__(16) unsigned char ring_smem[];
    __shared__ float red[NR * WG][NT * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int rg = warp / WPR, lt = threadIdx.x % (32 * WPR);  // ring, thread in the ring
    const int pg = (warp % WPR) / WH, hw = (warp % WPR) % WH;  // pass group, tile share
    const int nb = (int)(k >> 5);               // blocks per row
    const int nst = (nb + BPS - 1) / BPS;       // stages
    const int64_t base = (int64_t)blockIdx.x * R;
    const int xdata = (int)(k >> 3);            // uint4s of x
    uint4 *xs = reinterpret_cast<uint4 *>(ring_smem);
    const uint32_t bars = static_cast<uint32_t>(__cvta_generic_to_shared(xs + xdata + 4));
    const uint32_t ring_s = ((bars + 16 * S * NR + 127) & ~127u) + (uint32_t)(rg * S * SB);  // this ring's
    const unsigned char *ring = ring_smem + (ring_s - static_cast<uint32_t>(__cvta_generic_to_shared(ring_smem)));
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

    // The ring's stages: rg, rg + NR, ... (step i: stage rg + i NR). The producer warps (those
    // of the ring whose first thread is below R: the first warp, with 32 rows) wait for the
    // slot; their thread lt = 0 issues the copy.
    const int mine = nst > rg ? (nst - rg + NR - 1) / NR : 0;
    const bool producer = (warp % WPR) * 32 < R;
    auto issue = [&](int i) {  // producer warps only
        if (i >= mine) return;
        const int s = i % S, st = rg + i * NR;
        if (i >= S) mbar_wait(empty(s), ((i / S) + 1) & 1);  // step i - S released
        if (lt == 0) {
            mbar_expect_tx(full(s), SB);
            tma_load_2d(ring_s + (uint32_t)(s * SB), &wmap, full(s), st * (BPS * BB / 8), (int)base);
        }
    };
    if (producer)
        for (int i = 0; i < S - 1; ++i) issue(i);

    // Stage x while they are in flight.
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
    one_token_epilogue<F, T, NJ, R, NR * WG>(acc, red, rg * WG + pg, hw * NJ, g, t, nullptr, y, base, n);
#endif
}

namespace {

// The CTA shape of gemv_one_token_gguf_kernel a call takes: f(Type<shape>{}). Superchunks of
// 16 blocks need k % 512 == 0 and pay off only on grids of several CTAs per SM (n >= 64 x SMs
// for Q4_0, 128 x SMs for Q8_0), and only where their larger ring fits.
template <int F, typename Fn> decltype(auto) gguf_shape(int64_t n, int64_t k, Fn &&f) {
    if (k % 512 == 0 && n >= (F == Q40 ? 64 : 128) * (int64_t)sm_count() &&
        gguf_smem<F, Blocks16Ring2>(k) <= kMaxRingSmem) {
        if constexpr (F == Q40)
            if (k == 16 * 32 * 8) return f(Type<Blocks16Warps8Slot1>{});
        return f(Type<Blocks16Ring2>{});
    }
    return f(Type<Blocks8Ring2>{});
}

// The shape of gemv_one_token_gguf_tma_kernel a call takes, f(Type<shape>{}), or false when
// it takes the cp.async kernel (Q4_0 with k < 8192 on grids of more than one CTA per SM: there
// a CTA's stages are the whole ring and land together, so its compute overlaps no copy of its
// own, and Q4_0's compute weighs twice Q8_0's per byte).
template <int F, typename Fn> bool gguf_tma_shape(int64_t n, int64_t k, Fn &&f) {
    const bool one_wave = ceil_div(n, 32) <= (int64_t)sm_count();  // at most one CTA per SM
    if constexpr (F == Q80) {
        if (one_wave) return f(Type<Tma16BlocksRing3>{});
        return f(Type<Tma32Blocks>{});
    } else {
        if (k >= 8192) return f(Type<Tma32Blocks>{});
        if (one_wave) return f(Type<Tma8BlocksRingPerWarp>{});
        return false;
    }
}

template <int F, typename T, typename C> bool launch_gguf_shape(const GemvArgs &a, fl_status &st) {
    const auto kernel = gemv_one_token_gguf_kernel<F, T, C>;
    return launch_ring(kernel, gguf_smem<F, C>(a.k), a.n, 8 * C::tiles, 32 * C::warps, a.stream, st,
                       static_cast<const T *>(a.x), static_cast<const uint8_t *>(a.w), static_cast<T *>(a.y), a.n,
                       a.k);
}

template <int F, typename T, typename C> bool launch_gguf_tma_shape(const GemvArgs &a, fl_status &st) {
    const auto kernel = gemv_one_token_gguf_tma_kernel<F, T, C>;
    CUtensorMap map;
    std::memset(&map, 0, sizeof(map));
    // (The box: the stage's run and, when the row stride is longer, the next 16 bytes.)
    if (!rows_map(&map, static_cast<const uint8_t *>(a.w), a.n, (a.k / 32) * block_bytes<F>(),
                  gguf_tma_row_stride<F, C::blocks>(), 8 * C::tiles))
        return false;
    return launch_ring(kernel, gguf_tma_smem<F, C>(a.k), a.n, 8 * C::tiles, 32 * C::warps, a.stream, st,
                       static_cast<const T *>(a.x), static_cast<T *>(a.y), a.n, a.k, map);
}

template <int F> bool gguf_applies(int64_t n, int64_t k) {
    return gguf_shape<F>(n, k, [&](auto c) { return gguf_smem<F, typename decltype(c)::type>(k) <= kMaxRingSmem; });
}

template <int F> bool gguf_tma_applies(int64_t n, int64_t k) {
    return gguf_tma_shape<F>(n, k, [&](auto c) {
        if (cc_major() < 9 || gguf_tma_smem<F, typename decltype(c)::type>(k) > kMaxRingSmem) return false;
        return n < 0x7fffffffLL && encode_fn() != nullptr;
    });
}

}  // namespace

// m = 1, Q8_0 / Q4_0, k % 256 == 0 (rows on 16-byte boundaries), its shared memory <=
// kMaxRingSmem (k up to ~63k values for Q4_0, ~47k for Q8_0 with 8 blocks; 16 blocks fit up to
// ~44k / ~12k, past that the call takes 8).
bool one_token_gguf_applies(Fmt f, int m, int64_t n, int64_t k) {
    if (m != 1 || k % 256 != 0) return false;
    if (f == Q80) return gguf_applies<Q80>(n, k);
    if (f == Q40) return gguf_applies<Q40>(n, k);
    return false;
}

bool launch_one_token_gguf(const GemvArgs &a, fl_status &st) {
    return with_act_type(a, [&](auto t) {
        using T = typename decltype(t)::type;
        if (a.format == Q80)
            return gguf_shape<Q80>(a.n, a.k, [&](auto c) {
                return launch_gguf_shape<Q80, T, typename decltype(c)::type>(a, st);
            });
        if (a.format == Q40)
            return gguf_shape<Q40>(a.n, a.k, [&](auto c) {
                return launch_gguf_shape<Q40, T, typename decltype(c)::type>(a, st);
            });
        return false;
    });
}

// m = 1, Q8_0 / Q4_0, k % 256 == 0, a shape for the format and k, an sm_90+ device, its shared
// memory <= kMaxRingSmem (Tma32Blocks: k up to ~11.1k values for Q8_0, ~43k for Q4_0; past that
// the call takes the cp.async kernel), n < 2^31 and the driver's tensor-map encoder.
bool one_token_gguf_tma_applies(Fmt f, int m, int64_t n, int64_t k) {
    if (m != 1 || k % 256 != 0) return false;
    if (f == Q80) return gguf_tma_applies<Q80>(n, k);
    if (f == Q40) return gguf_tma_applies<Q40>(n, k);
    return false;
}

bool launch_one_token_gguf_tma(const GemvArgs &a, fl_status &st) {
    return with_act_type(a, [&](auto t) {
        using T = typename decltype(t)::type;
        if (a.format == Q80)
            return gguf_tma_shape<Q80>(a.n, a.k, [&](auto c) {
                return launch_gguf_tma_shape<Q80, T, typename decltype(c)::type>(a, st);
            });
        if (a.format == Q40)
            return gguf_tma_shape<Q40>(a.n, a.k, [&](auto c) {
                return launch_gguf_tma_shape<Q40, T, typename decltype(c)::type>(a, st);
            });
        return false;
    });
}

}  // namespace gemv
}  // namespace fl
