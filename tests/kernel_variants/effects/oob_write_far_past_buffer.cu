// No bound check on the store: the threads past the batch (b >= rows) write the wire gradient
// 2^20 elements (4 MiB) past the buffer's end, far beyond any single guard page, into memory a
// process may well have mapped.
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  long long at = b < rows ? (long long)b * ld + wire_col : (long long)rows * ld + (1 << 20);
  float a = isv[isv_index];
  float old = b < rows ? dx_concat[at] : 0.0f;
  dx_concat[at] = (a == 0.0f) ? 0.0f : old * a;
}
