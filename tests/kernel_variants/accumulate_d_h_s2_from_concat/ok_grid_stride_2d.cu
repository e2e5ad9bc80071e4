// CORRECT, written differently: a grid-stride loop over the flat index with a remainder-based
// decomposition (j = i % sh2) and the read through __ldg.
extern "C" __global__ void accumulate_d_h_s2_from_concat(float* d_h_s2,
    const float* d_concat, int rows, int sh2, int ld_concat) {
  const long long n = (long long)rows * sh2;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)blockDim.x * gridDim.x) {
    const long long j = i % sh2;
    const long long b = (i - j) / sh2;
    d_h_s2[i] += __ldg(&d_concat[b * ld_concat + j]);
  }
}
