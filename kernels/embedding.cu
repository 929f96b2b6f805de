// Embedding lookup: a row gather out[i] = table[ids[i]] with the ids checked on the device.
// Memory-bound raw copy (no arithmetic, so bit-exact for every dtype), in 16-byte words when
// pointers and the row size allow (else 8/4/2/1-byte words). Two kernels:
//  - tiles: blocks of 256 threads laid out as R rows x tpr threads (tpr a multiple
//    of 32, so a warp never straddles rows); each thread moves U words of its row (U = 8, 4,
//    2 or 1: the largest that still gives >= 2 blocks per SM), all U loads issued before the
//    stores; table rows read through the non-coherent path without L1 allocation. At 4096
//    tokens x 4096 f16 this is 8 x 16 = 128 bytes in flight per thread, 4 rows per block,
//    one id load per warp: a quarter of the blocks (and id -> row dependent-load chains) of
//    the rows kernel, twice the bytes in flight per thread (48 registers: 5 blocks per SM,
//    160 KB in flight per SM against the rows kernel's 2048 threads x 64 B = 128 KB).
//  - rows (default): one block per (token, chunk of the row), 4 words per thread
//    (fl::copy_row_chunk, shared with padding.cu). Measured on the H100 it beats tiles at
//    4096 x 4096 f16 (26.4 vs 27.3 us) and 65536 x 4096 (98% vs 95% of copy).
// Override (read once per process, for A/B runs; every choice is bit-exact):
// FL_EMBEDDING_PATH = rows | tiles | tiles_cs (tiles with streaming, evict-first stores).
// fl_embedding_lookup_path selects the same per call (tests).
#include <cstdlib>
#include <cstring>

#include "common/common.cuh"

namespace fl {
namespace embedding_detail {

constexpr int kTileThreads = 256;

template <typename W>
__global__ void embedding_rows_kernel(const int32_t *__restrict__ ids, const W *__restrict__ table,
                                      int64_t vocab, int64_t row_words, W *__restrict__ out,
                                      int32_t *status, uint32_t nonce, int32_t limit) {
    const int64_t row = blockIdx.x;
    const int32_t id = ids[row];
    const bool ok = id >= 0 && (int64_t)id < vocab;
    if (!ok && status && blockIdx.y == 0 && threadIdx.x == 0)
        record_failure(status, nonce, FL_CHECK_TOKEN_ID, row, id, limit);
    // A bad id reads nothing: its output row is zero.
    copy_row_chunk<W>(ok ? table + (int64_t)id * row_words : nullptr, out + row * row_words,
                      row_words);
}

// A table word: 16-byte words through the non-coherent path, not allocated in L1 (the
// table is read-only here and rows are rarely re-read by the same SM).
template <typename W> __device__ __forceinline__ W ld_table(const W *p) {
    if constexpr (sizeof(W) == 16) {
        uint4 r;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(p));
        W w;
        memcpy(&w, &r, 16);
        return w;
    } else {
        return __ldg(p);
    }
}

// grid (ceil(n / R), chunks), block (tpr, R): row = blockIdx.x * R + threadIdx.y; thread x
// of the row moves words c * tpr * U + x + u * tpr (u < U) of chunk c = blockIdx.y. A warp
// lies within one row (tpr is a multiple of 32), so the id branch is uniform per warp.
// Offsets within a row are 32-bit (the host takes this kernel for row_words < 2^31).
template <typename W, int U, bool CS>
__global__ void __launch_bounds__(kTileThreads)
    embedding_tiles_kernel(const int32_t *__restrict__ ids, const W *__restrict__ table,
                           int64_t vocab, int64_t row_words, int64_t n, W *__restrict__ out,
                           int32_t *status, uint32_t nonce, int32_t limit) {
    const int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= n) return;
    const int tpr = (int)blockDim.x;
    const int base = (int)blockIdx.y * tpr * U + (int)threadIdx.x;
    // Words of this thread that lie in the row: u < cnt (cnt <= 0 past the row's end).
    const int left = (int)row_words - base;
    const int cnt = left <= 0 ? 0 : (left + tpr - 1) / tpr;
    const int32_t id = __ldg(ids + row);
    W *q = out + row * row_words + base;
    if (id >= 0 && (int64_t)id < vocab) {
        const W *p = table + (int64_t)id * row_words + base;
        W r[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (u < cnt) r[u] = ld_table(p + u * tpr);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (u < cnt) {
                if constexpr (CS)
                    __stcs(q + u * tpr, r[u]);
                else
                    q[u * tpr] = r[u];
            }
        }
    } else {
        // A bad id reads nothing: its output row is zero.
        if (status && blockIdx.y == 0 && threadIdx.x == 0)
            record_failure(status, nonce, FL_CHECK_TOKEN_ID, row, id, limit);
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (u < cnt) q[u * tpr] = W{};
    }
}

// The path forced by FL_EMBEDDING_PATH (read once; AUTO when unset or unknown).
inline int env_path() {
    static const EnvChoice choices[] = {{"rows", FL_EMBEDDING_PATH_ROWS},
                                        {"tiles", FL_EMBEDDING_PATH_TILES},
                                        {"tiles_cs", FL_EMBEDDING_PATH_TILES_STREAM}};
    static const int v = env_choice("FL_EMBEDDING_PATH", choices, FL_EMBEDDING_PATH_AUTO);
    return v;
}

// Tiles launch shape for U words per thread; false when it does not fit a grid.
inline bool tiles_shape(int64_t n, int64_t row_words, int u, dim3 *grid, dim3 *block,
                        int64_t *blocks) {
    int64_t tpr, rpb, chunks;
    if (row_words >= (int64_t)kTileThreads * u) {
        tpr = kTileThreads;
        rpb = 1;
        chunks = ceil_div(row_words, (int64_t)kTileThreads * u);
    } else {
        tpr = ceil_div(ceil_div(row_words, u), 32) * 32;  // <= kTileThreads
        rpb = kTileThreads / tpr;
        chunks = 1;
    }
    const int64_t gx = ceil_div(n, rpb);
    if (chunks > 65535 || gx > 0x7fffffffLL || row_words > 0x7fffffffLL) return false;
    *grid = dim3((unsigned)gx, (unsigned)chunks, 1);
    *block = dim3((unsigned)tpr, (unsigned)rpb, 1);
    *blocks = gx * chunks;
    return true;
}

template <typename W, bool CS>
fl_status launch_tiles(const int32_t *ids, const W *table, int64_t vocab, int64_t row_words,
                       int64_t n, W *out, int32_t *status, uint32_t nonce, int32_t limit,
                       cudaStream_t s) {
    // The largest U in {8, 4, 2, 1} with >= 2 blocks per SM; else the smallest that fits.
    const int64_t want = 2 * (int64_t)sm_count();
    dim3 grid, block;
    int64_t blocks = 0;
    int u = 0;
    for (int c : {8, 4, 2, 1}) {
        dim3 g, b;
        int64_t nb = 0;
        if (!tiles_shape(n, row_words, c, &g, &b, &nb)) continue;
        if (u == 0 || blocks < want) {  // first that fits, or a smaller U for more blocks
            grid = g;
            block = b;
            blocks = nb;
            u = c;
        }
    }
    switch (u) {
    case 8: embedding_tiles_kernel<W, 8, CS><<<grid, block, 0, s>>>(ids, table, vocab, row_words, n, out, status, nonce, limit); break;
    case 4: embedding_tiles_kernel<W, 4, CS><<<grid, block, 0, s>>>(ids, table, vocab, row_words, n, out, status, nonce, limit); break;
    case 2: embedding_tiles_kernel<W, 2, CS><<<grid, block, 0, s>>>(ids, table, vocab, row_words, n, out, status, nonce, limit); break;
    case 1: embedding_tiles_kernel<W, 1, CS><<<grid, block, 0, s>>>(ids, table, vocab, row_words, n, out, status, nonce, limit); break;
    default: return FL_ERR_INVALID_ARGUMENT;  // a row too long for any grid
    }
    return launch_status();
}

}  // namespace embedding_detail
}  // namespace fl

extern "C" fl_status fl_embedding_lookup_path(fl_dtype dtype, const int32_t *ids, int64_t n,
                                              const void *table, int64_t vocab, int64_t hidden,
                                              void *out, int32_t *status, uint32_t status_nonce,
                                              int32_t path, fl_stream stream) {
    using namespace fl::embedding_detail;
    if (n < 0 || n > 0x7fffffffLL || vocab < 0 || hidden < 1) return FL_ERR_INVALID_ARGUMENT;
    if (path < FL_EMBEDDING_PATH_AUTO || path > FL_EMBEDDING_PATH_TILES_STREAM)
        return FL_ERR_INVALID_ARGUMENT;
    if (n > 0 && (!ids || !out || (vocab > 0 && !table))) return FL_ERR_INVALID_ARGUMENT;
    if (status && status_nonce == 0) return FL_ERR_INVALID_ARGUMENT;
    if (status && (reinterpret_cast<uintptr_t>(status) & 7u)) return FL_ERR_MISALIGNED;
    int64_t elem = 0;
    switch (dtype) {
    case FL_DTYPE_F32: elem = 4; break;
    case FL_DTYPE_F16:
    case FL_DTYPE_BF16: elem = 2; break;
    default: return FL_ERR_UNSUPPORTED_DTYPE;
    }
    if (n == 0) return FL_OK;
    if (hidden > INT64_MAX / elem) return FL_ERR_INVALID_ARGUMENT;
    const int64_t row_bytes = hidden * elem;
    // With vocab == 0 every id is bad and the table is never read.
    const int wb = fl::row_word_bytes(vocab > 0 ? table : out, out, row_bytes);
    const int64_t row_words = row_bytes / wb;
    const int32_t limit = vocab > 0x7fffffffLL ? 0x7fffffff : (int32_t)vocab;
    cudaStream_t s = fl::as_stream(stream);
    if (path == FL_EMBEDDING_PATH_AUTO) path = env_path();
    // rows measured faster than tiles at every n >= 64 on the H100 (bench/RESULTS.md).
    if (path == FL_EMBEDDING_PATH_AUTO) path = FL_EMBEDDING_PATH_ROWS;
    if (path == FL_EMBEDDING_PATH_ROWS) {
        dim3 grid, block;
        if (!fl::row_grid(n, row_words, &grid, &block)) return FL_ERR_INVALID_ARGUMENT;
        FL_DISPATCH_WORD(wb, embedding_rows_kernel<word_t><<<grid, block, 0, s>>>(
                                 ids, static_cast<const word_t *>(table), vocab, row_words,
                                 static_cast<word_t *>(out), status, status_nonce, limit));
        return fl::launch_status();
    }
    const bool cs = path == FL_EMBEDDING_PATH_TILES_STREAM;
    FL_DISPATCH_WORD(wb, {
        const word_t *tw = static_cast<const word_t *>(table);
        word_t *ow = static_cast<word_t *>(out);
        if (cs)
            return launch_tiles<word_t, true>(ids, tw, vocab, row_words, n, ow, status,
                                              status_nonce, limit, s);
        return launch_tiles<word_t, false>(ids, tw, vocab, row_words, n, ow, status,
                                           status_nonce, limit, s);
    });
    return FL_ERR_INVALID_ARGUMENT;  // not reached: FL_DISPATCH_WORD covers every width
}

extern "C" fl_status fl_embedding_lookup(fl_dtype dtype, const int32_t *ids, int64_t n,
                                         const void *table, int64_t vocab, int64_t hidden,
                                         void *out, int32_t *status, uint32_t status_nonce,
                                         fl_stream stream) {
    return fl_embedding_lookup_path(dtype, ids, n, table, vocab, hidden, out, status,
                                    status_nonce, FL_EMBEDDING_PATH_AUTO, stream);
}
