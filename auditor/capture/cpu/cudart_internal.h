/* What the units of the fake libcudart share (never exported). */
#pragma once
#include <cuda_runtime_api.h>

#include "egf_cpu.h"

#define HIDDEN __attribute__((visibility("hidden")))

HIDDEN cudaError_t egf_rt_error(CUresult rc);  // a driver result as the runtime's, kept as last
HIDDEN cudaError_t egf_rt_set(cudaError_t e);  // kept as the last error when it is one
HIDDEN void egf_rt_start(void);                // cuInit before the first callback

/* The runtime API calls: ENTER, the work, EXIT (runtime domain); the driver calls the work
 * makes fire their own callbacks inside, as with NVIDIA's runtime. */
#define RUNTIME_CALL(CBID, NAME, symbol, ...)                                              \
    CBID##_params p_ = {__VA_ARGS__};                                                      \
    EgfCall c_;                                                                            \
    egf_rt_start();                                                                        \
    egf_cpu_enter(&c_, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_##CBID, NAME, \
                  &p_, symbol)
#define RUNTIME_RETURN(expr)               \
    do {                                   \
        cudaError_t r_ = egf_rt_set(expr); \
        egf_cpu_exit(&c_, &r_);            \
        return r_;                         \
    } while (0)

/* for the calls that take no parameter */
typedef struct {
    int unused;
} egf_rt_no_params;
