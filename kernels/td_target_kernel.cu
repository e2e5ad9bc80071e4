// TD target of one branch: y[b] = r[b] + gamma * (1 - done[b]) * max_a q_next[b, a].
// One thread per row. Writes y[b * ld_out + col] and argmax[b * ld_out + col] (the first index
// of the maximum); reads q_next[b, :] (row stride nact), reward[b], done[b].
extern "C" __global__ void td_target(float* y, int* argmax, const float* q_next,
    const float* reward, const float* done, int rows, int nact, int ld_out, int col, float gamma) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  const float* q = q_next + (long long)b * nact;
  int best = 0;
  for (int j = 1; j < nact; ++j)
    if (q[j] > q[best]) best = j;
  y[(long long)b * ld_out + col] = reward[b] + gamma * (1.0f - done[b]) * q[best];
  argmax[(long long)b * ld_out + col] = best;
}
