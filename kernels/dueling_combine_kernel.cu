// Dueling head: q[b, a] = value[b] + adv[b, a] - mean_a adv[b, a]. One thread per row.
// Writes q[b, :] (row stride nact); reads value[b] and adv[b, :].
extern "C" __global__ void dueling_combine(float* q, const float* value, const float* adv,
    int rows, int nact) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  const float* a = adv + (long long)b * nact;
  float s = 0.0f;
  for (int j = 0; j < nact; ++j) s += a[j];
  float mean = s / (float)nact;
  for (int j = 0; j < nact; ++j) q[(long long)b * nact + j] = value[b] + (a[j] - mean);
}
