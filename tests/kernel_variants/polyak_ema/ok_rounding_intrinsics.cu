// CORRECT CUDA, refused today: explicit round-to-nearest intrinsics (__fmul_rn, __fadd_rn),
// which trainers use to forbid FMA contraction. Each is one correctly rounded fp32 operation,
// so the result is bitwise the bundled kernel's; cpu_shim.h just does not define them yet.
extern "C" __global__ void polyak_ema(float* target, const float* online, float tau, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  target[i] = __fadd_rn(__fmul_rn(tau, online[i]), __fmul_rn(1.0f - tau, target[i]));
}
