// Finite differences of reference.h's loss against its backward, on the CPU (no GPU needed):
//   alpha = 1: the backward is the full gradient of L = L_cql + L_td + L_aux;
//   alpha = 0: it is the gradient with the wire held constant (the gate cuts exactly that path);
//   alpha = 0.37: it is the blend of the two, linear in alpha.
// Build and run: g++ -O2 -std=c++17 -I.. fd_check.cpp -o fd_check && ./fd_check
#include <cstdio>

#include "../reference.h"

int main() {
  Dims D{16, 6, 12, 7, 3, 5, 4, {3, 5, 3, 3}, {1, 2, 1, 1}, 512};  // small, SH2 + 1 = 8
  Hyper H;
  const ParamTable P = make_param_table(D);
  const BatchPlan bp = make_batch_plan(D);
  const RefBatch batch = ref_batch(D, bp, make_batch(D, bp, 7));
  std::vector<float> w0 = make_params(P, 7);
  Vec W(w0.begin(), w0.end()), T(W);
  Rng rng(99);
  for (double& t : T) t += 0.05 * rng.normal();  // a target that is not the online net
  RefModel M(D, H, P, batch);
  const RefFwd tg = M.forward(T, true);
  auto loss = [&](const Vec& w, const Vec* frozen) {
    const RefFwd on = M.forward(w, false, frozen);
    const RefLoss L = M.losses(on, tg);
    return L.td + L.cql + L.aux;
  };
  const RefFwd on = M.forward(W, false);
  const RefLoss L = M.losses(on, tg);
  const Vec g1 = M.backward(W, on, L, 1.0), g0 = M.backward(W, on, L, 0.0);
  const Vec gm = M.backward(W, on, L, 0.37);
  int bad = 0;
  double worst = 0;
  const double h = 1e-6;
  for (int id = 0; id < NPARAM; ++id) {
    const Tensor& t = P[id];
    for (int probe = 0; probe < 6; ++probe) {
      const long long i = t.off + (long long)(rng.next() % (uint64_t)t.numel());
      for (int frozen = 0; frozen < 2; ++frozen) {
        Vec wp = W, wm = W;
        wp[i] += h;
        wm[i] -= h;
        const Vec* fz = frozen ? &on.wire : nullptr;
        const double fd = (loss(wp, fz) - loss(wm, fz)) / (2 * h);
        const double an = frozen ? g0[i] : g1[i];
        const double err = std::fabs(fd - an) / std::max(1e-6, std::fabs(fd) + std::fabs(an));
        worst = std::max(worst, std::fabs(fd - an));
        if (std::fabs(fd - an) > 1e-7 + 1e-5 * std::fabs(fd)) {
          ++bad;
          std::printf("MISMATCH %s[%lld] %s: fd %.9g backward %.9g (rel %.2g)\n", t.name.c_str(),
                      i - t.off, frozen ? "alpha=0" : "alpha=1", fd, an, err);
        }
      }
      const double blend = g0[i] + 0.37 * (g1[i] - g0[i]);
      if (std::fabs(gm[i] - blend) > 1e-12 + 1e-9 * std::fabs(blend)) {
        ++bad;
        std::printf("MISMATCH %s[%lld] alpha=0.37 is not the blend\n", t.name.c_str(), i - t.off);
      }
    }
  }
  double wire_part = 0;
  for (long long i = 0; i < P.region; ++i) wire_part = std::max(wire_part, std::fabs(g1[i] - g0[i]));
  std::printf("losses: td %.6f cql %.6f aux %.6f; largest wire-path gradient %.3g\n", L.td, L.cql,
              L.aux, wire_part);
  std::printf("%s: %d probes x 2 gates, largest |fd - backward| %.3g, %d mismatches\n",
              bad ? "FAIL" : "PASS", NPARAM * 6, worst, bad);
  return bad ? 1 : 0;
}
