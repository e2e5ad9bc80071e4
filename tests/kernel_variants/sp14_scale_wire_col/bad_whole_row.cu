// WRONG: scales the whole row of dX by the gate, not only the wire column: the h_s2 part of the
// direction branch's gradient is gated too (and zeroed under the sentinel).
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  float a = isv[isv_index];
  float* row = dx_concat + (long long)b * ld;
  for (int j = 0; j <= wire_col; ++j) row[j] = (a == 0.0f) ? 0.0f : row[j] * a;
}
