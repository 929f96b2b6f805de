// Softmax over the last dimension, with temperature: y = softmax(x / t).
//
// Numerics: max-subtracted, computed in f32 as p = exp2((x - m) * log2(e) / t) with m the
// row's maximum of x (t > 0, so max(x / t) = max(x) / t), y = p / sum(p), rounded once to
// the output type. Special values, per row:
//  - every element -inf (a fully masked row): y = 0 everywhere (defined, not NaN);
//  - -inf elements among finite ones: y = 0 there;
//  - any NaN or +inf in the row: the whole row is NaN (the maximum is NaN-propagating).
//
// Paths, chosen per call on the host:
//  - register: n a multiple of the 16-byte vector width of the input, x and y 16-byte
//    aligned, n <= 1024 * 4 vectors (32768 f16/bf16, 16384 f32). Block per row; the row is
//    read once into registers, block max, block sum, written once (2 passes over registers,
//    1 over memory). Few rows: up to 1024 threads per row; >= 1024 rows: 256 threads.
//  - cluster (sm_90+ only; vectors as above, 4096 < n / vec <= 8 * 256 * 16 vectors, i.e.
//    n <= 262144 f16/bf16, 131072 f32): one thread-block cluster of 8 blocks of 256 threads
//    per row (clusters loop over rows when there are many). Each block holds its eighth of
//    the row in registers (VPT = 4, 8 or 16 vectors per thread), computes its block's
//    (max, sum of exp2) from them, and the 8 pairs are exchanged through distributed shared
//    memory (one cluster.sync per row) and merged; then each block writes its part. One read
//    and one write of the data, whatever the number of rows. The host takes this path only
//    on a device of compute capability >= 9 whose loaded kernel image is sm_90+ code (a
//    build with only compute_80 PTX JIT-compiles the empty body: never launched), and falls
//    back to the other paths if the cluster launch is refused.
//  - split (few long rows: rows < 128, n > 4096, a workspace given, and not the cluster
//    path): each row is cut into chunks, one block of 256 threads per (row, chunk), with the
//    chunk length chosen so that rows * chunks ~ 4 * SMs and each thread has >= 8 vectors
//    (or 8 elements on the scalar path). Kernel 1 writes the chunk's (max, sum) to the
//    workspace; kernel 2 merges the row's partials and writes its chunk, re-reading x (from
//    L2). The workspace is sized for the shortest chunk (2048 elements).
//  - generic: anything else (unaligned, odd n, long rows with many rows before sm_90, no
//    workspace). Block of up to 1024 threads per row: one online (max, sum) pass, merged
//    over the block, then a pass that re-reads x and writes y. For long rows the grid is
//    capped at one block per SM so that the rows in flight fit in L2 and the second read
//    mostly hits it.
// fl_softmax_path with FL_SOFTMAX_PORTABLE skips the cluster path (split / generic, what
// runs before sm_90), so that tests reach both on one Hopper GPU. Kernels that lost to these
// on the H100 are listed in kernels/experiments/softmax.md.
// Every element of y is written by the thread that reads the same element of x, so y may
// alias x when the dtypes are equal.
#include <atomic>
#include <cfloat>
#include <cmath>

#include <cooperative_groups.h>

#include "common/common.cuh"

namespace fl {
namespace softmax_detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kMinChunk = 2048;     // split path: shortest chunk (sizes the workspace)
constexpr int kChunkThreads = 256;      // split path: threads per block
constexpr int64_t kSplitMaxRows = 128;  // split path only for fewer rows than this
constexpr int kCluster = 8;             // cluster path: blocks per cluster (portable maximum)
constexpr int kClusterThreads = 256;    // cluster path: threads per block
constexpr int kClusterMaxVpt = 16;      // cluster path: most vectors per thread

// The larger of a and b; NaN when either is NaN.
__device__ __forceinline__ float nanmax(float a, float b) { return (a > b || a != a) ? a : b; }

__device__ __forceinline__ float warp_nanmax(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// NaN-propagating block max; every thread gets the result. scratch: >= 32 floats.
__device__ __forceinline__ float block_nanmax(float x, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    x = warp_nanmax(x);
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < nwarps ? scratch[lane] : -INFINITY;
    return warp_nanmax(x);
}

// Running statistics of a set of x: m = max x, s = sum exp2((x - m) * scale).
// The empty set is {-inf, 0}; so is a set of only -inf.
struct Stats {
    float m, s;
};

// 2^x by the bare MUFU.EX2 (ex2.approx.ftz, max rel. error 2^-22 as exp2f's): results below
// 2^-126 flush to 0, so probabilities under 1.2e-38 come out as 0 (f32 and bf16 outputs could
// hold them as denormals; f16 flushes far above). exp2f adds a range fix-up for them around
// the same instruction: 3 more instructions per element and pass, a measurable cost on the
// longest rows (kernels/experiments/softmax.md).
__device__ __forceinline__ float ex2_ftz(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ Stats merge(Stats a, Stats b, float scale) {
    const float m = nanmax(a.m, b.m);
    if (m == -INFINITY) return {m, 0.f};
    return {m, a.s * ex2_ftz((a.m - m) * scale) + b.s * ex2_ftz((b.m - m) * scale)};
}

// Adds K values to the running statistics (one rescale per call).
template <int K>
__device__ __forceinline__ void update(Stats &t, const float (&v)[K], float scale) {
    float vm = v[0];
#pragma unroll
    for (int j = 1; j < K; ++j) vm = nanmax(vm, v[j]);
    const float m = nanmax(t.m, vm);
    if (m == -INFINITY) return;  // nothing but -inf so far: s stays 0
    float s = t.s * ex2_ftz((t.m - m) * scale);
#pragma unroll
    for (int j = 0; j < K; ++j) s += ex2_ftz((v[j] - m) * scale);
    t = {m, s};
}

__device__ __forceinline__ Stats warp_merge(Stats t, float scale) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        Stats u{__shfl_xor_sync(0xffffffffu, t.m, o), __shfl_xor_sync(0xffffffffu, t.s, o)};
        t = merge(t, u, scale);  // commutative: every lane ends with the same value
    }
    return t;
}

// Block-wide merge; every thread gets the result. scratch: >= 64 floats.
__device__ __forceinline__ Stats block_merge(Stats t, float *scratch, float scale) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    t = warp_merge(t, scale);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = t.m;
        scratch[32 + warp] = t.s;
    }
    __syncthreads();
    Stats u = lane < nwarps ? Stats{scratch[lane], scratch[32 + lane]} : Stats{-INFINITY, 0.f};
    return warp_merge(u, scale);
}

// Stores N f32 values to p as T, in accesses of at most 16 bytes (p aligned to
// min(16, N * sizeof(T)) bytes).
template <typename T, int N> __device__ __forceinline__ void store_f32(T *p, const float (&v)[N]) {
    constexpr int W = (N * (int)sizeof(T) > 16) ? 16 / (int)sizeof(T) : N;
#pragma unroll
    for (int c = 0; c < N / W; ++c) {
        Vec<T, W> o;
#pragma unroll
        for (int j = 0; j < W; ++j) o.v[j] = from_f32<T>(v[c * W + j]);
        reinterpret_cast<Vec<T, W> *>(p)[c] = o;
    }
}

__device__ __forceinline__ float prob(float v, float m, float inv, float scale, bool zero) {
    return zero ? 0.f : ex2_ftz((v - m) * scale) * inv;
}

// This thread's statistics over x[begin, end), elements strided over the block.
// VEC: 16-byte vectors (x 16-byte aligned, begin and end multiples of the vector width).
template <typename T, bool VEC>
__device__ __forceinline__ Stats thread_stats(const T *x, int64_t begin, int64_t end, float scale) {
    Stats t{-INFINITY, 0.f};
    const int64_t stride = blockDim.x;
    if constexpr (VEC) {
        constexpr int N = vec16<T>();
        constexpr int U = 16 / N;  // vectors in flight per thread: 16 values, 32-64 bytes
        using V = Vec<T, N>;
        const V *xv = reinterpret_cast<const V *>(x);
        const int64_t ve = end / N;
        for (int64_t i = begin / N + threadIdx.x; i < ve; i += U * stride) {
            V buf[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int64_t k = i + u * stride;
                if (k < ve) buf[u] = xv[k];
            }
            float v[U * N];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const bool in = i + u * stride < ve;
#pragma unroll
                for (int j = 0; j < N; ++j) v[u * N + j] = in ? to_f32(buf[u].v[j]) : -INFINITY;
            }
            update(t, v, scale);
        }
    } else {
        constexpr int U = 4;
        for (int64_t i = begin + threadIdx.x; i < end; i += U * stride) {
            float v[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int64_t k = i + u * stride;
                v[u] = k < end ? to_f32(x[k]) : -INFINITY;
            }
            update(t, v, scale);
        }
    }
    return t;
}

// y[i] = softmax value of x[i] for i in [begin, end), given the row's (m, 1 / s).
template <typename Tin, typename Tout, bool VEC>
__device__ __forceinline__ void write_range(const Tin *x, Tout *y, int64_t begin, int64_t end,
                                            float m, float inv, float scale) {
    const bool zero = (m == -INFINITY);
    const int64_t stride = blockDim.x;
    if constexpr (VEC) {
        constexpr int U = 2;
        constexpr int N = vec16<Tin>();
        using V = Vec<Tin, N>;
        const V *xv = reinterpret_cast<const V *>(x);
        const int64_t ve = end / N;
        for (int64_t i = begin / N + threadIdx.x; i < ve; i += U * stride) {
            V buf[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (i + u * stride < ve) buf[u] = xv[i + u * stride];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int64_t k = i + u * stride;
                if (k < ve) {
                    float o[N];
#pragma unroll
                    for (int j = 0; j < N; ++j) o[j] = prob(to_f32(buf[u].v[j]), m, inv, scale, zero);
                    store_f32<Tout, N>(y + k * N, o);
                }
            }
        }
    } else {
        for (int64_t i = begin + threadIdx.x; i < end; i += stride)
            y[i] = from_f32<Tout>(prob(to_f32(x[i]), m, inv, scale, zero));
    }
}

// ------------------------------------------------------------------ register path
template <typename Tin, typename Tout, int VPT>
__global__ void __launch_bounds__(1024)
    softmax_reg_kernel(const Tin *x, Tout *y, int64_t rows, int64_t n, float scale) {
    constexpr int N = vec16<Tin>();
    using V = Vec<Tin, N>;
    __shared__ float scratch[32];
    const int nvec = (int)(n / N);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const V *xv = reinterpret_cast<const V *>(x + row * n);
        Tout *yr = y + row * n;
        V r[VPT];
        float tmax = -INFINITY;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i < nvec) {
                r[k] = xv[i];
#pragma unroll
                for (int j = 0; j < N; ++j) tmax = nanmax(tmax, to_f32(r[k].v[j]));
            }
        }
        const float m = block_nanmax(tmax, scratch);
        const bool zero = (m == -INFINITY);
        float ts = 0.f;
        if (!zero) {
#pragma unroll
            for (int k = 0; k < VPT; ++k) {
                if (threadIdx.x + k * blockDim.x < nvec) {
#pragma unroll
                    for (int j = 0; j < N; ++j) ts += ex2_ftz((to_f32(r[k].v[j]) - m) * scale);
                }
            }
        }
        const float inv = 1.f / block_sum(ts, scratch);  // inf for a masked row, unused
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i < nvec) {
                float o[N];
#pragma unroll
                for (int j = 0; j < N; ++j) o[j] = prob(to_f32(r[k].v[j]), m, inv, scale, zero);
                store_f32<Tout, N>(yr + (int64_t)i * N, o);
            }
        }
    }
}

// ------------------------------------------------------------------ generic path
template <typename Tin, typename Tout, bool VEC>
__global__ void __launch_bounds__(1024)
    softmax_generic_kernel(const Tin *x, Tout *y, int64_t rows, int64_t n, float scale) {
    __shared__ float scratch[64];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const Tin *xr = x + row * n;
        const Stats t = block_merge(thread_stats<Tin, VEC>(xr, 0, n, scale), scratch, scale);
        write_range<Tin, Tout, VEC>(xr, y + row * n, 0, n, t.m, 1.f / t.s, scale);
    }
}

// ------------------------------------------------------------------ split path
// grid (chunks, rows), `chunk` elements per block (a multiple of the vector width when VEC);
// ws[row * chunks + c] = (max, sum) of chunk c.
template <typename Tin, bool VEC>
__global__ void __launch_bounds__(kChunkThreads)
    softmax_split_stats_kernel(const Tin *x, float2 *ws, int64_t n, int64_t chunk, float scale) {
    __shared__ float scratch[64];
    const int64_t row = blockIdx.y, chunks = gridDim.x, c = blockIdx.x;
    const int64_t begin = c * chunk, end = begin + chunk < n ? begin + chunk : n;
    const Stats t =
        block_merge(thread_stats<Tin, VEC>(x + row * n, begin, end, scale), scratch, scale);
    if (threadIdx.x == 0) ws[row * chunks + c] = make_float2(t.m, t.s);
}

template <typename Tin, typename Tout, bool VEC>
__global__ void __launch_bounds__(kChunkThreads)
    softmax_split_write_kernel(const Tin *x, Tout *y, const float2 *ws, int64_t n, int64_t chunk,
                               float scale) {
    __shared__ float scratch[64];
    const int64_t row = blockIdx.y, chunks = gridDim.x, c = blockIdx.x;
    Stats t{-INFINITY, 0.f};
    for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) {
        const float2 p = ws[row * chunks + j];
        t = merge(t, Stats{p.x, p.y}, scale);
    }
    t = block_merge(t, scratch, scale);
    const int64_t begin = c * chunk, end = begin + chunk < n ? begin + chunk : n;
    write_range<Tin, Tout, VEC>(x + row * n, y + row * n, begin, end, t.m, 1.f / t.s, scale);
}


// ------------------------------------------------------------------ cluster path (sm_90+)
// grid: a multiple of kCluster blocks, cluster dims (kCluster, 1, 1); cluster c handles rows
// c, c + clusters, ... Block rank r of a cluster holds vectors [r * 256 * VPT, (r + 1) * 256 *
// VPT) of the row, thread t vectors r * 256 * VPT + k * 256 + t, k < VPT (coalesced).
template <typename Tin, typename Tout, int VPT>
__global__ void __launch_bounds__(kClusterThreads, 2)
    softmax_cluster_kernel(const Tin *x, Tout *y, int64_t rows, int64_t n, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    constexpr int N = vec16<Tin>();
    using V = Vec<Tin, N>;
    __shared__ float scratch[32];
    // This block's (max, sum) per row, read by every block of the cluster; double-buffered
    // by row parity so one cluster.sync per row suffices (a buffer is rewritten two rows
    // later, after the next row's cluster.sync, which every reader of it has passed).
    __shared__ float2 part[2];
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int lane = threadIdx.x & 31;
    const int64_t nvec = n / N;
    const int64_t base = (int64_t)rank * (kClusterThreads * VPT) + threadIdx.x;
    const int64_t clusters = gridDim.x / kCluster;
    int buf = 0;
    V r[VPT];
    for (int64_t row = blockIdx.x / kCluster; row < rows; row += clusters) {
        Tout *yr = y + row * n;
        float tmax = -INFINITY;
        const V *xv = reinterpret_cast<const V *>(x + row * n);
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int64_t i = base + k * kClusterThreads;
            if (i < nvec) r[k] = xv[i];
        }
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            if (base + k * kClusterThreads < nvec) {
#pragma unroll
                for (int j = 0; j < N; ++j) tmax = nanmax(tmax, to_f32(r[k].v[j]));
            }
        }
        const float bm = block_nanmax(tmax, scratch);
        float ts = 0.f;
        if (bm != -INFINITY) {  // a block of only -inf (or past the row's end): sum 0
#pragma unroll
            for (int k = 0; k < VPT; ++k) {
                if (base + k * kClusterThreads < nvec) {
#pragma unroll
                    for (int j = 0; j < N; ++j) ts += ex2_ftz((to_f32(r[k].v[j]) - bm) * scale);
                }
            }
        }
        const float bs = block_sum(ts, scratch);
        if (threadIdx.x == 0) part[buf] = make_float2(bm, bs);
        cluster.sync();  // every block's part[buf] written and visible cluster-wide
        // Lanes 0..7 of every warp read one block's pair each and merge them over the 8
        // lanes (xor 4, 2, 1 stays within the group); lane 0's result goes to the warp.
        Stats t{-INFINITY, 0.f};
        if (lane < kCluster) {
            const float2 p = *cluster.map_shared_rank(&part[buf], lane);
            t = Stats{p.x, p.y};
        }
#pragma unroll
        for (int o = kCluster / 2; o > 0; o >>= 1) {
            const Stats u{__shfl_xor_sync(0xffffffffu, t.m, o), __shfl_xor_sync(0xffffffffu, t.s, o)};
            t = merge(t, u, scale);
        }
        const float m = __shfl_sync(0xffffffffu, t.m, 0);
        const float s = __shfl_sync(0xffffffffu, t.s, 0);
        const bool zero = (m == -INFINITY);
        const float inv = 1.f / s;  // inf for a masked row (unused); NaN for a NaN/+inf row
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int64_t i = base + k * kClusterThreads;
            if (i < nvec) {
                float o[N];
#pragma unroll
                for (int j = 0; j < N; ++j) o[j] = prob(to_f32(r[k].v[j]), m, inv, scale, zero);
                store_f32<Tout, N>(yr + i * N, o);
            }
        }
        buf ^= 1;
    }
    cluster.sync();  // no block exits while another may still read its part[]
#endif
}

// ------------------------------------------------------------------ host side
inline bool split_applies(int64_t rows, int64_t n) {
    return rows < kSplitMaxRows && n > 2 * kMinChunk;
}

// Sized for the shortest chunk, so it holds the partials of any chunk length chosen below.
inline int64_t workspace_bytes(int64_t rows, int64_t n) {
    if (rows <= 0 || n <= 0 || !split_applies(rows, n)) return 0;
    return rows * ceil_div(n, kMinChunk) * (int64_t)sizeof(float2);
}

inline unsigned row_grid(int64_t blocks) {
    const int64_t cap = 65535LL * 32;  // a grid-stride loop covers the rest
    return (unsigned)(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

// Per-device facts, looked up once per device (0 in a slot: not looked up yet).
constexpr int kMaxDevices = 64;
struct DeviceFacts {
    int sms;          // multiprocessors
    bool cluster_ok;  // cluster path usable: cc >= 9, cluster launch, sm_90+ kernel image
};

inline int current_device() {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();  // clear it: the launch reports its own errors
        return -1;
    }
    return dev;
}

inline DeviceFacts device_facts() {
    static std::atomic<int> sms_cache[kMaxDevices];      // 0 unknown, else SM count
    static std::atomic<int> cluster_cache[kMaxDevices];  // 0 unknown, 1 no, 2 yes
    const int dev = current_device();
    const bool cached = dev >= 0 && dev < kMaxDevices;
    if (cached) {
        const int s = sms_cache[dev].load(std::memory_order_relaxed);
        const int c = cluster_cache[dev].load(std::memory_order_relaxed);
        if (s > 0 && c > 0) return {s, c == 2};
    }
    int sms = 0, major = 0, cl = 0;
    bool ok = dev >= 0;
    ok = ok && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess;
    ok = ok && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess;
    if (ok && major >= 9 && cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) != cudaSuccess)
        cl = 0;
    bool cluster_ok = ok && major >= 9 && cl != 0;
    if (cluster_ok) {
        // The image loaded for this device must hold sm_90+ code: a build with only
        // compute_80 PTX would JIT the kernel's empty (pre-sm_90) body.
        cudaFuncAttributes fa{};
        cluster_ok = cudaFuncGetAttributes(&fa, softmax_cluster_kernel<float, float, 4>) ==
                         cudaSuccess &&
                     fa.binaryVersion >= 90;
    }
    cudaGetLastError();  // clear any lookup error: the launch reports its own errors
    if (!ok || sms < 1) return {132, false};  // not cached: looked up again next call
    if (cached) {
        sms_cache[dev].store(sms, std::memory_order_relaxed);
        cluster_cache[dev].store(cluster_ok ? 2 : 1, std::memory_order_relaxed);
    }
    return {sms, cluster_ok};
}

// Clusters loop over rows; the grid holds 2 clusters per SM (16 blocks per SM, more than fit
// at once, so the hardware keeps every SM busy; beyond that the blocks loop).
template <typename Tin, typename Tout, int VPT>
cudaError_t launch_cluster(const Tin *x, Tout *y, int64_t rows, int64_t n, float scale,
                           int sms, cudaStream_t s) {
    const int64_t cap = 2 * (int64_t)sms;
    const int64_t clusters = rows < cap ? rows : cap;
    if (clusters * kCluster > 0x7fffffffLL) return cudaErrorInvalidValue;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kCluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3((unsigned)(clusters * kCluster), 1, 1);
    cfg.blockDim = dim3(kClusterThreads, 1, 1);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, softmax_cluster_kernel<Tin, Tout, VPT>, x, y, rows, n, scale);
}

template <typename Tin, typename Tout>
fl_status softmax(const Tin *x, Tout *y, int64_t rows, int64_t n, float scale, void *ws,
                  int64_t ws_bytes, bool portable, cudaStream_t s) {
    constexpr int N = vec16<Tin>();
    const bool vec_ok = n % N == 0 && aligned16(x) && aligned16(y);
    const int64_t nvec = n / N;
    if (vec_ok && nvec <= 1024 * 4) {
        const int64_t target = rows >= 1024 ? 256 : 1024;
        int vpt = 1;
        while (vpt < 4 && ceil_div(nvec, vpt) > target) vpt *= 2;
        const int threads = (int)(ceil_div(ceil_div(nvec, vpt), 32) * 32);
        const unsigned grid = row_grid(rows);
        switch (vpt) {
        case 1: softmax_reg_kernel<Tin, Tout, 1><<<grid, threads, 0, s>>>(x, y, rows, n, scale); break;
        case 2: softmax_reg_kernel<Tin, Tout, 2><<<grid, threads, 0, s>>>(x, y, rows, n, scale); break;
        default: softmax_reg_kernel<Tin, Tout, 4><<<grid, threads, 0, s>>>(x, y, rows, n, scale); break;
        }
        return launch_status();
    }
    const DeviceFacts dev = device_facts();
    // Cluster path: nvec > 4096 here, so a cluster of 8 x 256 threads needs >= 4 vectors per
    // thread (VPT 2 would hold only the register path's 4096 vectors).
    constexpr int64_t kPerVpt = (int64_t)kCluster * kClusterThreads;  // vectors per VPT step
    if (!portable && vec_ok && dev.cluster_ok && nvec <= kPerVpt * kClusterMaxVpt) {
        cudaError_t e;
        if (nvec <= kPerVpt * 4)
            e = launch_cluster<Tin, Tout, 4>(x, y, rows, n, scale, dev.sms, s);
        else if (nvec <= kPerVpt * 8)
            e = launch_cluster<Tin, Tout, 8>(x, y, rows, n, scale, dev.sms, s);
        else
            e = launch_cluster<Tin, Tout, 16>(x, y, rows, n, scale, dev.sms, s);
        if (e == cudaSuccess) return launch_status();
        // Refused (e.g. no room for a cluster on a partitioned GPU): a launch-configuration
        // error, not sticky. Clear it and take the other paths.
        cudaGetLastError();
    }
    const int64_t need = workspace_bytes(rows, n);
    if (need > 0 && ws != nullptr && ws_bytes >= need &&
        (reinterpret_cast<uintptr_t>(ws) & 7u) == 0) {
        // Chunks: ~4 blocks per SM over all rows, each thread >= 8 vectors (8 elements on
        // the scalar path); chunk lengths a multiple of the vector width.
        const int64_t gran = vec_ok ? N : 1;
        const int64_t min_chunk = (int64_t)kChunkThreads * 8 * gran;  // >= kMinChunk
        int64_t chunks = ceil_div(4 * (int64_t)dev.sms, rows);
        const int64_t most = n / min_chunk;
        if (chunks > most) chunks = most;
        if (chunks >= 2) {
            const int64_t chunk = ceil_div(ceil_div(n, chunks), gran) * gran;
            const dim3 grid((unsigned)ceil_div(n, chunk), (unsigned)rows);
            float2 *w = static_cast<float2 *>(ws);  // grid.x * rows <= need / 8 partials
            if (vec_ok) {
                softmax_split_stats_kernel<Tin, true>
                    <<<grid, kChunkThreads, 0, s>>>(x, w, n, chunk, scale);
                softmax_split_write_kernel<Tin, Tout, true>
                    <<<grid, kChunkThreads, 0, s>>>(x, y, w, n, chunk, scale);
            } else {
                softmax_split_stats_kernel<Tin, false>
                    <<<grid, kChunkThreads, 0, s>>>(x, w, n, chunk, scale);
                softmax_split_write_kernel<Tin, Tout, false>
                    <<<grid, kChunkThreads, 0, s>>>(x, y, w, n, chunk, scale);
            }
            return launch_status();
        }
    }
    // Generic: threads for ~4 vectors (or 4 elements) each, 64..1024.
    const int64_t per_thread = vec_ok ? 4 * N : 4;
    const int64_t want = ceil_div(ceil_div(n, per_thread), 32) * 32;
    const int threads = (int)(want < 64 ? 64 : (want > 1024 ? 1024 : want));
    int64_t blocks = rows;
    if (n * (int64_t)sizeof(Tin) > (64 << 10)) {
        const int64_t cap = dev.sms;  // long rows: one block per SM (rows in flight fit L2)
        if (blocks > cap) blocks = cap;
    }
    const unsigned grid = row_grid(blocks);
    if (vec_ok)
        softmax_generic_kernel<Tin, Tout, true><<<grid, threads, 0, s>>>(x, y, rows, n, scale);
    else
        softmax_generic_kernel<Tin, Tout, false><<<grid, threads, 0, s>>>(x, y, rows, n, scale);
    return launch_status();
}

}  // namespace softmax_detail
}  // namespace fl

extern "C" int64_t fl_softmax_workspace_size(int64_t rows, int64_t n) {
    return fl::softmax_detail::workspace_bytes(rows, n);
}

extern "C" fl_status fl_softmax_path(fl_dtype x_dtype, const void *x, fl_dtype y_dtype, void *y,
                                     int64_t rows, int64_t n, float temperature, void *workspace,
                                     int64_t workspace_bytes, int32_t long_path,
                                     fl_stream stream) {
    using namespace fl::softmax_detail;
    if (rows < 0 || n < 1 || workspace_bytes < 0) return FL_ERR_INVALID_ARGUMENT;
    if (long_path != FL_SOFTMAX_AUTO && long_path != FL_SOFTMAX_PORTABLE)
        return FL_ERR_INVALID_ARGUMENT;
    if (!(temperature >= FLT_MIN) || !std::isfinite(temperature)) return FL_ERR_INVALID_ARGUMENT;
    if (y_dtype != x_dtype && y_dtype != FL_DTYPE_F32) return FL_ERR_UNSUPPORTED_DTYPE;
    if (rows == 0) return FL_OK;
    if (!x || !y) return FL_ERR_INVALID_ARGUMENT;
    if (x == y && x_dtype != y_dtype) return FL_ERR_INVALID_ARGUMENT;
    const float scale = kLog2e / temperature;
    const bool portable = long_path == FL_SOFTMAX_PORTABLE;
    cudaStream_t s = fl::as_stream(stream);
    FL_DISPATCH_FLOAT(x_dtype, {
        if (y_dtype == x_dtype)
            return softmax<scalar_t, scalar_t>(static_cast<const scalar_t *>(x),
                                               static_cast<scalar_t *>(y), rows, n, scale,
                                               workspace, workspace_bytes, portable, s);
        return softmax<scalar_t, float>(static_cast<const scalar_t *>(x), static_cast<float *>(y),
                                        rows, n, scale, workspace, workspace_bytes, portable, s);
    });
    return FL_ERR_UNSUPPORTED_DTYPE;
}

extern "C" fl_status fl_softmax(fl_dtype x_dtype, const void *x, fl_dtype y_dtype, void *y,
                                int64_t rows, int64_t n, float temperature, void *workspace,
                                int64_t workspace_bytes, fl_stream stream) {
    return fl_softmax_path(x_dtype, x, y_dtype, y, rows, n, temperature, workspace,
                           workspace_bytes, FL_SOFTMAX_AUTO, stream);
}
