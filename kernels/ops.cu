// Elementwise and small reduction kernels of the models on NHWC tensors: ReLU, max pooling,
// residual sums, global average pooling, the linear layer's bias, casts between float32 and
// bfloat16, and the convolution weights between their float32 [K, C, R, S] master copy and the
// [K, R, S, Cs] layout cuDNN reads beside NHWC tensors.

template <typename T>
__device__ void relu_impl(T* x, long total) {
    GRID_STRIDE(t, total) st(x, t, fmaxf(ld(x, t), 0.f));
}
template <typename T>
__device__ void relu_bwd_impl(const T* y, T* dy, long total) {
    GRID_STRIDE(t, total) if (ld(y, t) <= 0.f) st(dy, t, 0.f);
}

// V winners' places (u8) at once.
template <int V>
__device__ __forceinline__ void ld_u8v(const u8* p, long i, u8* a) {
    if constexpr (V == 8) {
        uint2 u = *reinterpret_cast<const uint2*>(p + i);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            a[k] = (u.x >> (8 * k)) & 0xff;
            a[4 + k] = (u.y >> (8 * k)) & 0xff;
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) a[k] = p[i + k];
    }
}
template <int V>
__device__ __forceinline__ void st_u8v(u8* p, long i, const u8* a) {
    if constexpr (V == 8) {
        uint2 u = make_uint2(0, 0);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u.x |= (u32)a[k] << (8 * k);
            u.y |= (u32)a[4 + k] << (8 * k);
        }
        *reinterpret_cast<uint2*>(p + i) = u;
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) p[i + k] = a[k];
    }
}

// k x k windows at `stride`, zero padding `pad` that never wins (floor output size). One thread
// per output pixel and group of V channels; arg = ky * k + kx of the winner, the first on ties
// (strict >, scanning ky then kx, like the CPU).
template <int V, typename T>
__device__ void maxpool_impl(const T* x, T* y, u8* arg, long n, int C, int h, int w, int oh,
                             int ow, int k, int stride, int pad) {
    int G = C / V, per = oh * ow * G;
    SAMPLE_STRIDE(s, n) ITEM_STRIDE(i, per) {
        int g = i % G, r = i / G;
        int ox = r % ow, oy = r / ow;
        int y0 = oy * stride - pad, x0 = ox * stride - pad;
        float best[V];
        u8 a[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            best[j] = __int_as_float(0xff800000);  // -inf, kept only if no window element is real
            a[j] = 0;
        }
        bool found = false;
        for (int ky = 0; ky < k; ky++) {
            int yy = y0 + ky;
            if (yy < 0 || yy >= h) continue;
            for (int kx = 0; kx < k; kx++) {
                int xx = x0 + kx;
                if (xx < 0 || xx >= w) continue;
                float v[V];
                ldv<V>(x, ((s * h + yy) * w + xx) * C + g * V, v);
#pragma unroll
                for (int j = 0; j < V; j++) {
                    if (!found || v[j] > best[j]) {
                        best[j] = v[j];
                        a[j] = (u8)(ky * k + kx);
                    }
                }
                found = true;
            }
        }
        long o = (s * per + i) * V;
        stv<V>(y, o, best);
        st_u8v<V>(arg, o, a);
    }
}

// One thread per input pixel and group of V channels, gathering (no atomics, so the sums are
// deterministic) from the outputs whose window covers it, in ascending (oy, ox) order: the first
// contribution is taken as is and the rest added in float32; 0 when it won no window.
template <int V, typename T>
__device__ void maxpool_bwd_impl(const T* dy, const u8* arg, T* dx, long n, int C, int h, int w,
                                 int oh, int ow, int k, int stride, int pad) {
    int G = C / V, per = h * w * G;
    SAMPLE_STRIDE(s, n) ITEM_STRIDE(i, per) {
        int g = i % G, r = i / G;
        int xx = r % w, yy = r / w;
        // Outputs o whose window o*stride - pad .. o*stride - pad + k - 1 holds the position:
        // ceil((yy + pad - k + 1) / stride) <= o <= (yy + pad) / stride (C division truncates,
        // so the lower bound's negative numerators are clamped first).
        int ny = yy + pad - k + 1, nx = xx + pad - k + 1;
        int oy0 = ny <= 0 ? 0 : (ny + stride - 1) / stride;
        int ox0 = nx <= 0 ? 0 : (nx + stride - 1) / stride;
        int oy1 = (yy + pad) / stride, ox1 = (xx + pad) / stride;
        if (oy1 > oh - 1) oy1 = oh - 1;
        if (ox1 > ow - 1) ox1 = ow - 1;
        float v[V];
        bool any[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            v[j] = 0.f;
            any[j] = false;
        }
        for (int oy = oy0; oy <= oy1; oy++) {
            int ky = yy + pad - oy * stride;
            for (int ox = ox0; ox <= ox1; ox++) {
                int kx = xx + pad - ox * stride;
                u8 code = (u8)(ky * k + kx);
                long o = ((s * oh + oy) * ow + ox) * C + g * V;
                u8 a[V];
                ld_u8v<V>(arg, o, a);
                bool hit = false;
#pragma unroll
                for (int j = 0; j < V; j++) hit |= a[j] == code;
                if (!hit) continue;
                float d[V];
                ldv<V>(dy, o, d);
#pragma unroll
                for (int j = 0; j < V; j++) {
                    if (a[j] == code) {
                        v[j] = any[j] ? v[j] + d[j] : d[j];
                        any[j] = true;
                    }
                }
            }
        }
        stv<V>(dx, (s * per + i) * V, v);
    }
}

// y = a + b (then max(y, 0) when relu), in float32 whatever the storage type; V at a time.
template <int V, typename T>
__device__ void add_impl(const T* a, const T* b, T* y, long total, int relu) {
    long vecs = total / V;
    GRID_STRIDE(t, vecs) {
        float p[V], q[V];
        ldv<V>(a, t * V, p);
        ldv<V>(b, t * V, q);
#pragma unroll
        for (int j = 0; j < V; j++) {
            p[j] += q[j];
            if (relu) p[j] = fmaxf(p[j], 0.f);
        }
        stv<V>(y, t * V, p);
    }
}
template <int V, typename T>
__device__ void accumulate_impl(T* dst, const T* src, long total) {
    long vecs = total / V;
    GRID_STRIDE(t, vecs) {
        float p[V], q[V];
        ldv<V>(dst, t * V, p);
        ldv<V>(src, t * V, q);
#pragma unroll
        for (int j = 0; j < V; j++) p[j] += q[j];
        stv<V>(dst, t * V, p);
    }
}

// Global average pooling of [n, hw, C]: block (s, b) takes channels b*32 .. b*32 + 31 of
// sample s, its 8 warps the pixels p = warp, warp + 8, ..., added in that fixed order.
template <typename T>
__device__ void gap_impl(const T* x, float* y, int C, int hw) {
    __shared__ float sh[8][32];
    int s = blockIdx.x, lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    int c = blockIdx.y * 32 + lane;
    float v = 0.f;
    if (c < C)
        for (int p = wp; p < hw; p += 8) v += ld(x, ((long)s * hw + p) * C + c);
    sh[wp][lane] = v;
    __syncthreads();
    if (wp == 0 && c < C) {
        for (int j = 1; j < 8; j++) v += sh[j][lane];
        y[(long)s * C + c] = v / hw;
    }
}
template <typename T>
__device__ void gap_bwd_impl(const float* dy, T* dx, long n, int C, int hw) {
    int per = hw * C;
    SAMPLE_STRIDE(s, n) ITEM_STRIDE(i, per) st(dx, s * per + i, dy[s * C + i % C] / hw);
}

template <typename S, typename D>
__device__ void cast_impl(const S* s, D* d, long total) {
    GRID_STRIDE(t, total) st(d, t, ld(s, t));
}

// out[K, RS, Cs] (channels from Cin on zero) from w[K, Cin, RS].
template <typename T>
__device__ void wpack_impl(const float* w, T* out, int K, int Cin, int RS, int Cs) {
    long total = (long)K * RS * Cs;
    GRID_STRIDE(t, total) {
        int c = (int)(t % Cs);
        long r = t / Cs;
        int rs = (int)(r % RS);
        long kk = r / RS;
        st(out, t, c < Cin ? w[(kk * Cin + c) * RS + rs] : 0.f);
    }
}
// out[K, Cin, RS] from dw[K, RS, Cs].
template <typename T>
__device__ void wunpack_impl(const T* dw, float* out, int K, int Cin, int RS, int Cs) {
    long total = (long)K * Cin * RS;
    GRID_STRIDE(t, total) {
        int rs = (int)(t % RS);
        long r = t / RS;
        int c = (int)(r % Cin);
        long kk = r / Cin;
        out[t] = ld(dw, (kk * RS + rs) * Cs + c);
    }
}

#define OPS(TN, T)                                                                           \
    extern "C" __global__ void relu_##TN(T* x, long total) { relu_impl<T>(x, total); }       \
    extern "C" __global__ void relu_bwd_##TN(const T* y, T* dy, long total) {                \
        relu_bwd_impl<T>(y, dy, total);                                                      \
    }                                                                                        \
    extern "C" __global__ void gap_##TN(const T* x, float* y, int C, int hw) {               \
        gap_impl<T>(x, y, C, hw);                                                            \
    }                                                                                        \
    extern "C" __global__ void gap_bwd_##TN(const float* dy, T* dx, long n, int C, int hw) { \
        gap_bwd_impl<T>(dy, dx, n, C, hw);                                                   \
    }                                                                                        \
    extern "C" __global__ void wpack_##TN(const float* w, T* out, int K, int Cin, int RS,    \
                                          int Cs) {                                          \
        wpack_impl<T>(w, out, K, Cin, RS, Cs);                                               \
    }                                                                                        \
    extern "C" __global__ void wunpack_##TN(const T* dw, float* out, int K, int Cin, int RS, \
                                            int Cs) {                                        \
        wunpack_impl<T>(dw, out, K, Cin, RS, Cs);                                            \
    }
OPS(f32, float)
OPS(bf16, bf16)

#define OPSV(TN, T, V)                                                                       \
    extern "C" __global__ void maxpool_##TN##_v##V(const T* x, T* y, u8* arg, long n, int C, \
                                                   int h, int w, int oh, int ow, int k,      \
                                                   int stride, int pad) {                    \
        maxpool_impl<V, T>(x, y, arg, n, C, h, w, oh, ow, k, stride, pad);                   \
    }                                                                                        \
    extern "C" __global__ void maxpool_bwd_##TN##_v##V(const T* dy, const u8* arg, T* dx,    \
                                                       long n, int C, int h, int w, int oh,  \
                                                       int ow, int k, int stride, int pad) { \
        maxpool_bwd_impl<V, T>(dy, arg, dx, n, C, h, w, oh, ow, k, stride, pad);             \
    }                                                                                        \
    extern "C" __global__ void add_##TN##_v##V(const T* a, const T* b, T* y, long total,     \
                                               int relu) {                                   \
        add_impl<V, T>(a, b, y, total, relu);                                                \
    }                                                                                        \
    extern "C" __global__ void accumulate_##TN##_v##V(T* dst, const T* src, long total) {    \
        accumulate_impl<V, T>(dst, src, total);                                              \
    }
OPSV(f32, float, 1)
OPSV(f32, float, 8)
OPSV(bf16, bf16, 1)
OPSV(bf16, bf16, 8)

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
