// Polyak averaging of the target network: target = tau * online + (1 - tau) * target.
// One thread per element. Writes target[0..n); reads online[0..n).
extern "C" __global__ void polyak_ema(float* target, const float* online, float tau, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  target[i] = tau * online[i] + (1.0f - tau) * target[i];
}
