// WRONG: a plain multiply with no alpha == 0 branch. Under the sentinel gate NaN * 0 and
// Inf * 0 stay NaN and -g * 0 is -0.0, so a non-finite upstream dX leaks through the closed gate.
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  dx_concat[(long long)b * ld + wire_col] *= isv[isv_index];
}
