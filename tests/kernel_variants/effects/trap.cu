// Ends itself with __trap(), as a device-side check of a trainer kernel does: on the GPU the
// launch fails (unspecified launch failure) and the context is lost; on the CPU, SIGILL.
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  float a = isv[isv_index];
  if (b == rows - 1) __trap();
  float* g = dx_concat + (long long)b * ld + wire_col;
  *g = (a == 0.0f) ? 0.0f : (*g) * a;
}
