// reference.h: an independent float64 model of one SP14 step (kernels/CONTRACT.md section 2), written as plain
// loops over the same parameter table. --self-check compares the device's gradients and updated
// state with it; host/fd_check.cpp checks its backward against finite differences of its loss.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "net.h"

using Vec = std::vector<double>;

struct RefBatch {
  Vec obs, next_obs, ctx[NBRANCH], next_ctx[NBRANCH], reward, done;  // ctx[d]: [B, E_d], d >= 1
  std::vector<int> actions, labels;                                  // actions [B, 4]
};

inline RefBatch ref_batch(const Dims& D, const BatchPlan& bp, const std::vector<float>& img) {
  RefBatch r;
  auto floats = [&](int id) {
    const Region& g = bp.plan.r[id];
    return Vec(img.begin() + g.off, img.begin() + g.off + g.numel());
  };
  auto ints = [&](int id) {
    const Region& g = bp.plan.r[id];
    std::vector<int> v(g.numel());
    std::memcpy(v.data(), img.data() + g.off, 4 * g.numel());
    return v;
  };
  r.obs = floats(bp.obs);
  r.next_obs = floats(bp.next_obs);
  for (int d = 1; d < NBRANCH; ++d) r.ctx[d] = floats(bp.ctx[d]), r.next_ctx[d] = floats(bp.next_ctx[d]);
  r.reward = floats(bp.reward);
  r.done = floats(bp.done);
  r.actions = ints(bp.actions);
  r.labels = ints(bp.aux_label);
  (void)D;
  return r;
}

struct RefFwd {
  Vec h1, h2, logits, p, wire, x[NBRANCH], hid[NBRANCH], adv[NBRANCH], vh, value, q[NBRANCH];
};

struct RefLoss {
  double td = 0, cql = 0, aux = 0;
  Vec dq_td[NBRANCH], dq_cql[NBRANCH];
  std::vector<int> argmax;  // [B, 4]
};

class RefModel {
 public:
  RefModel(const Dims& D, const Hyper& H, const ParamTable& P, const RefBatch& b)
      : D(D), H(H), P(P), b(b) {}

  // One net on obs (next = false) or next_obs. frozen_wire, when given, replaces the wire
  // column p[up] - p[down] (the FD check's stand-in for a closed gate).
  RefFwd forward(const Vec& W, bool next, const Vec* frozen_wire = nullptr) const {
    RefFwd f;
    const Vec& in = next ? b.next_obs : b.obs;
    linear(in, D.OBS, W, W_S1, f.h1, true);
    linear(f.h1, D.SH1, W, W_S2, f.h2, true);
    linear(f.h2, D.SH2, W, W_AUX, f.logits, false);
    f.p.assign((size_t)D.B * D.AUXK, 0);
    f.wire.assign(D.B, 0);
    for (int r = 0; r < D.B; ++r) {
      const double* z = &f.logits[(size_t)r * D.AUXK];
      double m = *std::max_element(z, z + D.AUXK), s = 0;
      for (int k = 0; k < D.AUXK; ++k) s += std::exp(z[k] - m);
      for (int k = 0; k < D.AUXK; ++k) f.p[(size_t)r * D.AUXK + k] = std::exp(z[k] - m) / s;
      f.wire[r] = frozen_wire ? (*frozen_wire)[r]
                              : f.p[(size_t)r * D.AUXK + AUX_UP] - f.p[(size_t)r * D.AUXK + AUX_DOWN];
    }
    for (int d = 0; d < NBRANCH; ++d) {
      const int X = D.X(d);
      f.x[d].assign((size_t)D.B * X, 0);
      for (int r = 0; r < D.B; ++r) {
        for (int j = 0; j < D.SH2; ++j) f.x[d][(size_t)r * X + j] = f.h2[(size_t)r * D.SH2 + j];
        for (int e = 0; e < D.E[d]; ++e)
          f.x[d][(size_t)r * X + D.SH2 + e] =
              d == 0 ? f.wire[r] : (next ? b.next_ctx[d] : b.ctx[d])[(size_t)r * D.E[d] + e];
      }
      linear(f.x[d], X, W, wfc(d), f.hid[d], true);
      linear(f.hid[d], D.ADV, W, wout(d), f.adv[d], false);
    }
    linear(f.h2, D.SH2, W, W_V0, f.vh, true);
    linear(f.vh, D.VALH, W, W_V1, f.value, false);
    for (int d = 0; d < NBRANCH; ++d) {
      f.q[d].assign((size_t)D.B * D.A[d], 0);
      for (int r = 0; r < D.B; ++r) {
        double mean = 0;
        for (int a = 0; a < D.A[d]; ++a) mean += f.adv[d][(size_t)r * D.A[d] + a];
        mean /= D.A[d];
        for (int a = 0; a < D.A[d]; ++a)
          f.q[d][(size_t)r * D.A[d] + a] = f.value[r] + f.adv[d][(size_t)r * D.A[d] + a] - mean;
      }
    }
    return f;
  }

  RefLoss losses(const RefFwd& on, const RefFwd& tg) const {
    RefLoss L;
    L.argmax.assign((size_t)D.B * NBRANCH, 0);
    for (int d = 0; d < NBRANCH; ++d) {
      const int n = D.A[d];
      L.dq_td[d].assign((size_t)D.B * n, 0);
      L.dq_cql[d].assign((size_t)D.B * n, 0);
      for (int r = 0; r < D.B; ++r) {
        const double* qn = &tg.q[d][(size_t)r * n];
        int best = 0;
        for (int a = 1; a < n; ++a)
          if (qn[a] > qn[best]) best = a;
        L.argmax[(size_t)r * NBRANCH + d] = best;
        const double y = b.reward[r] + H.gamma * (1.0 - b.done[r]) * qn[best];
        const double* q = &on.q[d][(size_t)r * n];
        const int a_t = b.actions[(size_t)r * NBRANCH + d];
        const double delta = q[a_t] - y, ad = std::fabs(delta), k = H.kappa;
        L.td += (ad <= k ? 0.5 * delta * delta : k * (ad - 0.5 * k)) / D.B;
        L.dq_td[d][(size_t)r * n + a_t] = std::max(-k, std::min(k, delta)) / D.B;
        const double m = *std::max_element(q, q + n);
        double s = 0;
        for (int a = 0; a < n; ++a) s += std::exp(q[a] - m);
        L.cql += H.lam_cql * (m + std::log(s) - q[a_t]) / D.B;
        for (int a = 0; a < n; ++a)
          L.dq_cql[d][(size_t)r * n + a] =
              H.lam_cql * (std::exp(q[a] - m) / s - (a == a_t ? 1.0 : 0.0)) / D.B;
      }
    }
    for (int r = 0; r < D.B; ++r)
      L.aux -= H.lam_aux * std::log(on.p[(size_t)r * D.AUXK + b.labels[r]]) / D.B;
    return L;
  }

  // The whole step's gradient: the CQL call site (dQ from L_cql) plus the main site (dQ from
  // L_td and the aux CE gradient), the wire's gradient into the aux head gated by alpha.
  Vec backward(const Vec& W, const RefFwd& f, const RefLoss& L, double alpha) const {
    Vec G(P.region, 0.0);
    site(W, f, L.dq_cql, false, alpha, G);
    site(W, f, L.dq_td, true, alpha, G);
    return G;
  }

  // The gate producer: ema * prev + (1 - ema) * clamp(accuracy), non-finite -> 0.
  double gate(const RefFwd& f, double prev) const {
    int hits = 0;
    for (int r = 0; r < D.B; ++r) {
      const double* p = &f.p[(size_t)r * D.AUXK];
      int best = 0;
      for (int k = 1; k < D.AUXK; ++k)
        if (p[k] > p[best]) best = k;
      hits += best == b.labels[r];
    }
    const double raw = std::min(1.0, std::max(0.0, (double)hits / D.B));
    const double a = H.gate_ema * prev + (1.0 - H.gate_ema) * raw;
    return std::isfinite(a) ? a : 0.0;
  }

  void adam(Vec& W, const Vec& G, Vec& m, Vec& v, int t) const {
    const double bc1 = 1.0 - std::pow((double)H.beta1, t), bc2 = 1.0 - std::pow((double)H.beta2, t);
    for (int id = 0; id < NPARAM; ++id)
      for (long long i = P[id].off; i < P[id].off + P[id].numel(); ++i) {
        m[i] = H.beta1 * m[i] + (1.0 - H.beta1) * G[i];
        v[i] = H.beta2 * v[i] + (1.0 - H.beta2) * G[i] * G[i];
        W[i] -= H.lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + H.eps);
      }
  }

  // One power iteration (v = W^T u / |.|, u = W v / |.|, sigma = |W v|), then the projection.
  void spectral(Vec& W, Vec& u, Vec& v) const {
    const Tensor& t = P[W_B0FC];
    const double* w = &W[t.off];
    Vec wtu(t.cols, 0), wv(t.rows, 0);
    for (int i = 0; i < t.rows; ++i)
      for (int j = 0; j < t.cols; ++j) wtu[j] += u[i] * w[(size_t)i * t.cols + j];
    const double n1 = std::max(norm(wtu), 1e-12);
    for (int j = 0; j < t.cols; ++j) v[j] = wtu[j] / n1;
    for (int i = 0; i < t.rows; ++i)
      for (int j = 0; j < t.cols; ++j) wv[i] += w[(size_t)i * t.cols + j] * v[j];
    const double sigma = norm(wv);
    for (int i = 0; i < t.rows; ++i) u[i] = wv[i] / std::max(sigma, 1e-12);
    if (sigma > H.sigma_max)
      for (long long i = 0; i < t.numel(); ++i) W[t.off + i] *= H.sigma_max / sigma;
  }

  void polyak(Vec& T, const Vec& W) const {
    for (size_t i = 0; i < T.size(); ++i) T[i] = H.tau * W[i] + (1.0 - H.tau) * T[i];
  }

 private:
  const Dims& D;
  const Hyper& H;
  const ParamTable& P;
  const RefBatch& b;

  static double norm(const Vec& x) {
    double s = 0;
    for (double e : x) s += e * e;
    return std::sqrt(s);
  }

  // y[B, out] = act(x[B, in] . W^T + b) for the weight `id` and its bias id + 1 (or, for the
  // batched pair, the bias the table names b_...).
  void linear(const Vec& x, int in, const Vec& W, int id, Vec& y, bool relu) const {
    const Tensor& w = P[id];
    const Tensor& bias = P[bias_of(id)];
    const int out = w.rows;
    y.assign((size_t)D.B * out, 0);
    for (int r = 0; r < D.B; ++r)
      for (int o = 0; o < out; ++o) {
        double s = W[bias.off + o];
        for (int i = 0; i < in; ++i) s += x[(size_t)r * in + i] * W[w.off + (size_t)o * w.cols + i];
        y[(size_t)r * out + o] = relu ? (s > 0 ? s : 0) : s;
      }
  }
  int bias_of(int id) const {
    for (int j = 0; j < NPARAM; ++j)
      if (P[j].name == "b" + P[id].name.substr(1)) return j;
    return -1;
  }

  // dW[out, in] += dy^T x;  db += colsum(dy);  returns dx = dy W (or nothing when dx is null)
  void linear_back(const Vec& x, int in, const Vec& dy, const Vec& W, int id, Vec& G, Vec* dx) const {
    const Tensor& w = P[id];
    const Tensor& bias = P[bias_of(id)];
    const int out = w.rows;
    for (int r = 0; r < D.B; ++r)
      for (int o = 0; o < out; ++o) {
        const double g = dy[(size_t)r * out + o];
        if (g == 0) continue;
        G[bias.off + o] += g;
        for (int i = 0; i < in; ++i) G[w.off + (size_t)o * w.cols + i] += g * x[(size_t)r * in + i];
      }
    if (!dx) return;
    dx->assign((size_t)D.B * in, 0);
    for (int r = 0; r < D.B; ++r)
      for (int o = 0; o < out; ++o) {
        const double g = dy[(size_t)r * out + o];
        if (g == 0) continue;
        for (int i = 0; i < in; ++i) (*dx)[(size_t)r * in + i] += g * W[w.off + (size_t)o * w.cols + i];
      }
  }
  static void mask(Vec& d, const Vec& act) {
    for (size_t i = 0; i < d.size(); ++i)
      if (!(act[i] > 0)) d[i] = 0;
  }

  void site(const Vec& W, const RefFwd& f, const Vec* dq, bool with_ce, double alpha, Vec& G) const {
    Vec dh2((size_t)D.B * D.SH2, 0), dv(D.B, 0), dx;
    Vec dadv[NBRANCH];
    for (int d = 0; d < NBRANCH; ++d) {  // dueling
      const int n = D.A[d];
      dadv[d].assign((size_t)D.B * n, 0);
      for (int r = 0; r < D.B; ++r) {
        double s = 0;
        for (int a = 0; a < n; ++a) s += dq[d][(size_t)r * n + a];
        dv[r] += s;
        for (int a = 0; a < n; ++a) dadv[d][(size_t)r * n + a] = dq[d][(size_t)r * n + a] - s / n;
      }
    }
    Vec dvh;  // value stream
    linear_back(f.vh, D.VALH, dv, W, W_V1, G, &dvh);
    mask(dvh, f.vh);
    linear_back(f.h2, D.SH2, dvh, W, W_V0, G, &dx);
    for (size_t i = 0; i < dh2.size(); ++i) dh2[i] += dx[i];
    Vec gwire(D.B, 0);
    for (int d = 0; d < NBRANCH; ++d) {  // branches
      Vec dhid;
      linear_back(f.hid[d], D.ADV, dadv[d], W, wout(d), G, &dhid);
      mask(dhid, f.hid[d]);
      const int X = D.X(d);
      linear_back(f.x[d], X, dhid, W, wfc(d), G, &dx);
      for (int r = 0; r < D.B; ++r)
        for (int j = 0; j < D.SH2; ++j) dh2[(size_t)r * D.SH2 + j] += dx[(size_t)r * X + j];
      if (d == 0)
        for (int r = 0; r < D.B; ++r) gwire[r] = alpha * dx[(size_t)r * X + D.SH2];
    }
    Vec dlog((size_t)D.B * D.AUXK, 0);  // aux head: CE (main site) + the gated wire
    for (int r = 0; r < D.B; ++r) {
      const double* p = &f.p[(size_t)r * D.AUXK];
      const double ep = p[AUX_UP] - p[AUX_DOWN];
      for (int i = 0; i < D.AUXK; ++i) {
        const double e = i == AUX_UP ? 1 : (i == AUX_DOWN ? -1 : 0);
        const double ce = with_ce ? H.lam_aux * (p[i] - (i == b.labels[r] ? 1 : 0)) / D.B : 0;
        dlog[(size_t)r * D.AUXK + i] = ce + p[i] * (e - ep) * gwire[r];
      }
    }
    linear_back(f.h2, D.SH2, dlog, W, W_AUX, G, &dx);
    for (size_t i = 0; i < dh2.size(); ++i) dh2[i] += dx[i];
    mask(dh2, f.h2);  // trunk
    Vec dh1;
    linear_back(f.h1, D.SH1, dh2, W, W_S2, G, &dh1);
    mask(dh1, f.h1);
    linear_back(b.obs, D.OBS, dh1, W, W_S1, G, nullptr);
  }
};

// max |got - want| over a tensor against EGF010's bound 1e-6 + 1e-4 * max |want|.
struct Agreement {
  double err = 0, scale = 0;
  bool ok() const { return err <= 1e-6 + 1e-4 * scale; }
};
inline Agreement agree(const float* got, const double* want, long long n) {
  Agreement a;
  for (long long i = 0; i < n; ++i) {
    const double e = std::fabs((double)got[i] - want[i]);
    a.err = std::isnan(e) ? INFINITY : std::max(a.err, e);  // std::max would drop a NaN
    a.scale = std::max(a.scale, std::fabs(want[i]));
  }
  return a;
}
