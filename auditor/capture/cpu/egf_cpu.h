/* What egf-audit's CPU stand-ins for the CUDA libraries share (`egf-audit capture --cpu`).
 *
 * The fake libcuda.so.1 holds the state of the "device": host memory handed out as device
 * memory, the kernels compiled for the CPU, the CUPTI subscriber and the refusals. The other
 * fakes (libcupti, libcudart, libcublas, libcublasLt, libnvrtc) link against it and call these
 * functions. CUPTI's callbacks are fired from inside libcuda.so.1, so a subscriber walking the
 * call stack (the recorder's `by`) sees libcuda's frames first and the caller's library next, as
 * with NVIDIA's driver.
 */
#pragma once
#include <cuda.h>
#include <cupti.h>
#include <stddef.h>
#include <stdint.h>

#define EGF_CPU_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* One API call as CUPTI reports it: ENTER before the work, EXIT after it, the same
 * correlation data at both. */
typedef struct {
    CUpti_CallbackData data;
    uint64_t correlation;
    CUpti_CallbackDomain domain;
    CUpti_CallbackId cbid;
    int fired;
} EgfCall;

EGF_CPU_API void egf_cpu_enter(EgfCall *call, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                               const char *name, const void *params, const char *symbol);
EGF_CPU_API void egf_cpu_exit(EgfCall *call, void *result);

/* CUPTI's subscriber, set by the fake libcupti. */
EGF_CPU_API int egf_cpu_subscribe(CUpti_CallbackFunc callback, void *userdata);
EGF_CPU_API void egf_cpu_unsubscribe(void);
EGF_CPU_API void egf_cpu_enable(CUpti_CallbackDomain domain, int cbid, int enable);  // cbid -1: all
EGF_CPU_API int egf_cpu_enabled(CUpti_CallbackDomain domain, int cbid);

/* A call egf-audit does not model: said once on stderr and written to the refusals file
 * (EGF_CPU_REFUSALS), which `egf-audit capture --cpu` turns into exit 2 naming it. */
EGF_CPU_API void egf_cpu_refuse(const char *name, const char *why);
EGF_CPU_API CUresult egf_cpu_unmodeled(const char *name);

/* Device memory is host memory: allocations inside guard zones. */
EGF_CPU_API void *egf_cpu_alloc(size_t bytes);
EGF_CPU_API int egf_cpu_free(void *ptr);  // 0 when ptr is no allocation's start
/* 1 when [ptr, ptr + bytes) lies inside one live allocation (bytes may be 0). */
EGF_CPU_API int egf_cpu_in_device(const void *ptr, size_t bytes);
EGF_CPU_API void egf_cpu_check_guards(const char *after);

/* Kernels: by symbol (mangled or extern "C") or by the identifier of a C++ name. */
EGF_CPU_API CUfunction egf_cpu_function_named(const char *symbol);
/* A launchable function of egf-audit's own (cuBLAS's GEMMs): one struct parameter. */
EGF_CPU_API CUfunction egf_cpu_host_function(const char *symbol, void (*run)(void *), size_t bytes);
EGF_CPU_API const char *egf_cpu_function_symbol(CUfunction f);

#ifdef __cplusplus
}
#endif
