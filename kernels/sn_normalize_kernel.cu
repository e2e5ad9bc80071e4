// Power-iteration step of the spectral norm: out[i] = in[i] / sqrt(norm2[0]) (norm2 = |in|^2,
// computed by an SGEMM dot product). One thread per element. Writes out[0..n); reads in[0..n)
// and norm2[0].
extern "C" __global__ void sn_normalize(float* out, const float* in, const float* norm2, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = in[i] / sqrtf(fmaxf(norm2[0], 1e-30f));
}
