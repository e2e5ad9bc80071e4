// A `fill` of another signature than the probe's (kernels/probe_kernels.cu): --cpu must never
// run it in place of the kernel a module's PTX defines.
extern "C" __global__ void fill(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 1.0f;
}
