// An SP14 DQN trainer, written from the SP14 contract (kernels/CONTRACT.md sections 2 and 3, the
// fault catalogue's names, the seed commit, docs/capture.md, kernels/README.md) by someone who
// never read egf-audit's own rebuild.
// C++ on the CUDA driver API (or, --api runtime, the runtime API), its kernels compiled at run
// time by NVRTC, every GEMM through cuBLAS. Run: ./trainer [--preset ci|prod] [--steps N]
//   [--fault NAME] [--layout-out FILE] [--api driver|runtime] [--self-check] [--kernels DIR]
// Step 0 runs with the gate closed (nothing writes ISV[393]: the sentinel), later steps live.
//
// One step, in this trainer's order:
//   zero grad_buf; online forward (obs); gate producer (live steps); target forward (next_obs,
//   writing ITS concat into the shared scratch); losses; the CQL call site; the main call site;
//   Adam; spectral-norm projection of w_b0fc; Polyak.
// Each call site: (1) rebuild the online concat, (2) zero d_h_s2, (3) backward_full: dueling,
// value stream (its dX into d_h_s2 with beta = 1), the urg/ord pair, mag, then dir last (its dW
// from the concat with width SH2 + 1, its dX into sp14_d_dir_qaux_concat), (4) gate the wire
// column, (5) accumulate the four branches' dX into d_h_s2, (6) the gated wire into the aux
// head, its dW, its dX into d_h_s2, then the trunk from d_h_s2.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu.h"
#include "net.h"
#include "reference.h"

#ifndef OUTSIDER_KERNEL_DIR
#define OUTSIDER_KERNEL_DIR "kernels"
#endif

// ---- faults: each re-creates one wiring bug in this trainer's own code -----------------------
#define FAULT_LIST(X)                                                                           \
  X(fwd_k_sh2, "fwd-k-sh2", "the direction FC forward GEMM contracts over SH2 of SH2 + 1 columns") \
  X(dw_k_sh2, "dw-k-sh2", "the d = 0 dW GEMM reads save_h_s2 with width SH2 (the pre-B.10 call)") \
  X(dx_k_sh2, "dx-k-sh2", "the d = 0 dX GEMM writes SH2 of the SH2 + 1 dX columns")               \
  X(skip_scale, "skip-scale", "no wire-gate launch at either call site")                         \
  X(cql_site_ungated, "cql-site-ungated", "no wire-gate launch at the CQL call site")            \
  X(scale_wrong_col, "scale-wrong-col", "the gate scales column SH2 - 1 instead of the wire")    \
  X(skip_rebuild, "skip-rebuild", "no online concat rebuild: dW reads the target's concat")      \
  X(no_zero_d_h_s2, "no-zero-d-h-s2", "d_h_s2 is not zeroed before backward_full")               \
  X(accumulate_wire_col, "accumulate-wire-col", "the dir accumulate reads the dX with row stride SH2") \
  X(target_grad_leak, "target-grad-leak", "the value head's dW_v1 GEMM accumulates into target_params") \
  X(polyak_tau_swap, "polyak-tau-swap", "polyak_ema is passed 1 - tau")                          \
  X(wrapper_on_main, "wrapper-on-main", "the main site calls backward_full's legacy path (0, 0)") \
  X(sn_vector_sh2, "sn-vector-sh2", "the spectral-norm v vector is SH2 long (not grown)")        \
  X(adam_state_sh2, "adam-state-sh2", "Adam's table still gives w_b0fc ADV * SH2 elements")       \
  X(gate_no_clamp, "gate-no-clamp", "the gate producer does not clamp the raw gate to [0, 1]")   \
  X(scale_x_concat, "scale-x-concat", "the gate is applied to the forward concat, not the dX")   \
  X(scale_dw_wire_col, "scale-dw-wire-col", "the gate is applied to dW w_b0fc's wire column")    \
  X(no_nan_branch, "no-nan-branch", "the wire gate kernel lacks its alpha == 0 branch")          \
  X(dx_reads_target, "dx-reads-target", "the d = 0 dX GEMM reads the target net's w_b0fc")       \
  X(dw_s1_k_short, "dw-s1-k-short", "the dW w_s1 GEMM reduces over B - 1 batch rows")             \
  X(grad_zero_once, "grad-zero-once", "grad_buf is zeroed before the first step only")           \
  X(concat_up_down_swapped, "concat-up-down-swapped", "the concat launches pass up = 0, down = 2")

enum class Fault {
  none,
#define AS_ENUM(id, name, what) id,
  FAULT_LIST(AS_ENUM)
#undef AS_ENUM
};
struct FaultInfo { Fault f; const char* name; const char* what; };
static const FaultInfo FAULTS[] = {
#define AS_INFO(id, name, what) {Fault::id, name, what},
    FAULT_LIST(AS_INFO)
#undef AS_INFO
};

struct Options {
  std::string preset = "ci", layout_out, kernels = OUTSIDER_KERNEL_DIR;
  int steps = 2;
  uint64_t seed = 1;
  Fault fault = Fault::none;
  Api api = Api::driver;
  bool self_check = false;
};

enum Site { CQL = 0, MAIN = 1 };

static std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read kernel source " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

class Trainer {
 public:
  Trainer(Gpu& gpu, const Dims& dims, const Options& opt)
      : g(gpu), D(dims), O(opt), P(make_param_table(D)),
        vlen(is(Fault::sn_vector_sh2) ? D.SH2 : D.SH2 + 1),
        A(make_pool_plan(D, vlen)), BP(make_batch_plan(D)) {
    load_kernels();
    allocate();
    init_state();
  }

  void write_layout(const std::string& path) const;
  void step(int t, bool live);
  bool self_check_ok() const { return check_failures == 0; }

 private:
  Gpu& g;
  const Dims D;
  const Hyper H;
  const Options O;
  const ParamTable P;
  const int vlen;  // the spectral-norm v vector's length (SH2 + 1)
  const PoolPlan A;
  const BatchPlan BP;
  dptr arena = 0, target = 0, pool = 0, batch = 0, isv = 0, sn = 0;
  std::vector<float> batch_host;
  int check_failures = 0;

  struct {
    Kernel concat, scale, accumulate, polyak;  // the ABI
    Kernel bias, softmax, branch_input, duel, losses, aux_loss, col_sum, duel_grad, relu_grad,
        aux_grad, adam, sq_norm, div_norm, sn_clip, gate;
  } k;

  bool is(Fault f) const { return O.fault == f; }

  // device addresses: a tensor in one of the arena's regions or the target, a named region
  dptr prm(int id) const { return arena + 4 * (dptr)P[id].off; }
  dptr grd(int id) const { return arena + 4 * (dptr)(P.region + P[id].off); }
  dptr tgt(int id) const { return target + 4 * (dptr)P[id].off; }
  dptr act(int r) const { return pool + 4 * (dptr)A.plan.r[r].off; }
  dptr bat(int r) const { return batch + 4 * (dptr)BP.plan.r[r].off; }
  dptr sn_u() const { return sn; }
  dptr sn_v() const { return sn + 4 * (dptr)D.ADV; }
  long long stride(int r2, int r3) const { return A.plan.r[r3].off - A.plan.r[r2].off; }

  void load_kernels() {
    auto one = [&](const std::string& file, const std::vector<std::string>& names) {
      return g.load(file, read_file(O.kernels + "/" + file), names);
    };
    k.concat = one("sp14_dir_concat_qaux_kernel.cu", {"sp14_dir_concat_qaux"})[0];
    k.scale = one(is(Fault::no_nan_branch) ? "faults/sp14_scale_wire_col_no_nan_branch.cu"
                                           : "sp14_scale_wire_col_kernel.cu",
                  {"sp14_scale_wire_col"})[0];
    k.accumulate = one("accumulate_d_h_s2_from_concat_kernel.cu", {"accumulate_d_h_s2_from_concat"})[0];
    k.polyak = one("polyak_ema_kernel.cu", {"polyak_ema"})[0];
    k.gate = one(is(Fault::gate_no_clamp) ? "faults/dqn_gate_kernel_no_clamp.cu" : "dqn_gate_kernel.cu",
                 {"dqn_gate_producer"})[0];
    const std::vector<Kernel> h = one(
        "dqn_kernels.cu",
        {"dqn_bias_forward", "dqn_row_softmax", "dqn_branch_input", "dqn_duel_head",
         "dqn_branch_losses", "dqn_aux_loss", "dqn_col_sum", "dqn_duel_grad", "dqn_relu_grad",
         "dqn_aux_head_grad", "dqn_adam_tensor", "dqn_sq_norm", "dqn_div_by_norm", "dqn_sn_clip"});
    Kernel* dst[] = {&k.bias, &k.softmax, &k.branch_input, &k.duel, &k.losses, &k.aux_loss,
                     &k.col_sum, &k.duel_grad, &k.relu_grad, &k.aux_grad, &k.adam, &k.sq_norm,
                     &k.div_norm, &k.sn_clip};
    for (size_t i = 0; i < h.size(); ++i) *dst[i] = h[i];
  }

  void allocate() {
    arena = g.alloc(4 * 4 * (size_t)P.region);  // params | grad_buf | adam_m | adam_v
    target = g.alloc(4 * (size_t)P.region);
    batch = g.alloc(4 * (size_t)BP.plan.total);
    pool = g.alloc(4 * (size_t)A.plan.total);
    isv = g.alloc(4 * (size_t)D.N_ISV);
    sn = g.alloc(4 * (size_t)(D.ADV + vlen));
  }

  void init_state() {
    const std::vector<float> w = make_params(P, O.seed);
    g.zero(arena, 4 * 4 * (size_t)P.region);  // grads and both Adam moments start at 0
    g.upload(arena, w.data(), 4 * w.size());
    g.upload(target, w.data(), 4 * w.size());  // the target starts as a copy of the online net
    batch_host = make_batch(D, BP, O.seed);
    g.upload(batch, batch_host.data(), 4 * batch_host.size());
    g.zero(pool, 4 * (size_t)A.plan.total);
    g.zero(isv, 4 * (size_t)D.N_ISV);  // ISV[393] = 0.0: the sentinel, until a producer runs
    const std::vector<float> s = make_sn_state(D.ADV, vlen, O.seed);
    g.upload(sn, s.data(), 4 * s.size());
  }

  // ---- row-major GEMMs on top of column-major cuBLAS (operands swapped) ----
  // Y[rows, out] = X[rows, :k] . W[out, :k]^T (beta 0); the bias comes after, from a kernel.
  void fc_fwd(dptr Y, int out, dptr X, int ldx, dptr W, int ldw, int rows, int kk, bool ex = false) {
    if (ex)
      g.gemm_ex(OP_T, OP_N, out, rows, kk, 1.0f, W, ldw, X, ldx, 0.0f, Y, out);
    else
      g.sgemm(OP_T, OP_N, out, rows, kk, 1.0f, W, ldw, X, ldx, 0.0f, Y, out);
  }
  // dW[out, :width] += dY[rows, out]^T . X[rows, :width]; ldc is dW's row stride.
  void fc_dw(dptr dW, int ldc, dptr dY, int out, dptr X, int ldx, int rows, int width) {
    g.sgemm(OP_N, OP_T, width, out, rows, 1.0f, X, ldx, dY, out, 1.0f, dW, ldc);
  }
  // dX[rows, :width] = dY[rows, out] . W[out, :width] (+ beta dX); ldc is dX's row stride.
  void fc_dx(dptr dX, int ldc, dptr dY, int out, dptr W, int ldw, int rows, int width, float beta) {
    g.sgemm(OP_N, OP_N, width, rows, out, 1.0f, W, ldw, dY, out, beta, dX, ldc);
  }

  // ---- kernel launches with their exact parameter types ----
  void bias(dptr y, dptr b, int rows, int cols, bool relu) {
    g.launch(k.bias, (long long)rows * cols, y, b, rows, cols, (int)relu);
  }
  void col_sum(dptr out, dptr in, int rows, int cols, bool accumulate) {
    g.launch(k.col_sum, cols, out, in, rows, cols, (int)accumulate);
  }
  void relu_grad(dptr dz, dptr dy, dptr a, long long n) { g.launch(k.relu_grad, n, dz, dy, a, n); }
  void concat(dptr h_s2, dptr p) {  // ABI: sp14_dir_concat_qaux
    const bool swapped = is(Fault::concat_up_down_swapped);
    g.launch(k.concat, D.B, act(A.scratch), h_s2, p, D.B, D.SH2, D.AUXK,
             swapped ? AUX_DOWN : AUX_UP, swapped ? AUX_UP : AUX_DOWN);
  }

  void forward(bool online);
  void losses();
  void backward_full(const int* dq, dptr dir_concat, dptr d_dir_concat);
  void call_site(Site s);
  void optimizer(int t);
  void spectral_norm();
  void self_check(int t, bool live, const std::vector<float>& before, const std::vector<float>& tgt_before,
                  const std::vector<float>& sn_before, float alpha_prev, float alpha,
                  const std::vector<float>& grad, const std::vector<float>& after,
                  const std::vector<float>& tgt_after, const std::vector<float>& sn_after);
};

void Trainer::forward(bool online) {
  const NetActs& a = online ? A.on : A.tg;
  auto W = [&](int id) { return online ? prm(id) : tgt(id); };  // the target: const pointers into target_params
  const dptr in = bat(online ? BP.obs : BP.next_obs);
  fc_fwd(act(a.h1), D.SH1, in, D.OBS, W(W_S1), D.OBS, D.B, D.OBS, /*ex=*/true);
  bias(act(a.h1), W(B_S1), D.B, D.SH1, true);
  fc_fwd(act(a.h2), D.SH2, act(a.h1), D.SH1, W(W_S2), D.SH1, D.B, D.SH1);
  bias(act(a.h2), W(B_S2), D.B, D.SH2, true);
  fc_fwd(act(a.logits), D.AUXK, act(a.h2), D.SH2, W(W_AUX), D.SH2, D.B, D.SH2);
  bias(act(a.logits), W(B_AUX), D.B, D.AUXK, false);
  g.launch(k.softmax, D.B, act(a.p), act(a.logits), D.B, D.AUXK);
  // branch inputs: dir = [h_s2 | wire] into the one scratch (the target's overwrites the
  // online one, hence the rebuild at each call site); the others = [h_s2 | the branch's
  // context columns of s, or of s' for the target]
  concat(act(a.h2), act(a.p));
  for (int d = 1; d < NBRANCH; ++d)
    g.launch(k.branch_input, (long long)D.B * D.X(d), act(a.x[d]), act(a.h2),
             bat(online ? BP.ctx[d] : BP.next_ctx[d]), D.B, D.SH2, D.E[d]);
  const int X0 = D.X(0);
  fc_fwd(act(a.hid[0]), D.ADV, act(A.scratch), X0, W(W_B0FC), X0, D.B,
         is(Fault::fwd_k_sh2) ? D.SH2 : X0);
  fc_fwd(act(a.hid[1]), D.ADV, act(a.x[1]), D.X(1), W(W_B1FC), D.X(1), D.B, D.X(1));
  // ord and urg have the same shapes: one strided-batched GEMM for both
  g.sgemm_strided_batched(OP_T, OP_N, D.ADV, D.B, D.X(2), 1.0f, W(W_B2FC), D.X(2),
                          P[W_B3FC].off - P[W_B2FC].off, act(a.x[2]), D.X(2),
                          stride(a.x[2], a.x[3]), 0.0f, act(a.hid[2]), D.ADV,
                          stride(a.hid[2], a.hid[3]), 2);
  for (int d = 0; d < NBRANCH; ++d) bias(act(a.hid[d]), W(bfc(d)), D.B, D.ADV, true);
  for (int d = 0; d < NBRANCH; ++d) {
    fc_fwd(act(a.adv[d]), D.A[d], act(a.hid[d]), D.ADV, W(wout(d)), D.ADV, D.B, D.ADV);
    bias(act(a.adv[d]), W(bout(d)), D.B, D.A[d], false);
  }
  fc_fwd(act(a.v_hid), D.VALH, act(a.h2), D.SH2, W(W_V0), D.SH2, D.B, D.SH2);
  bias(act(a.v_hid), W(B_V0), D.B, D.VALH, true);
  fc_fwd(act(a.value), 1, act(a.v_hid), D.VALH, W(W_V1), D.VALH, D.B, D.VALH);
  bias(act(a.value), W(B_V1), D.B, 1, false);
  for (int d = 0; d < NBRANCH; ++d)
    g.launch(k.duel, D.B, act(a.q[d]), act(a.value), act(a.adv[d]), D.B, D.A[d]);
}

void Trainer::losses() {
  for (int d = 0; d < NBRANCH; ++d)
    g.launch(k.losses, D.B, act(A.dq_td[d]), act(A.dq_cql[d]), act(A.td_y), act(A.td_argmax),
             act(A.loss_terms), act(A.on.q[d]), act(A.tg.q[d]), bat(BP.actions), bat(BP.reward),
             bat(BP.done), D.B, D.A[d], d, NBRANCH, A.loss_ld, H.gamma, H.kappa, 1.0f / D.B,
             H.lam_cql / D.B);
  g.launch(k.aux_loss, D.B, act(A.loss_terms), act(A.on.p), bat(BP.aux_label), D.B, D.AUXK,
           A.loss_ld, 2 * NBRANCH, H.lam_aux / D.B);
  col_sum(act(A.loss_sums), act(A.loss_terms), D.B, A.loss_ld, false);
}

// backward_full(dQ, dir_qaux_concat_ptr, d_dir_qaux_concat_ptr). With both pointers 0 it is the
// legacy wrapper path (diagnostic only): the direction branch's dW from save_h_s2 and its dX
// straight into d_h_s2, both with width SH2, the wire column dropped. (This trainer runs the
// value stream first, so that path adds into d_h_s2 with beta = 1.)
void Trainer::backward_full(const int* dq, dptr dir_concat, dptr d_dir_concat) {
  const NetActs& a = A.on;
  for (int d = 0; d < NBRANCH; ++d)
    g.launch(k.duel_grad, D.B, act(A.d_adv[d]), act(A.d_value), act(dq[d]), D.B, D.A[d], (int)(d > 0));
  // value stream
  fc_dw(is(Fault::target_grad_leak) ? tgt(W_V1) : grd(W_V1), D.VALH, act(A.d_value), 1,
        act(a.v_hid), D.VALH, D.B, D.VALH);
  col_sum(grd(B_V1), act(A.d_value), D.B, 1, true);
  fc_dx(act(A.d_v_hid), D.VALH, act(A.d_value), 1, prm(W_V1), D.VALH, D.B, D.VALH, 0.0f);
  relu_grad(act(A.d_v_hid), act(A.d_v_hid), act(a.v_hid), (long long)D.B * D.VALH);
  fc_dw(grd(W_V0), D.SH2, act(A.d_v_hid), D.VALH, act(a.h2), D.SH2, D.B, D.SH2);
  col_sum(grd(B_V0), act(A.d_v_hid), D.B, D.VALH, true);
  fc_dx(act(A.d_h_s2), D.SH2, act(A.d_v_hid), D.VALH, prm(W_V0), D.SH2, D.B, D.SH2, 1.0f);
  // the branches' output layers, last branch first
  for (int d = NBRANCH - 1; d >= 0; --d) {
    fc_dw(grd(wout(d)), D.ADV, act(A.d_adv[d]), D.A[d], act(a.hid[d]), D.ADV, D.B, D.ADV);
    col_sum(grd(bout(d)), act(A.d_adv[d]), D.B, D.A[d], true);
    fc_dx(act(A.d_hid[d]), D.ADV, act(A.d_adv[d]), D.A[d], prm(wout(d)), D.ADV, D.B, D.ADV, 0.0f);
    relu_grad(act(A.d_hid[d]), act(A.d_hid[d]), act(a.hid[d]), (long long)D.B * D.ADV);
    col_sum(grd(bfc(d)), act(A.d_hid[d]), D.B, D.ADV, true);
  }
  // ord + urg FC: dW and dX as one strided-batched GEMM each
  const int X2 = D.X(2);
  const long long sW = P[W_B3FC].off - P[W_B2FC].off;
  g.sgemm_strided_batched(OP_N, OP_T, X2, D.ADV, D.B, 1.0f, act(a.x[2]), X2, stride(a.x[2], a.x[3]),
                          act(A.d_hid[2]), D.ADV, stride(A.d_hid[2], A.d_hid[3]), 1.0f,
                          grd(W_B2FC), X2, sW, 2);
  g.sgemm_strided_batched(OP_N, OP_N, X2, D.B, D.ADV, 1.0f, prm(W_B2FC), X2, sW, act(A.d_hid[2]),
                          D.ADV, stride(A.d_hid[2], A.d_hid[3]), 0.0f, act(A.d_x[2]), X2,
                          stride(A.d_x[2], A.d_x[3]), 2);
  // mag FC
  const int X1 = D.X(1);
  fc_dw(grd(W_B1FC), X1, act(A.d_hid[1]), D.ADV, act(a.x[1]), X1, D.B, X1);
  fc_dx(act(A.d_x[1]), X1, act(A.d_hid[1]), D.ADV, prm(W_B1FC), X1, D.B, X1, 0.0f);
  // dir FC, last: its dX GEMM is directly followed by the wire gate
  const int X0 = D.X(0);
  if (dir_concat == 0 && d_dir_concat == 0) {  // the legacy K = SH2 path
    fc_dw(grd(W_B0FC), X0, act(A.d_hid[0]), D.ADV, act(a.h2), D.SH2, D.B, D.SH2);
    fc_dx(act(A.d_h_s2), D.SH2, act(A.d_hid[0]), D.ADV, prm(W_B0FC), X0, D.B, D.SH2, 1.0f);
    return;
  }
  if (is(Fault::dw_k_sh2))
    fc_dw(grd(W_B0FC), X0, act(A.d_hid[0]), D.ADV, act(a.h2), D.SH2, D.B, D.SH2);
  else
    fc_dw(grd(W_B0FC), X0, act(A.d_hid[0]), D.ADV, dir_concat, X0, D.B, X0);
  fc_dx(d_dir_concat, X0, act(A.d_hid[0]), D.ADV, is(Fault::dx_reads_target) ? tgt(W_B0FC) : prm(W_B0FC),
        X0, D.B, is(Fault::dx_k_sh2) ? D.SH2 : X0, 0.0f);
}

void Trainer::call_site(Site s) {
  const bool main_site = s == MAIN;
  const dptr dir_dx = act(A.d_x[0]);
  // (1) the forward left the TARGET concat in the scratch: rebuild the online one
  if (!is(Fault::skip_rebuild)) concat(act(A.on.h2), act(A.on.p));
  // (2) the value-FC dX accumulates on top of d_h_s2 (beta = 1): start it at zero
  if (!is(Fault::no_zero_d_h_s2)) g.zero(act(A.d_h_s2), 4 * (size_t)D.B * D.SH2);
  // (3)
  const bool legacy = main_site && is(Fault::wrapper_on_main);
  backward_full(main_site ? A.dq_td : A.dq_cql, legacy ? 0 : act(A.scratch), legacy ? 0 : dir_dx);
  // (4) gate the wire column of the dir dX by ISV[393], in place
  const bool gated = !is(Fault::skip_scale) && !(is(Fault::cql_site_ungated) && s == CQL);
  if (gated) {
    dptr dx = dir_dx;
    int rows = D.B, col = D.SH2;
    if (is(Fault::scale_x_concat)) dx = act(A.scratch);
    if (is(Fault::scale_dw_wire_col)) dx = grd(W_B0FC), rows = D.ADV;
    if (is(Fault::scale_wrong_col)) col = D.SH2 - 1;
    g.launch(k.scale, rows, dx, isv, rows, D.X(0), col, ISV_GATE);
  }
  // (5) the first SH2 columns of every branch's dX into d_h_s2; the wire stays where it is
  for (int d : {1, 2, 3, 0}) {
    const int ld = d == 0 && is(Fault::accumulate_wire_col) ? D.SH2 : D.X(d);
    g.launch(k.accumulate, (long long)D.B * D.SH2, act(A.d_h_s2), act(A.d_x[d]), D.B, D.SH2, ld);
  }
  // (6) the gated wire (and, at the main site, the CE gradient) into the aux head
  g.launch(k.aux_grad, D.B, act(A.d_aux), act(A.on.p), bat(BP.aux_label), dir_dx, D.B, D.AUXK,
           D.X(0), D.SH2, AUX_UP, AUX_DOWN, main_site ? H.lam_aux / D.B : 0.0f);
  fc_dw(grd(W_AUX), D.SH2, act(A.d_aux), D.AUXK, act(A.on.h2), D.SH2, D.B, D.SH2);
  col_sum(grd(B_AUX), act(A.d_aux), D.B, D.AUXK, true);
  fc_dx(act(A.d_h_s2), D.SH2, act(A.d_aux), D.AUXK, prm(W_AUX), D.SH2, D.B, D.SH2, 1.0f);
  // the trunk, from d_h_s2 (read only: the masked gradient goes to d_z2)
  relu_grad(act(A.d_z2), act(A.d_h_s2), act(A.on.h2), (long long)D.B * D.SH2);
  fc_dw(grd(W_S2), D.SH1, act(A.d_z2), D.SH2, act(A.on.h1), D.SH1, D.B, D.SH1);
  col_sum(grd(B_S2), act(A.d_z2), D.B, D.SH2, true);
  fc_dx(act(A.d_h1), D.SH1, act(A.d_z2), D.SH2, prm(W_S2), D.SH1, D.B, D.SH1, 0.0f);
  relu_grad(act(A.d_h1), act(A.d_h1), act(A.on.h1), (long long)D.B * D.SH1);
  fc_dw(grd(W_S1), D.OBS, act(A.d_h1), D.SH1, bat(BP.obs), D.OBS,
        is(Fault::dw_s1_k_short) ? D.B - 1 : D.B, D.OBS);
  col_sum(grd(B_S1), act(A.d_h1), D.B, D.SH1, true);
}

void Trainer::optimizer(int t) {
  const float bc1 = (float)(1.0 - std::pow((double)H.beta1, t));
  const float bc2 = (float)(1.0 - std::pow((double)H.beta2, t));
  for (int id = 0; id < NPARAM; ++id) {
    long long n = P[id].numel();
    if (id == W_B0FC && is(Fault::adam_state_sh2)) n = (long long)D.ADV * D.SH2;
    g.launch(k.adam, n, prm(id), (long long)P.region, n, H.lr, H.beta1, H.beta2, H.eps, bc1, bc2);
  }
}

// One power iteration on (u, v) of w_b0fc, then W *= sigma_max / sigma where sigma = |W v|.
void Trainer::spectral_norm() {
  const int X0 = D.X(0);
  const dptr n2 = act(A.sn_norm2);
  fc_dx(act(A.sn_wtu), vlen, sn_u(), D.ADV, prm(W_B0FC), X0, 1, vlen, 0.0f);  // u . W
  g.launch(k.sq_norm, 1, n2, act(A.sn_wtu), vlen);
  g.launch(k.div_norm, vlen, sn_v(), act(A.sn_wtu), n2, vlen);
  fc_fwd(act(A.sn_wv), D.ADV, sn_v(), vlen, prm(W_B0FC), X0, 1, vlen);  // v . W^T
  g.launch(k.sq_norm, 1, n2 + 4, act(A.sn_wv), D.ADV);
  g.launch(k.div_norm, D.ADV, sn_u(), act(A.sn_wv), n2 + 4, D.ADV);
  g.launch(k.sn_clip, P[W_B0FC].numel(), prm(W_B0FC), n2 + 4, P[W_B0FC].numel(), H.sigma_max);
}

void Trainer::step(int t, bool live) {
  std::vector<float> before, tgt_before, sn_before, grad, after, tgt_after, sn_after;
  float alpha_prev = 0, alpha = 0;  // ISV[393] at the step's start and as the backward read it
  auto grab = [&](std::vector<float>& v, dptr p, size_t n) { v.resize(n); g.download(v.data(), p, 4 * n); };
  if (O.self_check) {
    grab(before, arena, 4 * (size_t)P.region);
    grab(tgt_before, target, P.region);
    grab(sn_before, sn, D.ADV + vlen);
    g.download(&alpha_prev, isv + 4 * ISV_GATE, 4);
  }
  if (!(is(Fault::grad_zero_once) && t > 0)) g.zero(arena + 4 * (dptr)P.region, 4 * (size_t)P.region);
  forward(true);
  if (live)  // the gate producer: from the online aux head's batch accuracy
    g.launch(k.gate, 1, isv, act(A.on.p), bat(BP.aux_label), D.B, D.AUXK, ISV_GATE, H.gate_ema);
  forward(false);
  losses();
  call_site(CQL);
  call_site(MAIN);
  if (O.self_check) grab(grad, arena + 4 * (dptr)P.region, P.region);
  optimizer(t + 1);
  spectral_norm();
  g.launch(k.polyak, P.region, target, arena,
           is(Fault::polyak_tau_swap) ? 1.0f - H.tau : H.tau, (long long)P.region);
  float sums[2 * NBRANCH + 1];
  g.download(sums, act(A.loss_sums), sizeof sums);
  g.download(&alpha, isv + 4 * ISV_GATE, 4);  // nothing writes it after the producer
  double td = 0, cql = 0;
  for (int d = 0; d < NBRANCH; ++d) td += sums[d], cql += sums[NBRANCH + d];
  std::printf("step %d (%s): L_td %.6f  L_cql %.6f  L_aux %.6f  total %.6f  alpha %.6g\n", t,
              live ? "live" : "sentinel", td, cql, sums[2 * NBRANCH], td + cql + sums[2 * NBRANCH],
              alpha);
  if (O.self_check) {
    grab(after, arena, 4 * (size_t)P.region);
    grab(tgt_after, target, P.region);
    grab(sn_after, sn, D.ADV + vlen);
    self_check(t, live, before, tgt_before, sn_before, alpha_prev, alpha, grad, after, tgt_after, sn_after);
  }
}

// The device's step against reference.h in float64: the gate, every gradient tensor, and the
// update (Adam, projection, Polyak) applied in float64 to the device's OWN gradients, each
// within EGF010's bound. Discrete decisions (ReLU masks, the TD argmax) are the reference's own:
// at ci shapes none lies near its kink.
void Trainer::self_check(int t, bool live, const std::vector<float>& before,
                         const std::vector<float>& tgt_before, const std::vector<float>& sn_before,
                         float alpha_prev, float alpha, const std::vector<float>& grad,
                         const std::vector<float>& after, const std::vector<float>& tgt_after,
                         const std::vector<float>& sn_after) {
  const long long R = P.region;
  Vec W(before.begin(), before.begin() + R), T(tgt_before.begin(), tgt_before.end());
  const RefBatch rb = ref_batch(D, BP, batch_host);
  RefModel M(D, H, P, rb);
  const RefFwd on = M.forward(W, false), tg = M.forward(T, true);
  const RefLoss L = M.losses(on, tg);
  int bad = 0;
  auto report = [&](const std::string& what, const Agreement& a) {
    if (!a.ok()) {
      ++bad;
      std::printf("  self-check step %d: %s differs: max |err| %.3g, max |ref| %.3g\n", t,
                  what.c_str(), a.err, a.scale);
    }
  };
  const double want_alpha = live ? M.gate(on, alpha_prev) : 0.0;
  const double d_alpha = std::fabs((double)alpha - want_alpha);
  if (!(d_alpha <= 1e-6)) {
    ++bad;
    std::printf("  self-check step %d: ISV[393] %.9g, the reference gate %.9g\n", t, alpha, want_alpha);
  }
  const Vec G = M.backward(W, on, L, alpha);  // the gate as the device's backward read it
  for (int id = 0; id < NPARAM; ++id)
    report("grad " + P[id].name, agree(grad.data() + P[id].off, G.data() + P[id].off, P[id].numel()));
  // the update, from the device's own gradients
  Vec g32(grad.begin(), grad.end()), m(before.begin() + 2 * R, before.begin() + 3 * R),
      v(before.begin() + 3 * R, before.begin() + 4 * R);
  M.adam(W, g32, m, v, t + 1);
  Vec u(sn_before.begin(), sn_before.begin() + D.ADV), sv(sn_before.begin() + D.ADV, sn_before.end());
  M.spectral(W, u, sv);
  M.polyak(T, W);
  for (int id = 0; id < NPARAM; ++id) {
    const long long o = P[id].off, n = P[id].numel();
    report("param " + P[id].name, agree(after.data() + o, W.data() + o, n));
    report("adam_m " + P[id].name, agree(after.data() + 2 * R + o, m.data() + o, n));
    report("adam_v " + P[id].name, agree(after.data() + 3 * R + o, v.data() + o, n));
    report("target " + P[id].name, agree(tgt_after.data() + o, T.data() + o, n));
  }
  if (!live) {  // a closed gate leaves exactly +0.0 in the wire column (the main site's, kept to here)
    std::vector<float> dx((size_t)D.B * D.X(0));
    g.download(dx.data(), act(A.d_x[0]), 4 * dx.size());
    int nonzero = 0;
    for (int r = 0; r < D.B; ++r) {
      uint32_t bits;
      std::memcpy(&bits, &dx[(size_t)r * D.X(0) + D.SH2], 4);
      nonzero += bits != 0u;
    }
    if (nonzero) {
      ++bad;
      std::printf("  self-check step %d: %d wire entries are not +0.0 under the sentinel\n", t, nonzero);
    }
  }
  report("sn u_b0fc", agree(sn_after.data(), u.data(), D.ADV));
  report("sn v_b0fc", agree(sn_after.data() + D.ADV, sv.data(), vlen));
  std::printf("  self-check step %d: %s (reference losses td %.6f cql %.6f aux %.6f)\n", t,
              bad ? "FAIL" : "ok", L.td, L.cql, L.aux);
  check_failures += bad;
}

// The layout file of docs/capture.md ("The layout file"), written by hand with this process's
// own addresses. params, grad_buf, adam_m and adam_v are the four regions of ONE allocation,
// each named as a buffer at its own address; the parameter table is the same in all four and
// in target_params.
void Trainer::write_layout(const std::string& path) const {
  std::ostringstream j;
  auto arr = [](const int* v) {
    std::ostringstream s;
    s << "[" << v[0] << ", " << v[1] << ", " << v[2] << ", " << v[3] << "]";
    return s.str();
  };
  j << "{\"format\": \"egf-audit-layout/1\",\n \"dims\": {\"B\": " << D.B << ", \"OBS\": " << D.OBS
    << ", \"SH1\": " << D.SH1 << ", \"SH2\": " << D.SH2 << ", \"AUXK\": " << D.AUXK
    << ", \"ADV\": " << D.ADV << ", \"VALH\": " << D.VALH << ", \"A\": " << arr(D.A)
    << ", \"E\": " << arr(D.E) << ", \"N_ISV\": " << D.N_ISV << ", \"tau\": " << H.tau << "},\n";
  j << " \"param_offsets\": {";
  for (int id = 0; id < NPARAM; ++id)
    j << (id ? ", " : "") << "\"" << P[id].name << "\": [" << P[id].off << ", " << P[id].rows
      << ", " << P[id].cols << "]";
  j << "},\n \"buffers\": {\n";
  bool first = true;
  auto buf = [&](const std::string& name, dptr addr, long long elems, const std::string& rest) {
    j << (first ? "" : ",\n") << "  \"" << name << "\": {\"address\": " << addr
      << ", \"bytes\": " << 4 * elems << rest << "}";
    first = false;
  };
  const long long R = P.region;
  buf("params", arena, R, ", \"params\": true");
  buf("grad_buf", arena + 4 * (dptr)R, R, ", \"params\": true");
  buf("adam_m", arena + 8 * (dptr)R, R, ", \"params\": true");
  buf("adam_v", arena + 12 * (dptr)R, R, ", \"params\": true");
  buf("target_params", target, R, ", \"params\": true");
  std::ostringstream snt;
  snt << ", \"tensors\": {\"u_b0fc\": [0, 1, " << D.ADV << "], \"v_b0fc\": [" << D.ADV << ", 1, "
      << vlen << "]}";
  buf("sn_state", sn, D.ADV + vlen, snt.str());
  buf("isv_signals", isv, D.N_ISV, "");
  auto shaped = [&](const Plan& plan, dptr base) {
    for (const Region& r : plan.r) {
      std::ostringstream s;
      if (r.name == "sn_norms")  // two scalars, named as the contract names them
        s << ", \"tensors\": {\"norm2_v\": [0, 1, 1], \"norm2_u\": [1, 1, 1]}";
      else
        s << ", \"shape\": [" << r.rows << ", " << r.cols << "]";
      buf(r.name, base + 4 * (dptr)r.off, r.numel(), s.str());
    }
  };
  shaped(BP.plan, batch);
  shaped(A.plan, pool);
  j << "}}\n";
  std::ofstream f(path);
  f << j.str();
  if (!f) throw std::runtime_error("cannot write the layout file " + path);
}

static int usage(const std::string& why) {
  std::fprintf(stderr, "trainer: %s\n", why.c_str());
  std::fprintf(stderr,
               "usage: trainer [--preset ci|prod] [--steps N] [--seed N] [--fault NAME] "
               "[--layout-out FILE] [--api driver|runtime] [--kernels DIR] [--self-check] "
               "[--list-faults]\n");
  return 2;
}

int main(int argc, char** argv) {
  Options O;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--preset") O.preset = value();
      else if (a == "--steps") O.steps = std::stoi(value());
      else if (a == "--seed") O.seed = std::stoull(value());
      else if (a == "--layout-out") O.layout_out = value();
      else if (a == "--kernels") O.kernels = value();
      else if (a == "--self-check") O.self_check = true;
      else if (a == "--api") {
        const std::string v = value();
        if (v != "driver" && v != "runtime") return usage("--api is driver or runtime, not " + v);
        O.api = v == "driver" ? Api::driver : Api::runtime;
      } else if (a == "--fault") {
        const std::string v = value();
        bool found = false;
        for (const FaultInfo& f : FAULTS)
          if (v == f.name) O.fault = f.f, found = true;
        if (!found) return usage("unknown fault " + v + " (--list-faults names them)");
      } else if (a == "--list-faults") {
        for (const FaultInfo& f : FAULTS) std::printf("%-24s %s\n", f.name, f.what);
        return 0;
      } else {
        return usage("unknown option " + a);
      }
    } catch (const std::logic_error& e) {
      return usage(e.what());
    }
  }
  Dims D;
  if (!preset_dims(O.preset, &D)) return usage("unknown preset " + O.preset);
  if (O.steps < 1) return usage("--steps must be at least 1");
  if (D.E[2] != D.E[3]) return usage("the ord/urg pair needs E_ord == E_urg");
  try {
    Gpu gpu(O.api);
    std::printf("outsider SP14 trainer: preset %s, %d step(s), fault %s, on %s\n", O.preset.c_str(),
                O.steps, O.fault == Fault::none ? "none" : FAULTS[(int)O.fault - 1].name,
                gpu.describe().c_str());
    Trainer tr(gpu, D, O);
    if (!O.layout_out.empty()) tr.write_layout(O.layout_out);
    for (int t = 0; t < O.steps; ++t) tr.step(t, /*live=*/t > 0);
    gpu.sync();
    if (O.self_check && !tr.self_check_ok()) {
      std::printf("self-check FAILED\n");
      return 1;
    }
    if (O.self_check) std::printf("self-check passed\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer: %s\n", e.what());
    return 3;
  }
  return 0;
}
