// The U-Net's layers on NHWC tensors: channel concatenation (and its split back), nearest-
// neighbour resizing and its backward, a per-channel bias and its gradient. Each thread takes V
// consecutive channels of one pixel (V = 8 where every row and offset is a multiple of 8).

// dst[row, doff + j] = src[row, soff + j] for j < cw, for every row (pixel) of n samples of hw:
// one half of a concatenation (src a whole tensor, dst the concatenation) or of its split back.
template <int V, typename T>
__device__ void channel_copy_impl(const T* src, T* dst, long n, int hw, int cw, int sstride,
                                  int soff, int dstride, int doff) {
    int G = cw / V, per = hw * G;
    SAMPLE_STRIDE(s, n) ITEM_STRIDE(i, per) {
        int g = i % G;
        long row = s * hw + i / G;
        float v[V];
        ldv<V>(src, row * sstride + soff + g * V, v);
        stv<V>(dst, row * dstride + doff + g * V, v);
    }
}

// y[s, oy, ox] = x[s, floor(oy * h / oh), floor(ox * w / ow)], V channels at a time.
template <int V, typename T>
__device__ void upsample_impl(const T* x, T* y, long n, int C, int h, int w, int oh, int ow) {
    int G = C / V, per = oh * ow * G;
    SAMPLE_STRIDE(s, n) ITEM_STRIDE(i, per) {
        int g = i % G, r = i / G;
        int ox = r % ow, oy = r / ow;
        int sy = (int)((long)oy * h / oh), sx = (int)((long)ox * w / ow);
        float v[V];
        ldv<V>(x, ((s * h + sy) * w + sx) * C + g * V, v);
        stv<V>(y, (s * per + i) * V, v);
    }
}

// One thread per input pixel and group of V channels, gathering (no atomics: deterministic) the
// outputs that read it, oy in [ceil(iy * oh / h), ceil((iy + 1) * oh / h)) and likewise for x,
// added in ascending (oy, ox) order from 0 in float32, as the CPU does; 0 where none reads it.
template <int V, typename T>
__device__ void upsample_bwd_impl(const T* dy, T* dx, long n, int C, int h, int w, int oh,
                                  int ow) {
    int G = C / V, per = h * w * G;
    SAMPLE_STRIDE(s, n) ITEM_STRIDE(i, per) {
        int g = i % G, r = i / G;
        int ix = r % w, iy = r / w;
        int oy0 = (int)(((long)iy * oh + h - 1) / h), oy1 = (int)(((long)(iy + 1) * oh + h - 1) / h);
        int ox0 = (int)(((long)ix * ow + w - 1) / w), ox1 = (int)(((long)(ix + 1) * ow + w - 1) / w);
        if (oy1 > oh) oy1 = oh;
        if (ox1 > ow) ox1 = ow;
        float v[V];
#pragma unroll
        for (int j = 0; j < V; j++) v[j] = 0.f;
        for (int oy = oy0; oy < oy1; oy++) {
            for (int ox = ox0; ox < ox1; ox++) {
                float d[V];
                ldv<V>(dy, ((s * oh + oy) * ow + ox) * C + g * V, d);
#pragma unroll
                for (int j = 0; j < V; j++) v[j] += d[j];
            }
        }
        stv<V>(dx, (s * per + i) * V, v);
    }
}

// y = x + b[channel] in float32, rounded once to T; V channels of one row at a time (C % V == 0).
template <int V, typename T>
__device__ void bias_impl(const T* x, const float* b, T* y, long total, int C) {
    long vecs = total / V;
    GRID_STRIDE(t, vecs) {
        int c0 = (int)((t * V) % C);
        float v[V];
        ldv<V>(x, t * V, v);
#pragma unroll
        for (int j = 0; j < V; j++) v[j] += b[c0 + j];
        stv<V>(y, t * V, v);
    }
}

// Partial sums of dy [rows, C] per channel: block (p, cb) takes channels cb*32 .. cb*32 + 31 of
// rows p*chunk .. (p+1)*chunk - 1, its 8 warps the rows warp, warp + 8, ... of that range, added
// in that fixed order and then warp by warp; part[p * C + c].
template <typename T>
__device__ void bias_bwd_part_impl(const T* dy, float* part, long rows, int C, long chunk) {
    __shared__ float sh[8][32];
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    int c = blockIdx.y * 32 + lane;
    long r0 = blockIdx.x * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float v = 0.f;
    if (c < C)
        for (long r = r0 + wp; r < r1; r += 8) v += ld(dy, r * C + c);
    sh[wp][lane] = v;
    __syncthreads();
    if (wp == 0 && c < C) {
        for (int j = 1; j < 8; j++) v += sh[j][lane];
        part[(long)blockIdx.x * C + c] = v;
    }
}

#define UNET(TN, T, V)                                                                        \
    extern "C" __global__ void channel_copy_##TN##_v##V(const T* src, T* dst, long n, int hw, \
                                                        int cw, int sstride, int soff,        \
                                                        int dstride, int doff) {              \
        channel_copy_impl<V, T>(src, dst, n, hw, cw, sstride, soff, dstride, doff);           \
    }                                                                                         \
    extern "C" __global__ void upsample_##TN##_v##V(const T* x, T* y, long n, int C, int h,   \
                                                    int w, int oh, int ow) {                  \
        upsample_impl<V, T>(x, y, n, C, h, w, oh, ow);                                        \
    }                                                                                         \
    extern "C" __global__ void upsample_bwd_##TN##_v##V(const T* dy, T* dx, long n, int C,    \
                                                        int h, int w, int oh, int ow) {       \
        upsample_bwd_impl<V, T>(dy, dx, n, C, h, w, oh, ow);                                  \
    }                                                                                         \
    extern "C" __global__ void bias_##TN##_v##V(const T* x, const float* b, T* y, long total, \
                                                int C) {                                      \
        bias_impl<V, T>(x, b, y, total, C);                                                   \
    }
UNET(f32, float, 1)
UNET(f32, float, 8)
UNET(bf16, bf16, 1)
UNET(bf16, bf16, 8)

#define UNET_BIAS_BWD(TN, T)                                                                  \
    extern "C" __global__ void bias_bwd_part_##TN(const T* dy, float* part, long rows, int C, \
                                                  long chunk) {                               \
        bias_bwd_part_impl<T>(dy, part, rows, C, chunk);                                      \
    }
UNET_BIAS_BWD(f32, float)
UNET_BIAS_BWD(bf16, bf16)

// db[c] = the sum of the S partial sums of channel c, in order (deterministic).
extern "C" __global__ void bias_bwd_finalize(const float* part, int S, int C, float* db) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float v = 0.f;
    for (int p = 0; p < S; p++) v += part[(long)p * C + c];
    db[c] = v;
}
