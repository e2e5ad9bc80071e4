// net.h: the SP14 net's shapes as this trainer lays them out in memory (host code only).
//
// Memory, this trainer's own grouping:
//   arena   ONE allocation of four equal regions: params | grad_buf | adam_m | adam_v, each
//           `region` floats, every tensor at the same offset in all four (so the optimizer
//           finds a tensor's gradient and moments from its parameter pointer alone);
//   target  the target net, its own allocation with the same offsets;
//   batch   one allocation: obs, next_obs, the branches' context columns for s and s',
//           actions, reward, done, aux_label;
//   pool    one allocation for every activation and backward scratch of both nets, the SP14
//           named buffers (save_h_s2, the concat scratch, the dX concat, d_h_s2, ...) included;
//   isv     isv_signals, its own allocation (a signal bus other producers would share);
//   sn      sn_state: the spectral-norm vectors u_b0fc and v_b0fc.
// Tensor offsets are rounded up to 8 floats (32 bytes) and pool regions to 64 floats (256 bytes),
// so there are gaps between tensors; the gaps are zero and stay zero.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

constexpr int NBRANCH = 4;         // dir, mag, ord, urg
constexpr int ISV_GATE = 393;      // ALPHA_GRAD_SMOOTHED_INDEX
constexpr int AUX_UP = 2, AUX_DOWN = 0;

struct Dims {
  int B, OBS, SH1, SH2, AUXK, ADV, VALH;
  int A[NBRANCH], E[NBRANCH];
  int N_ISV;
  int X(int d) const { return SH2 + E[d]; }  // branch d's input width [h_s2 | extra_d]
};

inline bool preset_dims(const std::string& name, Dims* d) {
  if (name == "ci") {
    *d = {64, 32, 64, 48, 3, 32, 32, {3, 5, 3, 3}, {1, 2, 1, 1}, 512};
  } else if (name == "prod") {
    *d = {4096, 128, 1024, 512, 3, 256, 256, {3, 5, 3, 3}, {1, 2, 1, 1}, 512};
  } else {
    return false;
  }
  return true;
}

// The contract's hyper-parameters (kernels/CONTRACT.md section 2).
struct Hyper {
  float gamma = 0.99f, kappa = 1.0f, lam_cql = 0.1f, lam_aux = 0.5f;
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float tau = 0.005f, sigma_max = 1.0f;
  float gate_ema = 0.9f;
};

// ---- parameters ------------------------------------------------------------------------------
// Order chosen so that the two same-shaped branch FC weights (ord, urg) sit one after the other:
// their forward and backward GEMMs run as one strided-batched call.
enum ParamId {
  W_S1, B_S1, W_S2, B_S2, W_AUX, B_AUX, W_V0, B_V0, W_V1, B_V1,
  W_B0FC, B_B0FC, W_B0OUT, B_B0OUT,
  W_B1FC, B_B1FC, W_B1OUT, B_B1OUT,
  W_B2FC, W_B3FC, B_B2FC, B_B3FC,
  W_B2OUT, B_B2OUT, W_B3OUT, B_B3OUT,
  NPARAM
};
inline ParamId wfc(int d) { static const ParamId t[] = {W_B0FC, W_B1FC, W_B2FC, W_B3FC}; return t[d]; }
inline ParamId bfc(int d) { static const ParamId t[] = {B_B0FC, B_B1FC, B_B2FC, B_B3FC}; return t[d]; }
inline ParamId wout(int d) { static const ParamId t[] = {W_B0OUT, W_B1OUT, W_B2OUT, W_B3OUT}; return t[d]; }
inline ParamId bout(int d) { static const ParamId t[] = {B_B0OUT, B_B1OUT, B_B2OUT, B_B3OUT}; return t[d]; }

struct Tensor {
  std::string name;
  long long off = 0;
  int rows = 0, cols = 0;  // row-major [out, in]; a bias is [1, out]
  long long numel() const { return (long long)rows * cols; }
};

struct ParamTable {
  Tensor t[NPARAM];
  long long region = 0;  // floats per region: the last tensor's end, rounded up to 64
  const Tensor& operator[](int id) const { return t[id]; }
};

inline long long round_up(long long x, long long m) { return (x + m - 1) / m * m; }

inline ParamTable make_param_table(const Dims& D) {
  ParamTable p;
  long long off = 0;
  auto put = [&](ParamId id, const char* name, int rows, int cols) {
    p.t[id] = {name, off, rows, cols};
    off = round_up(off + (long long)rows * cols, 8);
  };
  put(W_S1, "w_s1", D.SH1, D.OBS);
  put(B_S1, "b_s1", 1, D.SH1);
  put(W_S2, "w_s2", D.SH2, D.SH1);
  put(B_S2, "b_s2", 1, D.SH2);
  put(W_AUX, "w_aux", D.AUXK, D.SH2);
  put(B_AUX, "b_aux", 1, D.AUXK);
  put(W_V0, "w_v0", D.VALH, D.SH2);
  put(B_V0, "b_v0", 1, D.VALH);
  put(W_V1, "w_v1", 1, D.VALH);
  put(B_V1, "b_v1", 1, 1);
  static const char* names[NBRANCH][4] = {{"w_b0fc", "b_b0fc", "w_b0out", "b_b0out"},
                                          {"w_b1fc", "b_b1fc", "w_b1out", "b_b1out"},
                                          {"w_b2fc", "b_b2fc", "w_b2out", "b_b2out"},
                                          {"w_b3fc", "b_b3fc", "w_b3out", "b_b3out"}};
  for (int d = 0; d < 2; ++d) {
    put(wfc(d), names[d][0], D.ADV, D.X(d));
    put(bfc(d), names[d][1], 1, D.ADV);
    put(wout(d), names[d][2], D.A[d], D.ADV);
    put(bout(d), names[d][3], 1, D.A[d]);
  }
  put(W_B2FC, names[2][0], D.ADV, D.X(2));
  put(W_B3FC, names[3][0], D.ADV, D.X(3));
  put(B_B2FC, names[2][1], 1, D.ADV);
  put(B_B3FC, names[3][1], 1, D.ADV);
  for (int d = 2; d < 4; ++d) {
    put(wout(d), names[d][2], D.A[d], D.ADV);
    put(bout(d), names[d][3], 1, D.A[d]);
  }
  p.region = round_up(off, 64);
  return p;
}

// ---- named regions of the batch and the pool -------------------------------------------------
struct Region {
  std::string name;
  long long off = 0;  // in 4-byte elements from the allocation's start
  int rows = 0, cols = 0;
  long long numel() const { return (long long)rows * cols; }
};

struct Plan {
  std::vector<Region> r;
  long long total = 0;  // elements
  int add(const std::string& name, int rows, int cols) {
    r.push_back({name, total, rows, cols});
    total = round_up(total + (long long)rows * cols, 64);
    return (int)r.size() - 1;
  }
};

// One net's forward activations (x[0] stays -1: the direction branch's input is the shared
// concat scratch, which the ABI kernel writes).
struct NetActs {
  int h1, h2, logits, p, x[NBRANCH], hid[NBRANCH], adv[NBRANCH], v_hid, value, q[NBRANCH];
};

struct PoolPlan {
  Plan plan;
  NetActs on, tg;
  int scratch;                                   // sp14_dir_qaux_concat_scratch [B, SH2 + 1]
  int dq_td[NBRANCH], dq_cql[NBRANCH], td_y, td_argmax, loss_terms, loss_sums;
  int d_adv[NBRANCH], d_value, d_v_hid, d_hid[NBRANCH], d_x[NBRANCH];  // d_x[0]: the dX concat
  int d_h_s2, d_aux, d_z2, d_h1;
  int sn_wtu, sn_wv, sn_norm2;
  int loss_ld;  // loss_terms' row: 4 TD terms, 4 CQL terms, the aux term
};

// Region names are kernels/CONTRACT.md's (the names a layout file gives; the float64 oracle
// of a deep capture reads its buffers by them); d_z2 and the loss scratch are this trainer's own.
inline PoolPlan make_pool_plan(const Dims& D, int sn_vlen) {
  PoolPlan P;
  Plan& p = P.plan;
  auto net = [&](NetActs& a, const std::string& pre) {  // pre: "save_" online, "tgt_" target
    const bool online = pre == "save_";
    auto bd = [&](int d, const char* what) { return pre + "b" + std::to_string(d) + "_" + what; };
    a.h1 = p.add(pre + "h_s1", D.B, D.SH1);
    a.h2 = p.add(pre + "h_s2", D.B, D.SH2);
    a.logits = p.add(pre + "aux_logits", D.B, D.AUXK);
    a.p = p.add(online ? "aux_nb_softmax_buf" : "tgt_aux_softmax", D.B, D.AUXK);
    a.x[0] = -1;
    for (int d = 1; d < NBRANCH; ++d) a.x[d] = p.add(bd(d, "concat"), D.B, D.X(d));
    for (int d = 0; d < NBRANCH; ++d) a.hid[d] = p.add(bd(d, "hid"), D.B, D.ADV);
    for (int d = 0; d < NBRANCH; ++d) a.adv[d] = p.add(bd(d, "adv"), D.B, D.A[d]);
    a.v_hid = p.add(pre + "v_hid", D.B, D.VALH);
    a.value = p.add(pre + "value", D.B, 1);
    for (int d = 0; d < NBRANCH; ++d) a.q[d] = p.add(pre + "q_b" + std::to_string(d), D.B, D.A[d]);
  };
  net(P.on, "save_");
  net(P.tg, "tgt_");
  P.scratch = p.add("sp14_dir_qaux_concat_scratch", D.B, D.SH2 + 1);
  for (int d = 0; d < NBRANCH; ++d) P.dq_td[d] = p.add("dq_main_b" + std::to_string(d), D.B, D.A[d]);
  for (int d = 0; d < NBRANCH; ++d) P.dq_cql[d] = p.add("dq_cql_b" + std::to_string(d), D.B, D.A[d]);
  P.td_y = p.add("td_target", D.B, NBRANCH);
  P.td_argmax = p.add("td_argmax", D.B, NBRANCH);
  P.loss_ld = 2 * NBRANCH + 1;
  P.loss_terms = p.add("loss_terms", D.B, P.loss_ld);
  P.loss_sums = p.add("loss_sums", 1, P.loss_ld);
  for (int d = 0; d < NBRANCH; ++d) P.d_adv[d] = p.add("d_b" + std::to_string(d) + "_adv", D.B, D.A[d]);
  P.d_value = p.add("d_value", D.B, 1);
  P.d_v_hid = p.add("d_v_hid", D.B, D.VALH);
  for (int d = 0; d < NBRANCH; ++d) P.d_hid[d] = p.add("d_b" + std::to_string(d) + "_hid", D.B, D.ADV);
  P.d_x[0] = p.add("sp14_d_dir_qaux_concat", D.B, D.SH2 + 1);
  for (int d = 1; d < NBRANCH; ++d) P.d_x[d] = p.add("sp14_d_b" + std::to_string(d) + "_concat", D.B, D.X(d));
  P.d_h_s2 = p.add("d_h_s2", D.B, D.SH2);
  P.d_aux = p.add("d_aux_logits", D.B, D.AUXK);
  P.d_z2 = p.add("d_z2", D.B, D.SH2);
  P.d_h1 = p.add("d_h_s1", D.B, D.SH1);
  P.sn_wtu = p.add("sn_scratch_v", 1, sn_vlen);  // W^T u, before it is normalised into v
  P.sn_wv = p.add("sn_scratch_u", 1, D.ADV);     // W v, before it is normalised into u
  P.sn_norm2 = p.add("sn_norms", 1, 2);          // |W^T u|^2 (norm2_v), |W v|^2 (norm2_u)
  return P;
}

struct BatchPlan {
  Plan plan;
  int obs, next_obs, actions, reward, done, aux_label;
  int ctx[NBRANCH], next_ctx[NBRANCH];  // branch d >= 1's E_d context columns for s and s'
};

inline BatchPlan make_batch_plan(const Dims& D) {
  BatchPlan b;
  b.obs = b.plan.add("obs", D.B, D.OBS);
  b.next_obs = b.plan.add("next_obs", D.B, D.OBS);
  b.ctx[0] = b.next_ctx[0] = -1;  // the direction branch's extra column is the wire
  for (int d = 1; d < NBRANCH; ++d) {
    b.ctx[d] = b.plan.add("ctx_b" + std::to_string(d), D.B, D.E[d]);
    b.next_ctx[d] = b.plan.add("next_ctx_b" + std::to_string(d), D.B, D.E[d]);
  }
  b.actions = b.plan.add("actions", D.B, NBRANCH);  // int32, column d = branch d's action
  b.reward = b.plan.add("reward", D.B, 1);
  b.done = b.plan.add("done", D.B, 1);
  b.aux_label = b.plan.add("aux_label", D.B, 1);    // int32
  return b;
}

// ---- the seeded generator ----------------------------------------------------------------------
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double)(next() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {  // Box-Muller
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  int below(int n) { return (int)(next() % (uint64_t)n); }
};

// The host image of the batch allocation (ints stored bit-for-bit in the float slots).
inline std::vector<float> make_batch(const Dims& D, const BatchPlan& bp, uint64_t seed) {
  std::vector<float> h(bp.plan.total, 0.0f);
  Rng rng(seed ^ 0xBA7C4ull);
  auto at = [&](int r, long long i) -> float& { return h[bp.plan.r[r].off + i]; };
  auto put_int = [&](int r, long long i, int v) { std::memcpy(&at(r, i), &v, 4); };
  for (long long i = 0; i < (long long)D.B * D.OBS; ++i) at(bp.obs, i) = (float)rng.normal();
  for (long long i = 0; i < (long long)D.B * D.OBS; ++i) at(bp.next_obs, i) = (float)rng.normal();
  for (int d = 1; d < NBRANCH; ++d)
    for (long long i = 0; i < (long long)D.B * D.E[d]; ++i) {
      at(bp.ctx[d], i) = (float)rng.normal();
      at(bp.next_ctx[d], i) = (float)rng.normal();
    }
  for (int b = 0; b < D.B; ++b) {
    for (int d = 0; d < NBRANCH; ++d) put_int(bp.actions, (long long)b * NBRANCH + d, rng.below(D.A[d]));
    at(bp.reward, b) = (float)rng.normal();
    at(bp.done, b) = rng.uniform() < 0.1 ? 1.0f : 0.0f;
    put_int(bp.aux_label, b, rng.below(D.AUXK));
  }
  return h;
}

// Initial weights: He-uniform for the ReLU net, W ~ U(-sqrt(6/in), sqrt(6/in)), and biases
// ~ U(-1/sqrt(in), 1/sqrt(in)) with the fan-in of their weight (b_X belongs to w_X). With these
// w_b0fc's spectral norm is above sigma_max = 1 from the first step, so the projection acts.
inline std::vector<float> make_params(const ParamTable& P, uint64_t seed) {
  std::vector<float> w(P.region, 0.0f);
  Rng rng(seed ^ 0x5EEDull);
  for (int id = 0; id < NPARAM; ++id) {
    const Tensor& t = P[id];
    int fan_in = t.cols;
    if (t.name[0] == 'b')
      for (int j = 0; j < NPARAM; ++j)
        if (P[j].name == "w" + t.name.substr(1)) fan_in = P[j].cols;
    const double bound = (t.name[0] == 'b' ? 1.0 : std::sqrt(6.0)) / std::sqrt((double)fan_in);
    for (long long i = 0; i < t.numel(); ++i) w[t.off + i] = (float)((2.0 * rng.uniform() - 1.0) * bound);
  }
  return w;
}

// sn_state's initial vectors: u, v ~ N(0, 1), normalised.
inline std::vector<float> make_sn_state(int adv, int vlen, uint64_t seed) {
  std::vector<float> s(adv + vlen);
  Rng rng(seed ^ 0x5A5Aull);
  for (int part = 0; part < 2; ++part) {
    const int n = part ? vlen : adv;
    float* x = s.data() + (part ? adv : 0);
    double nn = 0;
    for (int i = 0; i < n; ++i) { x[i] = (float)rng.normal(); nn += (double)x[i] * x[i]; }
    for (int i = 0; i < n; ++i) x[i] = (float)(x[i] / std::sqrt(nn));
  }
  return s;
}
