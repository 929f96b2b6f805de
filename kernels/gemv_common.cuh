// What the files of the quantised GEMV share (kernels/gemv*.cu; the dispatcher and C API are
// in gemv.cu): one call's arguments, each file's launchers, and the helpers of the ring
// kernels (cp.async copies, staged scales, the one-token epilogue, TMA maps, the launch with a
// shared-memory opt-in).
#pragma once

#include <cstring>
#include <type_traits>

#include "common/tma_host.cuh"
#include "gemv_unpack.cuh"

namespace fl {
namespace gemv {

// One call of fl_gemv_quant_path after its checks: y [m, n] = x [m, k] . W^T, W in `format`.
struct GemvArgs {
    Fmt format;
    bool bf16;  // x and y bf16, else f16
    const void *x, *w, *scales;
    const uint8_t *zeros;
    void *y;
    int m;
    int64_t n, k;
    int group;
    cudaStream_t stream;
};

// f(Type<T>{}) with T the call's activation type.
template <typename T> struct Type {
    using type = T;
};
template <typename Fn> decltype(auto) with_act_type(const GemvArgs &a, Fn &&f) {
    if (a.bf16) return f(Type<__nv_bfloat16>{});
    return f(Type<__half>{});
}

// ---------------------------------------------------------------- the launchers of each file
// `*_applies`: whether the automatic choice takes that kernel for the call (host-side rule of
// its file); `launch_*`: launches it and returns true with the launch's status in `st`, or
// false, with no error left behind, when the device refuses its shared memory (the caller then
// takes the next kernel).

// gemv_fma.cu: the CUDA-core kernel, every format and m; one warp per output row, 4 per CTA.
constexpr int kFmaRowsPerCta = 4;
fl_status launch_fma(const GemvArgs &a);
// gemv_mma.cu: the general tensor-core kernel, every format and m.
fl_status launch_mma(const GemvArgs &a);
// gemv_one_token_int.cu: int8 / int4 at m = 1, cp.async rings per warp ...
bool one_token_int_applies(Fmt f, int m, int64_t n, int64_t k, int group);
bool launch_one_token_int(const GemvArgs &a, fl_status &st);
// ... and int8 at m = 1 on sm_90+, one ring per CTA filled by TMA.
bool one_token_int8_tma_applies(int m, int64_t n, int64_t k);
bool launch_one_token_int8_tma(const GemvArgs &a, fl_status &st);
// gemv_one_token_gguf.cu: Q8_0 / Q4_0 at m = 1 with k % 256 == 0, cp.async rings per warp ...
bool one_token_gguf_applies(Fmt f, int m, int64_t n, int64_t k);
bool launch_one_token_gguf(const GemvArgs &a, fl_status &st);
// ... and on sm_90+, rings filled by TMA.
bool one_token_gguf_tma_applies(Fmt f, int m, int64_t n, int64_t k);
bool launch_one_token_gguf_tma(const GemvArgs &a, fl_status &st);
// gemv_multi_token.cu: m = 2..16 with k % 256 == 0, Q8_0 / Q4_0 and int8 / int4.
bool multi_token_gguf_applies(int m, int64_t k);
bool launch_multi_token_gguf(const GemvArgs &a, fl_status &st);
bool multi_token_int_applies(Fmt f, int m, int64_t n, int64_t k, int group);
bool launch_multi_token_int(const GemvArgs &a, fl_status &st);

// ---------------------------------------------------------------- ring kernels: copies
// The most dynamic shared memory a ring kernel takes (its x, scales and rings); past it the
// call takes another kernel.
constexpr int64_t kMaxRingSmem = 160 << 10;

// common.cuh's cp_async16 with a generic pointer to the shared-memory destination.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    fl::cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), gmem, src_bytes);
}

// The same with an L2 prefetch-size hint (PF = 128 or 256 bytes: on a miss the L2 fetches the
// aligned PF bytes around the 16), for the one-token rings' weight copies: the int kernel takes
// 256 (its 4 or 8 warps copy adjacent 64-byte pieces of each row at once), the GGUF kernel 128
// (a warp's superchunk is 8 or 16 blocks of a row); see kernels/experiments/gemv.md.
template <int PF> __device__ __forceinline__ void cp_async16_pf(void *smem, const void *gmem, int src_bytes) {
    static_assert(PF == 128 || PF == 256, "an L2 prefetch size the callers measured");
    const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    if constexpr (PF == 256)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem), "r"(src_bytes)
                     : "memory");
    else
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem), "r"(src_bytes)
                     : "memory");
}

__host__ __device__ constexpr int round16(int b) { return (b + 15) & ~15; }

// ---------------------------------------------------------------- ring kernels: staged int4 scales
// Row strides of the int4 scales (halves) and zeros (bytes) that the int kernels stage per
// CTA: a row whose length is a multiple of 128 bytes is padded by 16, so that the 8 rows g that
// a warp's lanes read at once (row stride 4 mod 8 words) fall in 8 different groups of 4 banks
// instead of one bank. Rows of 64 bytes (4-way conflicts) stay unpadded: padded, they were
// slower at 16 tokens.
__host__ __device__ inline int scale_row_stride(int groups) { return groups % 64 == 0 ? groups + 8 : groups; }
__host__ __device__ inline int zero_row_stride(int groups) { return groups % 128 == 0 ? groups + 16 : groups; }
// Their bytes for nt 8-row tiles.
template <int F> __host__ __device__ inline int staged_scale_bytes(int nt, int groups) {
    return (F == I4 || F == I4Z) ? round16(8 * nt * scale_row_stride(groups) * 2) : 0;
}
template <int F> __host__ __device__ inline int staged_zero_bytes(int nt, int groups) {
    return F == I4Z ? round16(8 * nt * zero_row_stride(groups)) : 0;
}

// Copies `valid` elements of E (2 or 1 bytes) from src to the shared run dst of `slots`
// elements (a multiple of 16 bytes), zeros after them: whole 16-byte words by cp.async (the
// caller commits), the word holding the end of the run by element loads (a cp.async of fewer
// than 16 source bytes still reads 16), all by element loads when src is not 16-byte aligned.
template <typename E> __device__ __forceinline__ void stage_run(E *dst, const E *src, int valid, int slots) {
    constexpr int PER = 16 / sizeof(E);
    if (aligned16(src)) {
        const int full = valid / PER;
        for (int c = threadIdx.x; c < slots / PER; c += blockDim.x)
            if (c != full) cp_async16(dst + c * PER, c < full ? src + c * PER : src, c < full ? 16 : 0);
        if (full < slots / PER)
            for (int e = full * PER + (int)threadIdx.x; e < (full + 1) * PER; e += blockDim.x)
                dst[e] = e < valid ? __ldg(src + e) : E(0);
    } else {
        for (int e = threadIdx.x; e < slots; e += blockDim.x) dst[e] = e < valid ? __ldg(src + e) : E(0);
    }
}
// `rows` rows of `cols` elements (row r at src + r cols) to dst at a row stride of `stride`
// elements, then zero rows up to `slots` rows: one run (stage_run, `bytes` of dst) when stride
// == cols; else (a padded stride: cols a whole number of 16-byte words) by cp.async per
// 16-byte word when src is 16-byte aligned, by element loads otherwise.
template <typename E>
__device__ __forceinline__ void stage_rows(E *dst, const E *src, int rows, int cols, int stride, int slots, int bytes) {
    if (stride == cols) {
        stage_run(dst, src, rows * cols, bytes / (int)sizeof(E));
        return;
    }
    constexpr int PER = 16 / sizeof(E);
    if (aligned16(src)) {
        const int words = cols / PER;
        for (int c = threadIdx.x; c < slots * words; c += blockDim.x) {
            const int r = c / words, e = (c - r * words) * PER;
            cp_async16(dst + r * stride + e, r < rows ? src + r * cols + e : src, r < rows ? 16 : 0);
        }
    } else {
        for (int c = threadIdx.x; c < slots * cols; c += blockDim.x) {
            const int r = c / cols, e = c - r * cols;
            dst[r * stride + e] = r < rows ? __ldg(src + c) : E(0);
        }
    }
}

// ---------------------------------------------------------------- GGUF rings
// Bytes of a run of BPS blocks of one row, and 16-byte words of a slot of such runs for the
// CTA's 8 NT rows (row r's run at r * gguf_run_bytes / 16).
template <int F, int BPS> __host__ __device__ constexpr int gguf_run_bytes() { return BPS * block_bytes<F>(); }
template <int F, int NT, int BPS> __host__ __device__ constexpr int gguf_slot_words() {
    return NT * 8 * gguf_run_bytes<F, BPS>() / 16;
}

// ---------------------------------------------------------------- one-token epilogue
// acc[j] holds this lane's sums of rows g and g + 8 of 16-row tile j0 + j in two D columns
// each (acc[j][0..1] and acc[j][2..3]): they are added, then summed over the 4 lanes t (xor 1,
// 2), into red[grp] (the CTA's R row sums of this warp's group; a group's warps hold disjoint
// rows). After one barrier, thread r < R adds the NG groups' row r in order (deterministic)
// and corr[r] when corr is given (the int4 raw product's offsets), applies int8's row scale
// (f32 `scales`), and writes y[base + r] when that row is < n.
template <int F, typename T, int NJ, int R, int NG>
__device__ __forceinline__ void one_token_epilogue(const float (&acc)[NJ][4], float (&red)[NG][R], int grp, int j0,
                                                   int g, int t, const void *scales, T *y, int64_t base, int64_t n,
                                                   const float *corr = nullptr) {
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            float v = acc[j][2 * c] + acc[j][2 * c + 1];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            if (t == 0) red[grp][16 * (j0 + j) + 8 * c + g] = v;
        }
    __syncthreads();
    if (threadIdx.x < R) {
        const int64_t col = base + threadIdx.x;
        if (col < n) {
            float v = 0.f;
#pragma unroll
            for (int u = 0; u < NG; ++u) v += red[u][threadIdx.x];
            if (corr) v += corr[threadIdx.x];
            if constexpr (F == I8) v *= __ldg(static_cast<const float *>(scales) + col);
            y[col] = from_f32<T>(v);
        }
    }
}

// ---------------------------------------------------------------- host: TMA map, launch
// The weights as n rows of rowb bytes, a 2-d tensor of 8-byte elements, with boxes of box_bytes /
// 8 x box_rows, zero-filled out of bounds: the map of the one-token TMA kernels. False when the
// driver's encoder is missing or refuses (w must be 16-byte aligned, rowb a multiple of 16).
inline bool rows_map(CUtensorMap *m, const uint8_t *w, int64_t n, int64_t rowb, int box_bytes, int box_rows) {
    const auto enc = encode_fn();
    if (!enc || !aligned16(w)) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)(rowb / 8), (cuuint64_t)n};
    const cuuint64_t strides[1] = {(cuuint64_t)rowb};
    const cuuint32_t box[2] = {(cuuint32_t)(box_bytes / 8), (cuuint32_t)box_rows};
    const cuuint32_t estr[2] = {1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, const_cast<uint8_t *>(w), dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Lets `kernel` launch with `smem` bytes of dynamic shared memory (above the 48 KB default).
// The limit is per function and process-wide, so it is always set to one value per kernel and
// device, never to this launch's size: the most the device allows a block beside the kernel's
// static shared memory (setting it to each launch's size raced between host threads launching
// one kernel with different k: see the test gemv_one_token_kernels_from_several_host_threads).
// One attribute lookup per launch; the set only when the value differs. False, with the error
// cleared, when `smem` is above what the device allows (e.g. 99 KB on sm_86 / sm_89).
template <typename Kernel> bool opt_in_smem(Kernel kernel, int64_t smem) {
    if (smem <= (48 << 10)) return true;
    cudaFuncAttributes fa;
    const int optin = smem_optin();
    if (optin <= 0 || cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    const int most = optin - (int)fa.sharedSizeBytes;
    if (smem > most) return false;
    if (fa.maxDynamicSharedSizeBytes != most &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

// The launch of every ring kernel: opts `kernel` into `smem` bytes of dynamic shared memory and
// launches ceil(n / rows) CTAs of `threads` with `args`. Returns true with the launch's status
// in `st` (FL_ERR_INVALID_ARGUMENT past 2^31 - 1 CTAs); false, with no error left behind, when
// the device refuses the shared memory.
template <typename... P, typename... A>
bool launch_ring(void (*kernel)(P...), int64_t smem, int64_t n, int rows, int threads, cudaStream_t s,
                 fl_status &st, A... args) {
    if (!opt_in_smem(kernel, smem)) return false;
    const int64_t ctas = ceil_div(n, rows);
    if (ctas > 0x7fffffffLL) {
        st = FL_ERR_INVALID_ARGUMENT;
        return true;
    }
    kernel<<<(unsigned)ctas, threads, (size_t)smem, s>>>(args...);
    st = launch_status();
    return true;
}

}  // namespace gemv
}  // namespace fl
