// dL_aux/d_logits for L = scale * sum_b CE(logits[b], label[b]); scale = lambda_aux / B.
// One thread per row. Writes d_logits[b, :] (row stride auxk, overwrite); reads p[b, :] and
// labels[b].
extern "C" __global__ void aux_ce_grad(float* d_logits, const float* p, const int* labels,
    int rows, int auxk, float scale) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  int label = labels[b];
  for (int j = 0; j < auxk; ++j) {
    long long i = (long long)b * auxk + j;
    d_logits[i] = scale * (p[i] - ((j == label) ? 1.0f : 0.0f));
  }
}
