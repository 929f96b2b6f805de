// Prefill attention over packed, padding-free sequences (FlashAttention-2 style): causal,
// or non-causal (every key of the query's own sequence: encoders, issue 35).
//
// One CTA owns Br = 16 * NW query rows of one (sequence, q head); each of its NW warps owns
// 16 of those rows. The CTA walks the key tiles of Bc keys that the causal (and window)
// limit allows, from the diagonal tile down, streaming K and V through shared memory with
// cp.async (two stages). S = Q K^T and O += P V run on the tensor cores with
// mma.sync.m16n8k16 (f16/bf16 in, f32 accumulate), operands loaded with ldmatrix (.trans
// for V). The softmax is online, in registers, in base 2 (scale * log2(e) folded into one
// FFMA per score). P is converted to 16-bit in registers and fed back as the A operand of
// the PV product (the S accumulator layout is the A fragment layout). Tiles that cross the
// causal diagonal or the window edge are masked, the others are not. No [L, L] matrix, no
// workspace. Rows of shared memory are padded by 16 bytes, so that the 8 rows an ldmatrix
// phase reads fall into distinct banks for every head size used here. f32 inputs run a
// CUDA-core version of the same loop (prefill_f32_kernel, below the 16-bit one).
//
// Both kernels are templated on PAGED: new query tokens at positions ctx - q_len .. ctx - 1
// over K/V read from a paged cache through a block table (fl_attention_prefill_paged), the
// same loop with key tiles gathered row by row (cp.async per 16-byte chunk, one table lookup
// per key) and the causal / window masks shifted by the query's position; and on CAUSAL (a
// compile-time flag, so the causal instantiations are the code they were before the
// non-causal ones were added): false walks every key tile of the sequence and masks only the
// last one's keys past the sequence end. Non-causal is instantiated for the packed path only,
// at head sizes 32, 64 and 128, without a window.
#include "common/common.cuh"

namespace fl {
namespace prefill {

constexpr float kLog2e = 1.4426950408889634f;

struct Params {
    const void *q, *k, *v;
    void *out;
    const int32_t *cu_seqlens;
    int32_t batch, q_heads, kv_heads, total_tokens, window;
    float scale_log2;  // softmax scale * log2(e)
    // Paged kernels only: k, v are the cache; key j of sequence b is slot j % block_size of
    // block block_table[b * max_blocks + j / block_size] (block b when block_table is null:
    // a contiguous cache, block_size = its capacity, max_blocks = 1).
    const int32_t *ctx_lens, *block_table;
    int32_t block_size, max_blocks, num_blocks;
};

// ---------------------------------------------------------------- PTX wrappers
__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; `bytes` = 0 writes zeros (reads nothing).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// c += a * b, m16n8k16, row.col, f32 accumulate.
template <typename T> struct Mma;
template <> struct Mma<__half> {
    __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};
template <> struct Mma<__nv_bfloat16> {
    __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};

// ---------------------------------------------------------------- tile configuration
// NW warps of MT m16 tiles each (Br = 16 * MT * NW query rows), Bc keys per tile. QREG: Q
// held in registers for the whole loop (MT == 1 only), else re-read from shared memory with
// ldmatrix at every key tile (lighter on registers, which lets a warp own 32 rows and so
// halve the K/V shared-memory reads per FLOP). MINB: CTAs per SM asked of the compiler.
template <int D> struct Cfg;
template <> struct Cfg<32> { static constexpr int NW = 4, MT = 2, BC = 64, MINB = 1; static constexpr bool QREG = false; };
template <> struct Cfg<64> { static constexpr int NW = 4, MT = 2, BC = 64, MINB = 1; static constexpr bool QREG = false; };
template <> struct Cfg<80> { static constexpr int NW = 4, MT = 1, BC = 64, MINB = 1; static constexpr bool QREG = true; };
template <> struct Cfg<96> { static constexpr int NW = 4, MT = 1, BC = 64, MINB = 1; static constexpr bool QREG = true; };
template <> struct Cfg<128> { static constexpr int NW = 4, MT = 2, BC = 64, MINB = 1; static constexpr bool QREG = false; };
template <> struct Cfg<256> { static constexpr int NW = 2, MT = 1, BC = 32, MINB = 1; static constexpr bool QREG = false; };

template <int D, int NW, int MT, int BC, bool QREG> struct Tile {
    static constexpr int BR = 16 * MT * NW;
    static constexpr int THREADS = 32 * NW;
    static constexpr int LD = D + 8;  // padded row (elements)
    static constexpr int KV_ELEMS = BC * LD;
    // [K0][V0][K1][V1] then Q when it is not aliased to stage 1.
    static constexpr int Q_OFF = QREG ? 2 * KV_ELEMS : 4 * KV_ELEMS;
    static constexpr int SMEM_ELEMS = QREG ? 4 * KV_ELEMS : 4 * KV_ELEMS + BR * LD;
    static constexpr size_t SMEM_BYTES = (size_t)SMEM_ELEMS * 2;
    static_assert(D % 16 == 0 && (D / 8) % 2 == 0, "head_dim must be a multiple of 16");
    static_assert(BC % 16 == 0, "key tile must be a multiple of 16");
    static_assert(!QREG || (MT == 1 && BR <= 2 * BC), "Q in registers: one m tile, aliased");
};

// Copies `ROWS` rows (of D elements) starting at row `row0` into a padded shared tile,
// zero-filling rows at or past `row_end`. Row stride in global memory: `gstride` elements.
template <typename T, int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(uint32_t sdst, const T *gbase, int64_t gstride,
                                          int row0, int row_end) {
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    constexpr int LD = D + 8;
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * CPR; i += THREADS) {
        const int r = i / CPR, c = i % CPR;
        const int row = row0 + r;
        const bool ok = row < row_end;
        const T *src = ok ? gbase + (int64_t)row * gstride + c * 8 : gbase;
        cp_async16(sdst + (uint32_t)((r * LD + c * 8) * 2), src, ok ? 16 : 0);
    }
}

// The sequence a CTA works on: query rows [start, start + len) of the packed q / out, at
// positions q_off .. q_off + len - 1, over keys 0 .. kv_len - 1. Packed K/V: the sequence's own
// tokens (q_off = 0, kv_len = len). Paged: kv_len = ctx_lens[b] clamped to the table's
// capacity and q_off = kv_len - len, negative only for a ctx_len below q_len (rows before
// position 0 see no key and get zeros).
template <bool PAGED>
__device__ __forceinline__ void seq_bounds(const Params &p, int b, int &start, int &len,
                                           int &q_off, int &kv_len) {
    packed_seq(p.cu_seqlens, b, p.total_tokens, start, len);
    if constexpr (PAGED) {
        const int cap = p.max_blocks * p.block_size;  // <= INT32_MAX, checked on the host
        kv_len = min(max(p.ctx_lens[b], 0), cap);
        q_off = kv_len - len;
    } else {
        kv_len = len;
        q_off = 0;
    }
}

// Copies the K and V rows of keys kv0 .. kv0 + ROWS - 1 (kv head kvh, sequence b) from the
// paged cache into padded shared tiles of row stride LD elements, zero-filling keys outside
// [0, kv_len) and keys whose block id is outside [0, num_blocks): nothing out of bounds is
// read, whatever the table holds.
template <typename T, int D, int LD, int ROWS, int THREADS>
__device__ __forceinline__ void load_kv_paged(uint32_t sk, uint32_t sv, const Params &p, int b,
                                              int kvh, int kv0, int kv_len) {
    constexpr int CH = 16 / (int)sizeof(T);  // elements per 16-byte chunk
    constexpr int CPR = D / CH;              // chunks per row
    const T *kc = static_cast<const T *>(p.k);
    const T *vc = static_cast<const T *>(p.v);
    const int32_t *tbl = p.block_table + (int64_t)b * p.max_blocks;
    auto row_of = [&](int key) -> int64_t {  // element offset of the key's row, or -1
        if (key < 0 || key >= kv_len) return -1;
        const int blk = p.block_table ? __ldg(tbl + key / p.block_size) : b;
        if (blk < 0 || blk >= p.num_blocks) return -1;
        return (((int64_t)blk * p.kv_heads + kvh) * p.block_size + key % p.block_size) * D;
    };
    auto copy = [&](int r, int c, int64_t row) {
        const bool ok = row >= 0;
        const uint32_t off = (uint32_t)((r * LD + c * CH) * (int)sizeof(T));
        cp_async16(sk + off, ok ? kc + row + c * CH : kc, ok ? 16 : 0);
        cp_async16(sv + off, ok ? vc + row + c * CH : vc, ok ? 16 : 0);
    };
    if constexpr (THREADS % CPR == 0) {  // a thread keeps one chunk column: one lookup per row
        const int c = threadIdx.x % CPR;
#pragma unroll
        for (int r = threadIdx.x / CPR; r < ROWS; r += THREADS / CPR) copy(r, c, row_of(kv0 + r));
    } else {
#pragma unroll
        for (int i = threadIdx.x; i < ROWS * CPR; i += THREADS)
            copy(i / CPR, i % CPR, row_of(kv0 + i / CPR));
    }
}

template <typename T, int D, int NW, int MT, int BC, bool QREG, int MINB, bool PAGED, bool CAUSAL>
__global__ void __launch_bounds__(32 * NW, MINB) prefill_kernel(Params p) {
    static_assert(CAUSAL || !PAGED, "the paged prefill is causal");
    using TL = Tile<D, NW, MT, BC, QREG>;
    constexpr int BR = TL::BR, LD = TL::LD, THREADS = TL::THREADS;
    constexpr int NT = BC / 8;   // 8-key column tiles of S
    constexpr int KD = D / 16;   // k-steps of QK^T
    constexpr int DT = D / 8;    // 8-wide column tiles of O
    constexpr int KB = BC / 16;  // k-steps of PV

    extern __shared__ __align__(16) unsigned char smem_raw[];

    const int h = blockIdx.x;
    const int b = blockIdx.y;
    const int m_block = gridDim.z - 1 - blockIdx.z;  // heavy (late) query tiles first
    const int group = p.q_heads / p.kv_heads;
    const int kvh = h / group;

    // Sequence bounds, clamped to the packed tensor whatever cu_seqlens holds.
    int start, len, q_off, kv_len;
    seq_bounds<PAGED>(p, b, start, len, q_off, kv_len);
    const int q_start = m_block * BR;
    if (q_start >= len) return;
    const int q_last = min(q_start + BR, len) - 1;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;

    const int64_t q_stride = (int64_t)p.q_heads * D;
    const int64_t kv_stride = (int64_t)p.kv_heads * D;
    const T *qg = static_cast<const T *>(p.q) + (int64_t)start * q_stride + (int64_t)h * D;
    const T *kg = static_cast<const T *>(p.k) + (int64_t)start * kv_stride + (int64_t)kvh * D;
    const T *vg = static_cast<const T *>(p.v) + (int64_t)start * kv_stride + (int64_t)kvh * D;

    // Key tiles [n_lo, n_hi): keys 0..q_off + q_last (causal), >= q_off + q_start - window + 1
    // (window). Paged: no tile when every row is before position 0 (bad ctx_len). Non-causal:
    // every key of the sequence.
    const int last_pos = q_off + q_last;
    const int n_hi = !CAUSAL ? (kv_len + BC - 1) / BC
                     : PAGED ? (last_pos < 0 ? 0 : last_pos / BC + 1) : (q_last + BC) / BC;
    int n_lo = 0;
    if (CAUSAL && p.window > 0) n_lo = max(0, q_off + q_start - p.window + 1) / BC;

    const uint32_t s_base = smem_addr(smem_raw);
    auto k_stage = [&](int s) { return s_base + (uint32_t)(2 * s * TL::KV_ELEMS * 2); };
    auto v_stage = [&](int s) { return s_base + (uint32_t)((2 * s + 1) * TL::KV_ELEMS * 2); };
    const uint32_t s_q = s_base + (uint32_t)(TL::Q_OFF * 2);

    // Q tile and the first K/V tile.
    load_tile<T, D, BR, THREADS>(s_q, qg, q_stride, q_start, len);
    if constexpr (PAGED) {
        if (n_hi > n_lo)
            load_kv_paged<T, D, LD, BC, THREADS>(k_stage(0), v_stage(0), p, b, kvh,
                                                 (n_hi - 1) * BC, kv_len);
    } else {
        load_tile<T, D, BC, THREADS>(k_stage(0), kg, kv_stride, (n_hi - 1) * BC, len);
        load_tile<T, D, BC, THREADS>(v_stage(0), vg, kv_stride, (n_hi - 1) * BC, len);
    }
    cp_async_commit();

    // ldmatrix lane roles. A (Q): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7),
    // (rows 0-7, k 8-15), (rows 8-15, k 8-15). B (K, non-trans): (keys 0-7, k 0-7),
    // (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15). B (V, trans):
    // (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15).
    const int mat = lane >> 3, mr = lane & 7;
    const uint32_t q_lane =
        s_q + (uint32_t)(((warp * 16 * MT + (mat & 1) * 8 + mr) * LD + (mat >> 1) * 8) * 2);
    const uint32_t k_lane = (uint32_t)((((mat >> 1) * 8 + mr) * LD + (mat & 1) * 8) * 2);
    const uint32_t v_lane = (uint32_t)((((mat & 1) * 8 + mr) * LD + (mat >> 1) * 8) * 2);

    uint32_t qf[QREG ? KD : 1][4];
    if constexpr (QREG) {
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) ldsm_x4(qf[kk], q_lane + kk * 32);
        __syncthreads();  // Q's buffer is stage 1: the loop below overwrites it
    }

    float o[MT][DT][4];
    float m[MT][2], l[MT][2];
    // This thread's query rows (within the sequence): row_base + 16 * i + 8 * half.
    const int row_base = q_start + warp * 16 * MT + g;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int j = 0; j < DT; ++j) o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.f;
        m[i][0] = m[i][1] = -INFINITY;
        l[i][0] = l[i][1] = 0.f;
    }
    const float sl2 = p.scale_log2;

    int stage = 0;
    for (int n = n_hi - 1; n >= n_lo; --n) {
        const int kv0 = n * BC;
        if (n > n_lo) {  // prefetch the next (lower) tile into the other stage
            if constexpr (PAGED) {
                load_kv_paged<T, D, LD, BC, THREADS>(k_stage(stage ^ 1), v_stage(stage ^ 1), p,
                                                     b, kvh, kv0 - BC, kv_len);
            } else {
                load_tile<T, D, BC, THREADS>(k_stage(stage ^ 1), kg, kv_stride, kv0 - BC, len);
                load_tile<T, D, BC, THREADS>(v_stage(stage ^ 1), vg, kv_stride, kv0 - BC, len);
            }
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        // S = Q K^T (raw dot products, f32).
        float s[MT][NT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) s[i][j][0] = s[i][j][1] = s[i][j][2] = s[i][j][3] = 0.f;
        const uint32_t kb = k_stage(stage) + k_lane;
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) {
            uint32_t a[MT][4];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                if constexpr (QREG) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[i][e] = qf[kk][e];
                } else {
                    ldsm_x4(a[i], q_lane + (uint32_t)((i * 16 * LD + kk * 16) * 2));
                }
            }
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                uint32_t bk[4];
                ldsm_x4(bk, kb + (uint32_t)((j * 8 * LD + kk * 16) * 2));
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    Mma<T>::run(s[i][j], a[i], bk[0], bk[1]);
                    Mma<T>::run(s[i][j + 1], a[i], bk[2], bk[3]);
                }
            }
        }

        // Mask the tiles that cross the diagonal, the end of the sequence or the window edge
        // (non-causal: the end of the sequence).
        const bool masked = CAUSAL ? kv0 + BC - 1 > q_off + q_start ||
                                         (p.window > 0 && kv0 <= q_off + q_last - p.window)
                                   : kv0 + BC > kv_len;
        if (masked) {
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = kv0 + j * 8 + 2 * t + (e & 1);
                        const int pos = q_off + row_base + i * 16 + (e >> 1) * 8;
                        const bool ok = CAUSAL ? key <= pos && key < kv_len &&
                                                     (p.window <= 0 || key > pos - p.window)
                                               : key < kv_len;
                        if (!ok) s[i][j][e] = -INFINITY;
                    }
        }

        // Online softmax (base 2). Row max over the 4 lanes of a quad.
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                mx0 = fmaxf(mx0, fmaxf(s[i][j][0], s[i][j][1]));
                mx1 = fmaxf(mx1, fmaxf(s[i][j][2], s[i][j][3]));
            }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            // scale > 0, so max(raw) * scale_log2 is the max of the scaled scores.
            const float mn0 = fmaxf(m[i][0], mx0 * sl2), mn1 = fmaxf(m[i][1], mx1 * sl2);
            const float mu0 = mn0 == -INFINITY ? 0.f : mn0;  // fully masked so far: no NaN
            const float mu1 = mn1 == -INFINITY ? 0.f : mn1;
            const float c0 = exp2f(m[i][0] - mu0), c1 = exp2f(m[i][1] - mu1);
            m[i][0] = mn0;
            m[i][1] = mn1;
            float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                s[i][j][0] = exp2f(fmaf(s[i][j][0], sl2, -mu0));
                s[i][j][1] = exp2f(fmaf(s[i][j][1], sl2, -mu0));
                s[i][j][2] = exp2f(fmaf(s[i][j][2], sl2, -mu1));
                s[i][j][3] = exp2f(fmaf(s[i][j][3], sl2, -mu1));
                rs0 += s[i][j][0] + s[i][j][1];
                rs1 += s[i][j][2] + s[i][j][3];
            }
            // per-lane partial sums; the quad is summed at the end
            l[i][0] = fmaf(l[i][0], c0, rs0);
            l[i][1] = fmaf(l[i][1], c1, rs1);
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                o[i][j][0] *= c0;
                o[i][j][1] *= c0;
                o[i][j][2] *= c1;
                o[i][j][3] *= c1;
            }
        }

        // O += P V, P from registers (S accumulator layout == A fragment layout).
        const uint32_t vb = v_stage(stage) + v_lane;
#pragma unroll
        for (int kk = 0; kk < KB; ++kk) {
            uint32_t a[MT][4];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                a[i][0] = Mma<T>::pack(s[i][2 * kk][0], s[i][2 * kk][1]);
                a[i][1] = Mma<T>::pack(s[i][2 * kk][2], s[i][2 * kk][3]);
                a[i][2] = Mma<T>::pack(s[i][2 * kk + 1][0], s[i][2 * kk + 1][1]);
                a[i][3] = Mma<T>::pack(s[i][2 * kk + 1][2], s[i][2 * kk + 1][3]);
            }
#pragma unroll
            for (int j = 0; j < DT; j += 2) {
                uint32_t bv[4];
                ldsm_x4_t(bv, vb + (uint32_t)((kk * 16 * LD + j * 8) * 2));
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    Mma<T>::run(o[i][j], a[i], bv[0], bv[1]);
                    Mma<T>::run(o[i][j + 1], a[i], bv[2], bv[3]);
                }
            }
        }
        __syncthreads();  // this stage is refilled by the next iteration's prefetch
        stage ^= 1;
    }

    if constexpr (PAGED) cp_async_wait<0>();  // no key tile ran (ctx_len < q_len): Q's copy
    // Normalise and store (rows past the sequence end are not written).
    T *og = static_cast<T *>(p.out) + (int64_t)start * q_stride + (int64_t)h * D + 2 * t;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float li = l[i][hf];
            li += __shfl_xor_sync(0xffffffffu, li, 1);
            li += __shfl_xor_sync(0xffffffffu, li, 2);
            const float inv = li > 0.f ? 1.f / li : 0.f;
            const int r = row_base + i * 16 + hf * 8;
            if (r < len) {
                T *orow = og + (int64_t)r * q_stride;
#pragma unroll
                for (int j = 0; j < DT; ++j)
                    *reinterpret_cast<uint32_t *>(orow + j * 8) =
                        Mma<T>::pack(o[i][j][2 * hf] * inv, o[i][j][2 * hf + 1] * inv);
            }
        }
}

// ---------------------------------------------------------------- f32 path (CUDA cores)
// The tensor cores take 16-bit inputs only (TF32 would round the inputs to 10 bits of
// mantissa), so f32 runs the same FlashAttention-2 loop on CUDA cores, all in f32: one CTA
// of 128 threads owns BR = 32 query rows of one (sequence, q head) and walks the key tiles of
// BC keys from the diagonal down, K and V streamed through shared memory with cp.async (two
// stages), Q staged once. Thread (ty, tx) = (tid / 8, tid % 8) owns query rows ty and ty + 16:
//   S = Q K^T: keys tx + 8 n of the tile (float4 reads of Q and K rows along head_dim);
//   softmax:   online, base 2, row max and sum over the 8 lanes of the row (shuffles);
//   O += P V:  float4 columns tx + 8 k of O; P[row][j] is broadcast from the lane that
//              computed it (a shuffle within the 8 lanes), V row j read from shared memory.
// Rows are padded by 4 floats, so the 8 K rows (or 4 Q rows) a warp reads at one head_dim
// offset fall into distinct 16-byte bank groups. No [L, L] matrix, no workspace.
// Shared memory: (BR + 4 BC) x (D + 4) x 4 bytes: 44 KB (D = 64) to 100 KB (D = 256, BC = 16).
constexpr int kF32Threads = 128;

template <int D> struct CfgF32 { static constexpr int BC = D >= 256 ? 16 : 32; };

template <int D, int BC> struct TileF32 {
    static constexpr int BR = 32;
    static constexpr int LD = D + 4;                 // padded row (floats)
    static constexpr int RM = BR / 16;               // query rows per thread
    static constexpr int KN = BC / 8;                // keys per thread in S
    static constexpr int C4 = D / 4;                 // float4 columns of a row
    static constexpr int DC = (C4 + 7) / 8;          // float4 columns of O per thread
    static constexpr int KV_OFF = BR * LD;           // floats: Q, then [K0][V0][K1][V1]
    static constexpr int SMEM_FLOATS = BR * LD + 4 * BC * LD;
    static constexpr size_t SMEM_BYTES = (size_t)SMEM_FLOATS * 4;
    static_assert(D % 16 == 0 && BC % 8 == 0 && BR % 16 == 0, "tile shape");
    static_assert(kF32Threads == 16 * 8, "16 row groups x 8 lanes");
};

// Copies ROWS rows of D floats starting at row `row0` into a padded shared tile (row stride
// D + 4), zero-filling rows at or past `row_end`. Row stride in global memory: `gstride`.
template <int D, int ROWS>
__device__ __forceinline__ void load_tile_f32(uint32_t sdst, const float *gbase, int64_t gstride,
                                              int row0, int row_end) {
    constexpr int CPR = D / 4;  // 16-byte chunks per row
    constexpr int LD = D + 4;
#pragma unroll 4
    for (int i = threadIdx.x; i < ROWS * CPR; i += kF32Threads) {
        const int r = i / CPR, c = i % CPR;
        const int row = row0 + r;
        const bool ok = row < row_end;
        const float *src = ok ? gbase + (int64_t)row * gstride + c * 4 : gbase;
        cp_async16(sdst + (uint32_t)((r * LD + c * 4) * 4), src, ok ? 16 : 0);
    }
}

__device__ __forceinline__ void fma4(float4 &o, float p, const float4 &v) {
    o.x = fmaf(p, v.x, o.x);
    o.y = fmaf(p, v.y, o.y);
    o.z = fmaf(p, v.z, o.z);
    o.w = fmaf(p, v.w, o.w);
}

template <int D, int BC, bool PAGED, bool CAUSAL>
__global__ void __launch_bounds__(kF32Threads) prefill_f32_kernel(Params p) {
    static_assert(CAUSAL || !PAGED, "the paged prefill is causal");
    using TL = TileF32<D, BC>;
    constexpr int BR = TL::BR, LD = TL::LD, RM = TL::RM, KN = TL::KN, C4 = TL::C4,
                  DC = TL::DC;
    constexpr int LD4 = LD / 4;  // row stride in float4

    extern __shared__ __align__(16) unsigned char smem_raw[];
    const float4 *sm4 = reinterpret_cast<const float4 *>(smem_raw);

    const int h = blockIdx.x;
    const int b = blockIdx.y;
    const int m_block = gridDim.z - 1 - blockIdx.z;  // heavy (late) query tiles first
    const int group = p.q_heads / p.kv_heads;
    const int kvh = h / group;

    // Sequence bounds, clamped to the packed tensor whatever cu_seqlens holds.
    int start, len, q_off, kv_len;
    seq_bounds<PAGED>(p, b, start, len, q_off, kv_len);
    const int q_start = m_block * BR;
    if (q_start >= len) return;
    const int q_last = min(q_start + BR, len) - 1;

    const int tid = threadIdx.x, lane = tid & 31;
    const int ty = tid >> 3, tx = tid & 7;
    const int row_lane0 = lane & ~7;  // first lane of this row group in the warp

    const int64_t q_stride = (int64_t)p.q_heads * D;
    const int64_t kv_stride = (int64_t)p.kv_heads * D;
    const float *qg = static_cast<const float *>(p.q) + (int64_t)start * q_stride + (int64_t)h * D;
    const float *kg =
        static_cast<const float *>(p.k) + (int64_t)start * kv_stride + (int64_t)kvh * D;
    const float *vg =
        static_cast<const float *>(p.v) + (int64_t)start * kv_stride + (int64_t)kvh * D;

    // Key tiles [n_lo, n_hi): keys 0..q_off + q_last (causal), >= q_off + q_start - window + 1
    // (window). Paged: no tile when every row is before position 0 (bad ctx_len). Non-causal:
    // every key of the sequence.
    const int last_pos = q_off + q_last;
    const int n_hi = !CAUSAL ? (kv_len + BC - 1) / BC
                     : PAGED ? (last_pos < 0 ? 0 : last_pos / BC + 1) : (q_last + BC) / BC;
    int n_lo = 0;
    if (CAUSAL && p.window > 0) n_lo = max(0, q_off + q_start - p.window + 1) / BC;

    const uint32_t s_base = smem_addr(smem_raw);
    auto k_off = [&](int s) { return TL::KV_OFF + 2 * s * BC * LD; };  // floats
    auto v_off = [&](int s) { return TL::KV_OFF + (2 * s + 1) * BC * LD; };

    load_tile_f32<D, BR>(s_base, qg, q_stride, q_start, len);
    if constexpr (PAGED) {
        if (n_hi > n_lo)
            load_kv_paged<float, D, LD, BC, kF32Threads>(s_base + (uint32_t)(k_off(0) * 4),
                                                         s_base + (uint32_t)(v_off(0) * 4), p,
                                                         b, kvh, (n_hi - 1) * BC, kv_len);
    } else {
        load_tile_f32<D, BC>(s_base + (uint32_t)(k_off(0) * 4), kg, kv_stride, (n_hi - 1) * BC,
                             len);
        load_tile_f32<D, BC>(s_base + (uint32_t)(v_off(0) * 4), vg, kv_stride, (n_hi - 1) * BC,
                             len);
    }
    cp_async_commit();

    float4 o[RM][DC];
    float m[RM], l[RM];  // running max (base 2, scaled) of each row; this lane's part of the sum
#pragma unroll
    for (int i = 0; i < RM; ++i) {
#pragma unroll
        for (int k = 0; k < DC; ++k) o[i][k] = make_float4(0.f, 0.f, 0.f, 0.f);
        m[i] = -INFINITY;
        l[i] = 0.f;
    }
    const float sl2 = p.scale_log2;

    int stage = 0;
    for (int n = n_hi - 1; n >= n_lo; --n) {
        const int kv0 = n * BC;
        if (n > n_lo) {  // prefetch the next (lower) tile into the other stage
            if constexpr (PAGED) {
                load_kv_paged<float, D, LD, BC, kF32Threads>(
                    s_base + (uint32_t)(k_off(stage ^ 1) * 4),
                    s_base + (uint32_t)(v_off(stage ^ 1) * 4), p, b, kvh, kv0 - BC, kv_len);
            } else {
                load_tile_f32<D, BC>(s_base + (uint32_t)(k_off(stage ^ 1) * 4), kg, kv_stride,
                                     kv0 - BC, len);
                load_tile_f32<D, BC>(s_base + (uint32_t)(v_off(stage ^ 1) * 4), vg, kv_stride,
                                     kv0 - BC, len);
            }
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        // S = Q K^T (raw dot products): rows ty + 16 i, keys tx + 8 n of the tile.
        float s[RM][KN];
#pragma unroll
        for (int i = 0; i < RM; ++i)
#pragma unroll
            for (int j = 0; j < KN; ++j) s[i][j] = 0.f;
        const float4 *ks = sm4 + k_off(stage) / 4;
#pragma unroll 4
        for (int c = 0; c < C4; ++c) {
            float4 qv[RM], kv[KN];
#pragma unroll
            for (int i = 0; i < RM; ++i) qv[i] = sm4[(ty + 16 * i) * LD4 + c];
#pragma unroll
            for (int j = 0; j < KN; ++j) kv[j] = ks[(tx + 8 * j) * LD4 + c];
#pragma unroll
            for (int i = 0; i < RM; ++i)
#pragma unroll
                for (int j = 0; j < KN; ++j) {
                    s[i][j] = fmaf(qv[i].x, kv[j].x, s[i][j]);
                    s[i][j] = fmaf(qv[i].y, kv[j].y, s[i][j]);
                    s[i][j] = fmaf(qv[i].z, kv[j].z, s[i][j]);
                    s[i][j] = fmaf(qv[i].w, kv[j].w, s[i][j]);
                }
        }

        // Mask the tiles that cross the diagonal, the end of the sequence or the window edge
        // (non-causal: the end of the sequence).
        const bool masked = CAUSAL ? kv0 + BC - 1 > q_off + q_start ||
                                         (p.window > 0 && kv0 <= q_off + q_last - p.window)
                                   : kv0 + BC > kv_len;
        if (masked) {
#pragma unroll
            for (int i = 0; i < RM; ++i)
#pragma unroll
                for (int j = 0; j < KN; ++j) {
                    const int key = kv0 + tx + 8 * j;
                    const int pos = q_off + q_start + ty + 16 * i;
                    const bool ok = CAUSAL ? key <= pos && key < kv_len &&
                                                 (p.window <= 0 || key > pos - p.window)
                                           : key < kv_len;
                    if (!ok) s[i][j] = -INFINITY;
                }
        }

        // Online softmax (base 2); the 8 lanes of a row group share its max.
#pragma unroll
        for (int i = 0; i < RM; ++i) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < KN; ++j) mx = fmaxf(mx, s[i][j]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            // scale > 0, so max(raw) * scale_log2 is the max of the scaled scores.
            const float mn = fmaxf(m[i], mx * sl2);
            const float mu = mn == -INFINITY ? 0.f : mn;  // fully masked so far: no NaN
            const float corr = exp2f(m[i] - mu);            // m == -inf -> 0
            m[i] = mn;
            float rs = 0.f;
#pragma unroll
            for (int j = 0; j < KN; ++j) {
                s[i][j] = exp2f(fmaf(s[i][j], sl2, -mu));  // masked: exp2(-inf) = 0
                rs += s[i][j];
            }
            l[i] = fmaf(l[i], corr, rs);
#pragma unroll
            for (int k = 0; k < DC; ++k) {
                o[i][k].x *= corr;
                o[i][k].y *= corr;
                o[i][k].z *= corr;
                o[i][k].w *= corr;
            }
        }

        // O += P V: P[row][j] lives in lane j % 8 of the row group, as s[i][j / 8].
        const float4 *vs = sm4 + v_off(stage) / 4;
#pragma unroll
        for (int j = 0; j < BC; ++j) {
            float pj[RM];
#pragma unroll
            for (int i = 0; i < RM; ++i)
                pj[i] = __shfl_sync(0xffffffffu, s[i][j / 8], row_lane0 | (j & 7));
#pragma unroll
            for (int k = 0; k < DC; ++k) {
                const int c = tx + 8 * k;
                if (C4 % 8 == 0 || c < C4) {
                    const float4 v = vs[j * LD4 + c];
#pragma unroll
                    for (int i = 0; i < RM; ++i) fma4(o[i][k], pj[i], v);
                }
            }
        }
        __syncthreads();  // this stage is refilled by the next iteration's prefetch
        stage ^= 1;
    }

    if constexpr (PAGED) cp_async_wait<0>();  // no key tile ran (ctx_len < q_len): Q's copy
    // Normalise and store (rows past the sequence end are not written).
    float *og = static_cast<float *>(p.out) + (int64_t)start * q_stride + (int64_t)h * D;
#pragma unroll
    for (int i = 0; i < RM; ++i) {
        float li = l[i];
        li += __shfl_xor_sync(0xffffffffu, li, 1);
        li += __shfl_xor_sync(0xffffffffu, li, 2);
        li += __shfl_xor_sync(0xffffffffu, li, 4);
        const float inv = li > 0.f ? 1.f / li : 0.f;
        const int r = q_start + ty + 16 * i;
        if (r < len) {
            float4 *orow = reinterpret_cast<float4 *>(og + (int64_t)r * q_stride);
#pragma unroll
            for (int k = 0; k < DC; ++k) {
                const int c = tx + 8 * k;
                if (C4 % 8 == 0 || c < C4)
                    orow[c] = make_float4(o[i][k].x * inv, o[i][k].y * inv, o[i][k].z * inv,
                                          o[i][k].w * inv);
            }
        }
    }
}

// ---------------------------------------------------------------- host side
inline bool head_dim_ok(int d) { return d == 64 || d == 80 || d == 96 || d == 128 || d == 256; }
// Non-causal (encoder) head sizes: BERT-small / MiniLM, BERT-base / large, and 128.
inline bool bidir_head_dim_ok(int d) { return d == 32 || d == 64 || d == 128; }

inline bool valid(const fl_prefill_attention_args *a, bool causal) {
    if (!a || a->batch < 0 || a->batch > 65535) return false;
    if (a->q_heads < 1 || a->kv_heads < 1 || a->q_heads % a->kv_heads) return false;
    if (a->dtype != FL_DTYPE_F32 && a->dtype != FL_DTYPE_F16 && a->dtype != FL_DTYPE_BF16)
        return false;
    if (!(causal ? head_dim_ok(a->head_dim) : bidir_head_dim_ok(a->head_dim))) return false;
    if (!causal && a->window != 0) return false;  // a window is a causal notion here
    if (a->total_tokens < 1 || a->max_seq_len < 1 || a->max_seq_len > a->total_tokens)
        return false;
    if (a->window < 0) return false;
    if (!(a->scale > 0.f) || a->scale == INFINITY) return false;  // also rejects NaN
    return true;
}

// What sizes the grid: (q_heads, batch, query tiles of max_len rows).
struct Grid {
    int32_t q_heads, batch, head_dim, max_len;
};

// One tile configuration (Cfg<D>'s, from launch_d).
template <typename T, int D, int NW, int MT, int BC, bool QREG, int MINB, bool PAGED, bool CAUSAL>
fl_status launch_cfg(const Grid &a, const Params &p, cudaStream_t st) {
    using TL = Tile<D, NW, MT, BC, QREG>;
    const int64_t m_blocks = ceil_div(a.max_len, TL::BR);
    if (m_blocks > 65535) return FL_ERR_INVALID_ARGUMENT;
    auto kern = prefill_kernel<T, D, NW, MT, BC, QREG, MINB, PAGED, CAUSAL>;
    if (TL::SMEM_BYTES > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)TL::SMEM_BYTES);
        if (e != cudaSuccess) return (fl_status)e;
    }
    dim3 grid((unsigned)a.q_heads, (unsigned)a.batch, (unsigned)m_blocks);
    kern<<<grid, TL::THREADS, TL::SMEM_BYTES, st>>>(p);
    return launch_status();
}

template <typename T, int D, bool PAGED, bool CAUSAL>
fl_status launch_d(const Grid &a, const Params &p, cudaStream_t st) {
    using C = Cfg<D>;
    return launch_cfg<T, D, C::NW, C::MT, C::BC, C::QREG, C::MINB, PAGED, CAUSAL>(a, p, st);
}

template <int D, bool PAGED, bool CAUSAL>
fl_status launch_f32_d(const Grid &a, const Params &p, cudaStream_t st) {
    constexpr int BC = CfgF32<D>::BC;
    using TL = TileF32<D, BC>;
    const int64_t m_blocks = ceil_div(a.max_len, TL::BR);
    if (m_blocks > 65535) return FL_ERR_INVALID_ARGUMENT;
    auto kern = prefill_f32_kernel<D, BC, PAGED, CAUSAL>;
    if (TL::SMEM_BYTES > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)TL::SMEM_BYTES);
        if (e != cudaSuccess) return (fl_status)e;
    }
    dim3 grid((unsigned)a.q_heads, (unsigned)a.batch, (unsigned)m_blocks);
    kern<<<grid, kF32Threads, TL::SMEM_BYTES, st>>>(p);
    return launch_status();
}

template <bool PAGED, bool CAUSAL>
fl_status launch_f32(const Grid &a, const Params &p, cudaStream_t st) {
    if constexpr (!CAUSAL) {  // only the head sizes bidir_head_dim_ok lets through
        switch (a.head_dim) {
        case 32: return launch_f32_d<32, PAGED, CAUSAL>(a, p, st);
        case 64: return launch_f32_d<64, PAGED, CAUSAL>(a, p, st);
        case 128: return launch_f32_d<128, PAGED, CAUSAL>(a, p, st);
        default: return FL_ERR_INVALID_ARGUMENT;
        }
    } else {
        switch (a.head_dim) {
        case 64: return launch_f32_d<64, PAGED, CAUSAL>(a, p, st);
        case 80: return launch_f32_d<80, PAGED, CAUSAL>(a, p, st);
        case 96: return launch_f32_d<96, PAGED, CAUSAL>(a, p, st);
        case 128: return launch_f32_d<128, PAGED, CAUSAL>(a, p, st);
        case 256: return launch_f32_d<256, PAGED, CAUSAL>(a, p, st);
        default: return FL_ERR_INVALID_ARGUMENT;
        }
    }
}

template <typename T, bool PAGED, bool CAUSAL>
fl_status launch_t(const Grid &a, const Params &p, cudaStream_t st) {
    if constexpr (!CAUSAL) {
        switch (a.head_dim) {
        case 32: return launch_d<T, 32, PAGED, CAUSAL>(a, p, st);
        case 64: return launch_d<T, 64, PAGED, CAUSAL>(a, p, st);
        case 128: return launch_d<T, 128, PAGED, CAUSAL>(a, p, st);
        default: return FL_ERR_INVALID_ARGUMENT;
        }
    } else {
        switch (a.head_dim) {
        case 64: return launch_d<T, 64, PAGED, CAUSAL>(a, p, st);
        case 80: return launch_d<T, 80, PAGED, CAUSAL>(a, p, st);
        case 96: return launch_d<T, 96, PAGED, CAUSAL>(a, p, st);
        case 128: return launch_d<T, 128, PAGED, CAUSAL>(a, p, st);
        case 256: return launch_d<T, 256, PAGED, CAUSAL>(a, p, st);
        default: return FL_ERR_INVALID_ARGUMENT;
        }
    }
}

// One launch over Params `p` (dtype and head size from the caller's args).
template <bool PAGED, bool CAUSAL>
fl_status launch_any(fl_dtype dtype, const Grid &g, const Params &p, cudaStream_t st) {
    if (dtype == FL_DTYPE_F32) return launch_f32<PAGED, CAUSAL>(g, p, st);
    if (dtype == FL_DTYPE_F16) return launch_t<__half, PAGED, CAUSAL>(g, p, st);
    return launch_t<__nv_bfloat16, PAGED, CAUSAL>(g, p, st);
}

inline Params make_params(const fl_prefill_attention_args *a) {
    Params p;
    p.q = a->q; p.k = a->k; p.v = a->v; p.out = a->out;
    p.cu_seqlens = a->cu_seqlens;
    p.batch = a->batch; p.q_heads = a->q_heads; p.kv_heads = a->kv_heads;
    p.total_tokens = a->total_tokens;
    p.window = a->window;
    p.scale_log2 = a->scale * kLog2e;
    p.ctx_lens = nullptr; p.block_table = nullptr;
    p.block_size = 0; p.max_blocks = 0; p.num_blocks = 0;
    return p;
}

inline bool valid_paged(const fl_prefill_paged_attention_args *a) {
    if (!a || a->batch < 0 || a->batch > 65535) return false;
    if (a->q_heads < 1 || a->kv_heads < 1 || a->q_heads % a->kv_heads) return false;
    if (a->dtype != FL_DTYPE_F32 && a->dtype != FL_DTYPE_F16 && a->dtype != FL_DTYPE_BF16)
        return false;
    if (!head_dim_ok(a->head_dim)) return false;
    if (a->total_q < 0 || a->max_q_len < 0 || a->max_q_len > a->total_q) return false;
    if (a->kv_block_size < 1 || a->num_blocks < 1) return false;
    if (a->layout == FL_KV_PAGED) {
        if (a->max_blocks_per_seq < 1) return false;
        if ((int64_t)a->kv_block_size * a->max_blocks_per_seq > INT32_MAX) return false;
    } else if (a->layout != FL_KV_CONTIGUOUS) {
        return false;
    }
    if (a->window < 0) return false;
    if (!(a->scale > 0.f) || a->scale == INFINITY) return false;  // also rejects NaN
    return true;
}

}  // namespace prefill

namespace prefill_wgmma {
fl_status launch(const fl_prefill_attention_args *a, bool causal, cudaStream_t st);  // attention_prefill_wgmma.cu
}

namespace prefill {
// fl_attention_prefill_kernel and its non-causal twin.
template <bool CAUSAL>
fl_status run_packed(const fl_prefill_attention_args *a, int32_t kernel, fl_stream stream) {
    if (kernel != FL_PREFILL_KERNEL_AUTO && kernel != FL_PREFILL_KERNEL_MMA_SYNC)
        return FL_ERR_INVALID_ARGUMENT;
    if (!valid(a, CAUSAL)) return FL_ERR_INVALID_ARGUMENT;
    if (a->batch == 0) return FL_OK;
    if (!a->q || !a->k || !a->v || !a->out || !a->cu_seqlens) return FL_ERR_INVALID_ARGUMENT;
    if (!fl::aligned16(a->q) || !fl::aligned16(a->k) || !fl::aligned16(a->v) ||
        !fl::aligned16(a->out))
        return FL_ERR_MISALIGNED;
    const Params p = make_params(a);
    cudaStream_t st = fl::as_stream(stream);
    if (kernel == FL_PREFILL_KERNEL_AUTO) {
        const fl_status s = fl::prefill_wgmma::launch(a, CAUSAL, st);
        if (s != FL_ERR_UNSUPPORTED_DTYPE) return s;  // else: a call that path does not run
    }
    const Grid g{a->q_heads, a->batch, a->head_dim, a->max_seq_len};
    return launch_any<false, CAUSAL>(a->dtype, g, p, st);
}
}  // namespace prefill
}  // namespace fl

extern "C" fl_status fl_attention_prefill_kernel(const fl_prefill_attention_args *a,
                                                int32_t kernel, fl_stream stream) {
    return fl::prefill::run_packed<true>(a, kernel, stream);
}

extern "C" fl_status fl_attention_prefill_bidirectional_kernel(const fl_prefill_attention_args *a,
                                                              int32_t kernel, fl_stream stream) {
    return fl::prefill::run_packed<false>(a, kernel, stream);
}

extern "C" fl_status fl_attention_prefill_bidirectional(const fl_prefill_attention_args *a,
                                                       fl_stream stream) {
    return fl::prefill::run_packed<false>(a, FL_PREFILL_KERNEL_AUTO, stream);
}

extern "C" fl_status fl_attention_prefill_paged(const fl_prefill_paged_attention_args *a,
                                               fl_stream stream) {
    using namespace fl::prefill;
    if (!valid_paged(a)) return FL_ERR_INVALID_ARGUMENT;
    if (a->batch == 0 || a->max_q_len == 0) return FL_OK;
    if (!a->q || !a->k || !a->v || !a->out || !a->cu_seqlens_q || !a->ctx_lens)
        return FL_ERR_INVALID_ARGUMENT;
    if (a->layout == FL_KV_PAGED && !a->block_table) return FL_ERR_INVALID_ARGUMENT;
    if (!fl::aligned16(a->q) || !fl::aligned16(a->k) || !fl::aligned16(a->v) ||
        !fl::aligned16(a->out))
        return FL_ERR_MISALIGNED;
    const bool paged = a->layout == FL_KV_PAGED;
    Params p;
    p.q = a->q; p.k = a->k; p.v = a->v; p.out = a->out;
    p.cu_seqlens = a->cu_seqlens_q;
    p.batch = a->batch; p.q_heads = a->q_heads; p.kv_heads = a->kv_heads;
    p.total_tokens = a->total_q;
    p.window = a->window;
    p.scale_log2 = a->scale * kLog2e;
    p.ctx_lens = a->ctx_lens;
    p.block_table = paged ? a->block_table : nullptr;
    p.block_size = a->kv_block_size;
    p.max_blocks = paged ? a->max_blocks_per_seq : 1;
    p.num_blocks = a->num_blocks;
    const Grid g{a->q_heads, a->batch, a->head_dim, a->max_q_len};
    return launch_any<true, true>(a->dtype, g, p, fl::as_stream(stream));
}

extern "C" fl_status fl_attention_prefill(const fl_prefill_attention_args *a, fl_stream stream) {
    return fl_attention_prefill_kernel(a, FL_PREFILL_KERNEL_AUTO, stream);
}
