// This trainer's own helper kernels (forward epilogues, losses, backward pieces, optimizer,
// spectral norm). Compiled at run time with NVRTC, like the ABI kernels beside them.
//
// Every kernel is plain per-thread code: a grid-stride loop over its items, no shared memory,
// no __syncthreads, no warp intrinsics and no atomics, so a CPU emulation that runs the grid one
// thread after another computes the same bits. Reductions (softmax, losses, column sums) are
// therefore one thread per row or per column; at these sizes that costs nothing that matters.
// Pointers are row-major: element (b, j) of a [rows, cols] buffer is at b * cols + j.

#define DQN_FOR(i, n)                                                                  \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (long long)(n); \
       i += (long long)gridDim.x * blockDim.x)

// y[b, j] = act(y[b, j] + bias[j]) in place, act = ReLU when relu != 0. The GEMM before it
// wrote y with beta = 0; the bias is added here, not by a GEMM against a ones column.
extern "C" __global__ void dqn_bias_forward(float* y, const float* bias, int rows, int cols,
                                            int relu) {
  DQN_FOR(i, (long long)rows * cols) {
    const float z = y[i] + bias[i % cols];
    y[i] = (relu && !(z > 0.0f)) ? 0.0f : z;
  }
}

// p[b, :] = softmax(logits[b, :]), max-subtracted. One thread per row.
extern "C" __global__ void dqn_row_softmax(float* p, const float* logits, int rows, int cols) {
  DQN_FOR(b, rows) {
    const float* z = logits + b * cols;
    float m = z[0];
    for (int k = 1; k < cols; ++k) m = fmaxf(m, z[k]);
    float s = 0.0f;
    for (int k = 0; k < cols; ++k) s += expf(z[k] - m);
    for (int k = 0; k < cols; ++k) p[b * cols + k] = expf(z[k] - m) / s;
  }
}

// x = [h | ctx]: the input row of a branch d >= 1 (h is h_s2, ctx the branch's context columns).
extern "C" __global__ void dqn_branch_input(float* x, const float* h, const float* ctx, int rows,
                                            int h_cols, int ctx_cols) {
  const int w = h_cols + ctx_cols;
  DQN_FOR(i, (long long)rows * w) {
    const long long b = i / w;
    const int j = (int)(i % w);
    x[i] = j < h_cols ? h[b * h_cols + j] : ctx[b * ctx_cols + (j - h_cols)];
  }
}

// Dueling combine of one branch: q[b, a] = value[b] + adv[b, a] - mean_a adv[b, a].
extern "C" __global__ void dqn_duel_head(float* q, const float* value, const float* adv, int rows,
                                         int nact) {
  DQN_FOR(b, rows) {
    float mean = 0.0f;
    for (int a = 0; a < nact; ++a) mean += adv[b * nact + a];
    mean /= (float)nact;
    for (int a = 0; a < nact; ++a) q[b * nact + a] = value[b] + adv[b * nact + a] - mean;
  }
}

// Both Q losses of one branch, and their gradients with respect to Q(s, .):
//   TD:  y = r + gamma (1 - done) max_a q_next[b, a];  L = td_scale * sum_b Huber_kappa(q[b, a_b] - y)
//   CQL: L = cql_scale * sum_b (logsumexp_a q[b, a] - q[b, a_b])
// td_scale = 1 / B and cql_scale = lambda_cql / B: each branch's loss is a batch mean, and the
// four branches' losses add. actions, td_y and td_argmax are [rows, nbranch] (column = branch);
// loss_terms[b, :] gets this row's TD term at column `branch` and its CQL term at
// nbranch + branch (the host sums them to print the losses).
extern "C" __global__ void dqn_branch_losses(float* dq_td, float* dq_cql, float* td_y,
    int* td_argmax, float* loss_terms, const float* q, const float* q_next, const int* actions,
    const float* reward, const float* done, int rows, int nact, int branch, int nbranch,
    int loss_ld, float gamma, float kappa, float td_scale, float cql_scale) {
  DQN_FOR(b, rows) {
    const float* qn = q_next + b * nact;
    int best = 0;
    for (int a = 1; a < nact; ++a)
      if (qn[a] > qn[best]) best = a;  // the first index of the maximum
    const float y = reward[b] + gamma * (1.0f - done[b]) * qn[best];
    td_y[b * nbranch + branch] = y;
    td_argmax[b * nbranch + branch] = best;

    const float* qs = q + b * nact;
    const int taken = actions[b * nbranch + branch];
    const float delta = qs[taken] - y;
    const float ad = fabsf(delta);
    const float huber = ad <= kappa ? 0.5f * delta * delta : kappa * (ad - 0.5f * kappa);
    const float slope = fminf(fmaxf(delta, -kappa), kappa);
    float m = qs[0];
    for (int a = 1; a < nact; ++a) m = fmaxf(m, qs[a]);
    float s = 0.0f;
    for (int a = 0; a < nact; ++a) s += expf(qs[a] - m);
    for (int a = 0; a < nact; ++a) {
      const float hit = a == taken ? 1.0f : 0.0f;
      dq_td[b * nact + a] = td_scale * slope * hit;
      dq_cql[b * nact + a] = cql_scale * (expf(qs[a] - m) / s - hit);
    }
    loss_terms[b * loss_ld + branch] = td_scale * huber;
    loss_terms[b * loss_ld + nbranch + branch] = cql_scale * (m + logf(s) - qs[taken]);
  }
}

// The aux head's cross-entropy term of row b: loss_terms[b, loss_col] = -scale * log p[b, label].
extern "C" __global__ void dqn_aux_loss(float* loss_terms, const float* p, const int* labels,
                                        int rows, int auxk, int loss_ld, int loss_col, float scale) {
  DQN_FOR(b, rows) {
    loss_terms[b * loss_ld + loss_col] = -scale * logf(fmaxf(p[b * auxk + labels[b]], 1e-30f));
  }
}

// out[j] (+)= sum_b in[b, j]: a bias gradient (accumulate = 1: into grad_buf, which both call
// sites add to) or a loss total (accumulate = 0). One thread per column, rows summed in order.
extern "C" __global__ void dqn_col_sum(float* out, const float* in, int rows, int cols,
                                       int accumulate) {
  DQN_FOR(j, cols) {
    float s = 0.0f;
    for (int b = 0; b < rows; ++b) s += in[(long long)b * cols + j];
    out[j] = accumulate ? out[j] + s : s;
  }
}

// Backward of the dueling combine of one branch: d_adv = dq - mean_a dq; d_value (+)= sum_a dq.
// The first branch of a call site passes accumulate = 0, the others 1.
extern "C" __global__ void dqn_duel_grad(float* d_adv, float* d_value, const float* dq, int rows,
                                         int nact, int accumulate) {
  DQN_FOR(b, rows) {
    float s = 0.0f;
    for (int a = 0; a < nact; ++a) s += dq[b * nact + a];
    for (int a = 0; a < nact; ++a) d_adv[b * nact + a] = dq[b * nact + a] - s / (float)nact;
    d_value[b] = accumulate ? d_value[b] + s : s;
  }
}

// ReLU backward: dz = dy where the saved activation is > 0, else 0. dz may be dy (in place, on
// this trainer's own scratch); d_h_s2 is only ever read here (dz is then another buffer).
extern "C" __global__ void dqn_relu_grad(float* dz, const float* dy, const float* act,
                                         long long n) {
  DQN_FOR(i, n) { dz[i] = act[i] > 0.0f ? dy[i] : 0.0f; }
}

// The aux head's logit gradient at one call site: ce_scale * (p - onehot(label)) (the main site
// passes lambda_aux / B, the CQL site 0), plus the gated wire gradient g = d_concat[b, wire_col]
// through the softmax: wire = p[up] - p[down], so d wire / d logit_i = p_i (e_i - e.p) with
// e = +1 at up_idx, -1 at down_idx.
extern "C" __global__ void dqn_aux_head_grad(float* d_logits, const float* p, const int* labels,
    const float* d_concat, int rows, int auxk, int ld, int wire_col, int up_idx, int down_idx,
    float ce_scale) {
  DQN_FOR(b, rows) {
    const float* pb = p + b * auxk;
    const float g = d_concat[b * ld + wire_col];
    const float ep = pb[up_idx] - pb[down_idx];
    for (int i = 0; i < auxk; ++i) {
      const float e = i == up_idx ? 1.0f : (i == down_idx ? -1.0f : 0.0f);
      const float ce = ce_scale * (pb[i] - (i == labels[b] ? 1.0f : 0.0f));
      d_logits[b * auxk + i] = ce + pb[i] * (e - ep) * g;
    }
  }
}

// Adam on one parameter tensor of the arena. w points at the tensor in the params region; its
// gradient, first and second moments sit at the same offset one, two and three regions further
// (region = the elements of one region). bc1 = 1 - beta1^t, bc2 = 1 - beta2^t.
extern "C" __global__ void dqn_adam_tensor(float* w, long long region, long long n, float lr,
    float beta1, float beta2, float eps, float bc1, float bc2) {
  DQN_FOR(i, n) {
    const float g = w[region + i];
    const float m = beta1 * w[2 * region + i] + (1.0f - beta1) * g;
    const float v = beta2 * w[3 * region + i] + (1.0f - beta2) * g * g;
    w[2 * region + i] = m;
    w[3 * region + i] = v;
    w[i] -= lr * (m / bc1) / (sqrtf(v / bc2) + eps);
  }
}

// out[0] = |x|^2, one thread (the vectors of the power iteration are short).
extern "C" __global__ void dqn_sq_norm(float* out, const float* x, int n) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    float s = 0.0f;
    for (int i = 0; i < n; ++i) s += x[i] * x[i];
    out[0] = s;
  }
}

// out = in / |in|, |in| = sqrt(norm2[0]) (floored so a zero vector stays finite).
extern "C" __global__ void dqn_div_by_norm(float* out, const float* in, const float* norm2,
                                           int n) {
  const float norm = fmaxf(sqrtf(norm2[0]), 1e-12f);
  DQN_FOR(i, n) { out[i] = in[i] / norm; }
}

// Spectral-norm projection: sigma = |W v| = sqrt(norm2[0]); W *= sigma_max / sigma if larger.
extern "C" __global__ void dqn_sn_clip(float* w, const float* norm2, long long n,
                                       float sigma_max) {
  const float sigma = sqrtf(norm2[0]);
  if (!(sigma > sigma_max)) return;
  const float f = sigma_max / sigma;
  DQN_FOR(i, n) { w[i] *= f; }
}
