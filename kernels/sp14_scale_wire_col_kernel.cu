// SP14 wire gate: scales the wire column of dL/dx_concat by ISV[isv_index], in place.
// One thread per batch row. Writes dx_concat[b, wire_col] only; reads isv[isv_index].
// NaN-safe: alpha == 0 gives exactly +0.0 whatever the old value (NaN and Inf included), so the
// sentinel gate closes the wire even when the upstream dX is not finite.
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  float a = isv[isv_index];
  float* g = dx_concat + (long long)b * ld + wire_col;
  *g = (a == 0.0f) ? 0.0f : (*g) * a;
}
