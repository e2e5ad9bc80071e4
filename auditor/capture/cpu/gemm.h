/* The fp32 GEMM the fake cuBLAS and cuBLASLt compute on the CPU, with cuBLAS's column-major
 * semantics: exactly m, n and k of each operand through its leading dimension, so a call with
 * k = lda - 1 drops the last column as on the GPU. */
#pragma once
#include <stddef.h>

typedef struct {
    int transa, transb;  // 0 N, 1 T, 2 C (C is T for real matrices)
    int m, n, k;
    float alpha, beta;
    const float *A, *B;
    const float *C;  // read (beta != 0)
    float *D;        // written: C itself for the classic API
    long long lda, ldb, ldc, ldd;
    long long strideA, strideB, strideC, strideD;  // elements between batches
    int batch;
    const float *const *Aarray, *const *Barray;  // pointer-array batches (NULL: strided)
    float *const *Darray;
    const float *bias;  // a cuBLASLt BIAS epilogue's vector, one element per row of D (NULL: none)
    int relu;           // a cuBLASLt RELU epilogue: D = max(D, 0) last
} EgfGemm;

/* Where each operand of one batch spans: NULL when every span lies inside one device
 * allocation, else a sentence naming the operand that does not. */
const char *egf_gemm_outside(const EgfGemm *g);
/* Computes every batch (the caller has checked the arguments and the spans). */
void egf_gemm_run(void *gemm);
