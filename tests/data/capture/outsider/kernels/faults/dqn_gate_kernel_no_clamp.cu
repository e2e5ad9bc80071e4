// FAULT gate-no-clamp: the gate producer without its clamp of the raw gate to [0, 1].
// The gate producer (live mode only): ISV[isv_index] = ema * ISV[isv_index] + (1 - ema) * raw,
// raw = the aux head's batch accuracy (argmax p == label), clamped to [0, 1]. Fails closed: a
// non-finite raw gate or previous value gives exactly 0. One thread (B rows, K classes).
extern "C" __global__ void dqn_gate_producer(float* isv, const float* p, const int* labels,
                                             int rows, int auxk, int isv_index, float ema) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int hits = 0;
  for (int b = 0; b < rows; ++b) {
    int best = 0;
    for (int k = 1; k < auxk; ++k)
      if (p[b * auxk + k] > p[b * auxk + best]) best = k;
    hits += best == labels[b];
  }
  float raw = (float)hits / (float)rows;
  const float prev = isv[isv_index];
  const float alpha = ema * prev + (1.0f - ema) * raw;
  // x - x is 0 exactly for a finite x and NaN for NaN or +-Inf
  isv[isv_index] = (raw - raw == 0.0f && prev - prev == 0.0f && alpha - alpha == 0.0f) ? alpha : 0.0f;
}
