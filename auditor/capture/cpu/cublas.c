/* libcublas for `egf-audit capture --cpu`: the handle, and every fp32 GEMM entry point the GPU
 * capture binds (cublasSgemm_v2, cublasGemmEx, cublasSgemmStridedBatched,
 * cublasGemmStridedBatchedEx, cublasSgemmBatched), computed on the CPU (gemm.c).
 *
 * As NVIDIA's cuBLAS: the call is logged first (cublas_log.c), then its arguments are checked
 * (CUBLAS_STATUS_INVALID_VALUE for an op that is no N, T or C, a negative size or batch count,
 * a leading dimension below max(1, the rows its operand stores)), then it runs as one launch
 * made from inside this library (so the recorder's `by` names libcublas and a deep capture
 * attributes the GEMM's writes to it). What it does not model (other element types, other
 * compute types) is refused by name. An operand that leaves its allocation is not computed:
 * stderr says so and the capture's EGF001 names it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cublas_log.h"
#include "egf_cpu.h"
#include "gemm.h"

#define EXPORT __attribute__((visibility("default")))
enum {
    OK = 0,
    NOT_INITIALIZED = 1,
    ALLOC_FAILED = 3,
    INVALID_VALUE = 7,
    EXECUTION_FAILED = 13,
    NOT_SUPPORTED = 15,
};
enum { R_32F = 0, COMPUTE_32F = 68, COMPUTE_32F_PEDANTIC = 69, COMPUTE_32F_FAST_16F = 74,
       COMPUTE_32F_FAST_16BF = 75, COMPUTE_32F_FAST_TF32 = 77 };

static const char *op_name(int op) {
    return op == 0 ? "CUBLAS_OP_N" : op == 1 ? "CUBLAS_OP_T" : op == 2 ? "CUBLAS_OP_C" : "?";
}

/* ---- the handle ---- */
EXPORT int cublasCreate_v2(Handle **handle) {
    if (!handle) return INVALID_VALUE;
    cuInit(0);
    CUcontext ctx;
    cuCtxGetCurrent(&ctx);  // a driver call, as NVIDIA's cublasCreate makes: the recorder hooks here
    *handle = calloc(1, sizeof **handle);
    if (!*handle) return ALLOC_FAILED;
    if (egf_log_on()) {
        egf_log_begin("cublasCreate_v2", "cublasContext**");
        egf_log_ptr("handle", "cublasHandle_t*", handle);
        egf_log_end(*handle);
    }
    return OK;
}

EXPORT int cublasDestroy_v2(Handle *handle) {
    if (!handle) return NOT_INITIALIZED;
    if (egf_log_on()) {
        egf_log_begin("cublasDestroy_v2", "cublasHandle_t");
        egf_log_ptr("handle", "cublasHandle_t", handle);
        egf_log_end(handle);
    }
    free(handle);
    return OK;
}

EXPORT int cublasSetStream_v2(Handle *handle, void *streamId) {
    if (!handle) return NOT_INITIALIZED;
    if (egf_log_on()) {
        egf_log_begin("cublasSetStream_v2", "cublasHandle_t, cudaStream_t");
        egf_log_ptr("handle", "cublasHandle_t", handle);
        egf_log_ptr("streamId", "cudaStream_t", streamId);
        egf_log_end(handle);
    }
    handle->stream = streamId;
    return OK;
}

EXPORT int cublasGetStream_v2(Handle *handle, void **streamId) {
    if (!handle) return NOT_INITIALIZED;
    if (!streamId) return INVALID_VALUE;
    *streamId = handle->stream;
    return OK;
}

EXPORT int cublasSetPointerMode_v2(Handle *handle, int mode) {
    if (!handle) return NOT_INITIALIZED;
    if (egf_log_on()) {
        egf_log_begin("cublasSetPointerMode_v2", "cublasHandle_t, cublasPointerMode_t");
        egf_log_ptr("handle", "cublasHandle_t", handle);
        egf_log_enum("mode", "cublasPointerMode_t",
                     mode ? "CUBLAS_POINTER_MODE_DEVICE" : "CUBLAS_POINTER_MODE_HOST", mode);
        egf_log_end(handle);
    }
    if (mode != 0 && mode != 1) return INVALID_VALUE;
    handle->pointer_mode = mode;
    return OK;
}

EXPORT int cublasGetPointerMode_v2(Handle *handle, int *mode) {
    if (!handle) return NOT_INITIALIZED;
    if (!mode) return INVALID_VALUE;
    if (egf_log_on()) {
        egf_log_begin("cublasGetPointerMode_v2", "cublasHandle_t, cublasPointerMode_t*");
        egf_log_ptr("handle", "cublasHandle_t", handle);
        egf_log_ptr("mode", "cublasPointerMode_t*", mode);
        egf_log_end(handle);
    }
    *mode = handle->pointer_mode;
    return OK;
}

EXPORT int cublasSetMathMode(Handle *handle, int mode) {
    if (!handle) return NOT_INITIALIZED;
    handle->math_mode = mode;  // fp32 is computed in fp32 here whatever the mode allows
    return OK;
}

EXPORT int cublasGetMathMode(Handle *handle, int *mode) {
    if (!handle) return NOT_INITIALIZED;
    if (!mode) return INVALID_VALUE;
    *mode = handle->math_mode;
    return OK;
}

EXPORT int cublasSetWorkspace_v2(Handle *handle, void *workspace, size_t bytes) {
    (void)workspace, (void)bytes;
    return handle ? OK : NOT_INITIALIZED;
}

EXPORT int cublasGetVersion_v2(Handle *handle, int *version) {
    (void)handle;
    if (!version) return INVALID_VALUE;
    *version = 130100;
    return OK;
}

EXPORT const char *cublasGetStatusName(int status) {
    switch (status) {
        case OK: return "CUBLAS_STATUS_SUCCESS";
        case NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

EXPORT const char *cublasGetStatusString(int status) { return cublasGetStatusName(status); }

/* ---- the GEMMs ---- */
// cuBLAS's argument checks; a status, 0 when they pass
static int invalid(int transa, int transb, int m, int n, int k, long long lda, long long ldb,
                   long long ldc, int batch) {
    if (transa < 0 || transa > 2 || transb < 0 || transb > 2) return INVALID_VALUE;
    if (m < 0 || n < 0 || k < 0 || batch < 0) return INVALID_VALUE;
    long long a_rows = transa == 0 ? m : k, b_rows = transb == 0 ? k : n;
    if (lda < (a_rows > 1 ? a_rows : 1)) return INVALID_VALUE;
    if (ldb < (b_rows > 1 ? b_rows : 1)) return INVALID_VALUE;
    if (ldc < (m > 1 ? m : 1)) return INVALID_VALUE;
    return OK;
}

// alpha and beta as the handle's pointer mode says (device memory is host memory here)
static int scalars(const Handle *h, const void *alpha, const void *beta, EgfGemm *g) {
    if (!alpha || !beta) return INVALID_VALUE;
    if (h->pointer_mode == 1 && (!egf_cpu_in_device(alpha, 4) || !egf_cpu_in_device(beta, 4)))
        return INVALID_VALUE;
    memcpy(&g->alpha, alpha, 4);
    memcpy(&g->beta, beta, 4);
    return OK;
}

static CUfunction gemm_function;
static pthread_once_t gemm_once = PTHREAD_ONCE_INIT;
static void make_gemm_function(void) {
    gemm_function = egf_cpu_host_function("egf_cpu_cublas_sgemm", egf_gemm_run, sizeof(EgfGemm));
}

// the GEMM as one launch from here: the recorder sees it made inside this cuBLAS call
static int launch(const Handle *h, EgfGemm *g, const char *function) {
    const char *outside = egf_gemm_outside(g);
    if (outside) {
        fprintf(stderr,
                "egf-audit capture --cpu: %s: operand %s leaves its device allocation: not "
                "computed (on a GPU it would read or write memory that is not its own)\n",
                function, outside);
        return OK;
    }
    pthread_once(&gemm_once, make_gemm_function);
    void *params[1] = {g};
    CUresult rc = cuLaunchKernel(gemm_function, 1, 1, 1, 1, 1, 1, 0, (CUstream)h->stream, params, NULL);
    return rc == CUDA_SUCCESS ? OK : EXECUTION_FAILED;
}

static void log_shape(const Handle *h, int transa, int transb, int m, int n, int k) {
    egf_log_ptr("handle", "cublasHandle_t", h);
    egf_log_enum("transa", "cublasOperation_t", op_name(transa), transa);
    egf_log_enum("transb", "cublasOperation_t", op_name(transb), transb);
    egf_log_int("m", "int", m);
    egf_log_int("n", "int", n);
    egf_log_int("k", "int", k);
}

static const char *type_name(int t) { return t == R_32F ? "CUDA_R_32F" : "CUDA_TYPE"; }

#define NO_TYPE (-1)     // a typed call's (S...) operand: no Atype line
#define NO_STRIDE (-1LL) // an unbatched call's: no strideA line

// one operand's lines in the prototype's order: A, [Atype], lda, [strideA]
static void log_operand(char role, const void *p, const char *ptr_type, int type, long long ld,
                        long long stride) {
    char name[16];
    snprintf(name, sizeof name, "%c", role);
    egf_log_ptr(name, ptr_type, p);
    if (type != NO_TYPE) {
        snprintf(name, sizeof name, "%ctype", role);
        egf_log_enum(name, "cudaDataType_t", type_name(type), type);
    }
    snprintf(name, sizeof name, "ld%c", role - 'A' + 'a');
    egf_log_int(name, "int", ld);
    if (stride != NO_STRIDE) {
        snprintf(name, sizeof name, "stride%c", role);
        egf_log_int(name, "SOME TYPE", stride);
    }
}

static const char *compute_name(int c) {
    switch (c) {
        case COMPUTE_32F: return "CUBLAS_COMPUTE_32F";
        case COMPUTE_32F_PEDANTIC: return "CUBLAS_COMPUTE_32F_PEDANTIC";
        case COMPUTE_32F_FAST_16F: return "CUBLAS_COMPUTE_32F_FAST_16F";
        case COMPUTE_32F_FAST_16BF: return "CUBLAS_COMPUTE_32F_FAST_16BF";
        case COMPUTE_32F_FAST_TF32: return "CUBLAS_COMPUTE_32F_FAST_TF32";
        default: return "CUBLAS_COMPUTE_TYPE";
    }
}

// an Ex call's last two lines
static void log_compute(int computeType, int algo) {
    egf_log_enum("computeType", "cublasComputeType_t", compute_name(computeType), computeType);
    egf_log_enum("algo", "SOME TYPE", algo == -1 ? "CUBLAS_GEMM_DEFAULT" : "CUBLAS_GEMM_ALGO", algo);
}

// an Ex call's types: fp32 data with an fp32 compute type is modeled (computed in fp32)
static int modeled_types(const char *function, int at, int bt, int ct, int compute) {
    int fp32 = compute == COMPUTE_32F || compute == COMPUTE_32F_PEDANTIC ||
               compute == COMPUTE_32F_FAST_16F || compute == COMPUTE_32F_FAST_16BF ||
               compute == COMPUTE_32F_FAST_TF32;
    if (at == R_32F && bt == R_32F && ct == R_32F && fp32) return 1;
    char why[256];
    snprintf(why, sizeof why,
             "Atype %d, Btype %d, Ctype %d, computeType %d: only fp32 data (CUDA_R_32F) with an "
             "fp32 compute type is modeled",
             at, bt, ct, compute);
    egf_cpu_refuse(function, why);
    return 0;
}

static EgfGemm shape(int transa, int transb, int m, int n, int k, const void *A, long long lda,
                     const void *B, long long ldb, void *C, long long ldc) {
    EgfGemm g;
    memset(&g, 0, sizeof g);
    g.transa = transa, g.transb = transb, g.m = m, g.n = n, g.k = k;
    g.A = A, g.B = B, g.C = C, g.D = C;
    g.lda = lda, g.ldb = ldb, g.ldc = g.ldd = ldc;
    g.batch = 1;
    return g;
}

#define SGEMM_PROTOTYPE                                                                       \
    "cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float*, const " \
    "float*, int, const float*, int, const float*, float*, int"

EXPORT int cublasSgemm_v2(Handle *h, int transa, int transb, int m, int n, int k,
                          const float *alpha, const float *A, int lda, const float *B, int ldb,
                          const float *beta, float *C, int ldc) {
    if (!h) return NOT_INITIALIZED;
    if (egf_log_on()) {
        egf_log_begin("cublasSgemm_v2", SGEMM_PROTOTYPE);
        log_shape(h, transa, transb, m, n, k);
        egf_log_ptr("alpha", "float", alpha);
        log_operand('A', A, "float", NO_TYPE, lda, NO_STRIDE);
        log_operand('B', B, "float", NO_TYPE, ldb, NO_STRIDE);
        egf_log_ptr("beta", "float", beta);
        log_operand('C', C, "float", NO_TYPE, ldc, NO_STRIDE);
        egf_log_end(h);
    }
    int bad = invalid(transa, transb, m, n, k, lda, ldb, ldc, 1);
    if (bad) return bad;
    EgfGemm g = shape(transa, transb, m, n, k, A, lda, B, ldb, C, ldc);
    if ((bad = scalars(h, alpha, beta, &g))) return bad;
    return launch(h, &g, "cublasSgemm_v2");
}

EXPORT int cublasGemmEx(Handle *h, int transa, int transb, int m, int n, int k, const void *alpha,
                        const void *A, int Atype, int lda, const void *B, int Btype, int ldb,
                        const void *beta, void *C, int Ctype, int ldc, int computeType, int algo) {
    if (!h) return NOT_INITIALIZED;
    if (egf_log_on()) {
        egf_log_begin("cublasGemmEx",
                      "cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const "
                      "void*, const void*, cudaDataType, int, const void*, cudaDataType, int, "
                      "const void*, void*, cudaDataType, int, cublasComputeType_t, "
                      "cublasGemmAlgo_t");
        log_shape(h, transa, transb, m, n, k);
        egf_log_ptr("alpha", "void", alpha);
        log_operand('A', A, "void", Atype, lda, NO_STRIDE);
        log_operand('B', B, "void", Btype, ldb, NO_STRIDE);
        egf_log_ptr("beta", "void", beta);
        log_operand('C', C, "void", Ctype, ldc, NO_STRIDE);
        log_compute(computeType, algo);
        egf_log_end(h);
    }
    int bad = invalid(transa, transb, m, n, k, lda, ldb, ldc, 1);
    if (bad) return bad;
    if (!modeled_types("cublasGemmEx", Atype, Btype, Ctype, computeType)) return NOT_SUPPORTED;
    EgfGemm g = shape(transa, transb, m, n, k, A, lda, B, ldb, C, ldc);
    if ((bad = scalars(h, alpha, beta, &g))) return bad;
    return launch(h, &g, "cublasGemmEx");
}

EXPORT int cublasSgemmStridedBatched(Handle *h, int transa, int transb, int m, int n, int k,
                                     const float *alpha, const float *A, int lda, long long strideA,
                                     const float *B, int ldb, long long strideB, const float *beta,
                                     float *C, int ldc, long long strideC, int batchCount) {
    if (!h) return NOT_INITIALIZED;
    if (egf_log_on()) {
        egf_log_begin("cublasSgemmStridedBatched",
                      "cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const "
                      "float*, const float*, int, long long int, const float*, int, long long int, "
                      "const float*, float*, int, long long int, int");
        log_shape(h, transa, transb, m, n, k);
        egf_log_ptr("alpha", "float", alpha);
        log_operand('A', A, "float", NO_TYPE, lda, strideA);
        log_operand('B', B, "float", NO_TYPE, ldb, strideB);
        egf_log_ptr("beta", "float", beta);
        log_operand('C', C, "float", NO_TYPE, ldc, strideC);
        egf_log_int("batchCount", "int", batchCount);
        egf_log_end(h);
    }
    int bad = invalid(transa, transb, m, n, k, lda, ldb, ldc, batchCount);
    if (bad) return bad;
    EgfGemm g = shape(transa, transb, m, n, k, A, lda, B, ldb, C, ldc);
    g.strideA = strideA, g.strideB = strideB, g.strideC = g.strideD = strideC, g.batch = batchCount;
    if ((bad = scalars(h, alpha, beta, &g))) return bad;
    return launch(h, &g, "cublasSgemmStridedBatched");
}

EXPORT int cublasGemmStridedBatchedEx(Handle *h, int transa, int transb, int m, int n, int k,
                                      const void *alpha, const void *A, int Atype, int lda,
                                      long long strideA, const void *B, int Btype, int ldb,
                                      long long strideB, const void *beta, void *C, int Ctype,
                                      int ldc, long long strideC, int batchCount, int computeType,
                                      int algo) {
    if (!h) return NOT_INITIALIZED;
    if (egf_log_on()) {
        egf_log_begin("cublasGemmStridedBatchedEx",
                      "cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const "
                      "void*, const void*, cudaDataType, int, long long int, const void*, "
                      "cudaDataType, int, long long int, const void*, void*, cudaDataType, int, "
                      "long long int, int, cublasComputeType_t, cublasGemmAlgo_t");
        log_shape(h, transa, transb, m, n, k);
        egf_log_ptr("alpha", "void", alpha);
        log_operand('A', A, "void", Atype, lda, strideA);
        log_operand('B', B, "void", Btype, ldb, strideB);
        egf_log_ptr("beta", "void", beta);
        log_operand('C', C, "void", Ctype, ldc, strideC);
        egf_log_int("batchCount", "int", batchCount);
        log_compute(computeType, algo);
        egf_log_end(h);
    }
    int bad = invalid(transa, transb, m, n, k, lda, ldb, ldc, batchCount);
    if (bad) return bad;
    if (!modeled_types("cublasGemmStridedBatchedEx", Atype, Btype, Ctype, computeType))
        return NOT_SUPPORTED;
    EgfGemm g = shape(transa, transb, m, n, k, A, lda, B, ldb, C, ldc);
    g.strideA = strideA, g.strideB = strideB, g.strideC = g.strideD = strideC, g.batch = batchCount;
    if ((bad = scalars(h, alpha, beta, &g))) return bad;
    return launch(h, &g, "cublasGemmStridedBatchedEx");
}

EXPORT int cublasSgemmBatched(Handle *h, int transa, int transb, int m, int n, int k,
                              const float *alpha, const float *const Aarray[], int lda,
                              const float *const Barray[], int ldb, const float *beta,
                              float *const Carray[], int ldc, int batchCount) {
    if (!h) return NOT_INITIALIZED;
    if (egf_log_on()) {
        egf_log_begin("cublasSgemmBatched",
                      "cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const "
                      "float*, const float* const*, int, const float* const*, int, const float*, "
                      "float* const*, int, int");
        log_shape(h, transa, transb, m, n, k);
        egf_log_ptr("alpha", "float", alpha);
        egf_log_ptr("Aarray", "SOME TYPE", Aarray);
        egf_log_int("lda", "int", lda);
        egf_log_ptr("Barray", "SOME TYPE", Barray);
        egf_log_int("ldb", "int", ldb);
        egf_log_ptr("beta", "float", beta);
        egf_log_ptr("Carray", "SOME TYPE", Carray);
        egf_log_int("ldc", "int", ldc);
        egf_log_int("batchCount", "int", batchCount);
        egf_log_end(h);
    }
    int bad = invalid(transa, transb, m, n, k, lda, ldb, ldc, batchCount);
    if (bad) return bad;
    size_t arrays = (size_t)batchCount * sizeof(void *);
    if (batchCount > 0 && (!egf_cpu_in_device(Aarray, arrays) || !egf_cpu_in_device(Barray, arrays) ||
                           !egf_cpu_in_device(Carray, arrays)))
        return INVALID_VALUE;  // the pointer arrays live in device memory
    EgfGemm g = shape(transa, transb, m, n, k, NULL, lda, NULL, ldb, NULL, ldc);
    g.Aarray = Aarray, g.Barray = Barray, g.Darray = Carray, g.batch = batchCount;
    if ((bad = scalars(h, alpha, beta, &g))) return bad;
    return launch(h, &g, "cublasSgemmBatched");
}
