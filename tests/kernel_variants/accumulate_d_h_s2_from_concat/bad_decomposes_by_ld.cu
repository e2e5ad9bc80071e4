// WRONG: splits the flat index with the concat's width (i / ld_concat, i % ld_concat) instead of
// d_h_s2's, and lets j == sh2 through (`j > sh2` bound): the wire (or first context column) is
// added into the next row's first element, and the last rows are never touched.
extern "C" __global__ void accumulate_d_h_s2_from_concat(float* d_h_s2,
    const float* d_concat, int rows, int sh2, int ld_concat) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)rows * sh2) return;
  long long b = i / ld_concat;
  long long j = i % ld_concat;
  if (j > sh2) return;
  d_h_s2[b * sh2 + j] += d_concat[b * ld_concat + j];
}
