// CORRECT CUDA, refused today: C linkage through an `extern "C" { ... }` block around the
// kernel, the way trainers with several kernels in one file often write it. NVRTC and g++ both
// accept it; only the entry-point check in kernel_sources.py does not (see docs/kernels-dir.md).
extern "C" {

__global__ void polyak_ema(float* target, const float* online, float tau, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  target[i] = tau * online[i] + (1.0f - tau) * target[i];
}

}  // extern "C"
