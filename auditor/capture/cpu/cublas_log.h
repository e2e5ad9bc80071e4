/* cuBLAS's API logger as the fake libcublas words it: one callback per line, in the format of
 * NVIDIA's (tests/data/cublas_api_sgemm.log is a verbatim one):
 *
 *   I! cuBLAS (v13.1.0) function cublasStatus_t NAME(PROTOTYPE) called:
 *   i!  ARG: type=TYPE; val=VALUE                      one line per argument
 *   i! Time: ...  /  i!Process=...  /  i! COMPILED WITH: ...
 */
#pragma once

typedef void (*CublasLogCallback)(const char *msg);

typedef struct cublasContext {
    int pointer_mode;  // 0 host, 1 device
    int math_mode;
    void *stream;
} Handle;

/* A call's lines are written only while the logger is on (cublasLoggerConfigure, or
 * CUBLAS_LOGINFO_DBG=1 when the library loads). */
int egf_log_on(void);
void egf_log_begin(const char *function, const char *prototype);
void egf_log_ptr(const char *arg, const char *type, const void *p);
void egf_log_int(const char *arg, const char *type, long long v);
void egf_log_enum(const char *arg, const char *type, const char *name, int v);
void egf_log_end(const Handle *h);
