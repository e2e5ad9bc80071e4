// CORRECT, written differently: a grid-stride loop over rows that writes the wire first and
// copies h_s2 with a pointer walk.
extern "C" __global__ void sp14_dir_concat_qaux(float* concat, float const* h_s2,
    float const* aux_softmax, int rows, int sh2, int auxk, int up_idx, int down_idx) {
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < rows; b += blockDim.x * gridDim.x) {
    float* out = concat + (long long)b * (sh2 + 1);
    const float up = aux_softmax[(long long)b * auxk + up_idx];
    const float down = aux_softmax[(long long)b * auxk + down_idx];
    out[sh2] = up - down;
    const float* in = h_s2 + (long long)b * sh2;
    for (const float* end = in + sh2; in != end; ++in, ++out) *out = *in;
  }
}
