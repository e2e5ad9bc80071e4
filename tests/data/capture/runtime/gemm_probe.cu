// Every cuBLAS GEMM entry point once, in a process that is no SP14 trainer: cublasSgemm_v2 (host
// and device pointer mode), cublasGemmEx, cublasSgemmStridedBatched, cublasGemmStridedBatchedEx,
// cublasSgemmBatched (pointer arrays) and a batched cublasLtMatmul, on tensors of one flat
// allocation (as llm.c keeps its activations), with a layout file naming each tensor. The shapes
// are llm.c's: Y = X·Wᵀ as matmul_forward calls it, S_b = Q_b·K_bᵀ per batch as its attention.
//
//   gemm_probe [--layout-out FILE] [--plant k-short|ld-long]
//
// --plant puts one token wrong: k-short gives the Y GEMM K = C - 1 against the leading
// dimension C (the last column of X and W is never read), ld-long gives the strided-batched
// GEMM ldc = T + 1 (each batch of S written with the wrong row stride, past its tensor).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "cublas_decls.h"
enum { N = 0, T = 1, R_32F = 0, COMPUTE_32F = 68, ALGO = -1 };
enum { LT_TRANSA = 3, LT_TRANSB = 4, LT_BATCH = 5, LT_STRIDE = 6 };

static void check(int status, const char *what) {
  if (status != 0) {
    std::fprintf(stderr, "gemm_probe: %s failed (%d)\n", what, status);
    std::exit(1);
  }
}

// llm.c's shapes, small: BT rows of C channels, OC outputs; NB attention batches of T x HS
const int BT = 24, C = 16, OC = 12, NB = 3, TT = 8, HS = 4;
struct Tensor {
  const char *name;
  int rows, cols;
  long long offset;  // elements into `acts`
};
// Y_* = X·Wᵀ [BT, OC] by four entry points; S_* = Q_b·K_bᵀ [NB*T, T] by four more
Tensor tensors[] = {{"X", BT, C}, {"W", OC, C}, {"Y_sgemm", BT, OC}, {"Y_ex", BT, OC},
                    {"Y_device_scalars", BT, OC}, {"Q", NB * TT, HS}, {"K", NB * TT, HS},
                    {"S_strided", NB * TT, TT}, {"S_strided_ex", NB * TT, TT},
                    {"S_batched", NB * TT, TT}, {"S_lt", NB * TT, TT}};
const int NT = sizeof tensors / sizeof *tensors;

int main(int argc, char **argv) {
  std::string layout_out, plant;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--layout-out" && i + 1 < argc) layout_out = argv[++i];
    else if (a == "--plant" && i + 1 < argc) plant = argv[++i];
    else return std::fprintf(stderr, "usage: gemm_probe [--layout-out F] [--plant P]\n"), 2;
  }
  long long total = 0;
  for (Tensor &t : tensors) t.offset = total, total += (long long)t.rows * t.cols;
  float *acts, *scalars;
  const float **arrays;
  check(cudaMalloc((void **)&acts, 4 * total), "cudaMalloc");
  check(cudaMalloc((void **)&scalars, 8), "cudaMalloc");
  check(cudaMalloc((void **)&arrays, 3 * NB * sizeof(float *)), "cudaMalloc");
  float *host = (float *)std::malloc(4 * total);
  for (long long i = 0; i < total; ++i) host[i] = (float)((i * 7919) % 97) / 97.0f - 0.5f;
  check(cudaMemcpy(acts, host, 4 * total, cudaMemcpyHostToDevice), "cudaMemcpy");
  auto at = [&](const char *name) {
    for (Tensor &t : tensors)
      if (std::strcmp(t.name, name) == 0) return acts + t.offset;
    std::exit(3);
  };
  if (!layout_out.empty()) {
    std::ofstream f(layout_out);
    f << "{\"format\": \"egf-audit-layout/1\", \"dims\": {}, \"buffers\": {\"acts\": {\"address\": "
      << (unsigned long long)acts << ", \"bytes\": " << 4 * total << ", \"tensors\": {";
    for (int i = 0; i < NT; ++i)
      f << (i ? ", " : "") << '"' << tensors[i].name << "\": [" << tensors[i].offset << ", "
        << tensors[i].rows << ", " << tensors[i].cols << "]";
    f << "}}}}\n";
  }
  cublasHandle_t h;
  check(cublasCreate_v2(&h), "cublasCreate");
  float one = 1.0f, zero = 0.0f;
  int k = plant == "k-short" ? C - 1 : C;
  // Y = X·Wᵀ, as llm.c's matmul_forward: (T, N, OC, BT, C, W, C, X, C, Y, OC)
  check(cublasSgemm_v2(h, T, N, OC, BT, k, &one, at("W"), C, at("X"), C, &zero, at("Y_sgemm"), OC),
        "cublasSgemm_v2");
  check(cublasGemmEx(h, T, N, OC, BT, C, &one, at("W"), R_32F, C, at("X"), R_32F, C, &zero,
                     at("Y_ex"), R_32F, OC, COMPUTE_32F, ALGO), "cublasGemmEx");
  float pair[2] = {1.0f, 0.0f};
  check(cudaMemcpy(scalars, pair, 8, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cublasSetPointerMode_v2(h, 1), "cublasSetPointerMode");
  check(cublasSgemm_v2(h, T, N, OC, BT, C, scalars, at("W"), C, at("X"), C, scalars + 1,
                       at("Y_device_scalars"), OC), "cublasSgemm_v2 (device scalars)");
  check(cublasSetPointerMode_v2(h, 0), "cublasSetPointerMode");
  // S_b = Q_b·K_bᵀ, as llm.c's attention: (T, N, T, T, HS, K, HS, T*HS, Q, HS, T*HS, S, T, T*T)
  int ldc = plant == "ld-long" ? TT + 1 : TT;
  check(cublasSgemmStridedBatched(h, T, N, TT, TT, HS, &one, at("K"), HS, TT * HS, at("Q"), HS,
                                  TT * HS, &zero, at("S_strided"), ldc, TT * TT, NB),
        "cublasSgemmStridedBatched");
  check(cublasGemmStridedBatchedEx(h, T, N, TT, TT, HS, &one, at("K"), R_32F, HS, TT * HS,
                                   at("Q"), R_32F, HS, TT * HS, &zero, at("S_strided_ex"), R_32F,
                                   TT, TT * TT, NB, COMPUTE_32F, ALGO),
        "cublasGemmStridedBatchedEx");
  const float *ptrs[3 * NB];
  for (int b = 0; b < NB; ++b) {
    ptrs[b] = at("K") + b * TT * HS;
    ptrs[NB + b] = at("Q") + b * TT * HS;
    ptrs[2 * NB + b] = at("S_batched") + b * TT * TT;
  }
  check(cudaMemcpy(arrays, ptrs, sizeof ptrs, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cublasSgemmBatched(h, T, N, TT, TT, HS, &one, arrays, HS, arrays + NB, HS, &zero,
                           (float *const *)(arrays + 2 * NB), TT, NB), "cublasSgemmBatched");
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  int opt = T, opn = N, batch = NB;
  long long sa = TT * HS, sc = TT * TT;
  check(cublasLtCreate(&lt), "cublasLtCreate");
  check(cublasLtMatmulDescCreate(&desc, COMPUTE_32F, R_32F), "cublasLtMatmulDescCreate");
  cublasLtMatmulDescSetAttribute(desc, LT_TRANSA, &opt, sizeof opt);
  cublasLtMatmulDescSetAttribute(desc, LT_TRANSB, &opn, sizeof opn);
  cublasLtMatrixLayoutCreate(&la, R_32F, HS, TT, HS);
  cublasLtMatrixLayoutCreate(&lb, R_32F, HS, TT, HS);
  cublasLtMatrixLayoutCreate(&lc, R_32F, TT, TT, TT);
  for (auto l : {la, lb, lc}) cublasLtMatrixLayoutSetAttribute(l, LT_BATCH, &batch, sizeof batch);
  cublasLtMatrixLayoutSetAttribute(la, LT_STRIDE, &sa, sizeof sa);
  cublasLtMatrixLayoutSetAttribute(lb, LT_STRIDE, &sa, sizeof sa);
  cublasLtMatrixLayoutSetAttribute(lc, LT_STRIDE, &sc, sizeof sc);
  check(cublasLtMatmul(lt, desc, &one, at("K"), la, at("Q"), lb, &zero, at("S_lt"), lc,
                       at("S_lt"), lc, nullptr, nullptr, 0, 0), "cublasLtMatmul");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::printf("gemm_probe: 8 GEMMs%s%s\n", plant.empty() ? "" : ", planted: ", plant.c_str());
  return 0;
}
