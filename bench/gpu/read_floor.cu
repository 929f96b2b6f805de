// read_floor: how fast can any kernel *read* N bytes from HBM on this GPU, launched back to
// back as the GEMV bench launches its kernels? The floor under a weight-only GEMV, which
// reads its weights once and writes almost nothing (the gemv bench compares against a
// device copy of the same bytes, read + write counted; this is the read-only side of it).
//
// Build (sm_90a), with the toolkit's nvcc, or the compiler wheels' (scripts/setup-cuda.sh)
// given -L<their site-packages>/nvidia/cu13/lib for the static cudart:
//   nvcc -O3 -arch=sm_90a -o read_floor bench/gpu/read_floor.cu
// scripts/test.sh compiles it (-c) so that it keeps building.
// Run: read_floor [bytes ...]   (default: the int4 g128 / Q4_0 / int8 weight bytes of the
// gemv bench's one-token shapes). Per size, prints the median (of 3 batches of 50 launches,
// CUDA events) of: an empty kernel (the launch floor), the copy probe of the gemv bench (a
// device-to-device copy of bytes / 2: bytes moved = bytes), and the best of a sweep of
// read-only kernels (grid x threads x loads in flight per thread), with its configuration.
// Buffers rotate through >= 256 MB, so every launch reads from HBM, not L2 (50 MB).
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

__global__ void empty_kernel(int *) {}

// Each CTA reads one contiguous chunk of `words` 16-byte words (the last CTA the rest), U
// loads in flight per thread (ld.global.nc.L1::no_allocate), XOR-folds them; a folded value
// is written only when it equals `never` (it does not: the buffer is 0x5a bytes), so the
// loads cannot be dropped and nothing is written.
template <int U>
__global__ void read_chunks(const uint4 *__restrict__ p, int64_t words, int64_t per_cta, uint32_t never,
                            uint32_t *out) {
    const int64_t lo = (int64_t)blockIdx.x * per_cta;
    const int64_t hi = min(words, lo + per_cta);
    uint32_t acc = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += (int64_t)U * blockDim.x) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t j = i + (int64_t)u * blockDim.x;
            if (j < hi) {
                asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                             : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                             : "l"(p + j));
            } else {
                v[u] = make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == never) out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

struct Timer {
    cudaEvent_t a, b;
    Timer() {
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
    }
    template <typename F> double us(cudaStream_t s, F &&f, int iters = 50) {
        for (int i = 0; i < 5; ++i) f(i);
        double t[3];
        for (int r = 0; r < 3; ++r) {
            CK(cudaEventRecord(a, s));
            for (int i = 0; i < iters; ++i) f(i);
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            t[r] = 1e3 * ms / iters;
        }
        std::sort(t, t + 3);
        CK(cudaGetLastError());
        return t[1];
    }
};

int main(int argc, char **argv) {
    std::vector<int64_t> sizes;
    for (int i = 1; i < argc; ++i) sizes.push_back(atoll(argv[i]));
    if (sizes.empty()) {
        // int4 g128 (4 shapes; 11008 x 4096 and 4096 x 11008 hold the same bytes), Q4_0, int8.
        sizes = {8650752, 23248896, 67584000, 9437184, 25362432, 16793600, 45132800};
    }
    int dev = 0, sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("read_floor on %s, %d SMs\n", prop.name, sms);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint32_t *out;
    CK(cudaMalloc(&out, 64 << 20));
    Timer tm;
    const double t_empty = tm.us(s, [&](int) { empty_kernel<<<sms, 128, 0, s>>>((int *)out); });
    printf("empty kernel, %d CTAs, back to back: %.2f us\n", sms, t_empty);
    printf("%12s %9s %9s %9s %9s %7s  %s\n", "bytes", "copy_us", "copyGB/s", "read_us", "readGB/s", "r/copy",
           "best read config (CTAs x threads x loads/thread)");
    for (int64_t bytes : sizes) {
        bytes = (bytes + 15) / 16 * 16;
        const int nbuf = (int)std::max<int64_t>(1, std::min<int64_t>(64, ((256ll << 20) + bytes - 1) / bytes));
        std::vector<char *> bufs(nbuf), dsts(nbuf);
        for (int i = 0; i < nbuf; ++i) {
            CK(cudaMalloc(&bufs[i], bytes));
            CK(cudaMemset(bufs[i], 0x5a, bytes));
            CK(cudaMalloc(&dsts[i], bytes / 2));
        }
        const double t_copy = tm.us(s, [&](int i) {
            CK(cudaMemcpyAsync(dsts[i % nbuf], bufs[i % nbuf] + bytes / 2, bytes / 2, cudaMemcpyDeviceToDevice, s));
        });
        const int64_t words = bytes / 16;
        double best = 1e30;
        char cfg[128] = "";
        for (int per_sm : {1, 2, 4, 8, 16}) {
            for (int threads : {256, 512, 1024}) {
                if (per_sm * threads > 2048) continue;
                for (int U : {2, 4, 8}) {
                    const int64_t ctas = (int64_t)sms * per_sm;
                    const int64_t per_cta = (words + ctas - 1) / ctas;
                    auto launch = [&](int i) {
                        const uint4 *p = reinterpret_cast<const uint4 *>(bufs[i % nbuf]);
                        if (U == 2) read_chunks<2><<<(unsigned)ctas, threads, 0, s>>>(p, words, per_cta, 1u, out);
                        if (U == 4) read_chunks<4><<<(unsigned)ctas, threads, 0, s>>>(p, words, per_cta, 1u, out);
                        if (U == 8) read_chunks<8><<<(unsigned)ctas, threads, 0, s>>>(p, words, per_cta, 1u, out);
                    };
                    const double t = tm.us(s, launch);
                    if (t < best) {
                        best = t;
                        snprintf(cfg, sizeof cfg, "%lld x %d x %d", (long long)ctas, threads, U);
                    }
                }
            }
        }
        printf("%12lld %9.2f %9.0f %9.2f %9.0f %7.2f  %s\n", (long long)bytes, t_copy, bytes / t_copy / 1e3, best,
               bytes / best / 1e3, t_copy / best, cfg);
        for (int i = 0; i < nbuf; ++i) {
            CK(cudaFree(bufs[i]));
            CK(cudaFree(dsts[i]));
        }
    }
    return 0;
}
