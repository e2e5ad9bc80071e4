// Kernels of the --cpu probe (cpu_probe.cu, beside this folder): plain per-thread ones --cpu
// runs, one it refuses (shared memory and a barrier), two that write outside their allocation,
// which the guard zones stop, one that hangs and one that exits.
extern "C" __global__ void fill(float *x, int n, float value) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = value;
}

extern "C" __global__ void tile_sum(float *x, int n) {
  __shared__ float tile[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  if (threadIdx.x == 0 && i < n) x[i] = tile[0] + tile[blockDim.x - 1];
}

// a write one page past the allocation's end: into the guard page
extern "C" __global__ void write_past(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) x[n + 1024] = 1.0f;
}

// a write just before the allocation's start: into its canary
extern "C" __global__ void write_before(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0 && n > 0) x[-2] = 1.0f;
}

// a kernel that never ends
extern "C" __global__ void spin(float *x) {
  volatile int forever = 1;
  while (forever) {
  }
  x[0] = 0.0f;
}

// a kernel whose source, compiled for the CPU, ends the process (no device code can)
extern "C" __global__ void quit(float *x) {
#ifdef EGF_CPU_SHIM
  exit(0);
#endif
  x[0] = 0.0f;
}
