// Elementwise and small reduction kernels of the models: ReLU, max pooling, residual sums,
// global average pooling, the linear layer's bias, casts between float32 and bfloat16.

template <typename T>
__device__ void relu_impl(T* x, long total) {
    GRID_STRIDE(t, total) st(x, t, fmaxf(ld(x, t), 0.f));
}
template <typename T>
__device__ void relu_bwd_impl(const T* y, T* dy, long total) {
    GRID_STRIDE(t, total) if (ld(y, t) <= 0.f) st(dy, t, 0.f);
}

// k x k windows at `stride`, zero padding `pad` that never wins (floor output size). One thread
// per output; arg = ky * k + kx of the winner, the first on ties (strict >, scanning ky then kx,
// like the CPU). Plane offsets are long: n * c * h * w passes 2^31 on large batches.
template <typename T>
__device__ void maxpool_impl(const T* x, T* y, u8* arg, long planes, int h, int w, int oh, int ow,
                             int k, int stride, int pad) {
    long ohw = (long)oh * ow, hw = (long)h * w;
    long total = planes * ohw;
    GRID_STRIDE(t, total) {
        long p = t / ohw;
        int r = (int)(t - p * ohw);
        int oy = r / ow, ox = r % ow;
        int y0 = oy * stride - pad, x0 = ox * stride - pad;
        const T* xp = x + p * hw;
        float best = __int_as_float(0xff800000);  // -inf, kept only if no window element is real
        int a = 0;
        bool found = false;
        for (int ky = 0; ky < k; ky++) {
            int yy = y0 + ky;
            if (yy < 0 || yy >= h) continue;
            for (int kx = 0; kx < k; kx++) {
                int xx = x0 + kx;
                if (xx < 0 || xx >= w) continue;
                float v = ld(xp, (long)yy * w + xx);
                if (!found || v > best) {
                    best = v;
                    a = ky * k + kx;
                    found = true;
                }
            }
        }
        st(y, t, best);
        arg[t] = (u8)a;
    }
}

// One thread per input element, gathering (no atomics, so the sums are deterministic) from the
// outputs whose window covers it, in ascending (oy, ox) order: the first contribution is taken
// as is and the rest added in float32; 0 when it won no window.
template <typename T>
__device__ void maxpool_bwd_impl(const T* dy, const u8* arg, T* dx, long planes, int h, int w,
                                 int oh, int ow, int k, int stride, int pad) {
    long ohw = (long)oh * ow, hw = (long)h * w;
    long total = planes * hw;
    GRID_STRIDE(t, total) {
        long p = t / hw;
        int r = (int)(t - p * hw);
        int yy = r / w, xx = r % w;
        // Outputs o whose window o*stride - pad .. o*stride - pad + k - 1 holds the position:
        // ceil((yy + pad - k + 1) / stride) <= o <= (yy + pad) / stride (C division truncates,
        // so the lower bound's negative numerators are clamped first).
        int ny = yy + pad - k + 1, nx = xx + pad - k + 1;
        int oy0 = ny <= 0 ? 0 : (ny + stride - 1) / stride;
        int ox0 = nx <= 0 ? 0 : (nx + stride - 1) / stride;
        int oy1 = (yy + pad) / stride, ox1 = (xx + pad) / stride;
        if (oy1 > oh - 1) oy1 = oh - 1;
        if (ox1 > ow - 1) ox1 = ow - 1;
        const T* dyp = dy + p * ohw;
        const u8* ap = arg + p * ohw;
        float v = 0.f;
        bool any = false;
        for (int oy = oy0; oy <= oy1; oy++) {
            int ky = yy + pad - oy * stride;
            for (int ox = ox0; ox <= ox1; ox++) {
                int kx = xx + pad - ox * stride;
                long o = (long)oy * ow + ox;
                if (ap[o] == (u8)(ky * k + kx)) {
                    float d = ld(dyp, o);
                    v = any ? v + d : d;
                    any = true;
                }
            }
        }
        st(dx, t, v);
    }
}

// y = a + b (then max(y, 0) when relu), in float32 whatever the storage type.
template <typename T>
__device__ void add_impl(const T* a, const T* b, T* y, long total, int relu) {
    GRID_STRIDE(t, total) {
        float v = ld(a, t) + ld(b, t);
        if (relu) v = fmaxf(v, 0.f);
        st(y, t, v);
    }
}
template <typename T>
__device__ void accumulate_impl(T* dst, const T* src, long total) {
    GRID_STRIDE(t, total) st(dst, t, ld(dst, t) + ld(src, t));
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
    extern "C" __global__ void maxpool_##TN(const T* x, T* y, u8* arg, long planes, int h,   \
                                            int w, int oh, int ow, int k, int stride,        \
                                            int pad) {                                       \
        maxpool_impl<T>(x, y, arg, planes, h, w, oh, ow, k, stride, pad);                    \
    }                                                                                        \
    extern "C" __global__ void maxpool_bwd_##TN(const T* dy, const u8* arg, T* dx,           \
                                                long planes, int h, int w, int oh, int ow,   \
                                                int k, int stride, int pad) {                \
        maxpool_bwd_impl<T>(dy, arg, dx, planes, h, w, oh, ow, k, stride, pad);              \
    }                                                                                        \
    extern "C" __global__ void add_##TN(const T* a, const T* b, T* y, long total,            \
                                        int relu) {                                          \
        add_impl<T>(a, b, y, total, relu);                                                   \
    }                                                                                        \
    extern "C" __global__ void accumulate_##TN(T* dst, const T* src, long total) {           \
        accumulate_impl<T>(dst, src, total);                                                 \
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
