// Batch normalisation over (n, hw) per channel of NCHW tensors. Statistics are reduced in two
// deterministic passes: each block of a (S, C) grid sums a fixed range of one channel (shifted by
// the channel's first value, which keeps E[x^2] - E[x]^2 accurate when the mean is large), then
// one thread per channel adds the S partial sums in order, in double precision.

template <typename T>
__device__ void stats_impl(const T* x, float* part, int n, int c, int hw, int S) {
    __shared__ float sh[32];
    int ci = blockIdx.y, j = blockIdx.x;
    long M = (long)n * hw;
    long lo = M * j / S, hi = M * (j + 1) / S;
    float K = ld(x, (long)ci * hw);
    float s1 = 0.f, s2 = 0.f;
    for (long t = lo + threadIdx.x; t < hi; t += blockDim.x) {
        long s = t / hw;
        int p = (int)(t - s * hw);
        float v = ld(x, (s * c + ci) * hw + p) - K;
        s1 += v;
        s2 += v * v;
    }
    s1 = block_sum(s1, sh);
    s2 = block_sum(s2, sh);
    if (threadIdx.x == 0) {
        part[(ci * S + j) * 2] = s1;
        part[(ci * S + j) * 2 + 1] = s2;
        if (j == 0) part[c * S * 2 + ci] = K;
    }
}

extern "C" __global__ void bn_finalize(const float* part, int S, int c, long M,
                                       const float* gamma, const float* beta, float* mean_out,
                                       float* invstd_out, float* rmean, float* rvar,
                                       float momentum, float eps, float* scale, float* shift) {
    int ci = blockIdx.x * blockDim.x + threadIdx.x;
    if (ci >= c) return;
    double s1 = 0, s2 = 0;
    for (int j = 0; j < S; j++) {
        s1 += part[(ci * S + j) * 2];
        s2 += part[(ci * S + j) * 2 + 1];
    }
    double m1 = s1 / M;
    double var = s2 / M - m1 * m1;
    if (var < 0) var = 0;
    double mean = (double)part[c * S * 2 + ci] + m1;
    float inv = (float)(1.0 / sqrt(var + (double)eps));
    mean_out[ci] = (float)mean;
    invstd_out[ci] = inv;
    double unbiased = M > 1 ? var * M / (M - 1) : var;
    rmean[ci] = (1.f - momentum) * rmean[ci] + momentum * (float)mean;
    rvar[ci] = (1.f - momentum) * rvar[ci] + momentum * (float)unbiased;
    float sc = gamma[ci] * inv;
    scale[ci] = sc;
    shift[ci] = beta[ci] - sc * (float)mean;
}

extern "C" __global__ void bn_eval_prep(const float* gamma, const float* beta, const float* rmean,
                                        const float* rvar, float eps, float* scale, float* shift,
                                        int c) {
    int ci = blockIdx.x * blockDim.x + threadIdx.x;
    if (ci >= c) return;
    float inv = 1.f / sqrtf(rvar[ci] + eps);
    scale[ci] = gamma[ci] * inv;
    shift[ci] = beta[ci] - gamma[ci] * inv * rmean[ci];
}

// y = x * scale[c] + shift[c], then max(y, 0) when relu.
template <typename T>
__device__ void apply_impl(const T* x, const float* scale, const float* shift, T* y, long total,
                           int c, int hw, int relu) {
    GRID_STRIDE(t, total) {
        int ci = (t / hw) % c;
        float v = ld(x, t) * scale[ci] + shift[ci];
        if (relu) v = fmaxf(v, 0.f);
        st(y, t, v);
    }
}

// Backward sums per channel: sum(dy) and sum(dy * (x - mean)), where dy is masked by the ReLU
// output `y` (y <= 0 stops the gradient) when y is given.
template <typename T>
__device__ void bwd_stats_impl(const T* x, const T* dy, const T* y, const float* mean,
                               float* part, int n, int c, int hw, int S) {
    __shared__ float sh[32];
    int ci = blockIdx.y, j = blockIdx.x;
    long M = (long)n * hw;
    long lo = M * j / S, hi = M * (j + 1) / S;
    float m = mean[ci];
    float s1 = 0.f, s2 = 0.f;
    for (long t = lo + threadIdx.x; t < hi; t += blockDim.x) {
        long s = t / hw;
        int p = (int)(t - s * hw);
        long i = (s * c + ci) * hw + p;
        float d = ld(dy, i);
        if (y && ld(y, i) <= 0.f) d = 0.f;
        s1 += d;
        s2 += d * (ld(x, i) - m);
    }
    s1 = block_sum(s1, sh);
    s2 = block_sum(s2, sh);
    if (threadIdx.x == 0) {
        part[(ci * S + j) * 2] = s1;
        part[(ci * S + j) * 2 + 1] = s2;
    }
}

// dgamma, dbeta and the coefficients of dx = a (dy - b - (x - mean) cc).
extern "C" __global__ void bn_bwd_finalize(const float* part, int S, int c, long M,
                                           const float* gamma, const float* invstd,
                                           float* dgamma, float* dbeta, float* coef) {
    int ci = blockIdx.x * blockDim.x + threadIdx.x;
    if (ci >= c) return;
    double s1 = 0, s2 = 0;
    for (int j = 0; j < S; j++) {
        s1 += part[(ci * S + j) * 2];
        s2 += part[(ci * S + j) * 2 + 1];
    }
    float is = invstd[ci];
    dbeta[ci] = (float)s1;
    dgamma[ci] = (float)(s2 * is);
    coef[ci * 3] = gamma[ci] * is;
    coef[ci * 3 + 1] = (float)(s1 / M);
    coef[ci * 3 + 2] = (float)(s2 / M * is * is);
}

template <typename T>
__device__ void bwd_apply_impl(const T* x, const T* dy, const T* y, const float* mean,
                               const float* coef, T* dx, long total, int c, int hw) {
    GRID_STRIDE(t, total) {
        int ci = (t / hw) % c;
        float d = ld(dy, t);
        if (y && ld(y, t) <= 0.f) d = 0.f;
        st(dx, t, coef[ci * 3] * (d - coef[ci * 3 + 1] - (ld(x, t) - mean[ci]) * coef[ci * 3 + 2]));
    }
}

#define BN(TN, T)                                                                            \
    extern "C" __global__ void bn_stats_##TN(const T* x, float* part, int n, int c, int hw,  \
                                             int S) {                                        \
        stats_impl<T>(x, part, n, c, hw, S);                                                 \
    }                                                                                        \
    extern "C" __global__ void bn_apply_##TN(const T* x, const float* scale,                 \
                                             const float* shift, T* y, long total, int c,     \
                                             int hw, int relu) {                             \
        apply_impl<T>(x, scale, shift, y, total, c, hw, relu);                               \
    }                                                                                        \
    extern "C" __global__ void bn_bwd_stats_##TN(const T* x, const T* dy, const T* y,        \
                                                 const float* mean, float* part, int n,      \
                                                 int c, int hw, int S) {                     \
        bwd_stats_impl<T>(x, dy, y, mean, part, n, c, hw, S);                                \
    }                                                                                        \
    extern "C" __global__ void bn_bwd_apply_##TN(const T* x, const T* dy, const T* y,        \
                                                 const float* mean, const float* coef, T* dx, \
                                                 long total, int c, int hw) {                \
        bwd_apply_impl<T>(x, dy, y, mean, coef, dx, total, c, hw);                           \
    }
BN(f32, float)
BN(bf16, bf16)
