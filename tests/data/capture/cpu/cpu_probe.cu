// What `egf-audit capture --cpu` runs, refuses and stops, one behaviour per run:
//
//   cpu_probe MODE
//
// clean         a <<<>>> launch and an SGEMM, checked to the bit (exit 0)
// k-short       an SGEMM with k = lda - 1: the product without the last column, exactly
// lda-short     an SGEMM with lda < m: cuBLAS's CUBLAS_STATUS_INVALID_VALUE, nothing written
// shared        a kernel with shared memory and a barrier (refused)
// orphan        a kernel with no source in --kernels (refused)
// graph         stream capture into a CUDA graph (refused)
// managed       cudaMallocManaged (refused)
// device1       cudaSetDevice(1) (refused: one device)
// sgemv         cublasSgemv_v2 (refused: not modeled)
// gemm-half     cublasGemmEx on half precision (refused)
// write-past    a kernel writing past its allocation (stopped: the process dies of SIGSEGV)
// write-before  a kernel writing just before its allocation, into the canary in front of it
//               (stopped the same way)
// hang          a kernel that never ends (stopped after EGF_CPU_LAUNCH_TIMEOUT seconds)
// exit          a kernel whose CPU source calls exit(0) (the process ends with status 134)
// ptx PATH      the driver API: `fill` from a module loaded from PTX (nvcc -ptx of
//               kernels/probe_kernels.cu), checked (exit 0)
// lt-bias       a cublasLtMatmul with the RELU_BIAS epilogue: D = max(A·B + bias, 0), the bias
//               one float a row of D, checked to the bit (exit 0)
// lt-bias-past  the same with the bias vector starting two floats before its allocation's end
//               (on a GPU it reads past it; the CPU computes nothing and says so, exit 0)
//
// Built with nvcc -cudart shared against the cuBLAS prototypes of cublas_decls.h.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "../runtime/cublas_decls.h"
#include "kernels/probe_kernels.cu"

extern "C" __global__ void orphan(float *x) { x[threadIdx.x] = 0.0f; }  // in no --kernels file

extern "C" int cublasSgemv_v2(cublasHandle_t, int, int, int, const float *, const float *, int,
                              const float *, int, const float *, float *, int);

static int fail(const char *what, int code) {
  std::fprintf(stderr, "cpu_probe: %s: %d\n", what, code);
  return 1;
}

// C (m x n) = A (m x k, lda) * B (k x n, ldb), column-major, k as given: true when C is exactly
// the fp32 sum over the first k columns of A
static int gemm_checked(cublasHandle_t h, int k_used) {
  const int m = 3, n = 2, lda = 4, ldb = 4, ldc = 3, k_full = 4;
  float hA[lda * k_full], hB[ldb * n], hC[ldc * n];
  for (int i = 0; i < lda * k_full; ++i) hA[i] = (float)(i % 7) - 2.0f;
  for (int i = 0; i < ldb * n; ++i) hB[i] = (float)(i % 5) + 0.5f;
  float *A, *B, *C;
  cudaMalloc((void **)&A, sizeof hA), cudaMalloc((void **)&B, sizeof hB);
  cudaMalloc((void **)&C, sizeof hC);
  cudaMemcpy(A, hA, sizeof hA, cudaMemcpyHostToDevice);
  cudaMemcpy(B, hB, sizeof hB, cudaMemcpyHostToDevice);
  float one = 1.0f, zero = 0.0f;
  int status = cublasSgemm_v2(h, 0, 0, m, n, k_used, &one, A, lda, B, ldb, &zero, C, ldc);
  if (status != 0) return fail("cublasSgemm_v2", status);
  cudaMemcpy(hC, C, sizeof hC, cudaMemcpyDeviceToHost);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float want = 0.0f;
      for (int p = 0; p < k_used; ++p) want += hA[i + p * lda] * hB[p + j * ldb];
      if (std::memcmp(&want, &hC[i + j * ldc], 4) != 0) return fail("the product", i + 10 * j);
    }
  return 0;
}

// D (3 x 2) = max(A (3 x 4) * B (4 x 2) + bias, 0) through cuBLASLt's RELU_BIAS epilogue; with
// `past`, the bias vector (3 floats) starts 2 floats before the end of a 4-float allocation
static int lt_bias(bool past) {
  enum { COMPUTE_32F = 68, R_32F = 0, LT_TRANSA = 3, LT_TRANSB = 4, EPILOGUE = 7, BIAS = 8 };
  const int m = 3, n = 2, k = 4, relu_bias = 2 | 4;
  float hA[m * k], hB[k * n], hbias[4] = {0.5f, -100.0f, 2.0f, 7.0f}, hD[m * n];
  for (int i = 0; i < m * k; ++i) hA[i] = (float)(i % 7) - 2.0f;
  for (int i = 0; i < k * n; ++i) hB[i] = (float)(i % 5) + 0.5f;
  float *A, *B, *D, *bias;
  cudaMalloc((void **)&A, sizeof hA), cudaMalloc((void **)&B, sizeof hB);
  cudaMalloc((void **)&D, sizeof hD), cudaMalloc((void **)&bias, sizeof hbias);
  cudaMemcpy(A, hA, sizeof hA, cudaMemcpyHostToDevice);
  cudaMemcpy(B, hB, sizeof hB, cudaMemcpyHostToDevice);
  cudaMemcpy(bias, hbias, sizeof hbias, cudaMemcpyHostToDevice);
  const float *bias_used = past ? bias + 2 : bias;
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  int opn = 0;
  if (int s = cublasLtCreate(&lt)) return fail("cublasLtCreate", s);
  if (int s = cublasLtMatmulDescCreate(&desc, COMPUTE_32F, R_32F)) return fail("DescCreate", s);
  cublasLtMatmulDescSetAttribute(desc, LT_TRANSA, &opn, sizeof opn);
  cublasLtMatmulDescSetAttribute(desc, LT_TRANSB, &opn, sizeof opn);
  cublasLtMatmulDescSetAttribute(desc, EPILOGUE, &relu_bias, sizeof relu_bias);
  cublasLtMatmulDescSetAttribute(desc, BIAS, &bias_used, sizeof bias_used);
  cublasLtMatrixLayoutCreate(&la, R_32F, m, k, m);
  cublasLtMatrixLayoutCreate(&lb, R_32F, k, n, k);
  cublasLtMatrixLayoutCreate(&ld, R_32F, m, n, m);
  float one = 1.0f, zero = 0.0f;
  int s = cublasLtMatmul(lt, desc, &one, A, la, B, lb, &zero, D, ld, D, ld, nullptr, nullptr, 0, 0);
  if (s != 0) return fail("cublasLtMatmul", s);
  if (past) return 0;
  cudaMemcpy(hD, D, sizeof hD, cudaMemcpyDeviceToHost);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float want = 0.0f;
      for (int p = 0; p < k; ++p) want += hA[i + p * m] * hB[p + j * k];
      want += hbias[i];
      want = want > 0.0f ? want : 0.0f;
      if (std::memcmp(&want, &hD[i + j * m], 4) != 0) return fail("the RELU_BIAS product", i);
    }
  return 0;
}

int main(int argc, char **argv) {
  std::string mode = argc > 1 ? argv[1] : "clean";
  cublasHandle_t h;
  if (int s = cublasCreate_v2(&h)) return fail("cublasCreate_v2", s);
  float *x;
  if (cudaError_t e = cudaMalloc((void **)&x, 1000 * sizeof(float))) return fail("cudaMalloc", e);
  if (mode == "clean") {
    fill<<<4, 256>>>(x, 1000, 2.5f);
    float back[1000];
    cudaMemcpy(back, x, sizeof back, cudaMemcpyDeviceToHost);
    for (float v : back)
      if (v != 2.5f) return fail("fill", 0);
    return gemm_checked(h, 4);
  }
  if (mode == "k-short") return gemm_checked(h, 3);
  if (mode == "lt-bias" || mode == "lt-bias-past") return lt_bias(mode == "lt-bias-past");
  if (mode == "ptx" && argc > 2) {
    CUmodule module;
    CUfunction f;
    if (CUresult r = cuModuleLoad(&module, argv[2])) return fail("cuModuleLoad", r);
    if (CUresult r = cuModuleGetFunction(&f, module, "fill")) return fail("cuModuleGetFunction", r);
    CUdeviceptr p = (CUdeviceptr)x;
    int n = 1000;
    float value = 3.5f;
    void *args[] = {&p, &n, &value};
    if (CUresult r = cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr))
      return fail("cuLaunchKernel", r);
    float back[1000];
    cudaMemcpy(back, x, sizeof back, cudaMemcpyDeviceToHost);
    for (float v : back)
      if (v != 3.5f) return fail("fill from PTX", 0);
    return 0;
  }
  if (mode == "lda-short") {
    float one = 1.0f, zero = 0.0f;
    int status = cublasSgemm_v2(h, 0, 0, 8, 2, 2, &one, x, 4, x + 100, 2, &zero, x + 200, 8);
    return status == 7 ? 0 : fail("cublasSgemm_v2 with lda < m returned", status);
  }
  if (mode == "shared") tile_sum<<<4, 256>>>(x, 1000);
  if (mode == "orphan") orphan<<<1, 32>>>(x);
  if (mode == "graph") {
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  }
  if (mode == "managed") {
    float *m;
    cudaMallocManaged((void **)&m, 64, 1);
  }
  if (mode == "device1") cudaSetDevice(1);
  if (mode == "sgemv") {
    float one = 1.0f;
    cublasSgemv_v2(h, 0, 4, 4, &one, x, 4, x + 16, 1, &one, x + 32, 1);
  }
  if (mode == "gemm-half") {
    float one = 1.0f, zero = 0.0f;
    cublasGemmEx(h, 0, 0, 4, 4, 4, &one, x, 2, 4, x + 16, 2, 4, &zero, x + 32, 2, 4, 68, -1);
  }
  if (mode == "write-past") write_past<<<1, 32>>>(x, 1000);
  if (mode == "hang") spin<<<1, 1>>>(x);
  if (mode == "exit") quit<<<1, 1>>>(x);
  if (mode == "write-before") {  // 400 bytes: the bytes before it in its page are its canary
    float *y;
    cudaMalloc((void **)&y, 100 * sizeof(float));
    write_before<<<1, 32>>>(y, 100);
  }
  cudaError_t e = cudaDeviceSynchronize();
  std::printf("cpu_probe %s: %s\n", mode.c_str(), cudaGetErrorString(cudaGetLastError()));
  return e == cudaSuccess ? 0 : 3;
}
