// The gated wire gradient into the aux head: with g = d_concat[b, wire_col] and the wire
// w = p[up] - p[down], d_logits[b, i] += p[i] * (s[i] - sum_j p[j] s[j]) where s = e * g and
// e = +1 at up_idx, -1 at down_idx, 0 elsewhere (the softmax Jacobian, transposed).
// One thread per row. Writes d_logits[b, :] (row stride auxk, accumulate); reads p[b, :] and
// d_concat[b * ld + wire_col].
extern "C" __global__ void aux_wire_backward(float* d_logits, const float* p,
    const float* d_concat, int rows, int auxk, int ld, int wire_col, int up_idx, int down_idx) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  float g = d_concat[(long long)b * ld + wire_col];
  const float* pb = p + (long long)b * auxk;
  float dot = pb[up_idx] * g - pb[down_idx] * g;
  for (int i = 0; i < auxk; ++i) {
    float s = (i == up_idx) ? g : ((i == down_idx) ? -g : 0.0f);
    d_logits[(long long)b * auxk + i] += pb[i] * (s - dot);
  }
}
