// Sampling: logits processors (penalties, banned tokens, minimum length), the sampler
// (greedy, multinomial, top-k, top-p, min-p, per row) and decoding-loop bookkeeping.
//
// The sampler is sort-free. Per row: one pass for the max (and the argmax), then for each
// threshold a radix select over the order-preserving 32-bit keys of the logits (digits of
// 11, 11 and 10 bits; histograms of counts and of fixed-point probability masses; it stops
// as soon as the boundary bin is settled), then one sampling pass (inverse CDF in token
// order). Masses are integers (trunc(e * 2^40), e = exp_fl((x - max) / T)), so sums do not
// depend on the order of additions: a row samples the same token whatever the batch it is
// in and however it is split over blocks, and the CPU reference (crates/fl-sampling/src/
// reference.rs), which uses the same exp_fl and the same integer arithmetic, picks the same
// token bit for bit.
//
// Small batches: a row is split over several blocks (up to 64) that meet at barriers in
// global memory (every block of the grid is co-resident: the grid is sized with the
// occupancy calculator). A split row's chunk is kept in shared memory when it fits, so only
// the first pass reads global memory.
#include <atomic>
#include <float.h>
#include <stdlib.h>

#include "common/common.cuh"

namespace fl {
namespace smp {

constexpr int THREADS = 512;
constexpr int WARPS = THREADS / 32;
constexpr int TILE = 256;            // elements per warp step: 8 per lane, lane-interleaved
constexpr int BINS = 2048;           // radix digit of at most 11 bits
constexpr int MAX_SPLIT = 64;        // blocks per row at most
constexpr int CACHE_ELEMS = 12288;   // f32 elements of a chunk kept in shared memory
constexpr int MIN_CHUNK = 2048;      // smallest chunk worth a block
constexpr unsigned FULL = 0xffffffffu;

// ---------------------------------------------------------------- shared definitions

// Philox4x32-10 (Salmon et al., Random123): counter c, key (k0, k1).
struct U4 {
    uint32_t x, y, z, w;
};
__host__ __device__ __forceinline__ U4 philox4x32_10(U4 c, uint32_t k0, uint32_t k1) {
#pragma unroll
    for (int i = 0; i < 10; ++i) {
        if (i > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint64_t p0 = (uint64_t)0xD2511F53u * c.x;
        const uint64_t p1 = (uint64_t)0xCD9E8D57u * c.z;
        U4 n;
        n.x = (uint32_t)(p1 >> 32) ^ c.y ^ k0;
        n.y = (uint32_t)p1;
        n.z = (uint32_t)(p0 >> 32) ^ c.w ^ k1;
        n.w = (uint32_t)p0;
        c = n;
    }
    return c;
}

__device__ __forceinline__ U4 row_words(const fl_sampling_params &p, const int32_t *steps,
                                        int64_t row) {
    U4 c;
    c.x = steps ? (uint32_t)steps[row] : 0u;
    c.y = 0u;
    c.z = p.request_lo;
    c.w = p.request_hi;
    return philox4x32_10(c, p.seed_lo, p.seed_hi);
}

// NaN -> -inf, +inf -> FLT_MAX, -0 -> +0.
__device__ __forceinline__ float sanitize(float x) {
    if (x != x) return -INFINITY;
    if (x == INFINITY) return FLT_MAX;
    if (x == 0.f) return 0.f;
    return x;
}

// Order-preserving map of a (sanitized) float to u32.
__device__ __forceinline__ uint32_t key_of(float x) {
    const uint32_t b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float float_of_key(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// exp(x) for x <= 0 with only correctly rounded operations (the CPU reference performs the
// same sequence, so both get the same bits). 0 below -30 (e^-30 < 2^-40: no mass anyway).
__device__ __forceinline__ float exp_fl(float x) {
    if (!(x >= -30.0f)) return 0.0f;
    const float n = rintf(__fmul_rn(x, __uint_as_float(0x3fb8aa3bu)));      // log2(e)
    float r = __fmaf_rn(n, -__uint_as_float(0x3f317200u), x);               // ln2 high part
    r = __fmaf_rn(n, -__uint_as_float(0x35bfbe8eu), r);                     // ln2 low part
    float p = __uint_as_float(0x39500d01u);                                 // 1/7!
    p = __fmaf_rn(p, r, __uint_as_float(0x3ab60b61u));                      // 1/6!
    p = __fmaf_rn(p, r, __uint_as_float(0x3c088889u));                      // 1/5!
    p = __fmaf_rn(p, r, __uint_as_float(0x3d2aaaabu));                      // 1/4!
    p = __fmaf_rn(p, r, __uint_as_float(0x3e2aaaabu));                      // 1/3!
    p = __fmaf_rn(p, r, 0.5f);
    p = __fmaf_rn(p, r, 1.0f);
    p = __fmaf_rn(p, r, 1.0f);
    const float s = __uint_as_float((uint32_t)((int)n + 127) << 23);       // 2^n, n in [-44, 0]
    return __fmul_rn(p, s);
}

// floor(a * b / 2^32) for a < 2^63, b <= 2^32 (fits in 63 bits).
__device__ __forceinline__ unsigned long long mul_shr32(unsigned long long a,
                                                        unsigned long long b) {
    const unsigned long long hi = __umul64hi(a, b), lo = a * b;
    return (hi << 32) | (lo >> 32);
}

// ---------------------------------------------------------------- block helpers

__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long y = __shfl_xor_sync(FULL, x, o);
        x = y > x ? y : x;
    }
    return x;
}
__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL, x, o);
    return x;
}
__device__ __forceinline__ unsigned long long warp_incl_scan_u64(unsigned long long x) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_up_sync(FULL, x, o);
        if (lane >= o) x += y;
    }
    return x;
}

struct Smem {
    unsigned int hcount[BINS];
    unsigned long long hmass[BINS];     // also: segment sums of the sampling pass
    unsigned long long stage[WARPS][32];  // warp-aggregated histogram updates
    unsigned long long red[WARPS + 1];
    unsigned long long bcast[4];
    int found_idx;
    int pad_;
    unsigned long long found_before;
};

__device__ __forceinline__ unsigned long long block_max_u64(unsigned long long x, Smem &sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = warp_max_u64(x);
    __syncthreads();
    if (lane == 0) sm.red[warp] = x;
    __syncthreads();
    x = lane < WARPS ? sm.red[lane] : 0ull;
    return warp_max_u64(x);
}
__device__ __forceinline__ unsigned long long block_sum_u64(unsigned long long x, Smem &sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = warp_sum_u64(x);
    __syncthreads();
    if (lane == 0) sm.red[warp] = x;
    __syncthreads();
    x = lane < WARPS ? sm.red[lane] : 0ull;
    return warp_sum_u64(x);
}
// Exclusive prefix sum over the block in thread order.
__device__ __forceinline__ unsigned long long block_excl_scan_u64(unsigned long long x, Smem &sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned long long inc = warp_incl_scan_u64(x);
    __syncthreads();
    if (lane == 31) sm.red[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        const unsigned long long v = lane < WARPS ? sm.red[lane] : 0ull;
        const unsigned long long vi = warp_incl_scan_u64(v);
        __syncwarp();
        if (lane < WARPS) sm.red[lane] = vi - v;
    }
    __syncthreads();
    return sm.red[warp] + inc - x;
}

// The first position (in ascending or descending index order over w[0..n), n <= BINS) at
// which the running sum reaches `target` (1 <= target <= sum): sets sm.found_idx and
// sm.found_before (the sum strictly before it); found_idx = -1 if the sum is short.
template <typename W>
__device__ void find_crossing(const W *w, int n, bool desc, unsigned long long target, Smem &sm) {
    constexpr int PER = BINS / THREADS;
    const int tid = threadIdx.x;
    if (tid == 0) sm.found_idx = -1;
    unsigned long long s = 0;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int pos = tid * PER + k;
        if (pos < n) s += (unsigned long long)w[desc ? n - 1 - pos : pos];
    }
    const unsigned long long before = block_excl_scan_u64(s, sm);
    if (s > 0 && before < target && target <= before + s) {
        unsigned long long cum = before;
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int pos = tid * PER + k;
            if (pos >= n) break;
            const int idx = desc ? n - 1 - pos : pos;
            const unsigned long long v = (unsigned long long)w[idx];
            if (cum + v >= target) {
                sm.found_idx = idx;
                sm.found_before = cum;
                break;
            }
            cum += v;
        }
    }
    __syncthreads();
}

// ---------------------------------------------------------------- split-row workspace

struct GroupWs {
    unsigned int bar;   // barrier arrivals of the current call
    unsigned int exit;  // blocks done with the row
    unsigned int pad[14];
    unsigned long long best[MAX_SPLIT];
    unsigned long long mass[MAX_SPLIT];
    unsigned int hcount[3][BINS];
    unsigned long long hmass[3][BINS];
};

__device__ __forceinline__ void group_barrier(GroupWs *g, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(&g->bar, 1u);
        while (*reinterpret_cast<volatile unsigned *>(&g->bar) < target) __nanosleep(32);
        __threadfence();
    }
    __syncthreads();
}

// The last block of the row to leave resets the counters for the next call.
__device__ __forceinline__ void group_exit(GroupWs *g, int split) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned prev = atomicAdd(&g->exit, 1u);
        if (prev == (unsigned)split - 1) {
            atomicExch(&g->bar, 0u);
            atomicExch(&g->exit, 0u);
        }
    }
}

// ---------------------------------------------------------------- the sampler

template <typename T, bool CACHE> struct Row {
    const T *__restrict__ x;  // the row in global memory
    const float *cache;       // the chunk, sanitized, when CACHE
    int beg, end;             // this block's chunk [beg, end) of the row

    __device__ __forceinline__ float load(int i) const {
        if (CACHE) return cache[i - beg];
        return sanitize(to_f32(x[i]));
    }
    // f(i, v, valid) for every element of the chunk; all 32 lanes of a warp call f together
    // (valid == false past the end), so f may use warp collectives.
    template <typename F> __device__ __forceinline__ void each(F &&f) const {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        for (int t = beg + warp * TILE; t < end; t += WARPS * TILE) {
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int i = t + j * 32 + lane;
                v[j] = i < end ? load(i) : 0.f;
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int i = t + j * 32 + lane;
                f(i, v[j], i < end);
            }
        }
    }
};

// Adds (1, q) to bin `bin` (-1: nothing) of the shared histogram, one atomic per distinct
// bin in the warp. Called by all 32 lanes together.
__device__ __forceinline__ void hist_add(Smem &sm, int bin, unsigned long long q, bool with_mass) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (__ballot_sync(FULL, bin >= 0) == 0) return;  // later digits: most warps hold nothing
    const unsigned m = __match_any_sync(FULL, bin);
    if (with_mass) sm.stage[warp][lane] = q;
    __syncwarp();
    if (bin >= 0 && lane == __ffs(m) - 1) {
        atomicAdd(&sm.hcount[bin], (unsigned)__popc(m));
        if (with_mass) {
            unsigned long long s = 0;
            for (unsigned mm = m; mm; mm &= mm - 1) s += sm.stage[warp][__ffs(mm) - 1];
            if (s) atomicAdd(&sm.hmass[bin], s);
        }
    }
    __syncwarp();
}

struct RowState {
    GroupWs *g;       // null when the row is not split
    int split, c;     // blocks per row, this block's index
    unsigned nbar;    // barriers passed
    unsigned npass;   // global histogram passes done
    __device__ __forceinline__ void barrier() {
        ++nbar;
        group_barrier(g, nbar * (unsigned)split);
    }
};

// Radix select over keys >= floor (and, for MASS, the top-p target derived from the first
// pass's total): returns the threshold key. COUNT: the key of the target-th largest element.
// MASS: the largest key v with mass(key >= v) >= target.
template <typename T, bool CACHE, bool MASS>
__device__ uint32_t radix_select(const Row<T, CACHE> &row, Smem &sm, RowState &st, uint32_t floor,
                                 unsigned long long target, unsigned long long p_fx, float M,
                                 float temp) {
    const int tid = threadIdx.x;
    uint32_t prefix = 0;
    int known = 0;
    for (int d = 0; d < 3; ++d) {
        const int bits = d < 2 ? 11 : 10;
        const int shift = 32 - known - bits;
        for (int b = tid; b < BINS; b += THREADS) {
            sm.hcount[b] = 0;
            if (MASS) sm.hmass[b] = 0;
        }
        __syncthreads();
        row.each([&](int, float v, bool valid) {
            const uint32_t k = key_of(v);
            const bool in = valid && k >= floor && (known == 0 || (k >> (32 - known)) == prefix);
            unsigned long long q = 0;
            if (MASS && in) q = __float2ull_rz(__fmul_rn(exp_fl(__fdiv_rn(__fsub_rn(v, M), temp)),
                                                         1099511627776.0f));
            hist_add(sm, in ? (int)((k >> shift) & ((1u << bits) - 1)) : -1, q, MASS);
        });
        __syncthreads();
        if (st.split > 1) {
            GroupWs *g = st.g;
            const int buf = st.npass % 3;
            for (int b = tid; b < BINS; b += THREADS) {
                const unsigned cnt = sm.hcount[b];
                if (cnt) {
                    atomicAdd(&g->hcount[buf][b], cnt);
                    if (MASS && sm.hmass[b]) atomicAdd(&g->hmass[buf][b], sm.hmass[b]);
                }
            }
            st.barrier();
            if (st.npass >= 1) {  // every block has read the previous pass's buffer by now
                const int prev = (st.npass - 1) % 3;
                for (int b = st.c * THREADS + tid; b < BINS; b += st.split * THREADS) {
                    g->hcount[prev][b] = 0;
                    g->hmass[prev][b] = 0;
                }
            }
            ++st.npass;
            for (int b = tid; b < BINS; b += THREADS) {
                sm.hcount[b] = __ldcg(&g->hcount[buf][b]);
                if (MASS) sm.hmass[b] = __ldcg(&g->hmass[buf][b]);
            }
            __syncthreads();
        }
        if (MASS && d == 0) {
            unsigned long long s = 0;
            for (int b = tid; b < BINS; b += THREADS) s += sm.hmass[b];
            const unsigned long long total = block_sum_u64(s, sm);
            // ceil(total * p_fx / 2^32), at least 1
            unsigned long long t = mul_shr32(total, p_fx);
            if ((total * p_fx) & 0xffffffffull) ++t;
            target = t < 1 ? 1 : t;
        }
        if (MASS)
            find_crossing(sm.hmass, BINS, true, target, sm);
        else
            find_crossing(sm.hcount, BINS, true, target, sm);
        const int bin = sm.found_idx;
        if (bin < 0) return prefix << (32 - known);  // cannot happen; keeps what is settled
        target -= sm.found_before;
        prefix = (prefix << bits) | (uint32_t)bin;
        known += bits;
        const unsigned cnt = sm.hcount[bin];
        __syncthreads();  // sm is rewritten by the next digit
        if (cnt == 1 || (!MASS && cnt == target) || known == 32) break;
    }
    return known == 32 ? prefix : prefix << (32 - known);
}

template <typename T, bool CACHE>
__device__ void sample_row(const T *__restrict__ logits, int64_t row_idx, int vocab,
                           const fl_sampling_params *__restrict__ params,
                           const int32_t *__restrict__ steps, const uint8_t *__restrict__ finished,
                           int32_t pad_id, int32_t *__restrict__ tokens, GroupWs *g, int split,
                           int c, int chunk, Smem &sm, float *cache) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (finished && finished[row_idx]) {
        if (c == 0 && tid == 0) tokens[row_idx] = pad_id;
        return;
    }
    fl_sampling_params p{};
    bool greedy = true;
    if (params) {
        p = params[row_idx];
        greedy = !(p.temperature > 0.f);
    }
    Row<T, CACHE> row;
    row.x = logits + row_idx * (int64_t)vocab;
    row.cache = cache;
    row.beg = c * chunk;
    row.end = min(vocab, row.beg + chunk);
    RowState st{g, split, c, 0u, 0u};

    if (split > 1) {  // fresh histograms for this call (visible after the first barrier)
        for (int b = c * THREADS + tid; b < 3 * BINS; b += split * THREADS) {
            (&g->hcount[0][0])[b] = 0;
            (&g->hmass[0][0])[b] = 0;
        }
    }

    // ---- pass 0: max key with the lowest index; fills the cache
    unsigned long long best = 0;
    {
        const int beg = row.beg, end = row.end;
        for (int t = beg + warp * TILE; t < end; t += WARPS * TILE) {
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int i = t + j * 32 + lane;
                v[j] = i < end ? sanitize(to_f32(row.x[i])) : 0.f;
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int i = t + j * 32 + lane;
                if (i < end) {
                    if (CACHE) cache[i - beg] = v[j];
                    const unsigned long long cand =
                        ((unsigned long long)key_of(v[j]) << 32) | (0xffffffffu - (uint32_t)i);
                    best = cand > best ? cand : best;
                }
            }
        }
    }
    best = block_max_u64(best, sm);
    if (split > 1) {
        if (tid == 0) g->best[c] = best;
        st.barrier();
        unsigned long long b = 0;
        if (tid < split) b = __ldcg(&g->best[tid]);
        best = block_max_u64(b, sm);
    }
    __syncthreads();  // the cache is complete
    const uint32_t kmax = (uint32_t)(best >> 32);
    const int argmax = (int)(0xffffffffu - (uint32_t)best);
    const float M = float_of_key(kmax);

    if (greedy || M == -INFINITY) {
        if (c == 0 && tid == 0) tokens[row_idx] = argmax;
        if (split > 1) group_exit(g, split);
        return;
    }

    const float temp = p.temperature;
    uint32_t tau = 0;
    if (p.top_k > 0 && p.top_k < vocab)
        tau = radix_select<T, CACHE, false>(row, sm, st, 0u, (unsigned long long)p.top_k, 0ull, M,
                                            temp);
    if (p.top_p < 1.f) {
        const unsigned long long p_fx = __float2ull_rz(__fmul_rn(p.top_p, 4294967296.0f));
        const uint32_t tp = radix_select<T, CACHE, true>(row, sm, st, tau, 1ull, p_fx, M, temp);
        tau = tp > tau ? tp : tau;
    }

    // ---- sampling pass: kept masses per segment of consecutive tiles, in token order
    const float minp = p.min_p;
    const bool minp_on = minp > 0.f;
    auto qmass = [&](float v) -> unsigned long long {
        if (key_of(v) < tau) return 0ull;
        const float e = exp_fl(__fdiv_rn(__fsub_rn(v, M), temp));
        if (minp_on && e < minp) return 0ull;
        return __float2ull_rz(__fmul_rn(e, 1099511627776.0f));
    };
    const int n = row.end - row.beg;
    const int ntiles = (n + TILE - 1) / TILE;
    const int tps = (ntiles + BINS - 1) / BINS;  // tiles per segment
    const int nseg = (ntiles + tps - 1) / tps;
    for (int s = warp; s < nseg; s += WARPS) {
        unsigned long long acc = 0;
        const int t_end = min(ntiles, (s + 1) * tps);
        for (int t = s * tps; t < t_end; ++t) {
            const int base = row.beg + t * TILE;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int i = base + j * 32 + lane;
                if (i < row.end) acc += qmass(row.load(i));
            }
        }
        acc = warp_sum_u64(acc);
        if (lane == 0) sm.hmass[s] = acc;
    }
    __syncthreads();
    unsigned long long mine = 0;
    for (int s = tid; s < nseg; s += THREADS) mine += sm.hmass[s];
    const unsigned long long block_total = block_sum_u64(mine, sm);
    unsigned long long before = 0, kept_total = block_total;
    if (split > 1) {
        if (tid == 0) g->mass[c] = block_total;
        st.barrier();
        if (tid == 0) {
            unsigned long long b = 0, tot = 0;
            for (int cc = 0; cc < split; ++cc) {
                const unsigned long long m = __ldcg(&g->mass[cc]);
                if (cc < c) b += m;
                tot += m;
            }
            sm.bcast[0] = b;
            sm.bcast[1] = tot;
        }
        __syncthreads();
        before = sm.bcast[0];
        kept_total = sm.bcast[1];
    }
    const U4 words = row_words(p, steps, row_idx);
    const unsigned long long target = mul_shr32(kept_total, (unsigned long long)words.x);
    if (kept_total == 0) {  // cannot happen (the max token has mass 2^40); stay defined
        if (c == 0 && tid == 0) tokens[row_idx] = argmax;
    } else if (target >= before && target < before + block_total) {
        const unsigned long long t_local = target - before;
        find_crossing(sm.hmass, nseg, false, t_local + 1, sm);
        const int s = sm.found_idx;
        if (warp == 0) {
            int token = -1;
            if (s >= 0) {
                const unsigned long long t_seg = t_local - sm.found_before;
                unsigned long long cum = 0;
                const int t_end = min(ntiles, (s + 1) * tps);
                for (int t = s * tps; t < t_end && token < 0; ++t) {
                    const int base = row.beg + t * TILE;
                    for (int j = 0; j < 8 && token < 0; ++j) {
                        const int i = base + j * 32 + lane;
                        const unsigned long long q = i < row.end ? qmass(row.load(i)) : 0ull;
                        const unsigned long long inc = warp_incl_scan_u64(q);
                        const unsigned hit = __ballot_sync(FULL, cum + inc > t_seg);
                        if (hit) token = base + j * 32 + (__ffs(hit) - 1);
                        cum += __shfl_sync(FULL, inc, 31);
                    }
                }
            }
            if (lane == 0) tokens[row_idx] = token >= 0 ? token : argmax;
        }
    }
    if (split > 1) group_exit(g, split);
}

template <typename T, bool CACHE>
__global__ void __launch_bounds__(THREADS, 2)
    sample_kernel(const T *__restrict__ logits, int64_t batch, int vocab,
                  const fl_sampling_params *__restrict__ params, const int32_t *__restrict__ steps,
                  const uint8_t *__restrict__ finished, int32_t pad_id, int32_t *__restrict__ tokens,
                  GroupWs *ws, int split, int chunk) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem &sm = *reinterpret_cast<Smem *>(smem_raw);
    float *cache = reinterpret_cast<float *>(smem_raw + sizeof(Smem));
    const int c = (int)(blockIdx.x % (unsigned)split);
    const int64_t group = blockIdx.x / (unsigned)split;
    const int64_t ngroups = gridDim.x / (unsigned)split;
    for (int64_t r = group; r < batch; r += ngroups) {
        sample_row<T, CACHE>(logits, r, vocab, params, steps, finished, pad_id, tokens,
                             split > 1 ? ws + group : nullptr, split, c, chunk, sm, cache);
        __syncthreads();  // shared memory is reused by the next row
    }
}

constexpr size_t SMEM_BASE = (sizeof(Smem) + 15) / 16 * 16;
constexpr size_t SMEM_CACHED = SMEM_BASE + CACHE_ELEMS * sizeof(float);

// Blocks of each variant that fit on one SM, and the SM count, per device (computed once).
struct Occupancy {
    int sms, cached, uncached;
    bool split_allowed;
};
constexpr int MAX_DEVICES = 64;

template <typename T> fl_status occupancy(Occupancy &out) {
    static std::atomic<int> ready[MAX_DEVICES];
    static Occupancy table[MAX_DEVICES];
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return (fl_status)e;
    if (dev >= 0 && dev < MAX_DEVICES && ready[dev].load(std::memory_order_acquire)) {
        out = table[dev];
        return FL_OK;
    }
    Occupancy o{};
    o.split_allowed = true;
    e = cudaDeviceGetAttribute(&o.sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(sample_kernel<T, true>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM_CACHED);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o.cached, sample_kernel<T, true>,
                                                          THREADS, SMEM_CACHED);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o.uncached, sample_kernel<T, false>,
                                                          THREADS, SMEM_BASE);
    if (e != cudaSuccess) return (fl_status)e;
    // Escape hatch: FL_SAMPLING_NO_SPLIT=1 never splits a row over blocks (no grid barriers),
    // e.g. where SMs are partitioned between processes and co-residency cannot be assumed.
    const char *no_split = getenv("FL_SAMPLING_NO_SPLIT");
    if (no_split && no_split[0] && no_split[0] != '0') o.split_allowed = false;
    if (dev >= 0 && dev < MAX_DEVICES) {
        table[dev] = o;
        ready[dev].store(1, std::memory_order_release);
    }
    out = o;
    return FL_OK;
}

inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

template <typename T>
fl_status sample(const T *logits, int64_t batch, int vocab, const fl_sampling_params *params,
                 const int32_t *steps, const uint8_t *finished, int32_t pad_id, int32_t *tokens,
                 void *workspace, int64_t workspace_bytes, cudaStream_t s) {
    Occupancy occ;
    fl_status st = occupancy<T>(occ);
    if (st != FL_OK) return st;
    const int64_t cap_cached = (int64_t)occ.cached * occ.sms;
    const int64_t cap_uncached = (int64_t)occ.uncached * occ.sms;
    const int64_t max_useful = ceil_div(vocab, MIN_CHUNK);
    bool cached = false;
    int64_t split = 1;
    if (batch <= FL_SAMPLING_MAX_SPLIT_ROWS && occ.split_allowed) {
        const int64_t need = ceil_div(vocab, CACHE_ELEMS);
        if (need <= MAX_SPLIT && batch * need <= cap_cached) {
            cached = true;
            int64_t want = cap_cached / batch;
            want = want < max_useful ? want : max_useful;
            want = want < MAX_SPLIT ? want : MAX_SPLIT;
            split = want > need ? want : need;
        } else {
            int64_t want = cap_uncached / batch;
            want = want < max_useful ? want : max_useful;
            want = want < MAX_SPLIT ? want : MAX_SPLIT;
            split = want > 1 ? want : 1;
        }
    }
    if (split <= 1) {
        split = 1;
        cached = vocab <= CACHE_ELEMS;
    }
    int64_t chunk = round_up(ceil_div(vocab, split), TILE);
    split = ceil_div(vocab, chunk);
    if (split > 1) {
        const int64_t need = batch * (int64_t)sizeof(GroupWs);
        if (!workspace || workspace_bytes < need) return FL_ERR_INVALID_ARGUMENT;
    }
    const int64_t grid = batch * split;
    if (grid > 0x7fffffffLL) return FL_ERR_INVALID_ARGUMENT;
    GroupWs *ws = static_cast<GroupWs *>(workspace);
    if (cached) {
        // the attribute was set when the occupancy was computed (once per device)
        sample_kernel<T, true><<<(unsigned)grid, THREADS, SMEM_CACHED, s>>>(
            logits, batch, vocab, params, steps, finished, pad_id, tokens, ws, (int)split,
            (int)chunk);
    } else {
        sample_kernel<T, false><<<(unsigned)grid, THREADS, SMEM_BASE, s>>>(
            logits, batch, vocab, params, steps, finished, pad_id, tokens, ws, (int)split,
            (int)chunk);
    }
    return launch_status();
}

// ---------------------------------------------------------------- logits processors

template <typename T>
__global__ void __launch_bounds__(512)
    process_kernel(T *__restrict__ logits, int64_t batch, int vocab,
                   const fl_sampling_params *__restrict__ params, const int32_t *__restrict__ history,
                   const int32_t *__restrict__ history_lens, int64_t max_history,
                   const int32_t *__restrict__ banned, int64_t max_banned,
                   const int32_t *__restrict__ lengths, const int32_t *__restrict__ end_ids,
                   int64_t n_end_ids, int *__restrict__ counts) {
    int *cnt = counts ? counts + (int64_t)blockIdx.x * vocab : nullptr;
    for (int64_t r = blockIdx.x; r < batch; r += gridDim.x) {
        T *x = logits + r * (int64_t)vocab;
        const fl_sampling_params p = params[r];
        const bool pen = p.repetition_penalty != 1.f || p.presence_penalty != 0.f ||
                         p.frequency_penalty != 0.f;
        if (history && cnt && pen) {
            int64_t n = history_lens[r];
            n = n < 0 ? 0 : (n > max_history ? max_history : n);
            const int32_t *h = history + r * max_history;
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
                const int t = h[j];
                if (t >= 0 && t < vocab) atomicAdd(&cnt[t], 1);
            }
            __syncthreads();
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
                const int t = h[j];
                if (t < 0 || t >= vocab) continue;
                const int k = atomicExch(&cnt[t], 0);  // one winner per distinct token
                if (k > 0) {
                    float v = to_f32(x[t]);
                    v = v > 0.f ? __fdiv_rn(v, p.repetition_penalty)
                                : __fmul_rn(v, p.repetition_penalty);
                    v = __fsub_rn(v, __fmaf_rn(p.frequency_penalty, (float)k, p.presence_penalty));
                    x[t] = from_f32<T>(v);
                }
            }
            __syncthreads();
        }
        if (banned) {
            const int32_t *bl = banned + r * max_banned;
            for (int64_t j = threadIdx.x; j < max_banned; j += blockDim.x) {
                const int t = bl[j];
                if (t >= 0 && t < vocab) x[t] = from_f32<T>(-INFINITY);
            }
        }
        if (end_ids && (lengths ? lengths[r] : 0) < p.min_new_tokens) {
            for (int64_t j = threadIdx.x; j < n_end_ids; j += blockDim.x) {
                const int t = end_ids[j];
                if (t >= 0 && t < vocab) x[t] = from_f32<T>(-INFINITY);
            }
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------- bookkeeping

__global__ void __launch_bounds__(1024)
    decode_update_kernel(int32_t *__restrict__ tokens, uint8_t *__restrict__ finished,
                         int32_t *__restrict__ lengths, int64_t batch,
                         const fl_sampling_params *__restrict__ params,
                         const int32_t *__restrict__ end_ids, int64_t n_end_ids, int32_t pad_id,
                         int32_t *__restrict__ history, int64_t max_history,
                         int32_t *__restrict__ all_finished) {
    __shared__ float scratch[32];
    float unfinished = 0.f;  // counts up to 2^24 exactly; only == 0 matters
    for (int64_t r = threadIdx.x; r < batch; r += blockDim.x) {
        if (finished[r]) {
            tokens[r] = pad_id;
            continue;
        }
        const int32_t tok = tokens[r];
        int32_t len = lengths[r];
        if (history && len >= 0 && len < max_history) history[r * max_history + len] = tok;
        len += 1;
        lengths[r] = len;
        bool done = false;
        for (int64_t j = 0; j < n_end_ids; ++j) done |= tok == end_ids[j];
        if (params && params[r].max_new_tokens > 0 && len >= params[r].max_new_tokens) done = true;
        if (done)
            finished[r] = 1;
        else
            unfinished = 1.f;
    }
    unfinished = block_max(unfinished, scratch);
    if (threadIdx.x == 0 && all_finished) all_finished[0] = unfinished == 0.f ? 1 : 0;
}

__global__ void philox_kernel(const fl_sampling_params *__restrict__ params,
                              const int32_t *__restrict__ steps, int64_t batch,
                              uint32_t *__restrict__ out) {
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < batch;
         r += (int64_t)gridDim.x * blockDim.x) {
        const U4 w = row_words(params[r], steps, r);
        out[r * 4 + 0] = w.x;
        out[r * 4 + 1] = w.y;
        out[r * 4 + 2] = w.z;
        out[r * 4 + 3] = w.w;
    }
}

}  // namespace smp
}  // namespace fl

static_assert(sizeof(fl_sampling_params) == 64, "fl_sampling_params is 16 words");

extern "C" int64_t fl_sample_workspace_size(int64_t batch, int64_t vocab) {
    if (batch < 0 || vocab < 1 || vocab > FL_SAMPLING_MAX_VOCAB) return -1;
    if (batch > FL_SAMPLING_MAX_SPLIT_ROWS || vocab <= fl::smp::MIN_CHUNK) return 0;
    return batch * (int64_t)sizeof(fl::smp::GroupWs);
}

extern "C" fl_status fl_sample(fl_dtype dtype, const void *logits, int64_t batch, int64_t vocab,
                               const fl_sampling_params *params, const int32_t *steps,
                               const uint8_t *finished, int32_t pad_id, int32_t *tokens,
                               void *workspace, int64_t workspace_bytes, fl_stream stream) {
    if (batch < 0 || vocab < 1 || vocab > FL_SAMPLING_MAX_VOCAB) return FL_ERR_INVALID_ARGUMENT;
    if (batch == 0) return FL_OK;
    if (!logits || !tokens) return FL_ERR_INVALID_ARGUMENT;
    FL_DISPATCH_FLOAT(dtype, return fl::smp::sample<scalar_t>(
                                 static_cast<const scalar_t *>(logits), batch, (int)vocab, params,
                                 steps, finished, pad_id, tokens, workspace, workspace_bytes,
                                 fl::as_stream(stream)));
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" int64_t fl_penalty_workspace_size(int64_t vocab) {
    if (vocab < 1 || vocab > FL_SAMPLING_MAX_VOCAB) return -1;
    return (int64_t)FL_PENALTY_ROWS * vocab * (int64_t)sizeof(int);
}

extern "C" fl_status fl_process_logits(fl_dtype dtype, void *logits, int64_t batch, int64_t vocab,
                                       const fl_sampling_params *params, const int32_t *history,
                                       const int32_t *history_lens, int64_t max_history,
                                       const int32_t *banned, int64_t max_banned,
                                       const int32_t *lengths, const int32_t *end_ids,
                                       int64_t n_end_ids, void *workspace, int64_t workspace_bytes,
                                       fl_stream stream) {
    if (batch < 0 || vocab < 1 || vocab > FL_SAMPLING_MAX_VOCAB || max_history < 0 ||
        max_banned < 0 || n_end_ids < 0)
        return FL_ERR_INVALID_ARGUMENT;
    if (batch == 0) return FL_OK;
    if (!logits || !params) return FL_ERR_INVALID_ARGUMENT;
    if (history && max_history == 0) history = nullptr;
    if (banned && max_banned == 0) banned = nullptr;
    if (end_ids && n_end_ids == 0) end_ids = nullptr;
    if (history) {
        if (!history_lens || !workspace ||
            workspace_bytes < (int64_t)FL_PENALTY_ROWS * vocab * (int64_t)sizeof(int))
            return FL_ERR_INVALID_ARGUMENT;
    }
    const int64_t rows = history ? FL_PENALTY_ROWS : 4096;
    const unsigned grid = (unsigned)(batch < rows ? batch : rows);
    FL_DISPATCH_FLOAT(dtype, {
        fl::smp::process_kernel<scalar_t><<<grid, 512, 0, fl::as_stream(stream)>>>(
            static_cast<scalar_t *>(logits), batch, (int)vocab, params, history, history_lens,
            max_history, banned, max_banned, lengths, end_ids, n_end_ids,
            history ? static_cast<int *>(workspace) : nullptr);
        return fl::launch_status();
    });
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_decode_update(int32_t *tokens, uint8_t *finished, int32_t *lengths,
                                      int64_t batch, const fl_sampling_params *params,
                                      const int32_t *end_ids, int64_t n_end_ids, int32_t pad_id,
                                      int32_t *history, int64_t max_history,
                                      int32_t *all_finished, fl_stream stream) {
    if (batch < 0 || n_end_ids < 0 || max_history < 0) return FL_ERR_INVALID_ARGUMENT;
    if (batch > 0 && (!tokens || !finished || !lengths)) return FL_ERR_INVALID_ARGUMENT;
    if (n_end_ids > 0 && !end_ids) return FL_ERR_INVALID_ARGUMENT;
    if (batch == 0 && !all_finished) return FL_OK;
    fl::smp::decode_update_kernel<<<1, 1024, 0, fl::as_stream(stream)>>>(
        tokens, finished, lengths, batch, params, end_ids, n_end_ids, pad_id,
        max_history > 0 ? history : nullptr, max_history, all_finished);
    return fl::launch_status();
}

extern "C" fl_status fl_philox_words(const fl_sampling_params *params, const int32_t *steps,
                                     int64_t batch, uint32_t *out, fl_stream stream) {
    if (batch < 0 || (batch > 0 && (!params || !out))) return FL_ERR_INVALID_ARGUMENT;
    if (batch == 0) return FL_OK;
    fl::smp::philox_kernel<<<fl::grid_for(batch, 256), 256, 0, fl::as_stream(stream)>>>(
        params, steps, batch, out);
    return fl::launch_status();
}
