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

// V consecutive values (a channel group of an NHWC row) as float32. With V = 8 the access is 16
// bytes of bfloat16 or two of 16 bytes of float32: `i` must be a multiple of 8 (rows of C % 8 == 0
// channels from a 256-byte aligned allocation are).
template <int V>
__device__ __forceinline__ void ldv(const bf16* p, long i, float* v) {
    if constexpr (V == 8) {
        uint4 u = *reinterpret_cast<const uint4*>(p + i);
        u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = __uint_as_float(w[k] << 16);
            v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) v[k] = ld(p, i + k);
    }
}
template <int V>
__device__ __forceinline__ void ldv(const float* p, long i, float* v) {
    if constexpr (V == 8) {
        float4 a = *reinterpret_cast<const float4*>(p + i);
        float4 b = *reinterpret_cast<const float4*>(p + i + 4);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) v[k] = p[i + k];
    }
}
__device__ __forceinline__ u32 bf16_bits(float v) {
    u32 u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
template <int V>
__device__ __forceinline__ void stv(bf16* p, long i, const float* v) {
    if constexpr (V == 8) {
        uint4 u;
        u.x = bf16_bits(v[0]) | bf16_bits(v[1]) << 16;
        u.y = bf16_bits(v[2]) | bf16_bits(v[3]) << 16;
        u.z = bf16_bits(v[4]) | bf16_bits(v[5]) << 16;
        u.w = bf16_bits(v[6]) | bf16_bits(v[7]) << 16;
        *reinterpret_cast<uint4*>(p + i) = u;
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) st(p, i + k, v[k]);
    }
}
template <int V>
__device__ __forceinline__ void stv(float* p, long i, const float* v) {
    if constexpr (V == 8) {
        *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<float4*>(p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) p[i + k] = v[k];
    }
}

// Per-sample loops of the NHWC kernels: blockIdx.y strides over the n samples and x over the
// `per` items of one sample, so index arithmetic within a sample is 32-bit (a sample has fewer
// than 2^31 values).
#define SAMPLE_STRIDE(s, n) for (long s = blockIdx.y; s < (n); s += gridDim.y)
#define ITEM_STRIDE(i, per) \
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (per); i += gridDim.x * blockDim.x)

// A sample's crop offset and flip (`Aug::packed`: dy | dx << 8 | flip << 16); without `aug` the
// sample is centred and unflipped. One rule for images (input.cu) and masks (seg.cu), which must
// move together.
struct Crop {
    int dy, dx;
    bool flip;
};
__device__ __forceinline__ Crop crop_of(const u32* aug, long s, int pad) {
    Crop c{pad, pad, false};
    if (aug) {
        u32 a = aug[s];
        c.dy = a & 0xff;
        c.dx = (a >> 8) & 0xff;
        c.flip = (a >> 16) & 1;
    }
    return c;
}
