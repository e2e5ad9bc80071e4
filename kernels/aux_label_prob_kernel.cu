// Gathers the aux head's probability of the true label: prob[b] = p[b, labels[b]], the
// per-row accuracy that the gate producer averages. One thread per row. Writes prob[b]; reads
// p[b, :] (row stride auxk) and labels[b].
extern "C" __global__ void aux_label_prob(float* prob, const float* p, const int* labels,
    int rows, int auxk) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  prob[b] = p[(long long)b * auxk + labels[b]];
}
