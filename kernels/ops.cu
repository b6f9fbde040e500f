// Elementwise and small reduction kernels of the model: ReLU, 2x2 max pooling, global average
// pooling, the linear layer's bias, casts between float32 and bfloat16.

template <typename T>
__device__ void relu_impl(T* x, long total) {
    GRID_STRIDE(t, total) st(x, t, fmaxf(ld(x, t), 0.f));
}
template <typename T>
__device__ void relu_bwd_impl(const T* y, T* dy, long total) {
    GRID_STRIDE(t, total) if (ld(y, t) <= 0.f) st(dy, t, 0.f);
}

// 2x2, stride 2, floor; arg records which of the four won (first on ties, like the CPU).
template <typename T>
__device__ void pool_impl(const T* x, T* y, u8* arg, long planes, int h, int w) {
    int oh = h / 2, ow = w / 2;
    long total = planes * oh * ow;
    GRID_STRIDE(t, total) {
        long p = t / (oh * ow);
        int r = (int)(t - p * oh * ow);
        int oy = r / ow, ox = r % ow;
        long base = p * h * w + (long)(2 * oy) * w + 2 * ox;
        float c0 = ld(x, base), c1 = ld(x, base + 1), c2 = ld(x, base + w),
              c3 = ld(x, base + w + 1);
        float best = c0;
        int k = 0;
        if (c1 > best) { best = c1; k = 1; }
        if (c2 > best) { best = c2; k = 2; }
        if (c3 > best) { best = c3; k = 3; }
        st(y, t, best);
        arg[t] = (u8)k;
    }
}

// One thread per input element: it receives the output gradient if it was the winner.
template <typename T>
__device__ void pool_bwd_impl(const T* dy, const u8* arg, T* dx, long planes, int h, int w) {
    int oh = h / 2, ow = w / 2;
    long total = planes * h * w;
    GRID_STRIDE(t, total) {
        long p = t / (h * w);
        int r = (int)(t - p * h * w);
        int yy = r / w, xx = r % w;
        int oy = yy / 2, ox = xx / 2;
        float v = 0.f;
        if (oy < oh && ox < ow) {
            long o = p * oh * ow + (long)oy * ow + ox;
            if (arg[o] == (u8)((yy & 1) * 2 + (xx & 1))) v = ld(dy, o);
        }
        st(dx, t, v);
    }
}

// One warp per (sample, channel) row.
template <typename T>
__device__ void gap_impl(const T* x, float* y, long rows, int hw) {
    long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float s = 0.f;
    for (int i = lane; i < hw; i += 32) s += ld(x, row * hw + i);
    s = warp_sum(s);
    if (lane == 0) y[row] = s / hw;
}
template <typename T>
__device__ void gap_bwd_impl(const float* dy, T* dx, long rows, int hw) {
    long total = rows * hw;
    GRID_STRIDE(t, total) st(dx, t, dy[t / hw] / hw);
}

template <typename S, typename D>
__device__ void cast_impl(const S* s, D* d, long total) {
    GRID_STRIDE(t, total) st(d, t, ld(s, t));
}

#define OPS(TN, T)                                                                           \
    extern "C" __global__ void relu_##TN(T* x, long total) { relu_impl<T>(x, total); }       \
    extern "C" __global__ void relu_bwd_##TN(const T* y, T* dy, long total) {                \
        relu_bwd_impl<T>(y, dy, total);                                                      \
    }                                                                                        \
    extern "C" __global__ void pool_##TN(const T* x, T* y, u8* arg, long planes, int h,      \
                                         int w) {                                            \
        pool_impl<T>(x, y, arg, planes, h, w);                                               \
    }                                                                                        \
    extern "C" __global__ void pool_bwd_##TN(const T* dy, const u8* arg, T* dx, long planes, \
                                             int h, int w) {                                 \
        pool_bwd_impl<T>(dy, arg, dx, planes, h, w);                                         \
    }                                                                                        \
    extern "C" __global__ void gap_##TN(const T* x, float* y, long rows, int hw) {           \
        gap_impl<T>(x, y, rows, hw);                                                         \
    }                                                                                        \
    extern "C" __global__ void gap_bwd_##TN(const float* dy, T* dx, long rows, int hw) {     \
        gap_bwd_impl<T>(dy, dx, rows, hw);                                                   \
    }
OPS(f32, float)
OPS(bf16, bf16)

extern "C" __global__ void cast_f32_bf16(const float* s, bf16* d, long total) {
    cast_impl<float, bf16>(s, d, total);
}
extern "C" __global__ void cast_bf16_f32(const bf16* s, float* d, long total) {
    cast_impl<bf16, float>(s, d, total);
}
extern "C" __global__ void cast_u8_f32(const u8* s, float* d, long total) {
    GRID_STRIDE(t, total) d[t] = (float)s[t];
}

// y[n, m] += b[m]
extern "C" __global__ void add_bias(float* y, const float* b, int n, int m) {
    long total = (long)n * m;
    GRID_STRIDE(t, total) y[t] += b[t % m];
}
// db[j] = sum over rows of dy[., j], in row order (deterministic).
extern "C" __global__ void col_sum(const float* dy, float* db, int n, int m) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= m) return;
    float s = 0.f;
    for (int r = 0; r < n; r++) s += dy[(long)r * m + j];
    db[j] = s;
}
