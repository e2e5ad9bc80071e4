// Row-wise softmax (max-subtracted). One thread per row.
// Writes p[b, :] (row stride cols); reads logits[b, :].
extern "C" __global__ void softmax_rows(float* p, const float* logits, int rows, int cols) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  const float* z = logits + (long long)b * cols;
  float* out = p + (long long)b * cols;
  float m = z[0];
  for (int j = 1; j < cols; ++j) m = fmaxf(m, z[j]);
  float s = 0.0f;
  for (int j = 0; j < cols; ++j) {
    out[j] = expf(z[j] - m);
    s += out[j];
  }
  for (int j = 0; j < cols; ++j) out[j] = out[j] / s;
}
