// WRONG: a bounds off-by-one (`i + 1 >= n`) never updates the last parameter (here the last bias
// of the value head), so that one target weight stays frozen at its initial value.
extern "C" __global__ void polyak_ema(float* target, const float* online, float tau, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i + 1 >= n) return;
  target[i] = tau * online[i] + (1.0f - tau) * target[i];
}
