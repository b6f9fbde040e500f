// Batch normalisation over (n, h, w) per channel of NHWC tensors, seen as M = n*h*w rows of C
// channels. Every kernel here runs on a (S, Cb) grid of 256-thread blocks: block (j, b) takes
// rows M*j/S .. M*(j+1)/S, and its thread t the V channels from ((b*GB + t%GB) * V) of rows
// t/GB, t/GB + L, ... (L = 256/GB lanes). A thread keeps its channels' constants in registers and
// reads whole rows together with its neighbours (16-byte accesses when V = 8).
//
// Statistics are reduced in two deterministic passes: each block sums its rows per channel (shifted
// by the channel's first value, which keeps E[x^2] - E[x]^2 accurate when the mean is large), in
// a fixed order, then one warp per channel adds the S partial sums in a fixed order, in double
// precision.
// The ReLU fused into batch norm masks the backward gradient by recomputing its input
// x*scale + shift from x (no read of the output).

#define BN_THREADS 256

struct Rows {
    int lane, lanes, gb, c0;
    bool on;
    long lo, hi;
};

__device__ __forceinline__ Rows rows_of(long M, int C, int S, int GB, int V) {
    Rows r;
    r.lanes = BN_THREADS / GB;
    r.gb = GB;
    int t = threadIdx.x;
    r.lane = t / GB;
    r.c0 = (blockIdx.y * GB + t % GB) * V;
    r.on = r.lane < r.lanes && r.c0 < C;
    r.lo = M * blockIdx.x / S;
    r.hi = M * (blockIdx.x + 1) / S;
    return r;
}

// Adds each thread's V pairs over the block's lanes, in lane order; the sums land in lane 0.
template <int V>
__device__ __forceinline__ void lane_sums(const Rows& r, float* s1, float* s2) {
    __shared__ float sh[2 * BN_THREADS * 8];
    int t = threadIdx.x;
    if (r.on) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            sh[t * V + k] = s1[k];
            sh[BN_THREADS * 8 + t * V + k] = s2[k];
        }
    }
    __syncthreads();
    if (r.on && r.lane == 0) {
        for (int l = 1; l < r.lanes; l++) {
            int u = l * r.gb + t;
#pragma unroll
            for (int k = 0; k < V; k++) {
                s1[k] += sh[u * V + k];
                s2[k] += sh[BN_THREADS * 8 + u * V + k];
            }
        }
    }
}

template <int V, typename T>
__device__ void stats_impl(const T* x, float* part, long M, int C, int S, int GB) {
    Rows r = rows_of(M, C, S, GB, V);
    float K[V], s1[V], s2[V];
#pragma unroll
    for (int k = 0; k < V; k++) s1[k] = s2[k] = 0.f;
    if (r.on) {
        ldv<V>(x, r.c0, K);
#pragma unroll 4
        for (long i = r.lo + r.lane; i < r.hi; i += r.lanes) {
            float v[V];
            ldv<V>(x, i * C + r.c0, v);
#pragma unroll
            for (int k = 0; k < V; k++) {
                float d = v[k] - K[k];
                s1[k] += d;
                s2[k] += d * d;
            }
        }
    }
    lane_sums<V>(r, s1, s2);
    if (r.on && r.lane == 0) {
        int j = blockIdx.x;
#pragma unroll
        for (int k = 0; k < V; k++) {
            int ci = r.c0 + k;
            part[((long)ci * S + j) * 2] = s1[k];
            part[((long)ci * S + j) * 2 + 1] = s2[k];
            if (j == 0) part[(long)C * S * 2 + ci] = K[k];
        }
    }
}

// The S partial pairs of channel ci in double precision: one warp per channel, lane l adding
// partials l, l + 32, ... in order, then the lanes in a fixed butterfly; valid in every lane.
__device__ __forceinline__ void part_sums(const float* part, int S, long ci, double* s1,
                                          double* s2) {
    int lane = threadIdx.x & 31;
    double a = 0, b = 0;
    for (int j = lane; j < S; j += 32) {
        a += part[(ci * S + j) * 2];
        b += part[(ci * S + j) * 2 + 1];
    }
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    *s1 = a;
    *s2 = b;
}

// What training keeps of channel ci's batch statistics (mean, biased variance over M rows): the
// saved mean and 1/std, the running statistics, and the scale and shift that bn_apply uses.
__device__ __forceinline__ void store_stats(int ci, float mean, double var, double M, float eps,
                                            float momentum, const float* gamma,
                                            const float* beta, float* mean_out,
                                            float* invstd_out, float* rmean, float* rvar,
                                            float* scale, float* shift) {
    float inv = (float)(1.0 / sqrt(var + (double)eps));
    mean_out[ci] = mean;
    invstd_out[ci] = inv;
    double unbiased = M > 1 ? var * M / (M - 1) : var;
    rmean[ci] = (1.f - momentum) * rmean[ci] + momentum * mean;
    rvar[ci] = (1.f - momentum) * rvar[ci] + momentum * (float)unbiased;
    // As bn_bwd_* recompute them from the saved statistics, bit for bit.
    float sc = gamma[ci] * inv;
    scale[ci] = sc;
    shift[ci] = fmaf(-sc, mean, beta[ci]);
}

// One warp per channel (blocks of 256 threads).
extern "C" __global__ void bn_finalize(const float* part, int S, int c, long M,
                                       const float* gamma, const float* beta, float* mean_out,
                                       float* invstd_out, float* rmean, float* rvar,
                                       float momentum, float eps, float* scale, float* shift) {
    int ci = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (ci >= c) return;
    double s1, s2;
    part_sums(part, S, ci, &s1, &s2);
    if ((threadIdx.x & 31) != 0) return;
    double m1 = s1 / M;
    double var = s2 / M - m1 * m1;
    if (var < 0) var = 0;
    float mean = (float)((double)part[(long)c * S * 2 + ci] + m1);
    store_stats(ci, mean, var, (double)M, eps, momentum, gamma, beta, mean_out, invstd_out, rmean,
                rvar, scale, shift);
}

// Synchronised batch norm (statistics over every rank's batch): each rank packs its sums about
// zero in double precision (its own shift K differs from the other ranks'), with its row count,
// as [sum x, sum x^2] per channel then M; NCCL adds the packs of all ranks; bn_sync_finalize
// then does what bn_finalize does with the world's totals.
extern "C" __global__ void bn_sync_pack(const float* part, int S, int c, long M, double* out) {
    int ci = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (ci >= c) return;
    double s1, s2;
    part_sums(part, S, ci, &s1, &s2);
    if ((threadIdx.x & 31) != 0) return;
    double k = (double)part[(long)c * S * 2 + ci];
    out[ci * 2] = s1 + M * k;
    out[ci * 2 + 1] = s2 + 2 * k * s1 + M * k * k;
    if (ci == 0) out[2 * c] = (double)M;
}

extern "C" __global__ void bn_sync_finalize(const double* tot, int c, const float* gamma,
                                            const float* beta, float* mean_out,
                                            float* invstd_out, float* rmean, float* rvar,
                                            float momentum, float eps, float* scale,
                                            float* shift) {
    int ci = blockIdx.x * blockDim.x + threadIdx.x;
    if (ci >= c) return;
    double M = tot[2 * c];
    double m1 = tot[ci * 2] / M;
    double var = tot[ci * 2 + 1] / M - m1 * m1;
    if (var < 0) var = 0;
    store_stats(ci, (float)m1, var, M, eps, momentum, gamma, beta, mean_out, invstd_out, rmean,
                rvar, scale, shift);
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

// y = x * scale[c] + shift[c] (+ res), then max(y, 0) when relu.
template <int V, typename T>
__device__ void apply_impl(const T* x, const float* scale, const float* shift, const T* res, T* y,
                           long M, int C, int S, int GB, int relu) {
    Rows r = rows_of(M, C, S, GB, V);
    if (!r.on) return;
    float sc[V], sh[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        sc[k] = scale[r.c0 + k];
        sh[k] = shift[r.c0 + k];
    }
#pragma unroll 4
    for (long i = r.lo + r.lane; i < r.hi; i += r.lanes) {
        long o = i * C + r.c0;
        float v[V], q[V];
        ldv<V>(x, o, v);
        if (res) ldv<V>(res, o, q);
#pragma unroll
        for (int k = 0; k < V; k++) {
            v[k] = fmaf(v[k], sc[k], sh[k]);
            if (res) v[k] += q[k];
            if (relu) v[k] = fmaxf(v[k], 0.f);
        }
        stv<V>(y, o, v);
    }
}

// The constants of the backward gradient of channel c: mean, and scale/shift of the forward (for
// the fused ReLU's mask).
template <int V>
__device__ __forceinline__ void bwd_consts(int c0, const float* gamma, const float* beta,
                                           const float* mean, const float* invstd, float* m,
                                           float* sc, float* sh) {
#pragma unroll
    for (int k = 0; k < V; k++) {
        m[k] = mean[c0 + k];
        sc[k] = gamma[c0 + k] * invstd[c0 + k];
        sh[k] = fmaf(-sc[k], m[k], beta[c0 + k]);
    }
}

// dy masked where the forward's ReLU stopped it: recomputed from x (relu), or where the given
// output of a fused sum is 0 (out).
template <int V, typename T>
__device__ __forceinline__ void masked(const T* dy, const T* out, long o, int relu, const float* x,
                                       const float* sc, const float* sh, float* d) {
    ldv<V>(dy, o, d);
    if (out) {
        float q[V];
        ldv<V>(out, o, q);
#pragma unroll
        for (int k = 0; k < V; k++)
            if (q[k] <= 0.f) d[k] = 0.f;
    }
    if (relu) {
#pragma unroll
        for (int k = 0; k < V; k++)
            if (fmaf(x[k], sc[k], sh[k]) <= 0.f) d[k] = 0.f;
    }
}

// Backward sums per channel: sum(d) and sum(d * (x - mean)), d the masked gradient.
template <int V, typename T>
__device__ void bwd_stats_impl(const T* x, const T* dy, const T* out, const float* gamma,
                               const float* beta, const float* mean, const float* invstd,
                               int relu, float* part, long M, int C, int S, int GB) {
    Rows r = rows_of(M, C, S, GB, V);
    float s1[V], s2[V], m[V], sc[V], sh[V];
#pragma unroll
    for (int k = 0; k < V; k++) s1[k] = s2[k] = 0.f;
    if (r.on) {
        bwd_consts<V>(r.c0, gamma, beta, mean, invstd, m, sc, sh);
#pragma unroll 4
        for (long i = r.lo + r.lane; i < r.hi; i += r.lanes) {
            long o = i * C + r.c0;
            float v[V], d[V];
            ldv<V>(x, o, v);
            masked<V>(dy, out, o, relu, v, sc, sh, d);
#pragma unroll
            for (int k = 0; k < V; k++) {
                s1[k] += d[k];
                s2[k] += d[k] * (v[k] - m[k]);
            }
        }
    }
    lane_sums<V>(r, s1, s2);
    if (r.on && r.lane == 0) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            int ci = r.c0 + k;
            part[((long)ci * S + blockIdx.x) * 2] = s1[k];
            part[((long)ci * S + blockIdx.x) * 2 + 1] = s2[k];
        }
    }
}

// dgamma, dbeta and the coefficients of dx = a (d - b - (x - mean) cc); one warp per channel.
extern "C" __global__ void bn_bwd_finalize(const float* part, int S, int c, long M,
                                           const float* gamma, const float* invstd,
                                           float* dgamma, float* dbeta, float* coef) {
    int ci = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (ci >= c) return;
    double s1, s2;
    part_sums(part, S, ci, &s1, &s2);
    if ((threadIdx.x & 31) != 0) return;
    float is = invstd[ci];
    dbeta[ci] = (float)s1;
    dgamma[ci] = (float)(s2 * is);
    coef[ci * 3] = gamma[ci] * is;
    coef[ci * 3 + 1] = (float)(s1 / M);
    coef[ci * 3 + 2] = (float)(s2 / M * is * is);
}

// Synchronised backward: this rank's [sum d, sum d (x - mean)] per channel and its M, packed in
// double precision for NCCL to add across the ranks (mean is already the world's).
extern "C" __global__ void bn_bwd_sync_pack(const float* part, int S, int c, long M,
                                            double* out) {
    int ci = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (ci >= c) return;
    double s1, s2;
    part_sums(part, S, ci, &s1, &s2);
    if ((threadIdx.x & 31) != 0) return;
    out[ci * 2] = s1;
    out[ci * 2 + 1] = s2;
    if (ci == 0) out[2 * c] = (double)M;
}

// dgamma and dbeta from this rank's sums (the gradient all-reduce averages them, as for every
// weight); the coefficients of dx from the world's, as PyTorch's SyncBatchNorm does.
extern "C" __global__ void bn_bwd_sync_finalize(const double* mine, const double* tot, int c,
                                                const float* gamma, const float* invstd,
                                                float* dgamma, float* dbeta, float* coef) {
    int ci = blockIdx.x * blockDim.x + threadIdx.x;
    if (ci >= c) return;
    double M = tot[2 * c];
    float is = invstd[ci];
    dbeta[ci] = (float)mine[ci * 2];
    dgamma[ci] = (float)(mine[ci * 2 + 1] * is);
    coef[ci * 3] = gamma[ci] * is;
    coef[ci * 3 + 1] = (float)(tot[ci * 2] / M);
    coef[ci * 3 + 2] = (float)(tot[ci * 2 + 1] / M * is * is);
}

// dx, and with a fused sum (out) the masked gradient that its other operand receives (dres).
template <int V, typename T>
__device__ void bwd_apply_impl(const T* x, const T* dy, const T* out, const float* gamma,
                               const float* beta, const float* mean, const float* invstd,
                               int relu, const float* coef, T* dx, T* dres, long M, int C, int S,
                               int GB) {
    Rows r = rows_of(M, C, S, GB, V);
    if (!r.on) return;
    float m[V], sc[V], sh[V], a[V], b[V], cc[V];
    bwd_consts<V>(r.c0, gamma, beta, mean, invstd, m, sc, sh);
#pragma unroll
    for (int k = 0; k < V; k++) {
        a[k] = coef[(r.c0 + k) * 3];
        b[k] = coef[(r.c0 + k) * 3 + 1];
        cc[k] = coef[(r.c0 + k) * 3 + 2];
    }
#pragma unroll 4
    for (long i = r.lo + r.lane; i < r.hi; i += r.lanes) {
        long o = i * C + r.c0;
        float v[V], d[V];
        ldv<V>(x, o, v);
        masked<V>(dy, out, o, relu, v, sc, sh, d);
        if (dres) stv<V>(dres, o, d);
#pragma unroll
        for (int k = 0; k < V; k++) v[k] = a[k] * (d[k] - b[k] - (v[k] - m[k]) * cc[k]);
        stv<V>(dx, o, v);
    }
}

// Forward and backward in macros of their own, so that each compiles as a program of its own
// (src/nn/cuda/kernels.rs: side by side, on a fresh host).
#define BN_FWD(TN, T, V)                                                                     \
    extern "C" __global__ void bn_stats_##TN##_v##V(const T* x, float* part, long M, int C,  \
                                                    int S, int GB) {                         \
        stats_impl<V, T>(x, part, M, C, S, GB);                                              \
    }                                                                                        \
    extern "C" __global__ void bn_apply_##TN##_v##V(                                         \
        const T* x, const float* scale, const float* shift, const T* res, T* y, long M,      \
        int C, int S, int GB, int relu) {                                                    \
        apply_impl<V, T>(x, scale, shift, res, y, M, C, S, GB, relu);                        \
    }
#define BN_BWD(TN, T, V)                                                                     \
    extern "C" __global__ void bn_bwd_stats_##TN##_v##V(                                     \
        const T* x, const T* dy, const T* out, const float* gamma, const float* beta,        \
        const float* mean, const float* invstd, int relu, float* part, long M, int C, int S, \
        int GB) {                                                                            \
        bwd_stats_impl<V, T>(x, dy, out, gamma, beta, mean, invstd, relu, part, M, C, S, GB); \
    }                                                                                        \
    extern "C" __global__ void bn_bwd_apply_##TN##_v##V(                                     \
        const T* x, const T* dy, const T* out, const float* gamma, const float* beta,        \
        const float* mean, const float* invstd, int relu, const float* coef, T* dx, T* dres, \
        long M, int C, int S, int GB) {                                                      \
        bwd_apply_impl<V, T>(x, dy, out, gamma, beta, mean, invstd, relu, coef, dx, dres, M, \
                             C, S, GB);                                                      \
    }
BN_FWD(f32, float, 1)
BN_FWD(f32, float, 8)
BN_FWD(bf16, bf16, 1)
BN_FWD(bf16, bf16, 8)
BN_BWD(f32, float, 1)
BN_BWD(f32, float, 8)
BN_BWD(bf16, bf16, 1)
BN_BWD(bf16, bf16, 8)
