// SP14 direction-branch concat: [h_s2 | wire] with the wire = p[up] - p[down].
// One thread per batch row. Writes concat[b, 0..sh2] (row stride sh2 + 1); reads h_s2 (row stride
// sh2) and aux_softmax (row stride auxk).
extern "C" __global__ void sp14_dir_concat_qaux(float* concat, const float* h_s2,
    const float* aux_softmax, int rows, int sh2, int auxk, int up_idx, int down_idx) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  long long ld = (long long)sh2 + 1;
  const float* src = h_s2 + (long long)b * sh2;
  float* dst = concat + (long long)b * ld;
  for (int j = 0; j < sh2; ++j) dst[j] = src[j];
  const float* p = aux_softmax + (long long)b * auxk;
  dst[sh2] = p[up_idx] - p[down_idx];
}
