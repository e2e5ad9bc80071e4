// ENVIRONMENT (exit 3): the count is `size_t n` (unsigned) where the ABI has `long long n`.
extern "C" __global__ void polyak_ema(float* target, const float* online, float tau, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  target[i] = tau * online[i] + (1.0f - tau) * target[i];
}
