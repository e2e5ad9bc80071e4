// ABI kernel (kernels/CONTRACT.md section 3): d_h_s2[b, j] += d_concat[b, j] for j < sh2 (beta = 1). The columns
// past sh2 of a branch's concat dX (the wire, the context columns) are never read.
// One thread per element of d_h_s2.
extern "C" __global__ void accumulate_d_h_s2_from_concat(float* d_h_s2,
    const float* d_concat, int rows, int sh2, int ld_concat) {
  const long long total = (long long)rows * sh2;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long b = i / sh2, j = i % sh2;
    d_h_s2[i] += d_concat[b * ld_concat + j];
  }
}
