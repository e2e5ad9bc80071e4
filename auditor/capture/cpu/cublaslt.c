/* libcublasLt for `egf-audit capture --cpu`: handles, matmul descriptors, matrix layouts,
 * preferences, the heuristic, and cublasLtMatmul with fp32 descriptors, computed on the CPU
 * (gemm.c) as one launch made from inside this library.
 *
 * cuBLASLt's logger is modeled as far as the recorder reads it: the API trace (mask 16) of each
 * cublasLtMatmul, one message naming its operands and descriptors (the recorder reads the
 * descriptors' contents back through the GetAttribute functions while the call is in progress),
 * worded as NVIDIA's: "A=0X7F.. Adesc=0X.. B=.. Bdesc=.. C=.. Cdesc=.. D=.. Ddesc=..
 * computeDesc=.. algo=.. workSpace=.. workSpaceSizeInBytes=.. stream=..". What it does not
 * model (other types, epilogues but ReLU and bias, scale pointers, row-major layouts, vector
 * pointer modes) is refused by name.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egf_cpu.h"
#include "gemm.h"

#define EXPORT __attribute__((visibility("default")))
enum { OK = 0, NOT_INITIALIZED = 1, ALLOC_FAILED = 3, INVALID_VALUE = 7, EXECUTION_FAILED = 13,
       NOT_SUPPORTED = 15 };
enum { R_32F = 0, EPILOGUE_DEFAULT = 1, EPILOGUE_RELU = 2, EPILOGUE_BIAS = 4, LOG_API = 16 };
enum { DESC_BIAS_POINTER = 8, DESC_WIDE_LAST = 12 };  // 8..12: 8-byte attributes kept (bias, aux)

typedef struct {
    int unused;
} LtHandle;

typedef struct {
    int32_t attr[8];  // compute type, scale type, pointer mode, transa, transb, transc, fill, epilogue
    int64_t wide[DESC_WIDE_LAST + 1];  // 8: the bias pointer, 11: the aux pointer, 12: its ld
    int other;  // an attribute past those set to something other than zero: its id + 1
} MatmulDesc;

typedef struct {
    uint32_t type;
    int32_t order;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride, plane;
} Layout;

typedef struct {
    uint64_t workspace;
} Preference;

typedef struct {
    uint64_t data[8];
} LtAlgo;
typedef struct {
    LtAlgo algo;
    size_t workspaceSize;
    int state;
    float wavesCount;
    int reserved[4];
} HeuristicResult;

/* ---- the logger ---- */
typedef void (*LtLogCallback)(int level, const char *function, const char *message);
static struct {
    LtLogCallback callback;
    int mask;
    FILE *file;
} lt_log;

EXPORT int cublasLtLoggerSetCallback(LtLogCallback callback) {
    lt_log.callback = callback;
    return OK;
}
EXPORT int cublasLtLoggerSetFile(FILE *file) {
    lt_log.file = file;
    return OK;
}
EXPORT int cublasLtLoggerOpenFile(const char *logFile) {
    lt_log.file = logFile ? fopen(logFile, "w") : NULL;
    return lt_log.file ? OK : INVALID_VALUE;
}
EXPORT int cublasLtLoggerSetMask(int mask) {
    lt_log.mask = mask;
    return OK;
}
EXPORT int cublasLtLoggerSetLevel(int level) {
    lt_log.mask = level <= 0 ? 0 : (1 << level) - 1;  // a level turns on every mask below it
    return OK;
}
EXPORT int cublasLtLoggerForceDisable(void) {
    lt_log.mask = 0;
    return OK;
}

static void lt_trace(const char *function, const char *message) {
    if (!(lt_log.mask & LOG_API)) return;
    if (lt_log.callback) lt_log.callback(5, function, message);  // level 5: API trace
    FILE *out = lt_log.file ? lt_log.file : stdout;
    fprintf(out, "[cublasLt][%d][Api][%s] %s\n", 0, function, message);
}

/* ---- handles, descriptors, layouts ---- */
EXPORT int cublasLtCreate(LtHandle **handle) {
    if (!handle) return INVALID_VALUE;
    cuInit(0);
    *handle = calloc(1, sizeof **handle);
    return *handle ? OK : ALLOC_FAILED;
}
EXPORT int cublasLtDestroy(LtHandle *handle) {
    free(handle);
    return OK;
}
EXPORT size_t cublasLtGetVersion(void) { return 130100; }

EXPORT int cublasLtMatmulDescCreate(MatmulDesc **desc, int computeType, int scaleType) {
    if (!desc) return INVALID_VALUE;
    *desc = calloc(1, sizeof **desc);
    if (!*desc) return ALLOC_FAILED;
    (*desc)->attr[0] = computeType, (*desc)->attr[1] = scaleType, (*desc)->attr[7] = EPILOGUE_DEFAULT;
    return OK;
}
EXPORT int cublasLtMatmulDescDestroy(MatmulDesc *desc) {
    free(desc);
    return OK;
}

static int nonzero(const void *buf, size_t size) {
    for (size_t i = 0; i < size; ++i)
        if (((const unsigned char *)buf)[i]) return 1;
    return 0;
}

// an attribute of 8 bytes this model keeps: the bias pointer (8), the auxiliary matrix's
// pointer (11) and leading dimension (12); 9 and 10 (batch strides) are not kept
static int wide_attribute(int attr) {
    return attr >= DESC_BIAS_POINTER && attr <= DESC_WIDE_LAST && attr != 9 && attr != 10;
}

EXPORT int cublasLtMatmulDescSetAttribute(MatmulDesc *desc, int attr, const void *buf, size_t size) {
    if (!desc || !buf) return INVALID_VALUE;
    if (attr >= 0 && attr < 8) {
        if (size != 4) return INVALID_VALUE;
        memcpy(&desc->attr[attr], buf, 4);
    } else if (wide_attribute(attr)) {
        if (size != 8) return INVALID_VALUE;
        memcpy(&desc->wide[attr], buf, 8);
    } else if (nonzero(buf, size)) {
        desc->other = attr + 1;
    }
    return OK;
}

EXPORT int cublasLtMatmulDescGetAttribute(MatmulDesc *desc, int attr, void *buf, size_t size,
                                          size_t *written) {
    int wide = wide_attribute(attr);
    if (!desc || attr < 0 || (attr >= 8 && !wide)) return INVALID_VALUE;
    size_t want = wide ? 8 : 4;
    if (written) *written = want;
    if (size == 0 && !buf) return written ? OK : INVALID_VALUE;
    if (size < want || !buf) return INVALID_VALUE;
    memcpy(buf, wide ? (const void *)&desc->wide[attr] : (const void *)&desc->attr[attr], want);
    return OK;
}

EXPORT int cublasLtMatrixLayoutCreate(Layout **layout, int type, uint64_t rows, uint64_t cols,
                                      int64_t ld) {
    if (!layout) return INVALID_VALUE;
    *layout = calloc(1, sizeof **layout);
    if (!*layout) return ALLOC_FAILED;
    **layout = (Layout){(uint32_t)type, 0, rows, cols, ld, 1, 0, 0};
    return OK;
}
EXPORT int cublasLtMatrixLayoutDestroy(Layout *layout) {
    free(layout);
    return OK;
}

// a layout attribute's field and size (cublasLtMatrixLayoutAttribute_t 0..7)
static void *layout_field(Layout *l, int attr, size_t *size) {
    switch (attr) {
        case 0: *size = 4; return &l->type;
        case 1: *size = 4; return &l->order;
        case 2: *size = 8; return &l->rows;
        case 3: *size = 8; return &l->cols;
        case 4: *size = 8; return &l->ld;
        case 5: *size = 4; return &l->batch;
        case 6: *size = 8; return &l->stride;
        case 7: *size = 8; return &l->plane;
        default: return NULL;
    }
}

EXPORT int cublasLtMatrixLayoutSetAttribute(Layout *layout, int attr, const void *buf, size_t size) {
    size_t want;
    void *field = layout && buf ? layout_field(layout, attr, &want) : NULL;
    if (!field || size != want) return INVALID_VALUE;
    memcpy(field, buf, size);
    return OK;
}

EXPORT int cublasLtMatrixLayoutGetAttribute(Layout *layout, int attr, void *buf, size_t size,
                                            size_t *written) {
    size_t want;
    void *field = layout ? layout_field(layout, attr, &want) : NULL;
    if (!field) return INVALID_VALUE;
    if (written) *written = want;
    if (size == 0 && !buf) return written ? OK : INVALID_VALUE;
    if (size < want || !buf) return INVALID_VALUE;
    memcpy(buf, field, want);
    return OK;
}

EXPORT int cublasLtMatmulPreferenceCreate(Preference **pref) {
    if (!pref) return INVALID_VALUE;
    *pref = calloc(1, sizeof **pref);
    return *pref ? OK : ALLOC_FAILED;
}
EXPORT int cublasLtMatmulPreferenceDestroy(Preference *pref) {
    free(pref);
    return OK;
}
EXPORT int cublasLtMatmulPreferenceSetAttribute(Preference *pref, int attr, const void *buf,
                                                size_t size) {
    (void)attr;
    if (!pref || !buf) return INVALID_VALUE;
    if (size == 8) memcpy(&pref->workspace, buf, 8);
    return OK;
}

// one algorithm, with no workspace: whatever is asked, the CPU computes it the same way
EXPORT int cublasLtMatmulAlgoGetHeuristic(LtHandle *handle, MatmulDesc *desc, Layout *a, Layout *b,
                                          Layout *c, Layout *d, Preference *pref, int requested,
                                          HeuristicResult *results, int *returned) {
    (void)pref;
    if (!handle || !desc || !a || !b || !c || !d || !results || !returned || requested < 1)
        return INVALID_VALUE;
    memset(&results[0], 0, sizeof results[0]);
    results[0].state = OK;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return OK;
}

/* ---- the matmul ---- */
static int refuse(const char *why) {
    egf_cpu_refuse("cublasLtMatmul", why);
    return NOT_SUPPORTED;
}

static int modeled(const MatmulDesc *desc, const Layout *const layouts[4]) {
    int compute = desc->attr[0];
    if (compute != 68 && compute != 69 && compute != 74 && compute != 75 && compute != 77)
        return refuse("a compute type other than fp32 (CUBLAS_COMPUTE_32F and its variants)");
    if (desc->attr[1] != R_32F) return refuse("a scale type other than CUDA_R_32F");
    if (desc->attr[2] != 0 && desc->attr[2] != 1)
        return refuse("a pointer mode with per-row scale vectors");
    if (desc->attr[5] != 0) return refuse("a transposed C (CUBLASLT_MATMUL_DESC_TRANSC)");
    int epilogue = desc->attr[7];
    if (epilogue != EPILOGUE_DEFAULT && epilogue != EPILOGUE_RELU && epilogue != EPILOGUE_BIAS &&
        epilogue != (EPILOGUE_RELU | EPILOGUE_BIAS))
        return refuse("an epilogue other than ReLU and bias (GELU, auxiliary outputs, gradients)");
    if (desc->wide[11] || desc->wide[12])
        return refuse("an epilogue's auxiliary matrix (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER)");
    if (desc->other) {
        char why[128];
        snprintf(why, sizeof why, "matmul descriptor attribute %d (scale pointers, bias, ...)",
                 desc->other - 1);
        return refuse(why);
    }
    for (int i = 0; i < 4; ++i) {
        if (layouts[i]->type != R_32F) return refuse("a matrix of another type than CUDA_R_32F");
        if (layouts[i]->order != 0) return refuse("a matrix layout other than column-major");
    }
    return OK;
}

// the arguments cuBLASLt checks; a status, 0 when they pass
static int check(const MatmulDesc *desc, const Layout *const l[4], EgfGemm *g) {
    const Layout *a = l[0], *b = l[1], *c = l[2], *d = l[3];
    int ta = desc->attr[3], tb = desc->attr[4];
    if (ta < 0 || ta > 2 || tb < 0 || tb > 2) return INVALID_VALUE;
    uint64_t m = d->rows, n = d->cols, k = ta == 0 ? a->cols : a->rows;
    if ((ta == 0 ? a->rows : a->cols) != m) return INVALID_VALUE;
    if ((tb == 0 ? b->rows : b->cols) != k || (tb == 0 ? b->cols : b->rows) != n) return INVALID_VALUE;
    if (c->rows != m || c->cols != n) return INVALID_VALUE;
    for (int i = 0; i < 4; ++i)
        if (l[i]->ld < (int64_t)(l[i]->rows > 1 ? l[i]->rows : 1) || l[i]->batch < 1) return INVALID_VALUE;
    int batch = d->batch;
    for (int i = 0; i < 3; ++i)
        if (l[i]->batch != batch) return INVALID_VALUE;
    if (m > 0x7fffffff || n > 0x7fffffff || k > 0x7fffffff) return NOT_SUPPORTED;
    g->transa = ta, g->transb = tb, g->m = (int)m, g->n = (int)n, g->k = (int)k;
    g->lda = a->ld, g->ldb = b->ld, g->ldc = c->ld, g->ldd = d->ld;
    g->strideA = a->stride, g->strideB = b->stride, g->strideC = c->stride, g->strideD = d->stride;
    g->batch = batch;
    return OK;
}

static CUfunction lt_function;
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static void make_lt_function(void) {
    lt_function = egf_cpu_host_function("egf_cpu_cublaslt_matmul", egf_gemm_run, sizeof(EgfGemm));
}

EXPORT int cublasLtMatmul(LtHandle *handle, MatmulDesc *desc, const void *alpha, const void *A,
                          Layout *Adesc, const void *B, Layout *Bdesc, const void *beta,
                          const void *C, Layout *Cdesc, void *D, Layout *Ddesc, const void *algo,
                          void *workspace, size_t workspaceSize, void *stream) {
    char message[512];
    snprintf(message, sizeof message,
             "A=0X%llX Adesc=0X%llX B=0X%llX Bdesc=0X%llX C=0X%llX Cdesc=0X%llX D=0X%llX "
             "Ddesc=0X%llX computeDesc=0X%llX algo=0X%llX workSpace=0X%llX "
             "workSpaceSizeInBytes=%zu stream=0X%llX",
             (unsigned long long)(uintptr_t)A, (unsigned long long)(uintptr_t)Adesc,
             (unsigned long long)(uintptr_t)B, (unsigned long long)(uintptr_t)Bdesc,
             (unsigned long long)(uintptr_t)C, (unsigned long long)(uintptr_t)Cdesc,
             (unsigned long long)(uintptr_t)D, (unsigned long long)(uintptr_t)Ddesc,
             (unsigned long long)(uintptr_t)desc, (unsigned long long)(uintptr_t)algo,
             (unsigned long long)(uintptr_t)workspace, workspaceSize,
             (unsigned long long)(uintptr_t)stream);
    lt_trace("cublasLtMatmul", message);
    if (!handle) return NOT_INITIALIZED;
    if (!desc || !Adesc || !Bdesc || !Ddesc || !alpha || !beta) return INVALID_VALUE;
    const Layout *layouts[4] = {Adesc, Bdesc, Cdesc ? Cdesc : Ddesc, Ddesc};
    int bad = modeled(desc, layouts);
    if (bad) return bad;
    EgfGemm g;
    memset(&g, 0, sizeof g);
    if ((bad = check(desc, layouts, &g))) return bad;
    if (desc->attr[2] == 1 && (!egf_cpu_in_device(alpha, 4) || !egf_cpu_in_device(beta, 4)))
        return INVALID_VALUE;
    memcpy(&g.alpha, alpha, 4);
    memcpy(&g.beta, beta, 4);
    g.A = A, g.B = B, g.C = C ? C : D, g.D = D;
    if (desc->attr[7] & EPILOGUE_BIAS) {
        if (!desc->wide[DESC_BIAS_POINTER] || g.batch > 1) return INVALID_VALUE;
        g.bias = (const float *)(uintptr_t)desc->wide[DESC_BIAS_POINTER];
    }
    g.relu = (desc->attr[7] & EPILOGUE_RELU) != 0;
    const char *outside = egf_gemm_outside(&g);
    if (outside) {
        fprintf(stderr,
                "egf-audit capture --cpu: cublasLtMatmul: operand %s leaves its device "
                "allocation: not computed (on a GPU it would read or write memory that is not "
                "its own)\n",
                outside);
        return OK;
    }
    pthread_once(&lt_once, make_lt_function);
    void *params[1] = {&g};
    CUresult rc = cuLaunchKernel(lt_function, 1, 1, 1, 1, 1, 1, 0, (CUstream)stream, params, NULL);
    return rc == CUDA_SUCCESS ? OK : EXECUTION_FAILED;
}
