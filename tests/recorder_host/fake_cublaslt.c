// libcublasLt.so.13 for the host replay: its logger (API trace), the attribute getters of a
// matrix layout and a matmul descriptor, and a cublasLtMatmul that logs its call as cuBLASLt
// does (the recorder's own cublasLtMatmul, preloaded, stands in front of this one).
#include <stdio.h>
#include <string.h>

#include "fake_abi.h"

typedef void (*LtLogger)(int, const char *, const char *);
static LtLogger logger;
static int mask;
int fake_lt_calls;  // how many calls reached this cublasLtMatmul

int cublasLtLoggerSetCallback(LtLogger callback) {
    logger = callback;
    return 0;
}
int cublasLtLoggerSetMask(int m) {
    mask = m;
    return 0;
}
int cublasLtLoggerSetFile(FILE *file) { return file ? 0 : 7; }

static int attribute(const void *value, size_t value_bytes, void *buf, size_t size,
                     size_t *written) {
    if (size != value_bytes) return 7;  // CUBLAS_STATUS_INVALID_VALUE
    memcpy(buf, value, size);
    if (written) *written = size;
    return 0;
}

int cublasLtMatrixLayoutGetAttribute(const void *layout, int attr, void *buf, size_t size,
                                     size_t *written) {
    static const size_t bytes[7] = {4, 4, 8, 8, 8, 4, 8};
    if (attr < 0 || attr > 6) return 7;
    int64_t wide = ((const FakeLayout *)layout)->attrs[attr];
    int32_t narrow = (int32_t)wide;
    return attribute(bytes[attr] == 4 ? (const void *)&narrow : (const void *)&wide, bytes[attr],
                     buf, size, written);
}

int cublasLtMatmulDescGetAttribute(const void *desc, int attr, void *buf, size_t size,
                                   size_t *written) {
    const FakeMatmulDesc *d = desc;
    if (attr >= 0 && attr <= 4) return attribute(&d->attrs[attr], 4, buf, size, written);
    if (attr == 7) return attribute(&d->epilogue, 4, buf, size, written);
    if (attr == 8) return attribute(&d->bias, 8, buf, size, written);
    if (attr == 11) return attribute(&d->aux, 8, buf, size, written);
    if (attr == 12) return attribute(&d->aux_ld, 8, buf, size, written);
    return 7;
}

int cublasLtMatmul(void *handle, void *desc, const void *alpha, const void *A, void *adesc,
                   const void *B, void *bdesc, const void *beta, const void *C, void *cdesc,
                   void *D, void *ddesc, const void *algo, void *workspace, size_t workspace_bytes,
                   void *stream) {
    (void)handle, (void)alpha, (void)beta;
    ++fake_lt_calls;
    char msg[512];
#define U(p) ((unsigned long long)(uintptr_t)(p))
    snprintf(msg, sizeof msg,
             "A=0X%llX Adesc=0X%llX B=0X%llX Bdesc=0X%llX C=0X%llX Cdesc=0X%llX D=0X%llX "
             "Ddesc=0X%llX computeDesc=0X%llX algo=0X%llX workSpace=0X%llX "
             "workSpaceSizeInBytes=%zu stream=0X%llX",
             U(A), U(adesc), U(B), U(bdesc), U(C), U(cdesc), U(D), U(ddesc), U(desc), U(algo),
             U(workspace), workspace_bytes, U(stream));
    if (logger && (mask & 16)) logger(4, "cublasLtMatmul", msg);
    return 0;
}
