/* Launchers of kernels/allreduce.cu (included by fl_kernels.h; see its rules). */
#ifndef FL_ALLREDUCE_H
#define FL_ALLREDUCE_H
#include "fl_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif

/* A one-shot all-reduce between the ranks of one process, through peer memory (NVLink or
 * PCIe peer access), for the small messages of a tensor-parallel decode step, where NCCL's
 * latency (8-12 us on H100 NVLink) is the whole cost.
 *
 * Each rank owns, on its device, three buffers that every rank can address (peer access
 * enabled between every pair of distinct devices; ranks may share a device):
 *  - staging: 2 * FL_ALLREDUCE_STAGING_HALF(capacity) bytes (two halves, used by turns);
 *  - flags:   FL_ALLREDUCE_FLAGS_BYTES, zeroed before the first call;
 *  - counter: FL_ALLREDUCE_COUNTER_BYTES of the rank's own device memory, zeroed before the
 *             first call (read and written by its own kernel only).
 * Every rank of the group must call fl_allreduce_oneshot the same number of times, with the
 * same n and dtype in the same order, on streams where consecutive calls do not overlap.
 *
 * data[i] = sum over ranks r = 0 .. world - 1 of data_r[i], for i < n, in place, computed in
 * f32 in rank order and rounded to dtype once: every rank gets the same bits.
 *
 * The kernel copies data into this rank's staging half, signals every peer block by block,
 * waits for their signals, and sums the ranks' staging halves (peer reads over the link).
 * A wait polls *abort (host memory mapped to the device, or NULL for none) now and then:
 * once it is non-zero, every waiting block gives up and the call ends with data undefined.
 *
 * dtype: f32, f16 or bf16. 1 <= world <= FL_ALLREDUCE_MAX_RANKS, 0 <= rank < world;
 * n >= 0 (0 launches nothing); n * sizeof(dtype) <= capacity; staging[r], flags[r] non-NULL
 * for r < world; counter non-NULL: FL_ERR_INVALID_ARGUMENT otherwise. data may have any
 * element alignment (16-byte vector accesses where it is 16-byte aligned). */
#define FL_ALLREDUCE_MAX_RANKS 8
#define FL_ALLREDUCE_BLOCKS 32
#define FL_ALLREDUCE_FLAGS_BYTES (FL_ALLREDUCE_MAX_RANKS * FL_ALLREDUCE_BLOCKS * 4)
#define FL_ALLREDUCE_COUNTER_BYTES (FL_ALLREDUCE_BLOCKS * 4)
/* One staging half for messages up to capacity bytes: capacity rounded up to 16. */
#define FL_ALLREDUCE_STAGING_HALF(capacity) ((((int64_t)(capacity)) + 15) / 16 * 16)

typedef struct fl_allreduce_peers {
    void *staging[FL_ALLREDUCE_MAX_RANKS];
    uint32_t *flags[FL_ALLREDUCE_MAX_RANKS];
} fl_allreduce_peers;

fl_status fl_allreduce_oneshot(fl_dtype dtype, void *data, int64_t n, int32_t rank, int32_t world,
                               const fl_allreduce_peers *peers, int64_t capacity,
                               uint32_t *counter, const int32_t *abort, fl_stream stream);

#ifdef __cplusplus
}
#endif
#endif
