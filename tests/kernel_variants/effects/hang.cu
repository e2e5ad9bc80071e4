// Never returns: the per-launch watchdog must turn it into a verdict. It spins on a volatile
// load from device memory that nothing changes, which no compiler may remove (an empty loop
// with no side effect may be assumed to end, and NVRTC drops one).
extern "C" __global__ void sp14_dir_concat_qaux(float* concat, const float* h_s2,
    const float* aux_softmax, int rows, int sh2, int auxk, int up_idx, int down_idx) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  volatile const float* watched = h_s2;
  const float first = watched[0];
  while (watched[0] == first || watched[0] != first) {
  }
  concat[b] = h_s2[b] + aux_softmax[up_idx] - aux_softmax[down_idx];
}
