/* libcuda.so.1 for `egf-audit capture --cpu`: versions, the device, contexts, streams, events.
 *
 * One device, the CPU: it has one primary context, and every stream runs in order (each call
 * has finished when it returns), so synchronising is immediate and events time host work.
 * Memory, modules and launches are in driver_memory_api.c and driver_launch_api.c.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <time.h>

#include "driver_internal.h"

#define DRIVER_VERSION 13000
static struct CUctx_st {
    int unused;
} primary;
static __thread CUcontext tl_current;
static __thread int tl_current_set;

HIDDEN CUcontext egf_cpu_primary_context(void) { return &primary; }

CUresult CUDAAPI cuInit(unsigned int Flags) {
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    return egf_cpu_init();
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = DRIVER_VERSION;
    return CUDA_SUCCESS;
}

// the results the fakes return: their names and their words, as NVIDIA's driver gives them
static const struct {
    CUresult code;
    const char *name, *words;
} RESULTS[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
     "operation not supported (egf-audit capture --cpu)"},
};

static CUresult result_text(CUresult error, const char **pStr, int name) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof RESULTS / sizeof *RESULTS; ++i) {
        if (RESULTS[i].code != error) continue;
        *pStr = name ? RESULTS[i].name : RESULTS[i].words;
        return CUDA_SUCCESS;
    }
    *pStr = name ? "CUDA_ERROR_UNKNOWN" : "unknown error";
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
    return result_text(error, pStr, 0);
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
    return result_text(error, pStr, 1);
}

/* A CUDA runtime of NVIDIA's (linked statically into a program, or a shared one that is not
 * egf-audit's) reaches the driver through private tables: they are not modeled. */
CUresult CUDAAPI cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId) {
    (void)pExportTableId;
    Dl_info info;
    const char *who = dladdr(__builtin_return_address(0), &info) && info.dli_fname
                          ? info.dli_fname
                          : "the program";
    char why[1400];
    snprintf(why, sizeof why,
             "NVIDIA's CUDA runtime in %s asks the driver for its private interface "
             "(cuGetExportTable), which --cpu cannot stand in for: build the program with "
             "`nvcc -cudart shared` so that it loads libcudart.so, which --cpu provides",
             who);
    egf_cpu_refuse("cuGetExportTable", why);
    if (ppExportTable) *ppExportTable = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- the device ---- */
static CUresult check_device(CUdevice dev) { return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
    DRIVER_CALL(cuDeviceGet, NULL, device, ordinal);
    if (!device) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    if (ordinal != 0) {
        egf_cpu_refuse("cuDeviceGet", "a device other than device 0: --cpu models one device");
        DRIVER_RETURN(CUDA_ERROR_INVALID_DEVICE);
    }
    *device = 0;
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
    DRIVER_CALL(cuDeviceGetCount, NULL, count);
    if (!count) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *count = 1;
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
    DRIVER_CALL(cuDeviceGetName, NULL, name, len, dev);
    if (!name || len <= 0) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    snprintf(name, (size_t)len, "egf-audit capture --cpu (host memory)");
    DRIVER_RETURN(check_device(dev));
}

static size_t host_memory(int free_only) {
    struct sysinfo si;
    if (sysinfo(&si) != 0) return 0;
    return (size_t)(free_only ? si.freeram : si.totalram) * si.mem_unit;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    DRIVER_CALL(cuDeviceTotalMem_v2, NULL, bytes, dev);
    if (!bytes) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *bytes = host_memory(0);
    DRIVER_RETURN(check_device(dev));
}

static int attribute(CUdevice_attribute a) {
    switch (a) {
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
        case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 1;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
        case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
        case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
        case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 0;
        case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1000000;
        case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
        case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 0;
        case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 0;
        default: return 0;
    }
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    DRIVER_CALL(cuDeviceGetAttribute, NULL, pi, attrib, dev);
    if (!pi) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *pi = attribute(attrib);
    DRIVER_RETURN(check_device(dev));
}

CUresult CUDAAPI cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) {
    DRIVER_CALL(cuDeviceComputeCapability, NULL, major, minor, dev);
    if (!major || !minor) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *major = 9, *minor = 0;
    DRIVER_RETURN(check_device(dev));
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    DRIVER_CALL(cuDeviceGetUuid_v2, NULL, uuid, dev);
    if (!uuid) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    memset(uuid, 0, sizeof *uuid);
    memcpy(uuid->bytes, "egf-audit-cpu", 13);
    DRIVER_RETURN(check_device(dev));
}

/* ---- contexts ---- */
static CUcontext current(void) { return tl_current_set ? tl_current : &primary; }

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    DRIVER_CALL(cuDevicePrimaryCtxRetain, NULL, pctx, dev);
    if (!pctx) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *pctx = &primary;
    DRIVER_RETURN(check_device(dev));
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    DRIVER_CALL(cuDevicePrimaryCtxRelease_v2, NULL, dev);
    DRIVER_RETURN(check_device(dev));
}

CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    DRIVER_CALL(cuDevicePrimaryCtxReset_v2, NULL, dev);
    DRIVER_RETURN(check_device(dev));
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    DRIVER_CALL(cuDevicePrimaryCtxSetFlags_v2, NULL, dev, flags);
    DRIVER_RETURN(check_device(dev));
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    DRIVER_CALL(cuDevicePrimaryCtxGetState, NULL, dev, flags, active);
    if (!flags || !active) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *flags = 0, *active = 1;
    DRIVER_RETURN(check_device(dev));
}

CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                CUdevice dev) {
    DRIVER_CALL(cuCtxCreate_v4, NULL, pctx, params, flags, dev);
    if (!pctx) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *pctx = &primary;  // one device, one memory: every context is the primary one
    tl_current = &primary, tl_current_set = 1;
    DRIVER_RETURN(check_device(dev));
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    return cuCtxCreate_v4(pctx, NULL, flags, dev);
}

CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
    DRIVER_CALL(cuCtxDestroy_v2, NULL, ctx);
    DRIVER_RETURN(ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
    DRIVER_CALL(cuCtxGetCurrent, NULL, pctx);
    if (!pctx) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *pctx = current();
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
    DRIVER_CALL(cuCtxSetCurrent, NULL, ctx);
    tl_current = ctx, tl_current_set = 1;
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
    DRIVER_CALL(cuCtxPushCurrent_v2, NULL, ctx);
    tl_current = ctx, tl_current_set = 1;
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx) {
    DRIVER_CALL(cuCtxPopCurrent_v2, NULL, pctx);
    if (pctx) *pctx = current();
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device) {
    DRIVER_CALL(cuCtxGetDevice, NULL, device);
    if (!device) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *device = 0;
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxGetFlags(unsigned int *flags) {
    DRIVER_CALL(cuCtxGetFlags, NULL, flags);
    if (!flags) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *flags = 0;
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
    DRIVER_CALL(cuCtxGetApiVersion, NULL, ctx, version);
    if (!version) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *version = 3020;
    DRIVER_RETURN(CUDA_SUCCESS);
}

typedef struct {
    int unused;
} cuCtxSynchronize_params;  // it takes none
CUresult CUDAAPI cuCtxSynchronize(void) {
    DRIVER_CALL(cuCtxSynchronize, NULL, 0);
    DRIVER_RETURN(CUDA_SUCCESS);  // every call finished when it returned
}

CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
    DRIVER_CALL(cuCtxSynchronize_v2, NULL, ctx);
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxGetLimit(size_t *pvalue, CUlimit limit) {
    DRIVER_CALL(cuCtxGetLimit, NULL, pvalue, limit);
    if (!pvalue) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *pvalue = limit == CU_LIMIT_STACK_SIZE ? 1024 : limit == CU_LIMIT_PRINTF_FIFO_SIZE ? 1 << 20 : 0;
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
    DRIVER_CALL(cuCtxSetLimit, NULL, limit, value);
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxSetCacheConfig(CUfunc_cache config) {
    DRIVER_CALL(cuCtxSetCacheConfig, NULL, config);
    DRIVER_RETURN(CUDA_SUCCESS);
}

/* ---- streams and events: in order, each call finished when it returns ---- */
struct CUstream_st {
    unsigned int flags;
};
struct CUevent_st {
    struct timespec at;
    int recorded;
};

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    DRIVER_CALL(cuStreamCreate, NULL, phStream, Flags);
    if (!phStream) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *phStream = calloc(1, sizeof **phStream);
    DRIVER_RETURN(*phStream ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    DRIVER_CALL(cuStreamCreateWithPriority, NULL, phStream, flags, priority);
    if (!phStream) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *phStream = calloc(1, sizeof **phStream);
    DRIVER_RETURN(*phStream ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
    DRIVER_CALL(cuStreamDestroy_v2, NULL, hStream);
    free(hStream);
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
    DRIVER_CALL(cuStreamSynchronize, NULL, hStream);
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
    DRIVER_CALL(cuStreamQuery, NULL, hStream);
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    DRIVER_CALL(cuStreamWaitEvent, NULL, hStream, hEvent, Flags);
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    DRIVER_CALL(cuStreamIsCapturing, NULL, hStream, captureStatus);
    if (!captureStatus) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;  // stream capture is refused (graphs)
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData) {
    DRIVER_CALL(cuLaunchHostFunc, NULL, hStream, fn, userData);
    if (!fn) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    fn(userData);  // everything before it in the stream has finished
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    DRIVER_CALL(cuEventCreate, NULL, phEvent, Flags);
    if (!phEvent) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *phEvent = calloc(1, sizeof **phEvent);
    DRIVER_RETURN(*phEvent ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
    DRIVER_CALL(cuEventDestroy_v2, NULL, hEvent);
    free(hEvent);
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
    DRIVER_CALL(cuEventRecord, NULL, hEvent, hStream);
    if (!hEvent) DRIVER_RETURN(CUDA_ERROR_INVALID_HANDLE);
    clock_gettime(CLOCK_MONOTONIC, &hEvent->at);
    hEvent->recorded = 1;
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
    DRIVER_CALL(cuEventRecordWithFlags, NULL, hEvent, hStream, flags);
    if (!hEvent) DRIVER_RETURN(CUDA_ERROR_INVALID_HANDLE);
    clock_gettime(CLOCK_MONOTONIC, &hEvent->at);
    hEvent->recorded = 1;
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
    DRIVER_CALL(cuEventSynchronize, NULL, hEvent);
    DRIVER_RETURN(hEvent ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
    DRIVER_CALL(cuEventQuery, NULL, hEvent);
    DRIVER_RETURN(hEvent ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

static CUresult elapsed(float *ms, CUevent start, CUevent end) {
    if (!ms || !start || !end) return CUDA_ERROR_INVALID_VALUE;
    if (!start->recorded || !end->recorded) return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)((end->at.tv_sec - start->at.tv_sec) * 1e3 + (end->at.tv_nsec - start->at.tv_nsec) / 1e6);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    DRIVER_CALL(cuEventElapsedTime_v2, NULL, pMilliseconds, hStart, hEnd);
    DRIVER_RETURN(elapsed(pMilliseconds, hStart, hEnd));
}

CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    DRIVER_CALL(cuEventElapsedTime, NULL, pMilliseconds, hStart, hEnd);
    DRIVER_RETURN(elapsed(pMilliseconds, hStart, hEnd));
}

/* ---- entry points by name, as NVIDIA's runtime and some bindings look them up ---- */
CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
    (void)cudaVersion, (void)flags;
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    static const char *suffixes[] = {"_v4", "_v3", "_v2", ""};
    void *self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *found = NULL;
    char name[256];
    for (size_t i = 0; !found && self && i < sizeof suffixes / sizeof *suffixes; ++i) {
        snprintf(name, sizeof name, "%s%s", symbol, suffixes[i]);
        found = dlsym(self, name);
    }
    *pfn = found;
    if (status) *status = found ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return found ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
