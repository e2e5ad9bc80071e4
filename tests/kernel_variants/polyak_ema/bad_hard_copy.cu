// WRONG: a hard target update (target = online) left in from a debugging session, where the
// soft Polyak blend belongs.
extern "C" __global__ void polyak_ema(float* target, const float* online, float tau, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  target[i] = online[i];
}
