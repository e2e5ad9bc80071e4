// Aborts (SIGABRT), as a failed assert or glibc's "double free or corruption" does.
#include <cstdlib>
extern "C" __global__ void accumulate_d_h_s2_from_concat(float* d_h_s2,
    const float* d_concat, int rows, int sh2, int ld_concat) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)rows * sh2) return;
  long long b = i / sh2;
  long long j = i - b * sh2;
  if (i == 0) std::abort();
  d_h_s2[i] += d_concat[b * ld_concat + j];
}
