/* What the units of the fake libcuda.so.1 share among themselves (never exported). */
#pragma once
#include <cuda.h>
#include <cupti.h>

/* cuda.h maps a few names to their newest version; the older symbols are defined too */
#undef cuEventElapsedTime
#undef cuGetProcAddress
CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);

#include "egf_cpu.h"

#define HIDDEN __attribute__((visibility("hidden")))

HIDDEN CUresult egf_cpu_init(void);
HIDDEN int egf_cpu_initialised(void);
HIDDEN CUcontext egf_cpu_primary_context(void);
HIDDEN void egf_cpu_load_kernel_index(void);

/* A kernel: compiled for the CPU from the trainer's source (run != NULL), refused (why), or
 * egf-audit's own (host: cuBLAS's GEMMs). Both CUfunction and CUkernel point at one. */
#define EGF_MAX_PARAMS 64
struct CUfunc_st {
    char *symbol;  // as the module names it: the extern "C" name or the C++-mangled one
    char *name;    // the identifier a source spells (the symbol's last name in C++)
    char *why;     // refused: why it cannot run on the CPU
    void (*run)(const unsigned *grid, const unsigned *block, void **params);
    void (*host)(void *);  // egf-audit's own: one struct parameter
    int program;  // from an NVRTC program's module: found only through that module
    int nparams;
    size_t sizes[EGF_MAX_PARAMS], offsets[EGF_MAX_PARAMS];
    struct CUfunc_st *next;  // every function known, in one list
};

/* A loaded module: the kernels it can hand out. `index` non-NULL for a module compiled by the
 * fake NVRTC (its own kernels); otherwise kernels are looked up by name in the --kernels index,
 * restricted to `entries` where the image could be read (PTX, an ELF cubin). */
struct CUmod_st {
    CUfunction *own;  // NVRTC's: the program's kernels
    int own_count;
    char **entries;   // the names the image defines; NULL: not readable (any name is looked up)
    int entry_count;
    int *entry_params;      // PTX: each entry's parameter count (-1: not read)
    size_t **entry_sizes;   // PTX: and their sizes
};

HIDDEN CUresult egf_cpu_module_load(CUmodule *module, const void *image, size_t size);
HIDDEN CUresult egf_cpu_module_function(CUfunction *f, CUmodule module, const char *name);
HIDDEN CUresult egf_cpu_launch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                               unsigned shared, void **params, void **extra);
HIDDEN void egf_cpu_run_guarded(CUfunction f, const unsigned grid[3], const unsigned block[3],
                                void **store, const char *what);
HIDDEN CUresult egf_cpu_param_info(CUfunction f, size_t i, size_t *offset, size_t *size);

/* The API calls themselves: ENTER, the work, EXIT (driver domain). */
#define DRIVER_CALL(NAME, symbol, ...)                                                         \
    NAME##_params p_ = {__VA_ARGS__};                                                          \
    EgfCall c_;                                                                                \
    if (!egf_cpu_initialised()) return CUDA_ERROR_NOT_INITIALIZED;                             \
    egf_cpu_enter(&c_, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_##NAME, #NAME, &p_, \
                  symbol)
#define DRIVER_RETURN(expr)       \
    do {                          \
        CUresult r_ = (expr);     \
        egf_cpu_exit(&c_, &r_);   \
        return r_;                \
    } while (0)
