// Embedding lookup: a row gather out[i] = table[ids[i]] with the ids checked on the device.
// Memory-bound raw copy (no arithmetic, so bit-exact for every dtype), in 16-byte words when
// pointers and the row size allow (else 8/4/2/1-byte words): one block per (token, chunk of
// the row), 4 words per thread (fl::copy_row_chunk, shared with padding.cu). A tiled kernel
// with more bytes in flight per thread lost to it (kernels/experiments/embedding.md).
#include "common/common.cuh"

namespace fl {
namespace embedding_detail {

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

}  // namespace embedding_detail
}  // namespace fl

extern "C" fl_status fl_embedding_lookup(fl_dtype dtype, const int32_t *ids, int64_t n,
                                         const void *table, int64_t vocab, int64_t hidden,
                                         void *out, int32_t *status, uint32_t status_nonce,
                                         fl_stream stream) {
    using namespace fl::embedding_detail;
    if (n < 0 || n > 0x7fffffffLL || vocab < 0 || hidden < 1) return FL_ERR_INVALID_ARGUMENT;
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
    dim3 grid, block;
    if (!fl::row_grid(n, row_words, &grid, &block)) return FL_ERR_INVALID_ARGUMENT;
    FL_DISPATCH_WORD(wb, embedding_rows_kernel<word_t><<<grid, block, 0, s>>>(
                             ids, static_cast<const word_t *>(table), vocab, row_words,
                             static_cast<word_t *>(out), status, status_nonce, limit));
    return fl::launch_status();
}
