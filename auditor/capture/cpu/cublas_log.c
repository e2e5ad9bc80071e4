/* The fake libcublas's API logger (cublas_log.h). */
#define _GNU_SOURCE
#include "cublas_log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HIDDEN __attribute__((visibility("hidden")))
#define EXPORT __attribute__((visibility("default")))
#define VERSION "13.1.0"  // the cuBLAS whose API and log format this models

static struct {
    int on, to_stdout, to_stderr;
    FILE *file;
    CublasLogCallback callback;
    struct timespec start;
    int started;
} log_ = {0};
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

// CUBLAS_LOGINFO_DBG / CUBLAS_LOGDEST_DBG, read once as cuBLAS reads them when it loads
static void from_environment(void) {
    clock_gettime(CLOCK_REALTIME, &log_.start);
    const char *on = getenv("CUBLAS_LOGINFO_DBG");
    if (!on || strcmp(on, "1") != 0) return;
    log_.on = 1;
    const char *dest = getenv("CUBLAS_LOGDEST_DBG");
    if (!dest || !strcmp(dest, "stdout"))
        log_.to_stdout = 1;
    else if (!strcmp(dest, "stderr"))
        log_.to_stderr = 1;
    else
        log_.file = fopen(dest, "w");
}

EXPORT int cublasLoggerConfigure(int logIsOn, int logToStdOut, int logToStdErr, const char *logFileName) {
    pthread_once(&env_once, from_environment);
    log_.on = logIsOn != 0;
    log_.to_stdout = logToStdOut != 0;
    log_.to_stderr = logToStdErr != 0;
    if (log_.file) fclose(log_.file);
    log_.file = logFileName && *logFileName ? fopen(logFileName, "w") : NULL;
    return 0;
}

EXPORT int cublasSetLoggerCallback(CublasLogCallback userCallback) {
    pthread_once(&env_once, from_environment);
    log_.callback = userCallback;
    return 0;
}

EXPORT int cublasGetLoggerCallback(CublasLogCallback *userCallback) {
    if (!userCallback) return 7;  // CUBLAS_STATUS_INVALID_VALUE
    *userCallback = log_.callback;
    return 0;
}

HIDDEN int egf_log_on(void) {
    pthread_once(&env_once, from_environment);
    return log_.on;
}

static void line(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (log_.callback) log_.callback(buf);
    if (log_.to_stdout) fputs(buf, stdout);
    if (log_.to_stderr) fputs(buf, stderr);
    if (log_.file) fputs(buf, log_.file);
}

HIDDEN void egf_log_begin(const char *function, const char *prototype) {
    line("I! cuBLAS (v" VERSION ") function cublasStatus_t %s(%s) called:\n", function, prototype);
}

HIDDEN void egf_log_ptr(const char *arg, const char *type, const void *p) {
    line("i!  %s: type=%s; val=POINTER (IN HEX:0x%p)\n", arg, type, p);
}

HIDDEN void egf_log_int(const char *arg, const char *type, long long v) {
    line("i!  %s: type=%s; val=%lld\n", arg, type, v);
}

HIDDEN void egf_log_enum(const char *arg, const char *type, const char *name, int v) {
    line("i!  %s: type=%s; val=%s(%d)\n", arg, type, name, v);
}

static const char *math_mode(int mode) {
    switch (mode & ~16) {
        case 1: return "CUBLAS_TENSOR_OP_MATH";
        case 2: return "CUBLAS_PEDANTIC_MATH";
        case 3: return "CUBLAS_TF32_TENSOR_OP_MATH";
        default: return "CUBLAS_DEFAULT_MATH";
    }
}

HIDDEN void egf_log_end(const Handle *h) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    double seconds = (double)(now.tv_sec - log_.start.tv_sec) + (now.tv_nsec - log_.start.tv_nsec) / 1e9;
    char stamp[32];
    struct tm tm;
    localtime_r(&now.tv_sec, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    line("i! Time: %s elapsed from start %f minutes or %f seconds\n", stamp, seconds / 60.0, seconds);
    line("i!Process=%d; Thread=%lu; GPU=0; Handle=POINTER (IN HEX:0x%p); StreamId=POINTER (IN "
         "HEX:0x%p)%s; MathMode=%s\n",
         (int)getpid(), (unsigned long)pthread_self(), (const void *)h, h ? h->stream : NULL,
         h && h->stream ? "" : " (defaultStream)",
         math_mode(h ? h->math_mode : 0));
#ifdef __VERSION__
    line("i! COMPILED WITH: GNU GCC/G++ / %s\n", __VERSION__);
#endif
}
