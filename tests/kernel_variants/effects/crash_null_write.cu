// Crashes: a stray store through a null pointer (SIGSEGV), as a mis-set pointer argument does.
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  float a = isv[isv_index];
  float* g = dx_concat + (long long)b * ld + wire_col;
  if (b == rows - 1) g = (float*)0;
  *g = (a == 0.0f) ? 0.0f : (*g) * a;
}
