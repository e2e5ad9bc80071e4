// Loads before its bound check, and the threads past the batch (b >= rows) load from 2^20
// elements (4 MiB) past the buffer's end: a read far beyond any single guard page, into memory
// a process may well have mapped. The load is volatile because a compiler drops a plain load
// whose value the early return discards.
extern "C" __global__ void sp14_scale_wire_col(float* dx_concat, const float* isv,
    int rows, int ld, int wire_col, int isv_index) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  long long at = b < rows ? (long long)b * ld + wire_col : (long long)rows * ld + (1 << 20);
  float old = *(volatile float*)(dx_concat + at);
  if (b >= rows) return;
  float a = isv[isv_index];
  dx_concat[at] = (a == 0.0f) ? 0.0f : old * a;
}
