// The cuBLAS and cuBLASLt prototypes the runtime trainer and the GEMM probe call, declared here
// because the machines that build them may have cuBLAS's libraries without its headers. The
// signatures are cublas_api.h's and cublasLt.h's (CUDA 13), with enums passed as int.
#pragma once
#include <cstddef>
#include <cuda_runtime_api.h>

extern "C" {
typedef struct cublasContext *cublasHandle_t;
typedef struct cublasLtContext *cublasLtHandle_t;
typedef void *cublasLtMatmulDesc_t;
typedef void *cublasLtMatrixLayout_t;
int cublasCreate_v2(cublasHandle_t *);
int cublasSetPointerMode_v2(cublasHandle_t, int);
int cublasSgemm_v2(cublasHandle_t, int, int, int, int, int, const float *, const float *, int,
                   const float *, int, const float *, float *, int);
int cublasGemmEx(cublasHandle_t, int, int, int, int, int, const void *, const void *, int, int,
                 const void *, int, int, const void *, void *, int, int, int, int);
int cublasSgemmStridedBatched(cublasHandle_t, int, int, int, int, int, const float *,
                              const float *, int, long long, const float *, int, long long,
                              const float *, float *, int, long long, int);
int cublasGemmStridedBatchedEx(cublasHandle_t, int, int, int, int, int, const void *,
                               const void *, int, int, long long, const void *, int, int,
                               long long, const void *, void *, int, int, long long, int, int, int);
int cublasSgemmBatched(cublasHandle_t, int, int, int, int, int, const float *,
                       const float *const[], int, const float *const[], int, const float *,
                       float *const[], int, int);
int cublasLtCreate(cublasLtHandle_t *);
int cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *, int, int);
int cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t, int, const void *, size_t);
int cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t);
int cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *, int, unsigned long long,
                               unsigned long long, long long);
int cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t, int, const void *, size_t);
int cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t);
int cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,
                   cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t, const void *,
                   const void *, cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t,
                   const void *, void *, size_t, cudaStream_t);
}
