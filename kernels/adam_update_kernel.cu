// Adam on one parameter tensor. bc1 = 1 - beta1^t and bc2 = 1 - beta2^t come from the host.
// One thread per element. Writes param, m, v [0..n); reads grad[0..n).
extern "C" __global__ void adam_update(float* param, const float* grad, float* m, float* v,
    long long n, float lr, float beta1, float beta2, float eps, float bc1, float bc2) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = grad[i];
  float mi = beta1 * m[i] + (1.0f - beta1) * g;
  float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  param[i] = param[i] - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
}
