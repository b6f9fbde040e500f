// Targets and losses of the mask, labels and values tasks: masks to per-pixel classes (crop and
// flip as the images), targets gathered from a dataset in GPU memory, the segmentation loss
// (cross-entropy + soft Dice) and its scores, BCE with logits, MSE and smooth L1.
//
// Segmentation logits are [n, k, hw] with element (s, c, p) at s*k*hw + p*sp + c*sc: an NHWC
// activation (sc = 1, sp = k) or an NCHW buffer (sc = hw, sp = 1). Targets are f32 class
// numbers; -1, NaN and anything outside 0..k is ignored (the CPU's `class_of`).

// Classes a block keeps in shared memory at once: the loss's sums take more classes in groups of
// SEG_K; the gradient's coefficients and the scores' counters of classes beyond are read and
// added in global memory (slower, the same values).
constexpr int SEG_K = 64;
// Dice's smoothing term (DICE_EPS in src/nn/cpu/losses.rs).
constexpr double DICE_EPS = 1.0;

__device__ __forceinline__ int seg_class(float y, int k) {
    return (y >= 0.f && y < (float)k) ? (int)y : -1;
}

__device__ __forceinline__ u32 warp_sum_u32(u32 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Where pixel t (of n*hw) starts.
__device__ __forceinline__ long seg_at(long t, int hw, int k, long sp) {
    long s = t / hw;
    return s * k * hw + (t - s * hw) * sp;
}

// The log-sum-exp of a pixel's k logits, and their argmax (the first on ties, as the CPU).
template <typename T>
__device__ __forceinline__ float seg_lse(const T* z, long at, long sc, int k, int* best) {
    float mx = ld(z, at);
    int b = 0;
    for (int c = 1; c < k; c++) {
        float v = ld(z, at + c * sc);
        if (v > mx) { mx = v; b = c; }
    }
    float se = 0.f;
    for (int c = 0; c < k; c++) se += expf(ld(z, at + c * sc) - mx);
    *best = b;
    return mx + logf(se);
}

// Masks (u8 or u16, as stored) to f32 classes [n, h, w], -1 where ignored: padded by `pad` with
// the ignored value, cropped at each sample's offset and flipped exactly as kernels/input.cu
// does the images. `order` (optional) gathers samples from a dataset in GPU memory; `aug`
// (optional) packs dy | dx << 8 | flip << 16 per sample, without it every sample is centred.
template <typename M>
__device__ void load_masks_impl(const M* mask, const u32* order, const u32* aug, float* out,
                                int n, int h, int w, int pad, int has_ignore, u32 ignore) {
    int per = h * w;
    SAMPLE_STRIDE(s, n) {
        long src = order ? (long)order[s] : s;
        Crop cr = crop_of(aug, s, pad);
        int dy = cr.dy, dx = cr.dx;
        bool flip = cr.flip;
        ITEM_STRIDE(i, per) {
            int x = i % w, y = i / w;
            int xx = flip ? w - 1 - x : x;
            int sy = y + dy - pad, sx = xx + dx - pad;
            float v = -1.f;
            if (sy >= 0 && sy < h && sx >= 0 && sx < w) {
                u32 m = mask[src * per + (long)sy * w + sx];
                if (!(has_ignore && m == ignore)) v = (float)m;
            }
            out[s * per + i] = v;
        }
    }
}

extern "C" __global__ void load_masks_u8(const u8* mask, const u32* order, const u32* aug,
                                         float* out, int n, int h, int w, int pad,
                                         int has_ignore, u32 ignore) {
    load_masks_impl<u8>(mask, order, aug, out, n, h, w, pad, has_ignore, ignore);
}
extern "C" __global__ void load_masks_u16(const u16* mask, const u32* order, const u32* aug,
                                          float* out, int n, int h, int w, int pad,
                                          int has_ignore, u32 ignore) {
    load_masks_impl<u16>(mask, order, aug, out, n, h, w, pad, has_ignore, ignore);
}

// out[s, j] = src[order[s], j] (src[s, j] without an order): targets [n, k] of the batch from
// a dataset's [samples, k] in GPU memory.
extern "C" __global__ void gather_targets(const float* src, const u32* order, float* out, int n,
                                          int k) {
    long total = (long)n * k;
    GRID_STRIDE(t, total) {
        long s = t / k;
        long from = order ? (long)order[s] : s;
        out[t] = src[from * k + (t - s * k)];
    }
}

// The segmentation loss's sums are reduced in a fixed order, so that the loss and gradient are
// the same bits on every run (training on the GPU is deterministic): a block's warps go round
// its pixels on a fixed stride (the grid is fixed for a shape), each warp adds its lanes in a
// fixed butterfly and keeps its own running sums per class, the block adds its warps' sums in
// warp order into its column of `part`, and seg_sums adds the blocks' partials in block order.
// No float is added atomically; counters are integers (exact in any order).

// Warps of a block (THREADS / 32 in src/nn/cuda/mod.rs): the sums keep one slot per warp.
constexpr int SEG_WARPS = 8;

// The block's partial sums of the segmentation loss, column-major in `part` [3k + 3][gridDim.x]
// (every value written, so nothing is zeroed first): per class sum p_c g_c (columns 0..k),
// sum p_c (k..2k), pixels of the class (2k..3k); then the cross-entropy sum, counted pixels and
// correctly classified ones. Classes are taken SEG_K at a time (more than SEG_K classes read
// the logits once per group).
template <typename T>
__device__ void seg_stats_impl(const T* z, const float* tgt, double* part, long m, int hw, int k,
                               long sc, long sp) {
    __shared__ double sh_i[SEG_WARPS][SEG_K], sh_p[SEG_WARPS][SEG_K];
    __shared__ u32 sh_g[SEG_WARPS][SEG_K];
    __shared__ float sh_ce[SEG_WARPS];
    __shared__ u32 sh_cnt[SEG_WARPS], sh_cor[SEG_WARPS];
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    long nb = gridDim.x, b = blockIdx.x, stride = nb * blockDim.x;
    float ce = 0.f;
    u32 cnt = 0, cor = 0;
    for (int c0 = 0; c0 < k; c0 += SEG_K) {
        int cn = min(k - c0, SEG_K);
        for (int c = lane; c < cn; c += 32) {
            sh_i[wp][c] = 0.0;
            sh_p[wp][c] = 0.0;
            sh_g[wp][c] = 0;
        }
        __syncwarp();
        // A warp's lanes go round together: the sums over its 32 pixels are warp reductions.
        for (long base = b * blockDim.x + (threadIdx.x - lane); base < m; base += stride) {
            long t = base + lane;
            int y = t < m ? seg_class(tgt[t], k) : -1;
            if (!__any_sync(0xffffffffu, y >= 0)) continue;
            long at = 0;
            float lse = 0.f;
            if (y >= 0) {
                at = seg_at(t, hw, k, sp);
                int best;
                lse = seg_lse(z, at, sc, k, &best);
                if (c0 == 0) {
                    ce += lse - ld(z, at + y * sc);
                    cnt++;
                    cor += best == y;
                }
            }
            for (int c = 0; c < cn; c++) {
                int cl = c0 + c;
                float p = y >= 0 ? expf(ld(z, at + cl * sc) - lse) : 0.f;
                u32 hit = __ballot_sync(0xffffffffu, y == cl);
                float pi = hit ? warp_sum(y == cl ? p : 0.f) : 0.f;
                p = warp_sum(p);
                if (lane == 0) {
                    sh_i[wp][c] += pi;
                    sh_p[wp][c] += p;
                    sh_g[wp][c] += __popc(hit);
                }
            }
        }
        __syncthreads();
        for (int c = threadIdx.x; c < cn; c += blockDim.x) {
            double si = 0.0, sq = 0.0;
            u32 sg = 0;
            for (int w = 0; w < nw; w++) {
                si += sh_i[w][c];
                sq += sh_p[w][c];
                sg += sh_g[w][c];
            }
            long cl = c0 + c;
            part[cl * nb + b] = si;
            part[(k + cl) * nb + b] = sq;
            part[(2 * k + cl) * nb + b] = (double)sg;
        }
        // The slots are zeroed again for the next group only after every thread read them.
        __syncthreads();
    }
    ce = warp_sum(ce);
    cnt = warp_sum_u32(cnt);
    cor = warp_sum_u32(cor);
    if (lane == 0) {
        sh_ce[wp] = ce;
        sh_cnt[wp] = cnt;
        sh_cor[wp] = cor;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        unsigned long long n1 = 0, n2 = 0;
        for (int w = 0; w < nw; w++) {
            s += sh_ce[w];
            n1 += sh_cnt[w];
            n2 += sh_cor[w];
        }
        part[(3L * k) * nb + b] = s;
        part[(3L * k + 1) * nb + b] = (double)n1;
        part[(3L * k + 2) * nb + b] = (double)n2;
    }
}

// sums[j] = the nb partials of column j of `part` [cols][nb] added in block order, one warp per
// column: lane l adds partials l, l + 32, ... in order, then the lanes in a fixed butterfly.
extern "C" __global__ void seg_sums(const double* part, double* sums, int cols, int nb) {
    long col = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (col >= cols) return;
    double a = 0.0;
    for (int j = lane; j < nb; j += 32) a += part[col * nb + j];
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    if (lane == 0) sums[col] = a;
}

// Soft Dice of class c from the batch sums.
__device__ __forceinline__ double seg_dice(const double* sums, int k, int c) {
    return (2.0 * sums[c] + DICE_EPS) / (sums[k + c] + sums[2 * k + c] + DICE_EPS);
}

// d(Dice term)/d(p_c) at a pixel of class y is a + (c == y) b: w (D_c - 2 g_c) / U_c with
// w = dice / (k - 1) and U_c = sum p_c + sum g_c + eps; class 0 has no term.
__device__ __forceinline__ void seg_coef(const double* sums, int k, double w, int c, float* a,
                                         float* b) {
    if (c == 0) {
        *a = 0.f;
        *b = 0.f;
        return;
    }
    double u = sums[k + c] + sums[2 * k + c] + DICE_EPS;
    *a = (float)(w * seg_dice(sums, k, c) / u);
    *b = (float)(-2.0 * w / u);
}

// dlogits of mean cross-entropy over counted pixels + dice x (1 - mean foreground Dice), from
// the sums of seg_sums; zero at ignored pixels. Block 0 adds (loss x n, correct) to stats.
template <typename T>
__device__ void seg_grad_impl(const T* z, const float* tgt, const double* sums, T* dz,
                              double* stats, long m, int hw, int k, long sc, long sp, float dice,
                              int n) {
    __shared__ float sh_a[SEG_K], sh_b[SEG_K];
    double cnt = sums[3 * k + 1];
    float inv_m = cnt > 0.0 ? (float)(1.0 / cnt) : 0.f;
    double w = k > 1 ? (double)dice / (k - 1) : 0.0;
    int ks = min(k, SEG_K);
    for (int c = threadIdx.x; c < ks; c += blockDim.x) seg_coef(sums, k, w, c, &sh_a[c], &sh_b[c]);
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        double md = 1.0;
        if (k > 1) {
            md = 0.0;
            for (int c = 1; c < k; c++) md += seg_dice(sums, k, c);
            md /= k - 1;
        }
        double loss = (cnt > 0.0 ? sums[3 * k] / cnt : 0.0) + (double)dice * (1.0 - md);
        atomicAdd(&stats[0], loss * n);
        atomicAdd(&stats[1], sums[3 * k + 2]);
    }
    GRID_STRIDE(t, m) {
        long at = seg_at(t, hw, k, sp);
        int y = seg_class(tgt[t], k);
        if (y < 0) {
            for (int c = 0; c < k; c++) st(dz, at + c * sc, 0.f);
            continue;
        }
        int best;
        float lse = seg_lse(z, at, sc, k, &best);
        float s = 0.f;
        for (int c = 0; c < k; c++) {
            float a, b;
            if (c < SEG_K) { a = sh_a[c]; b = sh_b[c]; } else seg_coef(sums, k, w, c, &a, &b);
            s += expf(ld(z, at + c * sc) - lse) * (a + (c == y ? b : 0.f));
        }
        for (int c = 0; c < k; c++) {
            float a, b;
            if (c < SEG_K) { a = sh_a[c]; b = sh_b[c]; } else seg_coef(sums, k, w, c, &a, &b);
            float p = expf(ld(z, at + c * sc) - lse);
            float g = (p - (c == y ? 1.f : 0.f)) * inv_m + p * (a + (c == y ? b : 0.f) - s);
            st(dz, at + c * sc, g);
        }
    }
}

// counts[3c .. 3c + 2] += (true positives, false positives, false negatives) of class c for
// the argmax of each counted pixel.
template <typename T>
__device__ void seg_score_impl(const T* z, const float* tgt, unsigned long long* counts, long m,
                               int hw, int k, long sc, long sp) {
    __shared__ u32 sh[3 * SEG_K];
    int ks = min(k, SEG_K);
    for (int i = threadIdx.x; i < 3 * ks; i += blockDim.x) sh[i] = 0;
    __syncthreads();
    GRID_STRIDE(t, m) {
        int y = seg_class(tgt[t], k);
        if (y < 0) continue;
        long at = seg_at(t, hw, k, sp);
        float mx = ld(z, at);
        int best = 0;
        for (int c = 1; c < k; c++) {
            float v = ld(z, at + c * sc);
            if (v > mx) { mx = v; best = c; }
        }
        int first = best == y ? 3 * y : 3 * best + 1, second = best == y ? -1 : 3 * y + 2;
        for (int j = 0; j < 2; j++) {
            int i = j == 0 ? first : second;
            if (i < 0) break;
            if (i < 3 * SEG_K) atomicAdd(&sh[i], 1u);
            else atomicAdd(&counts[i], 1ull);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 3 * ks; i += blockDim.x)
        if (sh[i]) atomicAdd(&counts[i], (unsigned long long)sh[i]);
}

// Mean BCE with logits over [n, k], one warp per row: stats[0] += the row's mean loss,
// stats[1] += 1 when every label of the row is right at logit 0.
template <typename T>
__device__ void bce_impl(const T* z, const float* y, T* dz, double* stats, int n, int k) {
    long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    float nk = (float)((long)n * k), loss = 0.f;
    bool right = true;
    for (int j = lane; j < k; j += 32) {
        long i = row * k + j;
        float v = ld(z, i), t = y[i];
        float e = expf(-fabsf(v));
        loss += fmaxf(v, 0.f) - v * t + log1pf(e);
        float sig = v >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
        st(dz, i, (sig - t) / nk);
        right = right && ((v > 0.f) == (t > 0.5f));
    }
    loss = warp_sum(loss);
    bool all = __all_sync(0xffffffffu, right);
    if (lane == 0) {
        atomicAdd(&stats[0], (double)loss / k);
        if (all) atomicAdd(&stats[1], 1.0);
    }
}

// Mean squared error, or smooth L1 (beta 1), over [n, k]; one warp per row, stats[0] += the
// row's mean loss.
template <typename T>
__device__ void regression_impl(const T* x, const float* y, T* dx, double* stats, int n, int k,
                                int smooth) {
    long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    float nk = (float)((long)n * k), loss = 0.f;
    for (int j = lane; j < k; j += 32) {
        long i = row * k + j;
        float e = ld(x, i) - y[i], g;
        if (!smooth) {
            loss += e * e;
            g = 2.f * e;
        } else if (fabsf(e) < 1.f) {
            loss += 0.5f * e * e;
            g = e;
        } else {
            loss += fabsf(e) - 0.5f;
            g = copysignf(1.f, e);
        }
        st(dx, i, g / nk);
    }
    loss = warp_sum(loss);
    if (lane == 0) atomicAdd(&stats[0], (double)loss / k);
}

#define SEG(TN, T)                                                                           \
    extern "C" __global__ void seg_stats_##TN(const T* z, const float* tgt, double* part,    \
                                              long m, int hw, int k, long sc, long sp) {     \
        seg_stats_impl<T>(z, tgt, part, m, hw, k, sc, sp);                                   \
    }                                                                                        \
    extern "C" __global__ void seg_grad_##TN(const T* z, const float* tgt,                   \
                                             const double* sums, T* dz, double* stats,       \
                                             long m, int hw, int k, long sc, long sp,        \
                                             float dice, int n) {                            \
        seg_grad_impl<T>(z, tgt, sums, dz, stats, m, hw, k, sc, sp, dice, n);                \
    }                                                                                        \
    extern "C" __global__ void seg_score_##TN(const T* z, const float* tgt,                  \
                                              unsigned long long* counts, long m, int hw,    \
                                              int k, long sc, long sp) {                     \
        seg_score_impl<T>(z, tgt, counts, m, hw, k, sc, sp);                                 \
    }                                                                                        \
    extern "C" __global__ void bce_logits_##TN(const T* z, const float* y, T* dz,            \
                                               double* stats, int n, int k) {                \
        bce_impl<T>(z, y, dz, stats, n, k);                                                  \
    }                                                                                        \
    extern "C" __global__ void regression_##TN(const T* x, const float* y, T* dx,            \
                                               double* stats, int n, int k, int smooth) {    \
        regression_impl<T>(x, y, dx, stats, n, k, smooth);                                   \
    }
SEG(f32, float)
SEG(bf16, bf16)
