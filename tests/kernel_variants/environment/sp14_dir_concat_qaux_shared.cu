// ENVIRONMENT (exit 3): stages the softmax row in shared memory (line 6), which the CPU shim
// cannot run (no block-wide memory, no barrier).
extern "C" __global__ void sp14_dir_concat_qaux(float* concat, const float* h_s2,
    const float* aux_softmax, int rows, int sh2, int auxk, int up_idx, int down_idx) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  __shared__ float wire[256];
  if (b >= rows) return;
  wire[threadIdx.x] = aux_softmax[b * auxk + up_idx] - aux_softmax[b * auxk + down_idx];
  for (int j = 0; j < sh2; ++j) concat[b * (sh2 + 1) + j] = h_s2[b * sh2 + j];
  concat[b * (sh2 + 1) + sh2] = wire[threadIdx.x];
}
