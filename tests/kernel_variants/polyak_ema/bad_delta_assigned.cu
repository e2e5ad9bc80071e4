// WRONG: the incremental form with `=` where `+=` was meant, target = tau * (online - target):
// the target becomes a small difference instead of a running average.
extern "C" __global__ void polyak_ema(float* target, const float* online, float tau, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  target[i] = tau * (online[i] - target[i]);
}
