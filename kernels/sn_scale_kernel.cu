// Spectral-norm projection: sigma = sqrt(norm2[0]) = |W v|; if sigma > sigma_max, W is scaled by
// sigma_max / sigma. One thread per element. Writes w[0..n); reads norm2[0].
extern "C" __global__ void sn_scale(float* w, const float* norm2, long long n, float sigma_max) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float sigma = sqrtf(norm2[0]);
  if (sigma > sigma_max) w[i] = w[i] * (sigma_max / sigma);
}
