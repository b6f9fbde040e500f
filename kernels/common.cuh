// Shared by every kernel file (prepended before NVRTC compiles it). No CUDA headers: NVRTC on a
// machine with only the driver and libnvrtc has none, so bfloat16 is a 16-bit struct here and
// converted by bit operations (round to nearest even, NaN kept).
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
struct bf16 { u16 x; };

__device__ __forceinline__ float ld(const float* p, long i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16* p, long i) {
    return __uint_as_float(((u32)p[i].x) << 16);
}
__device__ __forceinline__ void st(float* p, long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16* p, long i, float v) {
    u32 u = __float_as_uint(v);
    u16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) r = 0x7fc0;
    else r = (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    p[i].x = r;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block (blockDim.x a multiple of 32); the result is valid in thread 0.
__device__ __forceinline__ float block_sum(float v, float* sh) {
    v = warp_sum(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : 0.f;
    if (w == 0) v = warp_sum(v);
    return v;
}

#define GRID_STRIDE(t, total) \
    for (long t = blockIdx.x * (long)blockDim.x + threadIdx.x; t < (total); \
         t += (long)gridDim.x * blockDim.x)
