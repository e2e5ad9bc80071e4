// gpu_cuda.cpp: gpu.h on CUDA. Kernels: NVRTC -> PTX -> cuModuleLoadData / cuLaunchKernel
// (Api::driver), or cudaLibraryLoadData / cudaLaunchKernel on the library's cudaKernel_t
// (Api::runtime). Memory and copies through the same API. GEMMs through cuBLAS on the same stream.
//
// This machine's toolkit may ship no cuBLAS or NVRTC headers, so the few prototypes and enum
// values used are declared here, from the libraries' documented C ABI (enums are C ints).
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "gpu.h"

extern "C" {
typedef int nvrtcResult;  // NVRTC_SUCCESS = 0
typedef struct _nvrtcProgram* nvrtcProgram;
nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name,
                               int numHeaders, const char* const* headers,
                               const char* const* includeNames);
nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char* const* options);
nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t* ptxSizeRet);
nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char* ptx);
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t* logSizeRet);
nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char* log);
nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog);
const char* nvrtcGetErrorString(nvrtcResult result);

typedef struct cublasContext* cublasHandle_t;
typedef int cublasStatus_t;  // CUBLAS_STATUS_SUCCESS = 0
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, int mode);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, int mode);
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                              const float* alpha, const float* A, int lda, const float* B,
                              int ldb, const float* beta, float* C, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                            const void* alpha, const void* A, int Atype, int lda, const void* B,
                            int Btype, int ldb, const void* beta, void* C, int Ctype, int ldc,
                            int computeType, int algo);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, int transa, int transb, int m,
                                         int n, int k, const float* alpha, const float* A,
                                         int lda, long long strideA, const float* B, int ldb,
                                         long long strideB, const float* beta, float* C, int ldc,
                                         long long strideC, int batchCount);
}

namespace {
constexpr int CUBLAS_POINTER_MODE_HOST = 0;
constexpr int CUBLAS_DEFAULT_MATH = 0;  // no TF32: fp32 GEMMs stay fp32
constexpr int CUBLAS_COMPUTE_32F = 68;
constexpr int CUBLAS_GEMM_DEFAULT = -1;

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

void check(CUresult rc, const char* what) {
  if (rc == CUDA_SUCCESS) return;
  const char* s = nullptr;
  cuGetErrorString(rc, &s);
  fail(std::string(what) + ": " + (s ? s : "unknown CUDA driver error"));
}
void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(rc));
}
void check_nvrtc(nvrtcResult rc, const char* what) {
  if (rc != 0) fail(std::string(what) + ": " + nvrtcGetErrorString(rc));
}
void check_blas(cublasStatus_t rc, const char* what) {
  if (rc != 0) fail(std::string(what) + ": cuBLAS status " + std::to_string(rc));
}
}  // namespace

struct Gpu::Impl {
  Api api;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;  // the same type as cudaStream_t
  cublasHandle_t blas = nullptr;
  int cc_major = 0, cc_minor = 0;
  char name[256] = {0};
  std::vector<dptr> allocations;
};

Gpu::Gpu(Api api) : impl_(new Impl) {
  Impl& I = *impl_;
  I.api = api;
  if (api == Api::driver) {
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&I.dev, 0), "cuDeviceGet");
    // the primary context: the one cuBLAS (a runtime-API library) also uses
    check(cuDevicePrimaryCtxRetain(&I.ctx, I.dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(I.ctx), "cuCtxSetCurrent");
    check(cuStreamCreate(&I.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check(cuDeviceGetAttribute(&I.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, I.dev),
          "cuDeviceGetAttribute");
    check(cuDeviceGetAttribute(&I.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, I.dev),
          "cuDeviceGetAttribute");
    check(cuDeviceGetName(I.name, sizeof I.name - 1, I.dev), "cuDeviceGetName");
  } else {  // nothing below goes through the driver API in this mode
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaFree(nullptr), "cudaFree(0) (runtime initialisation)");
    check(cudaStreamCreateWithFlags(&I.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaDeviceGetAttribute(&I.cc_major, cudaDevAttrComputeCapabilityMajor, 0),
          "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&I.cc_minor, cudaDevAttrComputeCapabilityMinor, 0),
          "cudaDeviceGetAttribute");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::snprintf(I.name, sizeof I.name, "%s", prop.name);
  }
  check_blas(cublasCreate_v2(&I.blas), "cublasCreate");
  check_blas(cublasSetStream_v2(I.blas, I.stream), "cublasSetStream");
  check_blas(cublasSetPointerMode_v2(I.blas, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
  check_blas(cublasSetMathMode(I.blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

Gpu::~Gpu() {
  Impl& I = *impl_;
  // errors while tearing down are not the trainer's result: report nothing, free what we can
  if (I.stream) cuStreamSynchronize(I.stream);
  if (I.blas) cublasDestroy_v2(I.blas);
  for (dptr p : I.allocations) {
    if (I.api == Api::driver)
      cuMemFree((CUdeviceptr)p);
    else
      cudaFree((void*)p);
  }
  if (I.api == Api::driver) {
    if (I.stream) cuStreamDestroy(I.stream);
    cuDevicePrimaryCtxRelease(I.dev);
  } else if (I.stream) {
    cudaStreamDestroy(I.stream);
  }
  delete impl_;
}

std::string Gpu::describe() const {
  return std::string(impl_->name) + " (sm_" + std::to_string(impl_->cc_major) +
         std::to_string(impl_->cc_minor) + ", " +
         (impl_->api == Api::driver ? "driver API" : "runtime API") + ")";
}

dptr Gpu::alloc(size_t bytes) {
  dptr p = 0;
  if (impl_->api == Api::driver) {
    CUdeviceptr d = 0;
    check(cuMemAlloc(&d, bytes), "cuMemAlloc");
    p = d;
  } else {
    void* d = nullptr;
    check(cudaMalloc(&d, bytes), "cudaMalloc");
    p = (dptr)d;
  }
  impl_->allocations.push_back(p);
  return p;
}

void Gpu::zero(dptr p, size_t bytes) {
  if (impl_->api == Api::driver)
    check(cuMemsetD32Async((CUdeviceptr)p, 0u, bytes / 4, impl_->stream), "cuMemsetD32Async");
  else
    check(cudaMemsetAsync((void*)p, 0, bytes, impl_->stream), "cudaMemsetAsync");
}

void Gpu::upload(dptr dst, const void* src, size_t bytes) {
  if (impl_->api == Api::driver) {
    check(cuMemcpyHtoDAsync((CUdeviceptr)dst, src, bytes, impl_->stream), "cuMemcpyHtoDAsync");
    check(cuStreamSynchronize(impl_->stream), "cuStreamSynchronize");  // src is pageable
  } else {
    check(cudaMemcpyAsync((void*)dst, src, bytes, cudaMemcpyHostToDevice, impl_->stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
  }
}

void Gpu::download(void* dst, dptr src, size_t bytes) {
  if (impl_->api == Api::driver) {
    check(cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, bytes, impl_->stream), "cuMemcpyDtoHAsync");
    check(cuStreamSynchronize(impl_->stream), "cuStreamSynchronize");
  } else {
    check(cudaMemcpyAsync(dst, (const void*)src, bytes, cudaMemcpyDeviceToHost, impl_->stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
  }
}

void Gpu::sync() {
  if (impl_->api == Api::driver)
    check(cuStreamSynchronize(impl_->stream), "cuStreamSynchronize");
  else
    check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
}

std::vector<Kernel> Gpu::load(const std::string& label, const std::string& source,
                              const std::vector<std::string>& names) {
  nvrtcProgram prog = nullptr;
  check_nvrtc(nvrtcCreateProgram(&prog, source.c_str(), label.c_str(), 0, nullptr, nullptr),
              "nvrtcCreateProgram");
  const std::string arch = "--gpu-architecture=compute_" + std::to_string(impl_->cc_major) +
                           std::to_string(impl_->cc_minor);
  const char* opts[] = {arch.c_str(), "--std=c++17"};
  const nvrtcResult rc = nvrtcCompileProgram(prog, 2, opts);
  if (rc != 0) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, &log[0]);
    nvrtcDestroyProgram(&prog);
    fail("NVRTC could not compile " + label + ":\n" + log);
  }
  size_t n = 0;
  check_nvrtc(nvrtcGetPTXSize(prog, &n), "nvrtcGetPTXSize");
  std::string ptx(n, '\0');
  check_nvrtc(nvrtcGetPTX(prog, &ptx[0]), "nvrtcGetPTX");
  nvrtcDestroyProgram(&prog);

  std::vector<Kernel> out;
  if (impl_->api == Api::driver) {
    CUmodule mod = nullptr;  // kept loaded for the life of the process
    check(cuModuleLoadData(&mod, ptx.c_str()), ("cuModuleLoadData " + label).c_str());
    for (const std::string& name : names) {
      CUfunction f = nullptr;
      check(cuModuleGetFunction(&f, mod, name.c_str()), ("cuModuleGetFunction " + name).c_str());
      out.push_back({(void*)f, name});
    }
  } else {
    cudaLibrary_t lib = nullptr;
    check(cudaLibraryLoadData(&lib, ptx.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0),
          ("cudaLibraryLoadData " + label).c_str());
    for (const std::string& name : names) {
      cudaKernel_t k = nullptr;
      check(cudaLibraryGetKernel(&k, lib, name.c_str()), ("cudaLibraryGetKernel " + name).c_str());
      out.push_back({(void*)k, name});
    }
  }
  return out;
}

void Gpu::launch_raw(const Kernel& k, long long items, void** args) {
  const long long blocks = items > 0 ? (items + THREADS_PER_BLOCK - 1) / THREADS_PER_BLOCK : 1;
  if (blocks > 0x7fffffffLL) fail("launch of " + k.name + ": too many blocks");
  if (impl_->api == Api::driver) {
    check(cuLaunchKernel((CUfunction)k.handle, (unsigned)blocks, 1, 1, THREADS_PER_BLOCK, 1, 1, 0,
                         impl_->stream, args, nullptr),
          ("cuLaunchKernel " + k.name).c_str());
  } else {
    // a cudaKernel_t from cudaLibraryGetKernel is passed to cudaLaunchKernel cast to void*
    check(cudaLaunchKernel((const void*)k.handle, dim3((unsigned)blocks), dim3(THREADS_PER_BLOCK),
                           args, 0, impl_->stream),
          ("cudaLaunchKernel " + k.name).c_str());
  }
}

void Gpu::sgemm(Op ta, Op tb, int m, int n, int k, float alpha, dptr A, int lda, dptr B, int ldb,
                float beta, dptr C, int ldc) {
  check_blas(cublasSgemm_v2(impl_->blas, ta, tb, m, n, k, &alpha, (const float*)A, lda,
                            (const float*)B, ldb, &beta, (float*)C, ldc),
             "cublasSgemm_v2");
}

void Gpu::gemm_ex(Op ta, Op tb, int m, int n, int k, float alpha, dptr A, int lda, dptr B,
                  int ldb, float beta, dptr C, int ldc) {
  check_blas(cublasGemmEx(impl_->blas, ta, tb, m, n, k, &alpha, (const void*)A, CUDA_R_32F, lda,
                          (const void*)B, CUDA_R_32F, ldb, &beta, (void*)C, CUDA_R_32F, ldc,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
}

void Gpu::sgemm_strided_batched(Op ta, Op tb, int m, int n, int k, float alpha, dptr A, int lda,
                                long long sA, dptr B, int ldb, long long sB, float beta, dptr C,
                                int ldc, long long sC, int batch) {
  check_blas(cublasSgemmStridedBatched(impl_->blas, ta, tb, m, n, k, &alpha, (const float*)A, lda,
                                       sA, (const float*)B, ldb, sB, &beta, (float*)C, ldc, sC,
                                       batch),
             "cublasSgemmStridedBatched");
}
