/* The fp32 GEMM of the fake cuBLAS and cuBLASLt (gemm.h). Each operand is packed first, read
 * exactly as cuBLAS reads it (m, n, k and the leading dimension), then every element of D is
 * one dot product summed in k order in fp32. cuBLAS's quick returns are kept: alpha == 0 (or
 * k == 0) reads neither A nor B, beta == 0 reads no C (a NaN there is not carried). */
#include "gemm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "egf_cpu.h"

#define HIDDEN __attribute__((visibility("hidden")))

// the span of a column-major operand stored rows x cols with leading dimension ld, in bytes
static size_t span(long long rows, long long cols, long long ld) {
    if (rows <= 0 || cols <= 0) return 0;
    return (size_t)(((cols - 1) * ld + rows) * (long long)sizeof(float));
}

static const float *operand(const float *base, const float *const *array, long long stride, int b) {
    return array ? array[b] : base + (long long)b * stride;
}

HIDDEN const char *egf_gemm_outside(const EgfGemm *g) {
    int read_ab = g->alpha != 0.0f && g->k > 0;
    long long a_rows = g->transa == 0 ? g->m : g->k, a_cols = g->transa == 0 ? g->k : g->m;
    long long b_rows = g->transb == 0 ? g->k : g->n, b_cols = g->transb == 0 ? g->n : g->k;
    for (int b = 0; b < g->batch; ++b) {
        const float *A = operand(g->A, g->Aarray, g->strideA, b);
        const float *B = operand(g->B, g->Barray, g->strideB, b);
        const float *D = operand(g->D, (const float *const *)g->Darray, g->strideD, b);
        const float *C = g->Darray ? D : operand(g->C, NULL, g->strideC, b);
        if (read_ab && !egf_cpu_in_device(A, span(a_rows, a_cols, g->lda))) return "A";
        if (read_ab && !egf_cpu_in_device(B, span(b_rows, b_cols, g->ldb))) return "B";
        if (g->beta != 0.0f && !egf_cpu_in_device(C, span(g->m, g->n, g->ldc))) return "C";
        if (!egf_cpu_in_device(D, span(g->m, g->n, g->ldd))) return "D";
    }
    if (g->bias && !egf_cpu_in_device(g->bias, span(g->m, 1, g->m))) return "bias";
    return NULL;
}

// op(X) of one batch as rows x k, row-major (row i of op(A), or column j of op(B))
static void pack(float *out, const float *X, int trans, long long ld, int rows, int k) {
    for (int i = 0; i < rows; ++i)
        for (int p = 0; p < k; ++p) out[(size_t)i * k + p] = trans == 0 ? X[i + p * ld] : X[p + i * ld];
}

static void one_batch(const EgfGemm *g, int b, float *ap, float *bp) {
    const float *A = operand(g->A, g->Aarray, g->strideA, b);
    const float *B = operand(g->B, g->Barray, g->strideB, b);
    float *D = (float *)operand(g->D, (const float *const *)g->Darray, g->strideD, b);
    const float *C = g->Darray ? D : operand(g->C, NULL, g->strideC, b);
    int product = g->alpha != 0.0f && g->k > 0;
    if (product) {
        pack(ap, A, g->transa, g->lda, g->m, g->k);
        // op(B) is k x n: its column j is row j of op(B) transposed
        pack(bp, B, g->transb == 0 ? 1 : 0, g->ldb, g->n, g->k);
    }
    for (int j = 0; j < g->n; ++j) {
        for (int i = 0; i < g->m; ++i) {
            float acc = 0.0f;
            if (product) {
                const float *x = ap + (size_t)i * g->k, *y = bp + (size_t)j * g->k;
                for (int p = 0; p < g->k; ++p) acc += x[p] * y[p];
                acc *= g->alpha;
            }
            float out = g->beta == 0.0f ? acc : acc + g->beta * C[i + j * g->ldc];
            if (g->bias) out += g->bias[i];
            if (g->relu) out = out > 0.0f ? out : 0.0f;  // as fmaxf(out, 0): a NaN gives 0
            D[i + j * g->ldd] = out;
        }
    }
}

HIDDEN void egf_gemm_run(void *gemm) {
    const EgfGemm *g = gemm;
    if (g->m <= 0 || g->n <= 0) return;
    if ((g->alpha == 0.0f || g->k == 0) && g->beta == 1.0f && g->C == g->D && !g->Darray) return;
    size_t ak = (size_t)g->m * (g->k > 0 ? g->k : 1), bk = (size_t)g->n * (g->k > 0 ? g->k : 1);
    float *ap = malloc(ak * sizeof *ap), *bp = malloc(bk * sizeof *bp);
    if (!ap || !bp) {
        fprintf(stderr, "egf-audit capture --cpu: out of host memory for a GEMM\n");
        abort();
    }
    for (int b = 0; b < g->batch; ++b) one_batch(g, b, ap, bp);
    free(ap);
    free(bp);
}
