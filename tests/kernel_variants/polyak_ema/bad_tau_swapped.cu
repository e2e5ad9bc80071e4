// WRONG: the blend order is swapped, target = (1 - tau) * online + tau * target: the target net
// jumps almost all the way to the online net every step instead of trailing it.
extern "C" __global__ void polyak_ema(float* target, const float* online, float tau, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  target[i] = (1.0f - tau) * online[i] + tau * target[i];
}
