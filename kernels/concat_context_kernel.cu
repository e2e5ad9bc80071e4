// Branch concat for d >= 1: out = [h | ctx]. One thread per element of out.
// Writes out[b, :] (row stride h_cols + ctx_cols); reads h (row stride h_cols) and ctx
// (row stride ctx_cols).
extern "C" __global__ void concat_context(float* out, const float* h, const float* ctx,
    int rows, int h_cols, int ctx_cols) {
  long long ld = (long long)h_cols + ctx_cols;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)rows * ld) return;
  long long b = i / ld;
  long long j = i - b * ld;
  out[i] = (j < h_cols) ? h[b * h_cols + j] : ctx[b * ctx_cols + (j - h_cols)];
}
