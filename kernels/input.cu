// IEEE half-precision pixels, converted by bit operations (NVRTC here has no cuda_fp16.h).
struct f16px { u16 x; };

__device__ __forceinline__ float half_to_float(u16 h) {
    u32 sign = (u32)(h & 0x8000u) << 16;
    u32 exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    // Infinity and NaN (never in a dataset: readers reject them) keep their class.
    if (exp == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0u) {
        // Zero and subnormals: man * 2^-24, exact in float32.
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// A stored pixel as float32: integers by value, floats exactly.
__device__ __forceinline__ float pixel(u8 v) { return (float)v; }
__device__ __forceinline__ float pixel(u16 v) { return (float)v; }
__device__ __forceinline__ float pixel(f16px v) { return half_to_float(v.x); }
__device__ __forceinline__ float pixel(float v) { return v; }

// Raw pixels (NCHW, as stored) to normalised float32 or bfloat16 NHWC tensors, with the
// crop (pad, then offset) and the flip of each sample, and the labels beside them. `idx`
// (optional) gathers samples from a dataset held in GPU memory; without it sample s is the s-th
// of `pix`. `aug` (optional) packs dy | dx << 8 | flip << 16 per sample; without it every sample
// is centred and unflipped. `maxv` is the dtype's divisor: 255 or 65535 for u8/u16 (pixels in
// [0, 1]), 1 for f16/f32 (values used as they are), as the CPU's `load_batch`.
template <int V, typename P, typename T>
__device__ void load_impl(const P* pix, const u32* idx, const u32* lab, const u32* aug,
                          const float* mean, const float* stdv, T* out, float* labels_out,
                          int n, int c, int h, int w, int pad, float maxv, int cs) {
    // One thread per output pixel and group of V channels (NHWC; channels from c on are zero:
    // the padding that gives the first convolution an aligned channel count).
    int groups = cs / V, per = h * w * groups;
    long plane = (long)h * w;
    SAMPLE_STRIDE(s, n) {
        long src = idx ? (long)idx[s] : s;
        Crop cr = crop_of(aug, s, pad);
        int dy = cr.dy, dx = cr.dx;
        bool flip = cr.flip;
        ITEM_STRIDE(i, per) {
            int g = i % groups, p = i / groups;
            int x = p % w, y = p / w;
            int xx = flip ? w - 1 - x : x;
            int sy = y + dy - pad, sx = xx + dx - pad;
            bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
            const P* px = pix + src * c * plane + (long)sy * w + sx;
            float v[V];
#pragma unroll
            for (int k = 0; k < V; k++) {
                int ci = g * V + k;
                v[k] = 0.f;
                if (inside && ci < c) v[k] = (pixel(px[ci * plane]) / maxv - mean[ci]) / stdv[ci];
            }
            stv<V>(out, (s * per + i) * V, v);
        }
        if (blockIdx.x == 0 && threadIdx.x == 0) labels_out[s] = (float)lab[src];
    }
}

#define LOAD(PN, P, TN, T, V)                                                                \
    extern "C" __global__ void load_##PN##_##TN##_v##V(                                      \
        const P* pix, const u32* idx, const u32* lab, const u32* aug, const float* mean,     \
        const float* stdv, T* out, float* labels_out, int n, int c, int h, int w, int pad,   \
        float maxv, int cs) {                                                                \
        load_impl<V, P, T>(pix, idx, lab, aug, mean, stdv, out, labels_out, n, c, h, w, pad, \
                        maxv, cs);                                                           \
    }
LOAD(u8, u8, f32, float, 1)
LOAD(u8, u8, f32, float, 8)
LOAD(u8, u8, bf16, bf16, 1)
LOAD(u8, u8, bf16, bf16, 8)
LOAD(u16, u16, f32, float, 1)
LOAD(u16, u16, f32, float, 8)
LOAD(u16, u16, bf16, bf16, 1)
LOAD(u16, u16, bf16, bf16, 8)
LOAD(f16, f16px, f32, float, 1)
LOAD(f16, f16px, f32, float, 8)
LOAD(f16, f16px, bf16, bf16, 1)
LOAD(f16, f16px, bf16, bf16, 8)
LOAD(f32, float, f32, float, 1)
LOAD(f32, float, f32, float, 8)
LOAD(f32, float, bf16, bf16, 1)
LOAD(f32, float, bf16, bf16, 8)
