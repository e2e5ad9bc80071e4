// Scales one element too many: w[n] is the first element of the next tensor of `params`
// (b_b0fc after w_b0fc), written whether or not sigma exceeds the bound.
extern "C" __global__ void sn_scale(float* w, const float* norm2, long long n, float sigma_max) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i > n) return;
  float sigma = sqrtf(norm2[0]);
  float s = sigma > sigma_max ? sigma_max / sigma : 0.5f;
  if (i == n || sigma > sigma_max) w[i] = w[i] * s;
}
