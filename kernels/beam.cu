// Beam search step: per request, the best (beam, token) candidates by running log-probability
// plus log-softmax (semantics: fl_beam.h and crates/fl-sampling/src/reference.rs).
//
// Two stages, as FasterTransformer's beam top-k:
//  1. grid (rows x chunks): a block reads one chunk of a row once, keeping the chunk's max and
//     sum of exp (online softmax) and its max_keep best logits. Every global top-k element is
//     in its chunk's top-k, so nothing is lost. The chunk count depends on rows and vocab only
//     (the workspace size is a pure function), sized so that 1 x 4 beams fills an H100.
//  2. one block per request: each warp takes rows of the request, turns (max, sum) of the
//     chunks into the row's log-sum-exp and the chunks' candidates into scores, keeps the best;
//     the warps' lists are merged and the request's k best written.
//
// Candidates are 64-bit keys (order-preserving bits of the value << 32 | ~index), so "larger
// value, then smaller index" is one unsigned comparison and keys are unique. A warp keeps the
// best 32 * R keys seen, sorted, R registers per lane; a batch of offers (one per lane) goes in
// one by one when few lanes offer (the common case once the threshold has settled) and through
// a bitonic sort and merge otherwise.
#include <float.h>

#include "common/common.cuh"

namespace fl {
namespace beam {

constexpr unsigned FULL = 0xffffffffu;
constexpr int S1_THREADS = 256;
constexpr int S1_WARPS = S1_THREADS / 32;
constexpr int PER_THREAD = 8;                        // elements a thread holds per tile
constexpr int TILE = S1_THREADS * PER_THREAD;        // elements a block reads per step
constexpr int MIN_CHUNK = TILE;                      // smallest chunk worth a block
constexpr int64_t TARGET_BLOCKS = 264;               // stage-1 blocks aimed for: 2 per H100 SM
constexpr int S2_THREADS = 256;
constexpr int S2_WARPS = S2_THREADS / 32;
constexpr int FEW_OFFERS = 4;                        // up to this many offers go in one by one

// ---------------------------------------------------------------- launch shape

struct Shape {
    int64_t splits;  // chunks per row
    int64_t chunk;   // tokens per chunk (the last one may be shorter)
};

// A pure function of (rows, vocab): the workspace size must not depend on the device.
__host__ __device__ inline Shape shape_of(int64_t rows, int64_t vocab) {
    const int64_t cap = (vocab + MIN_CHUNK - 1) / MIN_CHUNK;
    const int64_t want = rows > 0 ? (TARGET_BLOCKS + rows - 1) / rows : 1;
    int64_t splits = want < cap ? want : cap;
    if (splits < 1) splits = 1;
    Shape s;
    s.chunk = (vocab + splits - 1) / splits;
    s.splits = (vocab + s.chunk - 1) / s.chunk;
    return s;
}

// Bytes per (row, chunk) piece of the workspace: max_keep keys and one (max, sum) pair.
inline int64_t piece_bytes(int64_t max_keep) { return 8 * max_keep + 8; }

// An upper bound of rows' * splits(rows') over every rows' <= rows: splits(r) <= cap and
// r * ceil(T / r) < T + r, both increasing in r.
inline int64_t max_pieces(int64_t rows, int64_t vocab) {
    const int64_t cap = (vocab + MIN_CHUNK - 1) / MIN_CHUNK;
    const int64_t a = rows * cap, b = TARGET_BLOCKS + rows - 1;
    return a < b ? a : b;
}

// ---------------------------------------------------------------- keys

// Order-preserving map of a float to u32 (NaN read as -inf; -0 ranks below +0, as Rust's
// total_cmp, which the reference sorts with).
__device__ __forceinline__ uint32_t key_of(float x) {
    if (x != x) x = -INFINITY;
    const uint32_t b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float float_of_key(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// Larger value first, then the smaller index; never 0 (0 marks an empty slot).
__device__ __forceinline__ uint64_t make_key(float x, uint32_t index) {
    return ((uint64_t)key_of(x) << 32) | (uint64_t)(~index);
}
__device__ __forceinline__ uint64_t umax64(uint64_t a, uint64_t b) { return a > b ? a : b; }
__device__ __forceinline__ uint64_t umin64(uint64_t a, uint64_t b) { return a < b ? a : b; }

// ---------------------------------------------------------------- (max, sum of exp)

// Merges (m2, s2) into (m, s), both sums relative to their max. An empty part (-inf, 0)
// contributes nothing; NaN sums propagate (a NaN logit makes its row's scores NaN).
__device__ __forceinline__ void merge_ms(float &m, float &s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    const float a = (m == -INFINITY && s == 0.f) ? 0.f : s * expf(m - mn);
    const float b = (m2 == -INFINITY && s2 == 0.f) ? 0.f : s2 * expf(m2 - mn);
    m = mn;
    s = a + b;
}
__device__ __forceinline__ void warp_merge_ms(float &m, float &s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(FULL, m, o), s2 = __shfl_xor_sync(FULL, s, o);
        merge_ms(m, s, m2, s2);
    }
}

// ---------------------------------------------------------------- warp top list

// Bitonic sort of one key per lane, descending over the lanes.
__device__ __forceinline__ uint64_t warp_sort_desc(uint64_t x, int lane) {
#pragma unroll
    for (int k = 2; k <= 32; k <<= 1) {
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            const uint64_t y = __shfl_xor_sync(FULL, x, j);
            const bool desc = (lane & k) == 0;
            const bool lower = (lane & j) == 0;
            x = (lower == desc) ? umax64(x, y) : umin64(x, y);
        }
    }
    return x;
}
// A bitonic sequence over the lanes, sorted descending.
__device__ __forceinline__ uint64_t warp_merge_desc(uint64_t x, int lane) {
#pragma unroll
    for (int j = 16; j > 0; j >>= 1) {
        const uint64_t y = __shfl_xor_sync(FULL, x, j);
        x = (lane & j) == 0 ? umax64(x, y) : umin64(x, y);
    }
    return x;
}

// The best 32 * R keys offered to a warp, sorted descending: position r * 32 + lane in
// seg[r] on `lane`. Segment r holds only keys >= every key of segment r + 1.
template <int R> struct WarpTop {
    uint64_t seg[R];

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int r = 0; r < R; ++r) seg[r] = 0;
    }

    // The key at position k - 1 (1 <= k <= 32 * R; 0 while fewer than k are held).
    __device__ __forceinline__ uint64_t kth(int k) const {
        const int rk = (k - 1) >> 5;
        uint64_t v = 0;
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (r == rk) v = seg[r];
        return __shfl_sync(FULL, v, (k - 1) & 31);
    }

    // One key, the same on every lane (nonzero).
    __device__ __forceinline__ void insert_one(uint64_t v, int lane) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint64_t cur = seg[r];
            const uint64_t up = __shfl_up_sync(FULL, cur, 1);
            const uint64_t last = __shfl_sync(FULL, cur, 31);
            const int p = __popc(__ballot_sync(FULL, cur > v));  // sorted: a prefix
            if (p == 32) continue;                               // v goes further down
            seg[r] = lane < p ? cur : (lane == p ? v : up);
            v = last;
            if (v == 0) break;
        }
    }

    // A batch sorted descending over the lanes: segment by segment, the top half of
    // (segment, batch) stays and the bottom half moves down.
    __device__ __forceinline__ void insert_sorted(uint64_t b, int lane) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint64_t rev = __shfl_sync(FULL, b, 31 - lane);
            const uint64_t hi = umax64(seg[r], rev), lo = umin64(seg[r], rev);
            seg[r] = warp_merge_desc(hi, lane);
            if (r + 1 < R) b = warp_merge_desc(lo, lane);
        }
    }

    // One offer per lane (0: none).
    __device__ __forceinline__ void offer(uint64_t v, int lane) {
        unsigned b = __ballot_sync(FULL, v != 0);
        if (b == 0) return;
        if (__popc(b) <= FEW_OFFERS) {
            while (b) {
                const int src = __ffs(b) - 1;
                b &= b - 1;
                insert_one(__shfl_sync(FULL, v, src), lane);
            }
        } else {
            insert_sorted(warp_sort_desc(v, lane), lane);
        }
    }
};

// Merges the lists of a block's warps into warp 0's (a tree over `lists`, one slot of
// 32 * R keys per warp); `k` keys are needed in the end, so offers at or below the k-th are
// dropped. Every thread of the block calls it.
template <int R, int WARPS>
__device__ __forceinline__ void block_merge(WarpTop<R> &top, uint64_t (*lists)[R * 32], int warp,
                                            int lane, int k) {
#pragma unroll
    for (int r = 0; r < R; ++r) lists[warp][r * 32 + lane] = top.seg[r];
#pragma unroll
    for (int step = 1; step < WARPS; step <<= 1) {
        __syncthreads();
        if ((warp & (2 * step - 1)) == 0) {
            uint64_t thr = top.kth(k);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const uint64_t o = lists[warp + step][r * 32 + lane];
                top.offer(o > thr ? o : 0, lane);
                thr = top.kth(k);
            }
#pragma unroll
            for (int r = 0; r < R; ++r) lists[warp][r * 32 + lane] = top.seg[r];
        }
    }
}

// ---------------------------------------------------------------- stage 1

// Block (row, chunk): the chunk's `k` best logit keys (index: token in the row) to cand, its
// (max, sum of exp(x - max)) to ms.
template <typename T, int R>
__global__ void __launch_bounds__(S1_THREADS)
    chunk_kernel(const T *__restrict__ logits, int vocab, int splits, int chunk, int k,
                 uint64_t *__restrict__ cand, float2 *__restrict__ ms) {
    __shared__ uint64_t lists[S1_WARPS][R * 32];
    __shared__ float2 red[S1_WARPS];
    const int64_t piece = blockIdx.x;
    const int64_t row = piece / splits;
    const int lo = (int)(piece % splits) * chunk;
    const int hi = min(vocab, lo + chunk);
    const T *x = logits + row * (int64_t)vocab;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    WarpTop<R> top;
    top.init();
    uint64_t thr = 0;
    float m = -INFINITY, s = 0.f;
    for (int base = lo; base < hi; base += TILE) {
        float v[PER_THREAD];
        uint64_t key[PER_THREAD];
#pragma unroll
        for (int e = 0; e < PER_THREAD; ++e) {
            const int i = base + e * S1_THREADS + tid;
            v[e] = i < hi ? to_f32(x[i]) : -INFINITY;
            key[e] = i < hi ? make_key(v[e], (uint32_t)i) : 0;
        }
        float tm = m;
#pragma unroll
        for (int e = 0; e < PER_THREAD; ++e) tm = fmaxf(tm, v[e]);
        float acc = (m == -INFINITY && s == 0.f) ? 0.f : s * expf(m - tm);
#pragma unroll
        for (int e = 0; e < PER_THREAD; ++e) acc += v[e] == -INFINITY ? 0.f : expf(v[e] - tm);
        m = tm;
        s = acc;
        // Rounds: each lane offers its best element not yet offered, while any lane has one
        // above the warp's k-th best (usually one or two rounds per tile).
        unsigned taken = 0;
        while (true) {
            uint64_t best = 0;
            int bi = 0;
#pragma unroll
            for (int e = 0; e < PER_THREAD; ++e)
                if (!((taken >> e) & 1u) && key[e] > best) {
                    best = key[e];
                    bi = e;
                }
            if (best <= thr) best = 0;
            if (!__any_sync(FULL, best != 0)) break;
            if (best) taken |= 1u << bi;
            top.offer(best, lane);
            thr = top.kth(k);
        }
    }

    warp_merge_ms(m, s);
    if (lane == 0) red[warp] = make_float2(m, s);
    block_merge<R, S1_WARPS>(top, lists, warp, lane, k);
    if (warp == 0) {
        uint64_t *out = cand + piece * k;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int pos = r * 32 + lane;
            if (pos < k) out[pos] = top.seg[r];
        }
        float2 p = lane < S1_WARPS ? red[lane] : make_float2(-INFINITY, 0.f);
        warp_merge_ms(p.x, p.y);
        if (lane == 0) ms[piece] = p;
    }
}

// ---------------------------------------------------------------- stage 2

// Block r: request r's best k_r candidates over its rows, from the chunks' candidates.
template <int R>
__global__ void __launch_bounds__(S2_THREADS)
    request_kernel(const uint64_t *__restrict__ cand, const float2 *__restrict__ ms,
                   const float *__restrict__ beam_scores, const int32_t *__restrict__ req_start,
                   const int32_t *__restrict__ keep, int rows, int vocab, int splits, int k,
                   float *__restrict__ out_scores, int32_t *__restrict__ out_ids) {
    __shared__ uint64_t lists[S2_WARPS][R * 32];
    const int req = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int first, nrows;
    packed_seq(req_start, req, rows, first, nrows);
    int kr = keep[req];
    kr = kr < 0 ? 0 : (kr > k ? k : kr);
    if ((int64_t)kr > (int64_t)nrows * vocab) kr = nrows * vocab;

    WarpTop<R> top;
    top.init();
    if (kr > 0) {
        uint64_t thr = 0;
        for (int j = warp; j < nrows; j += S2_WARPS) {
            const int64_t row = first + j;
            float m = -INFINITY, s = 0.f;
            for (int c = lane; c < splits; c += 32) {
                const float2 p = ms[row * splits + c];
                merge_ms(m, s, p.x, p.y);
            }
            warp_merge_ms(m, s);
            const float lse = logf(s);
            const float bs = beam_scores[row];
            const uint64_t *rc = cand + row * splits * k;
            const uint32_t base = (uint32_t)j * (uint32_t)vocab;
            // Lane c walks chunk c's list (sorted by logit, so by score) until it falls below
            // the warp's k_r-th best score.
            for (int c0 = 0; c0 < splits; c0 += 32) {
                const int c = c0 + lane;
                bool active = c < splits;
                int h = 0;
                while (__any_sync(FULL, active)) {
                    uint64_t o = 0;
                    if (active) {
                        const uint64_t key = h < k ? rc[(int64_t)c * k + h] : 0;
                        if (key == 0) {
                            active = false;
                        } else {
                            const float xv = float_of_key((uint32_t)(key >> 32));
                            const uint32_t tok = ~(uint32_t)key;
                            const float score = __fadd_rn(bs, __fsub_rn(__fsub_rn(xv, m), lse));
                            const uint64_t k2 = make_key(score, base + tok);
                            if ((uint32_t)(k2 >> 32) < (uint32_t)(thr >> 32)) {
                                active = false;
                            } else {
                                if (k2 > thr) o = k2;
                                ++h;
                            }
                        }
                    }
                    top.offer(o, lane);
                    thr = top.kth(kr);
                }
            }
        }
    }
    block_merge<R, S2_WARPS>(top, lists, warp, lane, kr > 0 ? kr : 1);
    if (warp == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int pos = r * 32 + lane;
            if (pos >= k) continue;
            const uint64_t key = top.seg[r];
            const bool ok = pos < kr && key != 0;
            out_scores[(int64_t)req * k + pos] = ok ? float_of_key((uint32_t)(key >> 32)) : -INFINITY;
            out_ids[(int64_t)req * k + pos] = ok ? (int32_t)(~(uint32_t)key) : -1;
        }
    }
}

template <typename T, int R>
fl_status launch(const T *logits, int64_t rows, int64_t vocab, const float *beam_scores,
                 const int32_t *req_start, const int32_t *keep, int64_t n_req, int k,
                 float *out_scores, int32_t *out_ids, void *workspace, cudaStream_t st) {
    const Shape sh = shape_of(rows, vocab);
    const int64_t pieces = rows * sh.splits;
    uint64_t *cand = static_cast<uint64_t *>(workspace);
    float2 *ms = reinterpret_cast<float2 *>(cand + pieces * k);
    if (pieces > 0) {
        chunk_kernel<T, R><<<(unsigned)pieces, S1_THREADS, 0, st>>>(
            logits, (int)vocab, (int)sh.splits, (int)sh.chunk, k, cand, ms);
        const fl_status e = launch_status();
        if (e != FL_OK) return e;
    }
    request_kernel<R><<<(unsigned)n_req, S2_THREADS, 0, st>>>(
        cand, ms, beam_scores, req_start, keep, (int)rows, (int)vocab, (int)sh.splits, k,
        out_scores, out_ids);
    return launch_status();
}

template <typename T>
fl_status dispatch_keep(const T *logits, int64_t rows, int64_t vocab, const float *beam_scores,
                        const int32_t *req_start, const int32_t *keep, int64_t n_req, int k,
                        float *out_scores, int32_t *out_ids, void *workspace, cudaStream_t st) {
    if (k <= 32)
        return launch<T, 1>(logits, rows, vocab, beam_scores, req_start, keep, n_req, k,
                            out_scores, out_ids, workspace, st);
    if (k <= 64)
        return launch<T, 2>(logits, rows, vocab, beam_scores, req_start, keep, n_req, k,
                            out_scores, out_ids, workspace, st);
    return launch<T, 4>(logits, rows, vocab, beam_scores, req_start, keep, n_req, k, out_scores,
                        out_ids, workspace, st);
}

}  // namespace beam
}  // namespace fl

static_assert(FL_BEAM_MAX_KEEP <= 4 * 32, "the widest warp list holds 128 keys");

extern "C" int64_t fl_beam_topk_workspace_size(int64_t rows, int64_t vocab, int64_t max_keep) {
    if (rows < 0 || vocab < 1 || vocab > INT32_MAX || rows > INT32_MAX / vocab || max_keep < 1 ||
        max_keep > FL_BEAM_MAX_KEEP)
        return -1;
    return fl::beam::max_pieces(rows, vocab) * fl::beam::piece_bytes(max_keep);
}

extern "C" fl_status fl_beam_topk(fl_dtype dtype, const void *logits, int64_t rows,
                                  int64_t vocab, const float *beam_scores,
                                  const int32_t *req_start, const int32_t *keep, int64_t n_req,
                                  int64_t max_keep, float *out_scores, int32_t *out_ids,
                                  void *workspace, int64_t workspace_bytes, fl_stream stream) {
    if (rows < 0 || vocab < 1 || vocab > INT32_MAX || rows > INT32_MAX / vocab || n_req < 0 ||
        n_req > INT32_MAX || max_keep < 1 || max_keep > FL_BEAM_MAX_KEEP)
        return FL_ERR_INVALID_ARGUMENT;
    if (n_req == 0) return FL_OK;
    if (!req_start || !keep || !out_scores || !out_ids) return FL_ERR_INVALID_ARGUMENT;
    if (rows > 0 && (!logits || !beam_scores)) return FL_ERR_INVALID_ARGUMENT;
    const fl::beam::Shape sh = fl::beam::shape_of(rows, vocab);
    const int64_t need = rows * sh.splits * fl::beam::piece_bytes(max_keep);
    if (need > 0 && (!workspace || workspace_bytes < need || (reinterpret_cast<uintptr_t>(workspace) & 7u)))
        return FL_ERR_INVALID_ARGUMENT;
    FL_DISPATCH_FLOAT(dtype, return fl::beam::dispatch_keep<scalar_t>(
                                 static_cast<const scalar_t *>(logits), rows, vocab, beam_scores,
                                 req_start, keep, n_req, (int)max_keep, out_scores, out_ids,
                                 workspace, fl::as_stream(stream)));
    return FL_ERR_UNSUPPORTED_DTYPE;
}
