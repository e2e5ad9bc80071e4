// WRONG: ignores `ld` and uses wire_col (= SH2, the old width) as the row stride: only row 0
// gates its wire; for b >= 1 it gates some other cell (element (b, SH2 - b) while b <= SH2).
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  float a = isv[isv_index];
  float* g = dx_concat + (long long)b * wire_col + wire_col;
  *g = (a == 0.0f) ? 0.0f : (*g) * a;
}
