// Backward of the dueling combine: d_adv[b, a] = dq[b, a] - mean_a dq[b, a];
// d_value[b] += sum_a dq[b, a] (the four branches accumulate into one d_value).
// One thread per row. Writes d_adv[b, :] (row stride nact) and d_value[b]; reads dq[b, :].
extern "C" __global__ void dueling_backward(float* d_adv, float* d_value, const float* dq,
    int rows, int nact) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  const float* g = dq + (long long)b * nact;
  float s = 0.0f;
  for (int j = 0; j < nact; ++j) s += g[j];
  float mean = s / (float)nact;
  for (int j = 0; j < nact; ++j) d_adv[(long long)b * nact + j] = g[j] - mean;
  d_value[b] += s;
}
