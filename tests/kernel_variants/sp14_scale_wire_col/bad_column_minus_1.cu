// WRONG: scales column wire_col - 1 (the kernel treats wire_col as a width, not an index): the
// last h_s2 column is gated and the wire column is left ungated.
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  float a = isv[isv_index];
  float* g = dx_concat + (long long)b * ld + (wire_col - 1);
  *g = (a == 0.0f) ? 0.0f : (*g) * a;
}
