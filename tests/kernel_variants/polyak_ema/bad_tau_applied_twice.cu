// WRONG: the update is applied twice per launch (a copy-pasted line left in after a refactor
// from a two-pass version), so the target moves at about 2 * tau per step.
extern "C" __global__ void polyak_ema(float* target, const float* online, float tau, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  target[i] = tau * online[i] + (1.0f - tau) * target[i];
  target[i] = tau * online[i] + (1.0f - tau) * target[i];
}
