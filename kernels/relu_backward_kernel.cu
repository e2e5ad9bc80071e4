// ReLU backward in place: dy[i] = 0 where the saved activation act[i] is not > 0.
// One thread per element. Writes dy[0..n); reads act[0..n).
extern "C" __global__ void relu_backward(float* dy, const float* act, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (!(act[i] > 0.0f)) dy[i] = 0.0f;
}
