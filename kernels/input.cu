// Raw u8/u16 pixels (NCHW, as stored) to normalised float32 or bfloat16 NHWC tensors, with the
// crop (pad, then offset) and the flip of each sample, and the labels beside them. `idx`
// (optional) gathers samples from a dataset held in GPU memory; without it sample s is the s-th
// of `pix`. `aug` (optional) packs dy | dx << 8 | flip << 16 per sample; without it every sample
// is centred and unflipped.
template <typename P, typename T>
__device__ void load_impl(const P* pix, const u32* idx, const u32* lab, const u32* aug,
                          const float* mean, const float* stdv, T* out, float* labels_out,
                          int n, int c, int h, int w, int pad, float maxv, int cs) {
    // One thread per output pixel, writing its cs channels (NHWC; channels from c on are zero:
    // the padding that gives the first convolution an aligned channel count).
    long total = (long)n * h * w;
    long per = (long)c * h * w;
    GRID_STRIDE(t, total) {
        int x = t % w;
        long r = t / w;
        int y = r % h;
        long s = r / h;
        long src = idx ? (long)idx[s] : s;
        int dy = pad, dx = pad;
        bool flip = false;
        if (aug) {
            u32 a = aug[s];
            dy = a & 0xff;
            dx = (a >> 8) & 0xff;
            flip = (a >> 16) & 1;
        }
        int xx = flip ? w - 1 - x : x;
        int sy = y + dy - pad, sx = xx + dx - pad;
        bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
        const P* px = pix + src * per + (long)sy * w + sx;
        for (int ci = 0; ci < cs; ci++) {
            float v = 0.f;
            if (inside && ci < c) v = ((float)px[(long)ci * h * w] / maxv - mean[ci]) / stdv[ci];
            st(out, t * cs + ci, v);
        }
        if (y == 0 && x == 0) labels_out[s] = (float)lab[src];
    }
}

#define LOAD(PN, P, TN, T)                                                                   \
    extern "C" __global__ void load_##PN##_##TN(                                             \
        const P* pix, const u32* idx, const u32* lab, const u32* aug, const float* mean,     \
        const float* stdv, T* out, float* labels_out, int n, int c, int h, int w, int pad,   \
        float maxv, int cs) {                                                                \
        load_impl<P, T>(pix, idx, lab, aug, mean, stdv, out, labels_out, n, c, h, w, pad,    \
                        maxv, cs);                                                           \
    }
LOAD(u8, u8, f32, float)
LOAD(u8, u8, bf16, bf16)
LOAD(u16, u16, f32, float)
LOAD(u16, u16, bf16, bf16)
