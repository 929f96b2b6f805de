// One-shot all-reduce between the ranks of one process over peer memory (fl_allreduce.h).
//
// A fixed grid of FL_ALLREDUCE_BLOCKS blocks on every rank; block b owns the same slice of the
// message on every rank (16-byte units, contiguous), so each block synchronises only with the
// same block of its peers:
//   1. copy its slice of data into this rank's staging half (call parity),
//   2. release: a flag = epoch in every peer's flags[rank][b]; acquire: wait for
//      flags[p][b] >= epoch from every peer p,
//   3. sum the slice over the ranks' staging halves (rank order, f32) into data.
// Why two halves and no closing barrier: a rank writes half h again only in the call after
// next, and to get there its block b passed the next call's wait, which needs peer block b's
// flag of that call, which the peer sets only after its kernel of this call (stream order)
// finished reading. A peer may run one call ahead of a rank still waiting (it saw the rank's
// flag and went on), so the wait is `>=`, not `==`. The epoch is a per-block counter in the
// rank's own memory (read and advanced by the kernel, so a CUDA graph replays it correctly).
#include "common/common.cuh"

namespace fl {

namespace {

constexpr int kArThreads = 256;
// Spins between two reads of the host-mapped abort word (each a trip over PCIe).
constexpr int kAbortPollEvery = 2048;

__device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
    __threadfence_system();
    *(volatile uint32_t *)p = v;
#endif
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p) {
    uint32_t v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
    v = *(const volatile uint32_t *)p;
    __threadfence_system();
#endif
    return v;
}

// Units [lo, hi) of block b: ceil(units / blocks) each, contiguous.
__device__ __forceinline__ void slice_of(int64_t units, int64_t &lo, int64_t &hi) {
    const int64_t per = (units + gridDim.x - 1) / gridDim.x;
    lo = per * blockIdx.x;
    hi = lo + per < units ? lo + per : units;
}

template <typename T>
__global__ void __launch_bounds__(kArThreads)
    allreduce_oneshot_kernel(T *data, int64_t n, int rank, int world, fl_allreduce_peers peers,
                             int64_t half_bytes, uint32_t *counter, const int32_t *abort) {
    constexpr int E = 16 / sizeof(T);  // elements per 16-byte unit
    const int64_t units = (n + E - 1) / E;
    const bool aligned = (reinterpret_cast<uintptr_t>(data) & 15) == 0;
    __shared__ uint32_t s_epoch;
    __shared__ int s_abort;
    if (threadIdx.x == 0) {
        s_epoch = counter[blockIdx.x] + 1;
        s_abort = 0;
    }
    __syncthreads();
    const uint32_t epoch = s_epoch;
    const int64_t half = (int64_t)(epoch & 1) * half_bytes;
    int64_t lo, hi;
    slice_of(units, lo, hi);

    // 1. This rank's slice into its staging half.
    uint4 *mine = reinterpret_cast<uint4 *>(static_cast<char *>(peers.staging[rank]) + half);
    for (int64_t u = lo + threadIdx.x; u < hi; u += blockDim.x) {
        if (aligned && (u + 1) * E <= n) {
            mine[u] = reinterpret_cast<const uint4 *>(data)[u];
        } else {
            Vec<T, E> v;
#pragma unroll
            for (int j = 0; j < E; ++j) v.v[j] = u * E + j < n ? data[u * E + j] : from_f32<T>(0.f);
            mine[u] = *reinterpret_cast<const uint4 *>(&v);
        }
    }

    // 2. Signal every peer's block b, then wait for theirs (one thread per peer).
    __syncthreads();
    const int p = threadIdx.x;
    if (p < world && p != rank) {
        st_release_sys(peers.flags[p] + rank * FL_ALLREDUCE_BLOCKS + blockIdx.x, epoch);
        const uint32_t *flag = peers.flags[rank] + p * FL_ALLREDUCE_BLOCKS + blockIdx.x;
        for (uint32_t spins = 1; (int32_t)(ld_acquire_sys(flag) - epoch) < 0; ++spins) {
            if (abort && spins % kAbortPollEvery == 0 && *(const volatile int32_t *)abort) {
                s_abort = 1;
                break;
            }
        }
    }
    __syncthreads();
    if (s_abort) return;  // the counter stays: the group is being torn down

    // 3. Sum the ranks' slices in rank order.
    for (int64_t u = lo + threadIdx.x; u < hi; u += blockDim.x) {
        float acc[E];
#pragma unroll
        for (int j = 0; j < E; ++j) acc[j] = 0.f;
        for (int r = 0; r < world; ++r) {
            const uint4 w = __ldcg(reinterpret_cast<const uint4 *>(
                                       static_cast<const char *>(peers.staging[r]) + half) +
                                   u);
            const Vec<T, E> &v = *reinterpret_cast<const Vec<T, E> *>(&w);
#pragma unroll
            for (int j = 0; j < E; ++j) acc[j] += to_f32(v.v[j]);
        }
        Vec<T, E> out;
#pragma unroll
        for (int j = 0; j < E; ++j) out.v[j] = from_f32<T>(acc[j]);
        if (aligned && (u + 1) * E <= n) {
            reinterpret_cast<uint4 *>(data)[u] = *reinterpret_cast<const uint4 *>(&out);
        } else {
#pragma unroll
            for (int j = 0; j < E; ++j)
                if (u * E + j < n) data[u * E + j] = out.v[j];
        }
    }
    if (threadIdx.x == 0) counter[blockIdx.x] = epoch;
}

}  // namespace

template <typename T>
fl_status allreduce_oneshot(T *data, int64_t n, int rank, int world, const fl_allreduce_peers &peers,
                            int64_t half_bytes, uint32_t *counter, const int32_t *abort,
                            cudaStream_t s) {
    allreduce_oneshot_kernel<T><<<FL_ALLREDUCE_BLOCKS, kArThreads, 0, s>>>(
        data, n, rank, world, peers, half_bytes, counter, abort);
    return launch_status();
}

}  // namespace fl

extern "C" fl_status fl_allreduce_oneshot(fl_dtype dtype, void *data, int64_t n, int32_t rank,
                                          int32_t world, const fl_allreduce_peers *peers,
                                          int64_t capacity, uint32_t *counter,
                                          const int32_t *abort, fl_stream stream) {
    if (dtype != FL_DTYPE_F32 && dtype != FL_DTYPE_F16 && dtype != FL_DTYPE_BF16)
        return FL_ERR_UNSUPPORTED_DTYPE;
    if (world < 1 || world > FL_ALLREDUCE_MAX_RANKS || rank < 0 || rank >= world || n < 0 ||
        capacity < 0 || !peers || !counter)
        return FL_ERR_INVALID_ARGUMENT;
    if (n == 0) return FL_OK;
    if (!data) return FL_ERR_INVALID_ARGUMENT;
    for (int r = 0; r < world; ++r)
        if (!peers->staging[r] || !peers->flags[r]) return FL_ERR_INVALID_ARGUMENT;
    const int64_t esize = dtype == FL_DTYPE_F32 ? 4 : 2;
    if (n > capacity / esize) return FL_ERR_INVALID_ARGUMENT;
    const int64_t half = FL_ALLREDUCE_STAGING_HALF(capacity);
    FL_DISPATCH_FLOAT(dtype, return fl::allreduce_oneshot<scalar_t>(
                                 static_cast<scalar_t *>(data), n, rank, world, *peers, half,
                                 counter, abort, fl::as_stream(stream)));
    return FL_ERR_UNSUPPORTED_DTYPE;
}
