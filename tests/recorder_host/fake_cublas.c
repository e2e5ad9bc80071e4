// libcublas.so.13 for the host replay: the logger calls the recorder turns on, and the two
// questions it asks of a handle while a call is logged (which, as cuBLAS's do, log themselves).
#include <stddef.h>

#include "fake_abi.h"

typedef void (*LogCallback)(const char *);
static LogCallback logger;
static int logging;

int cublasLoggerConfigure(int on, int to_stdout, int to_stderr, const char *file) {
    (void)to_stdout, (void)to_stderr, (void)file;
    logging = on;
    return 0;
}

int cublasSetLoggerCallback(LogCallback callback) {
    logger = callback;
    return 0;
}

static void log_message(const char *msg) {
    if (logging && logger) logger(msg);
}

int cublasGetPointerMode_v2(void *handle, int *mode) {
    log_message("I! cuBLAS (v13.1.0) function cublasStatus_t cublasGetPointerMode_v2("
                "cublasHandle_t, cublasPointerMode_t*) called:\n");
    *mode = ((const FakeHandle *)handle)->pointer_mode;
    return 0;
}

int cublasGetStream_v2(void *handle, void **stream) {
    log_message("I! cuBLAS (v13.1.0) function cublasStatus_t cublasGetStream_v2(cublasHandle_t, "
                "cudaStream_t*) called:\n");
    *stream = ((const FakeHandle *)handle)->stream;
    return 0;
}

void fake_cublas_call(const char *const *messages, int n, void (*inside)(void)) {
    for (int i = 0; i < n; ++i) log_message(messages[i]);
    if (inside) inside();
}
