// gpu.h on the CPU, for this folder's own test of the trainer without a GPU (host/check.sh).
// The kernels are the same .cu sources, compiled into this file behind a shim for the CUDA
// built-ins and run one thread after another; GEMMs are plain column-major loops with cuBLAS's
// (m, n, k, ld) meaning. Every GEMM operand is checked to lie inside one allocation, and fresh
// allocations are filled with NaN, so a read of memory the trainer never wrote shows up.
// This is not how egf-audit runs the trainer on the CPU; it tests the trainer's own wiring.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "../gpu.h"

namespace {
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};
Dim3 blockIdx, threadIdx, blockDim, gridDim;
}  // namespace

#define __global__
#include "../kernels/accumulate_d_h_s2_from_concat_kernel.cu"
#include "../kernels/dqn_gate_kernel.cu"
#include "../kernels/dqn_kernels.cu"
#include "../kernels/polyak_ema_kernel.cu"
#include "../kernels/sp14_dir_concat_qaux_kernel.cu"
#include "../kernels/sp14_scale_wire_col_kernel.cu"
#define sp14_scale_wire_col sim_sp14_scale_wire_col_no_nan_branch
#include "../kernels/faults/sp14_scale_wire_col_no_nan_branch.cu"
#undef sp14_scale_wire_col
#define dqn_gate_producer sim_dqn_gate_producer_no_clamp
#include "../kernels/faults/dqn_gate_kernel_no_clamp.cu"
#undef dqn_gate_producer

namespace {
using Invoker = std::function<void(void**)>;

template <class... T, size_t... I>
void call(void (*f)(T...), void** a, std::index_sequence<I...>) {
  f(*static_cast<std::remove_reference_t<T>*>(a[I])...);
}
template <class... T>
Invoker invoker(void (*f)(T...)) {
  return [f](void** a) { call(f, a, std::index_sequence_for<T...>{}); };
}

std::map<std::pair<std::string, std::string>, Invoker>& table() {
  static std::map<std::pair<std::string, std::string>, Invoker> t = {
      {{"sp14_dir_concat_qaux_kernel.cu", "sp14_dir_concat_qaux"}, invoker(sp14_dir_concat_qaux)},
      {{"sp14_scale_wire_col_kernel.cu", "sp14_scale_wire_col"}, invoker(sp14_scale_wire_col)},
      {{"faults/sp14_scale_wire_col_no_nan_branch.cu", "sp14_scale_wire_col"},
       invoker(sim_sp14_scale_wire_col_no_nan_branch)},
      {{"accumulate_d_h_s2_from_concat_kernel.cu", "accumulate_d_h_s2_from_concat"},
       invoker(accumulate_d_h_s2_from_concat)},
      {{"polyak_ema_kernel.cu", "polyak_ema"}, invoker(polyak_ema)},
      {{"dqn_gate_kernel.cu", "dqn_gate_producer"}, invoker(dqn_gate_producer)},
      {{"faults/dqn_gate_kernel_no_clamp.cu", "dqn_gate_producer"},
       invoker(sim_dqn_gate_producer_no_clamp)},
#define K(name) {{"dqn_kernels.cu", #name}, invoker(name)}
      K(dqn_bias_forward), K(dqn_row_softmax), K(dqn_branch_input), K(dqn_duel_head),
      K(dqn_branch_losses), K(dqn_aux_loss), K(dqn_col_sum), K(dqn_duel_grad),
      K(dqn_relu_grad), K(dqn_aux_head_grad), K(dqn_adam_tensor), K(dqn_sq_norm),
      K(dqn_div_by_norm), K(dqn_sn_clip),
#undef K
  };
  return t;
}
}  // namespace

struct Gpu::Impl {
  std::map<uintptr_t, size_t> allocations;  // start -> bytes
  long long launches = 0, gemms = 0;
  // the allocation that holds [p, p + bytes), or throws naming what
  void inside(dptr p, size_t bytes, const char* what) const {
    auto it = allocations.upper_bound((uintptr_t)p);
    if (it != allocations.begin()) {
      --it;
      if ((uintptr_t)p >= it->first && (uintptr_t)p + bytes <= it->first + it->second) return;
    }
    throw std::runtime_error(std::string("simulated GPU: ") + what + " leaves its allocation");
  }
  // C[m, n] (column-major, ldc) = alpha op(A) op(B) + beta C; beta == 0 never reads C.
  void gemm(Op ta, Op tb, int m, int n, int k, float alpha, const float* A,
              int lda, const float* B, int ldb, float beta, float* C, int ldc) {
    const int ar = ta == OP_N ? m : k, ac = ta == OP_N ? k : m;  // A is ar x ac, column-major
    const int br = tb == OP_N ? k : n, bc = tb == OP_N ? n : k;
    if (lda < ar || ldb < br || ldc < m) throw std::runtime_error("simulated GPU: a leading dimension is too small");
    auto span = [](int rows, int cols, int ld) { return cols ? 4 * ((size_t)(cols - 1) * ld + rows) : 0; };
    inside((dptr)A, span(ar, ac, lda), "a GEMM's A");
    inside((dptr)B, span(br, bc, ldb), "a GEMM's B");
    inside((dptr)C, span(m, n, ldc), "a GEMM's C");
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float s = 0;
        for (int l = 0; l < k; ++l) {
          const float a = ta == OP_N ? A[i + (size_t)l * lda] : A[l + (size_t)i * lda];
          const float b = tb == OP_N ? B[l + (size_t)j * ldb] : B[j + (size_t)l * ldb];
          s += a * b;
        }
        float& c = C[i + (size_t)j * ldc];
        c = beta == 0.0f ? alpha * s : alpha * s + beta * c;
      }
  }
};

Gpu::Gpu(Api) : impl_(new Impl) {}
Gpu::~Gpu() {
  for (auto& a : impl_->allocations) std::free((void*)a.first);
  delete impl_;
}
std::string Gpu::describe() const { return "a host simulation (no GPU)"; }

dptr Gpu::alloc(size_t bytes) {
  const size_t n = (bytes + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, n);
  if (!p) throw std::runtime_error("simulated GPU: out of memory");
  std::memset(p, 0xff, n);  // NaN: the trainer must write what it reads
  impl_->allocations[(uintptr_t)p] = bytes;
  return (dptr)p;
}
void Gpu::zero(dptr p, size_t bytes) {
  impl_->inside(p, bytes, "a memset");
  std::memset((void*)p, 0, bytes);
}
void Gpu::upload(dptr dst, const void* src, size_t bytes) {
  impl_->inside(dst, bytes, "an upload");
  std::memcpy((void*)dst, src, bytes);
}
void Gpu::download(void* dst, dptr src, size_t bytes) {
  impl_->inside(src, bytes, "a download");
  std::memcpy(dst, (const void*)src, bytes);
}
void Gpu::sync() {}

std::vector<Kernel> Gpu::load(const std::string& label, const std::string&,
                              const std::vector<std::string>& names) {
  std::vector<Kernel> out;
  for (const std::string& n : names) {
    auto it = table().find({label, n});
    if (it == table().end()) throw std::runtime_error("simulated GPU: no kernel " + n + " in " + label);
    out.push_back({(void*)&it->second, n});
  }
  return out;
}

void Gpu::launch_raw(const Kernel& k, long long items, void** args) {
  const Invoker& f = *static_cast<const Invoker*>(k.handle);
  const long long blocks = items > 0 ? (items + THREADS_PER_BLOCK - 1) / THREADS_PER_BLOCK : 1;
  gridDim = {(unsigned)blocks, 1, 1};
  blockDim = {THREADS_PER_BLOCK, 1, 1};
  for (long long b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < THREADS_PER_BLOCK; ++t) {
      blockIdx = {(unsigned)b, 1, 1};
      blockIdx.y = blockIdx.z = 0;
      threadIdx = {t, 0, 0};
      f(args);
    }
  ++impl_->launches;
}


void Gpu::sgemm(Op ta, Op tb, int m, int n, int k, float alpha, dptr A, int lda, dptr B, int ldb,
                float beta, dptr C, int ldc) {
  impl_->gemm(ta, tb, m, n, k, alpha, (const float*)A, lda, (const float*)B, ldb, beta, (float*)C, ldc);
  ++impl_->gemms;
}
void Gpu::gemm_ex(Op ta, Op tb, int m, int n, int k, float alpha, dptr A, int lda, dptr B, int ldb,
                  float beta, dptr C, int ldc) {
  sgemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
void Gpu::sgemm_strided_batched(Op ta, Op tb, int m, int n, int k, float alpha, dptr A, int lda,
                                long long sA, dptr B, int ldb, long long sB, float beta, dptr C,
                                int ldc, long long sC, int batch) {
  for (int i = 0; i < batch; ++i)
    sgemm(ta, tb, m, n, k, alpha, A + 4 * (dptr)(i * sA), lda, B + 4 * (dptr)(i * sB), ldb, beta,
          C + 4 * (dptr)(i * sC), ldc);
}
