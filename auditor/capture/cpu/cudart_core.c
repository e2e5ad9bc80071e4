/* libcudart for `egf-audit capture --cpu`: errors, the fat binaries nvcc registers, launches.
 *
 * A program built with `nvcc -cudart shared` registers each kernel's host stub with its device
 * name (__cudaRegisterFunction); a `<<<>>>` launch then asks for the kernel of its stub
 * (__cudaGetKernel) and launches it (__cudaLaunchKernel). The kernel is the one of that name in
 * the --kernels sources, compiled for the CPU (the fake libcuda finds it): the launch goes on
 * through cudaLaunchKernel to the driver's cuLaunchKernel, each firing its callbacks, as
 * NVIDIA's runtime does. Device code of the fat binary itself is never read.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudart_internal.h"

static __thread cudaError_t tl_last = cudaSuccess;
static pthread_once_t start_once = PTHREAD_ONCE_INIT;

static void start(void) { cuInit(0); }
HIDDEN void egf_rt_start(void) { pthread_once(&start_once, start); }

HIDDEN cudaError_t egf_rt_set(cudaError_t e) {
    if (e != cudaSuccess) tl_last = e;
    return e;
}

HIDDEN cudaError_t egf_rt_error(CUresult rc) {
    switch (rc) {
        case CUDA_SUCCESS: return cudaSuccess;
        case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
        case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
        case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
        case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
        case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
        case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
        case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
        default: return cudaErrorUnknown;
    }
}

typedef egf_rt_no_params cudaGetLastError_v3020_params;
typedef egf_rt_no_params cudaPeekAtLastError_v3020_params;

cudaError_t CUDARTAPI cudaGetLastError(void) {
    RUNTIME_CALL(cudaGetLastError_v3020, "cudaGetLastError", NULL, 0);
    cudaError_t e = tl_last;
    tl_last = cudaSuccess;
    egf_cpu_exit(&c_, &e);
    return e;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) {
    RUNTIME_CALL(cudaPeekAtLastError_v3020, "cudaPeekAtLastError", NULL, 0);
    cudaError_t e = tl_last;
    egf_cpu_exit(&c_, &e);
    return e;
}

const char *CUDARTAPI cudaGetErrorName(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInitializationError: return "cudaErrorInitializationError";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
        case cudaErrorSymbolNotFound: return "cudaErrorSymbolNotFound";
        case cudaErrorNotSupported: return "cudaErrorNotSupported";
        case cudaErrorMissingConfiguration: return "cudaErrorMissingConfiguration";
        default: return "cudaErrorUnknown";
    }
}

const char *CUDARTAPI cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidDeviceFunction: return "invalid device function";
        case cudaErrorNotSupported: return "operation not supported (egf-audit capture --cpu)";
        default: return cudaGetErrorName(error);
    }
}

/* ---- registered kernels: host stub -> device name ---- */
typedef struct {
    const void *stub;
    char *symbol;
    CUfunction f;  // found at its first use
} Registered;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Registered *registered;
static int registered_count;

void **CUDARTAPI __cudaRegisterFatBinary(void *fatCubin) {
    static void *handles[64];
    static int used;
    void **handle = used < 64 ? &handles[used++] : malloc(sizeof(void *));
    if (handle) *handle = fatCubin;
    return handle;
}

void CUDARTAPI __cudaRegisterFatBinaryEnd(void **fatCubinHandle) { (void)fatCubinHandle; }
void CUDARTAPI __cudaUnregisterFatBinary(void **fatCubinHandle) { (void)fatCubinHandle; }
char CUDARTAPI __cudaInitModule(void **fatCubinHandle) {
    (void)fatCubinHandle;
    return 1;
}

void CUDARTAPI __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                      const char *deviceName, int thread_limit, uint3 *tid,
                                      uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize) {
    (void)fatCubinHandle, (void)deviceName, (void)thread_limit, (void)tid, (void)bid;
    (void)bDim, (void)gDim, (void)wSize;
    pthread_mutex_lock(&lock);
    Registered *grown = realloc(registered, (size_t)(registered_count + 1) * sizeof *grown);
    if (grown) {
        registered = grown;
        registered[registered_count++] = (Registered){hostFun, strdup(deviceFun), NULL};
    }
    pthread_mutex_unlock(&lock);
}

void CUDARTAPI __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                                 const char *deviceName, int ext, size_t size, int constant,
                                 int global) {
    (void)fatCubinHandle, (void)hostVar, (void)deviceAddress, (void)ext, (void)size;
    (void)constant, (void)global;
    (void)deviceName;  // refused where the program reaches it (cudaMemcpyToSymbol, ...)
}

void CUDARTAPI __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress,
                                        char *deviceAddress, const char *deviceName, int ext,
                                        size_t size, int constant, int global) {
    (void)fatCubinHandle, (void)hostVarPtrAddress, (void)deviceAddress, (void)ext, (void)size;
    (void)constant, (void)global;
    char why[512];
    snprintf(why, sizeof why, "__managed__ variable %s: managed memory is not modeled", deviceName);
    egf_cpu_refuse("__cudaRegisterManagedVar", why);
}

void CUDARTAPI __cudaRegisterTexture(void **fatCubinHandle, const void *hostVar,
                                     const void **deviceAddress, const char *deviceName, int dim,
                                     int norm, int ext) {
    (void)fatCubinHandle, (void)hostVar, (void)deviceAddress, (void)deviceName, (void)dim;
    (void)norm, (void)ext;
    egf_cpu_refuse("__cudaRegisterTexture", "textures are not modeled");
}

void CUDARTAPI __cudaRegisterSurface(void **fatCubinHandle, const void *hostVar,
                                     const void **deviceAddress, const char *deviceName, int dim,
                                     int ext) {
    (void)fatCubinHandle, (void)hostVar, (void)deviceAddress, (void)deviceName, (void)dim;
    (void)ext;
    egf_cpu_refuse("__cudaRegisterSurface", "surfaces are not modeled");
}

// The kernel of a registered stub (NULL: not a stub), found in the --kernels sources by its
// device name at its first use.
static CUfunction stub_function(const void *stub) {
    CUfunction f = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < registered_count; ++i) {
        if (registered[i].stub != stub) continue;
        if (!registered[i].f) registered[i].f = egf_cpu_function_named(registered[i].symbol);
        f = registered[i].f;
        break;
    }
    pthread_mutex_unlock(&lock);
    return f;
}

// A launch's `func`: a registered host stub, or a kernel handle this runtime handed out.
static CUfunction launch_function(const void *func) {
    CUfunction f = stub_function(func);
    if (f) return f;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < registered_count && !f; ++i)
        if (registered[i].f && (const void *)registered[i].f == func) f = registered[i].f;
    pthread_mutex_unlock(&lock);
    return f;
}

static const char *symbol_of(const void *func) {
    CUfunction f = launch_function(func);
    return f ? egf_cpu_function_symbol(f) : NULL;
}

/* ---- <<<>>> ---- */
typedef struct {
    dim3 grid, block;
    size_t shared;
    void *stream;
} Configuration;
static __thread Configuration tl_config[16];
static __thread int tl_configs;

unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                               struct CUstream_st *stream) {
    if (tl_configs >= 16) return 1;
    tl_config[tl_configs++] = (Configuration){gridDim, blockDim, sharedMem, stream};
    return 0;
}

cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                                 void *stream) {
    if (tl_configs <= 0) return egf_rt_set(cudaErrorMissingConfiguration);
    Configuration c = tl_config[--tl_configs];
    *gridDim = c.grid, *blockDim = c.block, *sharedMem = c.shared;
    *(void **)stream = c.stream;
    return cudaSuccess;
}

typedef struct {
    cudaKernel_t *kernelPtr;
    const void *entryFuncAddr;
} __cudaGetKernel_v13000_params;

static cudaError_t get_kernel(cudaKernel_t *kernelPtr, const void *entryFuncAddr) {
    if (!kernelPtr) return cudaErrorInvalidValue;
    CUfunction f = stub_function(entryFuncAddr);
    if (!f) return cudaErrorInvalidDeviceFunction;
    *kernelPtr = (cudaKernel_t)f;
    return cudaSuccess;
}

cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t *kernelPtr, const void *entryFuncAddr) {
    RUNTIME_CALL(__cudaGetKernel_v13000, "__cudaGetKernel", NULL, kernelPtr, entryFuncAddr);
    RUNTIME_RETURN(get_kernel(kernelPtr, entryFuncAddr));
}

cudaError_t CUDARTAPI cudaGetKernel(cudaKernel_t *kernelPtr, const void *entryFuncAddr) {
    RUNTIME_CALL(cudaGetKernel_v12000, "cudaGetKernel", NULL, kernelPtr, entryFuncAddr);
    RUNTIME_RETURN(get_kernel(kernelPtr, entryFuncAddr));
}

cudaError_t CUDARTAPI cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr) {
    RUNTIME_CALL(cudaGetFuncBySymbol_v11000, "cudaGetFuncBySymbol", NULL, functionPtr, symbolPtr);
    if (!functionPtr) RUNTIME_RETURN(cudaErrorInvalidValue);
    CUfunction f = stub_function(symbolPtr);  // a host stub only, as NVIDIA's runtime answers
    if (!f) RUNTIME_RETURN(cudaErrorInvalidDeviceFunction);
    *functionPtr = (cudaFunction_t)f;
    RUNTIME_RETURN(cudaSuccess);
}

static cudaError_t launch(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                          cudaStream_t stream) {
    CUfunction f = launch_function(func);
    if (!f) return cudaErrorInvalidDeviceFunction;
    return egf_rt_error(cuLaunchKernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                       (unsigned)shared, (CUstream)stream, args, NULL));
}

cudaError_t CUDARTAPI cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                       size_t sharedMem, cudaStream_t stream) {
    RUNTIME_CALL(cudaLaunchKernel_v7000, "cudaLaunchKernel", symbol_of(func), func, gridDim,
                 blockDim, args, sharedMem, stream);
    RUNTIME_RETURN(launch(func, gridDim, blockDim, args, sharedMem, stream));
}

cudaError_t CUDARTAPI cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim,
                                            void **args, size_t sharedMem, cudaStream_t stream) {
    RUNTIME_CALL(cudaLaunchKernel_ptsz_v7000, "cudaLaunchKernel_ptsz", symbol_of(func), func,
                 gridDim, blockDim, args, sharedMem, stream);
    RUNTIME_RETURN(launch(func, gridDim, blockDim, args, sharedMem, stream));
}

static cudaError_t launch_ex(const cudaLaunchConfig_t *config, const void *func, void **args) {
    if (!config) return cudaErrorInvalidValue;
    for (unsigned i = 0; i < config->numAttrs; ++i) {
        if (config->attrs[i].id == cudaLaunchAttributeCooperative && config->attrs[i].val.cooperative) {
            egf_cpu_refuse("cudaLaunchKernelExC", "a cooperative launch (grid-wide synchronisation)");
            return cudaErrorNotSupported;
        }
        if (config->attrs[i].id == cudaLaunchAttributeClusterDimension) {
            egf_cpu_refuse("cudaLaunchKernelExC", "a launch in thread block clusters");
            return cudaErrorNotSupported;
        }
    }
    return launch(func, config->gridDim, config->blockDim, args, config->dynamicSmemBytes,
                  config->stream);
}

cudaError_t CUDARTAPI cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
                                          void **args) {
    RUNTIME_CALL(cudaLaunchKernelExC_v11060, "cudaLaunchKernelExC", symbol_of(func), config, func,
                 args);
    RUNTIME_RETURN(launch_ex(config, func, args));
}

/* nvcc 13's <<<>>>: the kernel handle of __cudaGetKernel, launched through cudaLaunchKernel */
typedef struct {
    cudaKernel_t kernel;
    dim3 gridDim, blockDim;
    void **args;
    size_t sharedMem;
    cudaStream_t stream;
} __cudaLaunchKernel_v13000_params;
typedef __cudaLaunchKernel_v13000_params __cudaLaunchKernel_ptsz_v13000_params;

cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                         void **args, size_t sharedMem, cudaStream_t stream) {
    RUNTIME_CALL(__cudaLaunchKernel_v13000, "__cudaLaunchKernel", symbol_of(kernel), kernel,
                 gridDim, blockDim, args, sharedMem, stream);
    RUNTIME_RETURN(cudaLaunchKernel((const void *)kernel, gridDim, blockDim, args, sharedMem, stream));
}

cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                              void **args, size_t sharedMem, cudaStream_t stream) {
    RUNTIME_CALL(__cudaLaunchKernel_ptsz_v13000, "__cudaLaunchKernel_ptsz", symbol_of(kernel),
                 kernel, gridDim, blockDim, args, sharedMem, stream);
    RUNTIME_RETURN(cudaLaunchKernel_ptsz((const void *)kernel, gridDim, blockDim, args, sharedMem,
                                         stream));
}

cudaError_t CUDARTAPI cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func) {
    RUNTIME_CALL(cudaFuncGetAttributes_v3020, "cudaFuncGetAttributes", NULL, attr, func);
    if (!attr) RUNTIME_RETURN(cudaErrorInvalidValue);
    if (!launch_function(func)) RUNTIME_RETURN(cudaErrorInvalidDeviceFunction);
    memset(attr, 0, sizeof *attr);
    attr->maxThreadsPerBlock = 1024;
    attr->ptxVersion = attr->binaryVersion = 90;
    RUNTIME_RETURN(cudaSuccess);
}

cudaError_t CUDARTAPI cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    RUNTIME_CALL(cudaFuncSetAttribute_v9000, "cudaFuncSetAttribute", NULL, func, attr, value);
    RUNTIME_RETURN(launch_function(func) ? cudaSuccess : cudaErrorInvalidDeviceFunction);
}

cudaError_t CUDARTAPI cudaFuncSetCacheConfig(const void *func, enum cudaFuncCache cacheConfig) {
    RUNTIME_CALL(cudaFuncSetCacheConfig_v3020, "cudaFuncSetCacheConfig", NULL, func, cacheConfig);
    RUNTIME_RETURN(launch_function(func) ? cudaSuccess : cudaErrorInvalidDeviceFunction);
}
