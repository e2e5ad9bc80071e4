// ABI kernel (kernels/CONTRACT.md section 3): the direction branch's input row [h_s2 | wire], wire = p[up] - p[down].
// This trainer's own implementation of the fixed signature. One thread per batch row
// (grid-stride, so any grid that covers `rows` is correct).
extern "C" __global__ void sp14_dir_concat_qaux(float* concat, const float* h_s2,
    const float* aux_softmax, int rows, int sh2, int auxk, int up_idx, int down_idx) {
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < rows; b += gridDim.x * blockDim.x) {
    float* out = concat + (long long)b * (sh2 + 1);
    const float* h = h_s2 + (long long)b * sh2;
    for (int j = 0; j < sh2; ++j) out[j] = h[j];
    const float* p = aux_softmax + (long long)b * auxk;
    out[sh2] = p[up_idx] - p[down_idx];
  }
}
