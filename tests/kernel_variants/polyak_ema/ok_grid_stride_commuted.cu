// CORRECT, written differently: a grid-stride loop, 1 - tau hoisted out of it, and the two terms
// added in the other order ((1 - tau) * target + tau * online: fp32 addition commutes exactly).
extern "C" __global__ void polyak_ema(float* __restrict__ target,
    const float* __restrict__ online, float tau, long long n) {
  const float keep = 1.0f - tau;
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    target[i] = keep * target[i] + tau * online[i];
  }
}
