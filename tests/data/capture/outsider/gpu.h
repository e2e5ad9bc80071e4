// gpu.h: the trainer's thin device layer. gpu_cuda.cpp implements it on the CUDA driver API
// (or, with Api::runtime, the runtime API) with NVRTC and cuBLAS; host/sim_gpu.cpp implements
// it on the CPU for this folder's own host test. The trainer itself is plain host C++ on top.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

using dptr = unsigned long long;  // a device address (CUdeviceptr on a 64-bit host)

enum class Api { driver, runtime };
enum Op { OP_N = 0, OP_T = 1 };  // the values of cuBLAS's CUBLAS_OP_N / CUBLAS_OP_T

struct Kernel {
  void* handle = nullptr;  // CUfunction, cudaKernel_t, or the host simulation's entry
  std::string name;
};

constexpr int THREADS_PER_BLOCK = 256;  // every launch: 1-D, 256 threads, ceil(items / 256) blocks

class Gpu {
 public:
  explicit Gpu(Api api);
  ~Gpu();
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;

  dptr alloc(size_t bytes);
  void zero(dptr p, size_t bytes);  // memset to 0 (bytes a multiple of 4), on the trainer's stream
  void upload(dptr dst, const void* src, size_t bytes);
  void download(void* dst, dptr src, size_t bytes);  // waits for everything before it
  void sync();

  // Compiles one kernel source with NVRTC (label: its file name) and loads it; returns the
  // entry points `names`, in that order. Throws with the compiler's log on failure.
  std::vector<Kernel> load(const std::string& label, const std::string& source,
                           const std::vector<std::string>& names);

  // One launch covering `items` threads. args[i] points at the i-th kernel parameter's value,
  // exactly as cuLaunchKernel takes them; launch() below builds the array from typed values.
  void launch_raw(const Kernel& k, long long items, void** args);
  template <class... T>
  void launch(const Kernel& k, long long items, T... args) {
    void* params[] = {static_cast<void*>(&args)..., nullptr};
    launch_raw(k, items, params);
  }

  // cuBLAS, column-major, host-pointer alpha and beta, on the trainer's stream.
  void sgemm(Op ta, Op tb, int m, int n, int k, float alpha, dptr A, int lda, dptr B, int ldb,
             float beta, dptr C, int ldc);
  // cublasGemmEx with fp32 A, B, C and CUBLAS_COMPUTE_32F (no TF32).
  void gemm_ex(Op ta, Op tb, int m, int n, int k, float alpha, dptr A, int lda, dptr B, int ldb,
               float beta, dptr C, int ldc);
  void sgemm_strided_batched(Op ta, Op tb, int m, int n, int k, float alpha, dptr A, int lda,
                             long long sA, dptr B, int ldb, long long sB, float beta, dptr C,
                             int ldc, long long sC, int batch);

  std::string describe() const;  // the device and API, for the trainer's first line

 private:
  struct Impl;
  Impl* impl_;
};
