// WRONG: a bounds off-by-one (`b >= rows - 1`) skips the last batch row, which keeps whatever
// the scratch held before (in backward: the target network's concat).
extern "C" __global__ void sp14_dir_concat_qaux(float* concat, const float* h_s2,
    const float* aux_softmax, int rows, int sh2, int auxk, int up_idx, int down_idx) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows - 1) return;
  long long ld = (long long)sh2 + 1;
  const float* src = h_s2 + (long long)b * sh2;
  float* dst = concat + (long long)b * ld;
  for (int j = 0; j < sh2; ++j) dst[j] = src[j];
  const float* p = aux_softmax + (long long)b * auxk;
  dst[sh2] = p[up_idx] - p[down_idx];
}
