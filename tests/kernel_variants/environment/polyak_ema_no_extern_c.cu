// ENVIRONMENT (exit 3): `extern "C"` is missing, so the symbol is C++-mangled and no launcher
// (cupy.RawModule.get_function, cuModuleGetFunction) can find `polyak_ema` by name.
__global__ void polyak_ema(float* target, const float* online, float tau, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  target[i] = tau * online[i] + (1.0f - tau) * target[i];
}
