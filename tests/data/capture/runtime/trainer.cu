// The stand-in's SP14 training steps, executed from C++ with every kernel launched through the
// runtime API (<<<>>>) and every GEMM through the cuBLAS entry point --gemm names. The steps
// come from a plan (make_plan.py): allocations, uploads, memsets, GEMMs and launches, in the
// stand-in's order, so a capture of this process is judged as the stand-in's is
// (plan_runner.h reads the plan; this file is the runtime API's part of it).
//
//   trainer PLAN LAYOUT_TEMPLATE [--layout-out FILE] [--gemm sgemm|ex|strided|lt]
//           [--device-scalars]
//
// No cuBLAS headers are needed: the prototypes used are declared in cublas_decls.h (beside it).
#include <cuda_runtime.h>

#include "plan_runner.h"

#include "dispatch.inc"

#define CUDA(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) fail(#x, e_); } while (0)

struct RuntimeDevice {
  void start() {}
  char *alloc(long long bytes) {
    char *p;
    CUDA(cudaMalloc((void **)&p, bytes));
    return p;
  }
  void upload(char *dst, const void *words, long long stride, long long count) {
    if (stride == 1)
      CUDA(cudaMemcpy(dst, words, 4 * count, cudaMemcpyHostToDevice));
    else
      CUDA(cudaMemcpy2D(dst, 4 * stride, words, 4, 4, count, cudaMemcpyHostToDevice));
  }
  void memset(char *dst, long long bytes) { CUDA(cudaMemsetAsync(dst, 0, bytes, 0)); }
  void launch(const std::string &name, unsigned blocks, unsigned threads,
              const std::vector<Arg> &args) {
    if (!launch_kernel(name, blocks, threads, args)) fail(("no kernel " + name).c_str(), 0);
    CUDA(cudaGetLastError());
  }
  void synchronize() { CUDA(cudaDeviceSynchronize()); }
};

int main(int argc, char **argv) {
  return run_plan<RuntimeDevice>(argc, argv, [](RuntimeDevice &, int, char **, int &) {
    return false;  // no options of its own
  });
}
