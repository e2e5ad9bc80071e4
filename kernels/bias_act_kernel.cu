// Adds a bias row to a GEMM output and optionally applies ReLU, in place.
// One thread per element. Writes y[b, j] (row stride cols); reads bias[j].
extern "C" __global__ void bias_act(float* y, const float* bias, int rows, int cols, int relu) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)rows * cols) return;
  float z = y[i] + bias[i % cols];
  y[i] = (relu && !(z > 0.0f)) ? 0.0f : z;
}
