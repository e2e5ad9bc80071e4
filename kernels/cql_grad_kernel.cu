// dL_cql/dQ of one branch for L = scale * sum_b (logsumexp_a Q[b, a] - Q[b, a_b]);
// scale = lambda_cql / B. One thread per row. Writes dq[b, :] (row stride nact); reads q[b, :]
// and actions[b * ld_act + col].
extern "C" __global__ void cql_grad(float* dq, const float* q, const int* actions,
    int rows, int nact, int ld_act, int col, float scale) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  const float* z = q + (long long)b * nact;
  float* out = dq + (long long)b * nact;
  int a = actions[(long long)b * ld_act + col];
  float m = z[0];
  for (int j = 1; j < nact; ++j) m = fmaxf(m, z[j]);
  float s = 0.0f;
  for (int j = 0; j < nact; ++j) s += expf(z[j] - m);
  for (int j = 0; j < nact; ++j) out[j] = scale * (expf(z[j] - m) / s - ((j == a) ? 1.0f : 0.0f));
}
