// WRONG: guards NaN but not Inf: a NaN dX is zeroed first, but Inf * 0 is NaN and -1 * 0 is
// -0.0, so the closed gate still lets non-finite and signed values through.
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  float* g = dx_concat + (long long)b * ld + wire_col;
  float v = isnan(*g) ? 0.0f : *g;
  *g = v * isv[isv_index];
}
