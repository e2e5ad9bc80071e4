// The gate producer. From the batch's summed true-label probability: accuracy = prob_sum / rows,
// raw = (accuracy - 1/auxk) / (1 - 1/auxk) (skill over chance), clamped to [0, 1], then
// smoothed: alpha = ema * isv[isv_index] + (1 - ema) * raw. Fails closed: a non-finite raw gate
// or a non-finite previous alpha gives exactly 0. A single thread.
// Writes isv[isv_index]; reads prob_sum[0] and isv[isv_index].
extern "C" __global__ void alpha_grad_compute(float* isv, const float* prob_sum, int rows,
    int auxk, int isv_index, float ema) {
  if (blockIdx.x * blockDim.x + threadIdx.x != 0) return;
  float chance = 1.0f / (float)auxk;
  float accuracy = prob_sum[0] / (float)rows;
  float raw = (accuracy - chance) / (1.0f - chance);
  float previous = isv[isv_index];
  if (!isfinite(raw) || !isfinite(previous)) {
    isv[isv_index] = 0.0f;
    return;
  }
  raw = fminf(fmaxf(raw, 0.0f), 1.0f);
  isv[isv_index] = ema * previous + (1.0f - ema) * raw;
}
