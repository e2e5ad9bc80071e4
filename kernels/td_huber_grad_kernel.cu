// dL_td/dQ of one branch for L = mean_b Huber_kappa(Q[b, a_b] - y[b]); scale = 1 / B.
// One thread per row. Writes dq[b, :] (row stride nact: zero except the taken action); reads
// q[b, :], y[b * ld_y + col], actions[b * ld_y + col].
extern "C" __global__ void td_huber_grad(float* dq, const float* q, const float* y,
    const int* actions, int rows, int nact, int ld_y, int col, float kappa, float scale) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  int a = actions[(long long)b * ld_y + col];
  float diff = q[(long long)b * nact + a] - y[(long long)b * ld_y + col];
  float g = fminf(fmaxf(diff, -kappa), kappa) * scale;
  for (int j = 0; j < nact; ++j) dq[(long long)b * nact + j] = (j == a) ? g : 0.0f;
}
