// Never returns: the per-launch watchdog must turn it into a verdict.
extern "C" __global__ void sp14_dir_concat_qaux(float* concat, const float* h_s2,
    const float* aux_softmax, int rows, int sh2, int auxk, int up_idx, int down_idx) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  volatile int spin = 1;
  while (spin) {
  }
  concat[b] = h_s2[b] + aux_softmax[up_idx] - aux_softmax[down_idx];
}
