// Ragged batches without padding (Effective Transformer, FasterTransformer v2.1):
// the packed layout (cu_seqlens, token -> padded-row map, total) built on the device from
// the sequence lengths, and the two row gathers between [batch, max_len, hidden] and
// [total, hidden]. The gathers are raw row copies (bit-exact), 16-byte words when possible.
#include "common/common.cuh"

namespace fl {

constexpr int kOffsetsThreads = 256;
constexpr int kOffsetsMaxBlocks = 256;

// Every block scans all lengths (batch <= FL_PADDING_MAX_BATCH, a few KB read from L2) into
// shared memory; block 0 writes cu_seqlens and total and records bad lengths; then the blocks
// share the token map, one sequence at a time.
__global__ void __launch_bounds__(kOffsetsThreads)
    padding_offsets_kernel(const int32_t *__restrict__ lengths, int32_t batch, int32_t max_len,
                           int32_t *__restrict__ cu_out, int32_t *__restrict__ map,
                           int64_t capacity, int32_t *__restrict__ total_out, int32_t *status,
                           uint32_t nonce) {
    __shared__ int32_t cu[FL_PADDING_MAX_BATCH + 1];
    __shared__ int32_t warp_incl[kOffsetsThreads / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int nwarps = kOffsetsThreads / 32;

    int32_t carry = 0;  // sum of the lengths of the tiles before this one (same in all threads)
    for (int base = 0; base < batch; base += kOffsetsThreads) {
        const int i = base + tid;
        int32_t len = 0;
        if (i < batch) {
            const int32_t raw = lengths[i];
            len = raw < 0 ? 0 : (raw > max_len ? max_len : raw);
            if (len != raw && status && blockIdx.x == 0)
                record_failure(status, nonce, FL_CHECK_SEQ_LEN, i, raw, max_len);
        }
        int32_t x = len;  // inclusive scan within the warp
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) warp_incl[warp] = x;
        __syncthreads();
        if (warp == 0) {  // inclusive scan of the warp totals
            int32_t w = lane < nwarps ? warp_incl[lane] : 0;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int32_t y = __shfl_up_sync(0xffffffffu, w, o);
                if (lane >= o) w += y;
            }
            if (lane < nwarps) warp_incl[lane] = w;
        }
        __syncthreads();
        if (i < batch) cu[i + 1] = carry + (warp > 0 ? warp_incl[warp - 1] : 0) + x;
        carry += warp_incl[nwarps - 1];
        __syncthreads();  // warp_incl is rewritten by the next tile
    }
    if (tid == 0) cu[0] = 0;
    __syncthreads();

    if (blockIdx.x == 0) {
        for (int i = tid; i <= batch; i += kOffsetsThreads) cu_out[i] = cu[i];
        if (tid == 0) total_out[0] = carry;
    }
    for (int b = blockIdx.x; b < batch; b += gridDim.x) {
        const int32_t start = cu[b], len = cu[b + 1] - start;
        const int32_t row0 = b * max_len;  // < 2^31: batch * max_len checked by the launcher
        for (int t = tid; t < len; t += kOffsetsThreads) {
            const int64_t k = (int64_t)start + t;
            if (k < capacity) map[k] = row0 + t;
        }
    }
}

template <typename W>
__global__ void remove_padding_kernel(const W *__restrict__ padded, int64_t padded_rows,
                                      const int32_t *__restrict__ map,
                                      const int32_t *__restrict__ total, W *__restrict__ packed,
                                      int64_t row_words) {
    const int64_t row = blockIdx.x;
    if (total && row >= (int64_t)total[0]) return;
    const int32_t src = map[row];
    const bool ok = src >= 0 && (int64_t)src < padded_rows;
    copy_row_chunk<W>(ok ? padded + (int64_t)src * row_words : nullptr, packed + row * row_words,
                      row_words);
}

template <typename W>
__global__ void rebuild_padding_kernel(const W *__restrict__ packed, int64_t packed_rows,
                                       const int32_t *__restrict__ cu, int32_t max_len,
                                       W *__restrict__ padded, int64_t row_words) {
    const int64_t row = blockIdx.x;  // b * max_len + t
    const int32_t b = (int32_t)(row / max_len), t = (int32_t)(row - (int64_t)b * max_len);
    const int32_t start = cu[b], len = cu[b + 1] - start;
    const int64_t src = (int64_t)start + t;
    const bool ok = t < len && src >= 0 && src < packed_rows;
    copy_row_chunk<W>(ok ? packed + src * row_words : nullptr, padded + row * row_words,
                      row_words);
}

inline int64_t float_size(fl_dtype dtype) {
    switch (dtype) {
    case FL_DTYPE_F32: return 4;
    case FL_DTYPE_F16:
    case FL_DTYPE_BF16: return 2;
    default: return 0;
    }
}

}  // namespace fl

extern "C" fl_status fl_padding_offsets(const int32_t *lengths, int32_t batch, int32_t max_len,
                                        int32_t *cu_seqlens, int32_t *token_map,
                                        int64_t map_capacity, int32_t *total, int32_t *status,
                                        uint32_t status_nonce, fl_stream stream) {
    if (batch < 0 || batch > FL_PADDING_MAX_BATCH || max_len < 0 || map_capacity < 0)
        return FL_ERR_INVALID_ARGUMENT;
    if ((int64_t)batch * max_len > 0x7fffffffLL) return FL_ERR_INVALID_ARGUMENT;
    if (!cu_seqlens || !total || (batch > 0 && !lengths) || (map_capacity > 0 && !token_map))
        return FL_ERR_INVALID_ARGUMENT;
    if (status && status_nonce == 0) return FL_ERR_INVALID_ARGUMENT;
    if (status && (reinterpret_cast<uintptr_t>(status) & 7u)) return FL_ERR_MISALIGNED;
    const int blocks = batch < 1 ? 1 : (batch > fl::kOffsetsMaxBlocks ? fl::kOffsetsMaxBlocks : batch);
    fl::padding_offsets_kernel<<<blocks, fl::kOffsetsThreads, 0, fl::as_stream(stream)>>>(
        lengths, batch, max_len, cu_seqlens, token_map, map_capacity, total, status,
        status_nonce);
    return fl::launch_status();
}

extern "C" fl_status fl_remove_padding(fl_dtype dtype, const void *padded, int32_t batch,
                                       int32_t max_len, int64_t hidden,
                                       const int32_t *token_map, const int32_t *total,
                                       int64_t packed_rows, void *packed, fl_stream stream) {
    const int64_t elem = fl::float_size(dtype);
    if (elem == 0) return FL_ERR_UNSUPPORTED_DTYPE;
    if (batch < 0 || max_len < 0 || hidden < 1 || packed_rows < 0 || packed_rows > 0x7fffffffLL)
        return FL_ERR_INVALID_ARGUMENT;
    const int64_t padded_rows = (int64_t)batch * max_len;
    if (padded_rows > 0x7fffffffLL || hidden > INT64_MAX / elem) return FL_ERR_INVALID_ARGUMENT;
    if (packed_rows == 0) return FL_OK;
    if (!token_map || !packed || (padded_rows > 0 && !padded)) return FL_ERR_INVALID_ARGUMENT;
    const int64_t row_bytes = hidden * elem;
    const int wb = fl::row_word_bytes(padded_rows > 0 ? padded : packed, packed, row_bytes);
    const int64_t row_words = row_bytes / wb;
    dim3 grid, block;
    if (!fl::row_grid(packed_rows, row_words, &grid, &block)) return FL_ERR_INVALID_ARGUMENT;
    FL_DISPATCH_WORD(wb, fl::remove_padding_kernel<word_t><<<grid, block, 0, fl::as_stream(stream)>>>(
                             static_cast<const word_t *>(padded), padded_rows, token_map, total,
                             static_cast<word_t *>(packed), row_words));
    return fl::launch_status();
}

extern "C" fl_status fl_rebuild_padding(fl_dtype dtype, const void *packed, int64_t packed_rows,
                                        const int32_t *cu_seqlens, int32_t batch,
                                        int32_t max_len, int64_t hidden, void *padded,
                                        fl_stream stream) {
    const int64_t elem = fl::float_size(dtype);
    if (elem == 0) return FL_ERR_UNSUPPORTED_DTYPE;
    if (batch < 0 || max_len < 0 || hidden < 1 || packed_rows < 0) return FL_ERR_INVALID_ARGUMENT;
    const int64_t padded_rows = (int64_t)batch * max_len;
    if (padded_rows > 0x7fffffffLL || hidden > INT64_MAX / elem) return FL_ERR_INVALID_ARGUMENT;
    if (padded_rows == 0) return FL_OK;
    if (!cu_seqlens || !padded || (packed_rows > 0 && !packed)) return FL_ERR_INVALID_ARGUMENT;
    const int64_t row_bytes = hidden * elem;
    const int wb = fl::row_word_bytes(packed_rows > 0 ? packed : padded, padded, row_bytes);
    const int64_t row_words = row_bytes / wb;
    dim3 grid, block;
    if (!fl::row_grid(padded_rows, row_words, &grid, &block)) return FL_ERR_INVALID_ARGUMENT;
    FL_DISPATCH_WORD(wb, fl::rebuild_padding_kernel<word_t><<<grid, block, 0, fl::as_stream(stream)>>>(
                             static_cast<const word_t *>(packed), packed_rows, cu_seqlens, max_len,
                             static_cast<word_t *>(padded), row_words));
    return fl::launch_status();
}
