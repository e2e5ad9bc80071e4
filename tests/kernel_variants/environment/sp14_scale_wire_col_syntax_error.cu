// ENVIRONMENT (exit 3): does not compile (an undeclared identifier on line 7); the compiler's
// first error line, with file and line, is the message.
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  float a = isv[isv_idx];
  float* g = dx_concat + (long long)b * ld + wire_col;
  *g = (a == 0.0f) ? 0.0f : (*g) * a;
}
