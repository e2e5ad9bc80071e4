// FAULT no-nan-branch: the wire gate without its alpha == 0 branch. With the gate closed a
// negative gradient becomes -0.0 and a NaN stays NaN: the sentinel no longer closes the wire
// to exactly +0.0. Compiled in place of ../sp14_scale_wire_col_kernel.cu under --fault.
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  const float alpha = isv[isv_index];
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < rows; b += gridDim.x * blockDim.x) {
    float* g = dx_concat + (long long)b * ld + wire_col;
    *g = *g * alpha;
  }
}
