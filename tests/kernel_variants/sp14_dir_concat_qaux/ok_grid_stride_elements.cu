// CORRECT, written differently: a grid-stride loop over every element of the concat instead of
// one thread per row (the launch still covers only `rows` threads; the loop walks the rest).
extern "C" __global__ void sp14_dir_concat_qaux(float* __restrict__ concat,
    const float* __restrict__ h_s2, const float* __restrict__ aux_softmax, int rows, int sh2,
    int auxk, int up_idx, int down_idx) {
  const long long ld = (long long)sh2 + 1;
  const long long total = (long long)rows * ld;
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    const long long b = i / ld;
    const long long j = i - b * ld;
    const float* p = aux_softmax + b * auxk;
    concat[i] = (j < sh2) ? __ldg(h_s2 + b * sh2 + j) : __ldg(p + up_idx) - __ldg(p + down_idx);
  }
}
