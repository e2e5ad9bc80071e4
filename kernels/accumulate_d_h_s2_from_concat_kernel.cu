// Adds the first sh2 columns of a branch's concat dX into d_h_s2 (beta = 1 semantics).
// One thread per element of d_h_s2. Writes d_h_s2[b, j] for j < sh2 (row stride sh2); reads
// d_concat[b, j] for j < sh2 (row stride ld_concat). Columns >= sh2 (the wire, the context
// columns) are never read.
extern "C" __global__ void accumulate_d_h_s2_from_concat(float* d_h_s2,
    const float* d_concat, int rows, int sh2, int ld_concat) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)rows * sh2) return;
  long long b = i / sh2;
  long long j = i - b * sh2;
  d_h_s2[i] += d_concat[b * ld_concat + j];
}
