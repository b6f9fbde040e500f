// Softmax cross-entropy with label smoothing (one warp per sample), the argmax, and the SGD step.

// stats[0] += sum of per-sample losses, stats[1] += correct predictions: the totals stay on the
// device until the host asks, so no training step waits for them.
extern "C" __global__ void softmax_xent(const float* z, const float* labels, float* dz,
                                        double* stats, int n, int k, float smoothing) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float* zr = z + (long)row * k;
    float mx = __int_as_float(0xff800000);  // -inf
    int best = 0;
    for (int j = lane; j < k; j += 32) {
        if (zr[j] > mx) { mx = zr[j]; best = j; }
    }
    // max with the first index on ties, like the CPU
    for (int o = 16; o > 0; o >>= 1) {
        float om = __shfl_xor_sync(0xffffffffu, mx, o);
        int ob = __shfl_xor_sync(0xffffffffu, best, o);
        if (om > mx || (om == mx && ob < best)) { mx = om; best = ob; }
    }
    float se = 0.f;
    for (int j = lane; j < k; j += 32) se += expf(zr[j] - mx);
    se = warp_sum(se);
    float lse = mx + logf(se);
    int y = (int)labels[row];
    float off = smoothing / k;
    float loss = 0.f;
    for (int j = lane; j < k; j += 32) {
        float q = off + (j == y ? 1.f - smoothing : 0.f);
        float logp = zr[j] - lse;
        loss -= q * logp;
        dz[(long)row * k + j] = (expf(logp) - q) / n;
    }
    loss = warp_sum(loss);
    if (lane == 0) {
        atomicAdd(&stats[0], (double)loss);
        if (best == y) atomicAdd(&stats[1], 1.0);
    }
}

extern "C" __global__ void argmax_rows(const float* z, u32* out, int n, int k) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= n) return;
    const float* zr = z + (long)row * k;
    int best = 0;
    for (int j = 1; j < k; j++)
        if (zr[j] > zr[best]) best = j;
    out[row] = best;
}

// SGD with Nesterov momentum (PyTorch's form) on float32 master weights.
extern "C" __global__ void sgd(float* w, const float* g, float* v, long total, float lr,
                               float mu, float wd) {
    GRID_STRIDE(t, total) {
        float d = g[t] + wd * w[t];
        float vv = mu * v[t] + d;
        v[t] = vv;
        w[t] -= lr * (d + mu * vv);
    }
}

// The same step for every trainable tensor in one launch: blockIdx.y picks the tensor. The
// learning rate is read from device memory, so that a captured graph replays with the rate the
// host sets before each replay.
struct SgdTensor {
    float* w;
    const float* g;
    float* v;
    long len;
    int decay;
    int pad;
};
extern "C" __global__ void sgd_multi(const SgdTensor* ts, const float* lr_p, float mu, float wd) {
    SgdTensor t = ts[blockIdx.y];
    float lr = *lr_p;
    float d_wd = t.decay ? wd : 0.f;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < t.len;
         i += (long)gridDim.x * blockDim.x) {
        float d = t.g[i] + d_wd * t.w[i];
        float vv = mu * t.v[i] + d;
        t.v[i] = vv;
        t.w[i] -= lr * (d + mu * vv);
    }
}
