// WRONG: the output row stride is sh2 (the pre-change width of h_s2), not sh2 + 1: row b lands
// b elements early, and each row's wire is overwritten by the next row's first h_s2 value.
extern "C" __global__ void sp14_dir_concat_qaux(float* concat, const float* h_s2,
    const float* aux_softmax, int rows, int sh2, int auxk, int up_idx, int down_idx) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  const float* src = h_s2 + (long long)b * sh2;
  float* dst = concat + (long long)b * sh2;
  for (int j = 0; j < sh2; ++j) dst[j] = src[j];
  const float* p = aux_softmax + (long long)b * auxk;
  dst[sh2] = p[up_idx] - p[down_idx];
}
