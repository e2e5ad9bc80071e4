// ABI kernel (kernels/CONTRACT.md section 3): target = tau * online + (1 - tau) * target, over the whole net.
// One thread per element.
extern "C" __global__ void polyak_ema(float* target, const float* online, float tau, long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    target[i] = tau * online[i] + (1.0f - tau) * target[i];
  }
}
