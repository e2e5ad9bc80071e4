// ABI kernel (kernels/CONTRACT.md section 3): gate the wire column of the direction branch's dX in place by
// isv[isv_index]. One thread per batch row. A closed gate (alpha == 0) writes +0.0 whatever the
// old value was, NaN and Inf included: 0 * NaN would be NaN and 0 * (-1) would be -0.0.
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  const float alpha = isv[isv_index];
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < rows; b += gridDim.x * blockDim.x) {
    float* g = dx_concat + (long long)b * ld + wire_col;
    if (alpha == 0.0f) {
      *g = 0.0f;
    } else {
      *g = *g * alpha;
    }
  }
}
