// Loads the wire element before its bound check: threads b >= rows read past the buffer. The
// load is volatile because a compiler drops a plain load whose value the early return discards.
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  float* g = dx_concat + (long long)b * ld + wire_col;
  float old = *(volatile float*)g;
  if (b >= rows) return;
  float a = isv[isv_index];
  *g = (a == 0.0f) ? 0.0f : old * a;
}
