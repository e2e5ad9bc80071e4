// ENVIRONMENT (exit 3): a block-wide barrier (line 9). The CPU backend runs threads one after
// another, so it cannot honour __syncthreads and refuses the source.
extern "C" __global__ void accumulate_d_h_s2_from_concat(float* d_h_s2,
    const float* d_concat, int rows, int sh2, int ld_concat) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long b = i / sh2;
  long long j = i - b * sh2;
  float v = (i < (long long)rows * sh2) ? d_concat[b * ld_concat + j] : 0.0f;
  __syncthreads();
  if (i < (long long)rows * sh2) d_h_s2[i] += v;
}
