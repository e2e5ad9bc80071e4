/* libcudart for `egf-audit capture --cpu`: memory, the device, streams and events, each on the
 * fake driver's entry point NVIDIA's runtime reaches for it (cudaMalloc -> cuMemAlloc_v2,
 * cudaMemcpy -> cuMemcpyHtoD_v2 / DtoH / DtoD, cudaMemsetAsync -> cuMemsetD8Async, ...), so
 * the recorder sees the same driver calls inside the runtime's as on a GPU. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cudart_internal.h"

typedef egf_rt_no_params cudaDeviceSynchronize_v3020_params;
typedef egf_rt_no_params cudaDeviceReset_v3020_params;
typedef struct {
    float *ms;
    cudaEvent_t start, end;
} cudaEventElapsedTime_v3020_params;

static CUdeviceptr dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

/* ---- memory ---- */
cudaError_t CUDARTAPI cudaMalloc(void **devPtr, size_t size) {
    RUNTIME_CALL(cudaMalloc_v3020, "cudaMalloc", NULL, devPtr, size);
    if (!devPtr) RUNTIME_RETURN(cudaErrorInvalidValue);
    if (size == 0) {
        *devPtr = NULL;
        RUNTIME_RETURN(cudaSuccess);
    }
    CUdeviceptr p = 0;
    cudaError_t e = egf_rt_error(cuMemAlloc_v2(&p, size));
    *devPtr = (void *)(uintptr_t)p;
    RUNTIME_RETURN(e);
}

cudaError_t CUDARTAPI cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
    RUNTIME_CALL(cudaMallocAsync_v11020, "cudaMallocAsync", NULL, devPtr, size, hStream);
    if (!devPtr) RUNTIME_RETURN(cudaErrorInvalidValue);
    CUdeviceptr p = 0;
    cudaError_t e = size ? egf_rt_error(cuMemAllocAsync(&p, size, (CUstream)hStream)) : cudaSuccess;
    *devPtr = (void *)(uintptr_t)p;
    RUNTIME_RETURN(e);
}

cudaError_t CUDARTAPI cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
    RUNTIME_CALL(cudaMallocPitch_v3020, "cudaMallocPitch", NULL, devPtr, pitch, width, height);
    if (!devPtr) RUNTIME_RETURN(cudaErrorInvalidValue);
    CUdeviceptr p = 0;
    cudaError_t e = egf_rt_error(cuMemAllocPitch_v2(&p, pitch, width, height, 4));
    *devPtr = (void *)(uintptr_t)p;
    RUNTIME_RETURN(e);
}

cudaError_t CUDARTAPI cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    RUNTIME_CALL(cudaMallocManaged_v6000, "cudaMallocManaged", NULL, devPtr, size, flags);
    CUdeviceptr p = 0;
    RUNTIME_RETURN(egf_rt_error(cuMemAllocManaged(&p, size, flags)));
}

cudaError_t CUDARTAPI cudaFree(void *devPtr) {
    RUNTIME_CALL(cudaFree_v3020, "cudaFree", NULL, devPtr);
    RUNTIME_RETURN(devPtr ? egf_rt_error(cuMemFree_v2(dptr(devPtr))) : cudaSuccess);
}

cudaError_t CUDARTAPI cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
    RUNTIME_CALL(cudaFreeAsync_v11020, "cudaFreeAsync", NULL, devPtr, hStream);
    RUNTIME_RETURN(devPtr ? egf_rt_error(cuMemFreeAsync(dptr(devPtr), (CUstream)hStream)) : cudaSuccess);
}

cudaError_t CUDARTAPI cudaMallocHost(void **ptr, size_t size) {
    RUNTIME_CALL(cudaMallocHost_v3020, "cudaMallocHost", NULL, ptr, size);
    RUNTIME_RETURN(egf_rt_error(cuMemAllocHost_v2(ptr, size)));
}

cudaError_t CUDARTAPI cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    RUNTIME_CALL(cudaHostAlloc_v3020, "cudaHostAlloc", NULL, pHost, size, flags);
    RUNTIME_RETURN(egf_rt_error(cuMemHostAlloc(pHost, size, flags)));
}

cudaError_t CUDARTAPI cudaFreeHost(void *ptr) {
    RUNTIME_CALL(cudaFreeHost_v3020, "cudaFreeHost", NULL, ptr);
    RUNTIME_RETURN(egf_rt_error(cuMemFreeHost(ptr)));
}

cudaError_t CUDARTAPI cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
    RUNTIME_CALL(cudaHostRegister_v4000, "cudaHostRegister", NULL, ptr, size, flags);
    RUNTIME_RETURN(egf_rt_error(cuMemHostRegister_v2(ptr, size, flags)));
}

cudaError_t CUDARTAPI cudaHostUnregister(void *ptr) {
    RUNTIME_CALL(cudaHostUnregister_v4000, "cudaHostUnregister", NULL, ptr);
    RUNTIME_RETURN(egf_rt_error(cuMemHostUnregister(ptr)));
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t *free_, size_t *total) {
    RUNTIME_CALL(cudaMemGetInfo_v3020, "cudaMemGetInfo", NULL, free_, total);
    RUNTIME_RETURN(egf_rt_error(cuMemGetInfo_v2(free_, total)));
}

static cudaError_t copy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                        cudaStream_t stream, int async) {
    CUstream s = (CUstream)stream;
    switch (kind) {
        case cudaMemcpyHostToHost:
            if (count) memmove(dst, src, count);
            return cudaSuccess;
        case cudaMemcpyHostToDevice:
            return egf_rt_error(async ? cuMemcpyHtoDAsync_v2(dptr(dst), src, count, s)
                                      : cuMemcpyHtoD_v2(dptr(dst), src, count));
        case cudaMemcpyDeviceToHost:
            return egf_rt_error(async ? cuMemcpyDtoHAsync_v2(dst, dptr(src), count, s)
                                      : cuMemcpyDtoH_v2(dst, dptr(src), count));
        case cudaMemcpyDeviceToDevice:
            return egf_rt_error(async ? cuMemcpyDtoDAsync_v2(dptr(dst), dptr(src), count, s)
                                      : cuMemcpyDtoD_v2(dptr(dst), dptr(src), count));
        case cudaMemcpyDefault:
            return egf_rt_error(async ? cuMemcpyAsync(dptr(dst), dptr(src), count, s)
                                      : cuMemcpy(dptr(dst), dptr(src), count));
        default:
            return cudaErrorInvalidMemcpyDirection;
    }
}

cudaError_t CUDARTAPI cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    RUNTIME_CALL(cudaMemcpy_v3020, "cudaMemcpy", NULL, dst, src, count, kind);
    RUNTIME_RETURN(copy(dst, src, count, kind, 0, 0));
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                      enum cudaMemcpyKind kind, cudaStream_t stream) {
    RUNTIME_CALL(cudaMemcpyAsync_v3020, "cudaMemcpyAsync", NULL, dst, src, count, kind, stream);
    RUNTIME_RETURN(copy(dst, src, count, kind, stream, 1));
}

static CUmemorytype side(enum cudaMemcpyKind kind, int source) {
    if (kind == cudaMemcpyDefault) return CU_MEMORYTYPE_UNIFIED;
    int device = source ? kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice
                        : kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    return device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
}

static cudaError_t copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t height, enum cudaMemcpyKind kind, cudaStream_t stream, int async) {
    if (kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = side(kind, 1), c.dstMemoryType = side(kind, 0);
    c.srcHost = src, c.srcDevice = dptr(src), c.srcPitch = spitch;
    c.dstHost = dst, c.dstDevice = dptr(dst), c.dstPitch = dpitch;
    c.WidthInBytes = width, c.Height = height;
    return egf_rt_error(async ? cuMemcpy2DAsync_v2(&c, (CUstream)stream) : cuMemcpy2D_v2(&c));
}

cudaError_t CUDARTAPI cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                   size_t width, size_t height, enum cudaMemcpyKind kind) {
    RUNTIME_CALL(cudaMemcpy2D_v3020, "cudaMemcpy2D", NULL, dst, dpitch, src, spitch, width, height,
                 kind);
    RUNTIME_RETURN(copy_2d(dst, dpitch, src, spitch, width, height, kind, 0, 0));
}

cudaError_t CUDARTAPI cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                        size_t width, size_t height, enum cudaMemcpyKind kind,
                                        cudaStream_t stream) {
    RUNTIME_CALL(cudaMemcpy2DAsync_v3020, "cudaMemcpy2DAsync", NULL, dst, dpitch, src, spitch,
                 width, height, kind, stream);
    RUNTIME_RETURN(copy_2d(dst, dpitch, src, spitch, width, height, kind, stream, 1));
}

cudaError_t CUDARTAPI cudaMemset(void *devPtr, int value, size_t count) {
    RUNTIME_CALL(cudaMemset_v3020, "cudaMemset", NULL, devPtr, value, count);
    RUNTIME_RETURN(egf_rt_error(cuMemsetD8_v2(dptr(devPtr), (unsigned char)value, count)));
}

cudaError_t CUDARTAPI cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    RUNTIME_CALL(cudaMemsetAsync_v3020, "cudaMemsetAsync", NULL, devPtr, value, count, stream);
    RUNTIME_RETURN(egf_rt_error(cuMemsetD8Async(dptr(devPtr), (unsigned char)value, count,
                                                (CUstream)stream)));
}

cudaError_t CUDARTAPI cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count,
                                         size_t offset, enum cudaMemcpyKind kind) {
    RUNTIME_CALL(cudaMemcpyToSymbol_v3020, "cudaMemcpyToSymbol", NULL, symbol, src, count, offset,
                 kind);
    egf_cpu_refuse("cudaMemcpyToSymbol", "a copy into a __device__ or __constant__ variable");
    RUNTIME_RETURN(cudaErrorNotSupported);
}

cudaError_t CUDARTAPI cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count,
                                           size_t offset, enum cudaMemcpyKind kind) {
    RUNTIME_CALL(cudaMemcpyFromSymbol_v3020, "cudaMemcpyFromSymbol", NULL, dst, symbol, count,
                 offset, kind);
    egf_cpu_refuse("cudaMemcpyFromSymbol", "a copy from a __device__ or __constant__ variable");
    RUNTIME_RETURN(cudaErrorNotSupported);
}

cudaError_t CUDARTAPI cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                               const void *ptr) {
    RUNTIME_CALL(cudaPointerGetAttributes_v4000, "cudaPointerGetAttributes", NULL, attributes, ptr);
    if (!attributes) RUNTIME_RETURN(cudaErrorInvalidValue);
    memset(attributes, 0, sizeof *attributes);
    int on_device = egf_cpu_in_device(ptr, 0);
    attributes->type = on_device ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    attributes->device = 0;
    attributes->devicePointer = on_device ? (void *)ptr : NULL;
    attributes->hostPointer = on_device ? NULL : (void *)ptr;
    RUNTIME_RETURN(cudaSuccess);
}

/* ---- the device ---- */
cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
    RUNTIME_CALL(cudaDeviceSynchronize_v3020, "cudaDeviceSynchronize", NULL, 0);
    RUNTIME_RETURN(egf_rt_error(cuCtxSynchronize()));
}

cudaError_t CUDARTAPI cudaDeviceReset(void) {
    RUNTIME_CALL(cudaDeviceReset_v3020, "cudaDeviceReset", NULL, 0);
    RUNTIME_RETURN(cudaSuccess);
}

cudaError_t CUDARTAPI cudaGetDeviceCount(int *count) {
    RUNTIME_CALL(cudaGetDeviceCount_v3020, "cudaGetDeviceCount", NULL, count);
    RUNTIME_RETURN(egf_rt_error(cuDeviceGetCount(count)));
}

cudaError_t CUDARTAPI cudaGetDevice(int *device) {
    RUNTIME_CALL(cudaGetDevice_v3020, "cudaGetDevice", NULL, device);
    if (!device) RUNTIME_RETURN(cudaErrorInvalidValue);
    *device = 0;
    RUNTIME_RETURN(cudaSuccess);
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
    RUNTIME_CALL(cudaSetDevice_v3020, "cudaSetDevice", NULL, device);
    CUdevice d;
    RUNTIME_RETURN(device == 0 ? cudaSuccess : egf_rt_error(cuDeviceGet(&d, device)));
}

cudaError_t CUDARTAPI cudaSetDeviceFlags(unsigned int flags) {
    RUNTIME_CALL(cudaSetDeviceFlags_v3020, "cudaSetDeviceFlags", NULL, flags);
    RUNTIME_RETURN(cudaSuccess);
}

cudaError_t CUDARTAPI cudaGetDeviceFlags(unsigned int *flags) {
    RUNTIME_CALL(cudaGetDeviceFlags_v7000, "cudaGetDeviceFlags", NULL, flags);
    if (!flags) RUNTIME_RETURN(cudaErrorInvalidValue);
    *flags = 0;
    RUNTIME_RETURN(cudaSuccess);
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    RUNTIME_CALL(cudaDeviceGetAttribute_v5000, "cudaDeviceGetAttribute", NULL, value, attr, device);
    // the runtime's attribute numbers are the driver's
    RUNTIME_RETURN(egf_rt_error(cuDeviceGetAttribute(value, (CUdevice_attribute)attr, device)));
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    RUNTIME_CALL(cudaGetDeviceProperties_v12000, "cudaGetDeviceProperties", NULL, prop, device);
    if (!prop) RUNTIME_RETURN(cudaErrorInvalidValue);
    if (device != 0) RUNTIME_RETURN(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    cuDeviceGetName(prop->name, sizeof prop->name, 0);
    cuDeviceTotalMem_v2(&prop->totalGlobalMem, 0);
    prop->major = 9, prop->minor = 0;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024, prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647, prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->multiProcessorCount = 1;
    prop->sharedMemPerBlock = 49152;
    prop->regsPerBlock = 65536;
    prop->totalConstMem = 65536;
    prop->unifiedAddressing = 1;
    prop->maxThreadsPerMultiProcessor = 2048;
    RUNTIME_RETURN(cudaSuccess);
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int *driverVersion) {
    RUNTIME_CALL(cudaDriverGetVersion_v3020, "cudaDriverGetVersion", NULL, driverVersion);
    RUNTIME_RETURN(egf_rt_error(cuDriverGetVersion(driverVersion)));
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int *runtimeVersion) {
    RUNTIME_CALL(cudaRuntimeGetVersion_v3020, "cudaRuntimeGetVersion", NULL, runtimeVersion);
    if (!runtimeVersion) RUNTIME_RETURN(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    RUNTIME_RETURN(cudaSuccess);
}

cudaError_t CUDARTAPI cudaDeviceSetLimit(enum cudaLimit limit, size_t value) {
    RUNTIME_CALL(cudaDeviceSetLimit_v3020, "cudaDeviceSetLimit", NULL, limit, value);
    RUNTIME_RETURN(egf_rt_error(cuCtxSetLimit((CUlimit)limit, value)));
}

cudaError_t CUDARTAPI cudaDeviceGetLimit(size_t *pValue, enum cudaLimit limit) {
    RUNTIME_CALL(cudaDeviceGetLimit_v3020, "cudaDeviceGetLimit", NULL, pValue, limit);
    RUNTIME_RETURN(egf_rt_error(cuCtxGetLimit(pValue, (CUlimit)limit)));
}

cudaError_t CUDARTAPI cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
    RUNTIME_CALL(cudaDeviceGetStreamPriorityRange_v5050, "cudaDeviceGetStreamPriorityRange", NULL,
                 leastPriority, greatestPriority);
    if (leastPriority) *leastPriority = 0;
    if (greatestPriority) *greatestPriority = 0;
    RUNTIME_RETURN(cudaSuccess);
}

/* ---- streams and events ---- */
cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t *pStream) {
    RUNTIME_CALL(cudaStreamCreate_v3020, "cudaStreamCreate", NULL, pStream);
    RUNTIME_RETURN(egf_rt_error(cuStreamCreate((CUstream *)pStream, 0)));
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    RUNTIME_CALL(cudaStreamCreateWithFlags_v5000, "cudaStreamCreateWithFlags", NULL, pStream, flags);
    RUNTIME_RETURN(egf_rt_error(cuStreamCreate((CUstream *)pStream, flags)));
}

cudaError_t CUDARTAPI cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags,
                                                   int priority) {
    RUNTIME_CALL(cudaStreamCreateWithPriority_v5050, "cudaStreamCreateWithPriority", NULL, pStream,
                 flags, priority);
    RUNTIME_RETURN(egf_rt_error(cuStreamCreateWithPriority((CUstream *)pStream, flags, priority)));
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
    RUNTIME_CALL(cudaStreamDestroy_v5050, "cudaStreamDestroy", NULL, stream);
    RUNTIME_RETURN(egf_rt_error(cuStreamDestroy_v2((CUstream)stream)));
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
    RUNTIME_CALL(cudaStreamSynchronize_v3020, "cudaStreamSynchronize", NULL, stream);
    RUNTIME_RETURN(egf_rt_error(cuStreamSynchronize((CUstream)stream)));
}

cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t stream) {
    RUNTIME_CALL(cudaStreamQuery_v3020, "cudaStreamQuery", NULL, stream);
    RUNTIME_RETURN(egf_rt_error(cuStreamQuery((CUstream)stream)));
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    RUNTIME_CALL(cudaStreamWaitEvent_v3020, "cudaStreamWaitEvent", NULL, stream, event, flags);
    RUNTIME_RETURN(egf_rt_error(cuStreamWaitEvent((CUstream)stream, (CUevent)event, flags)));
}

cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t stream,
                                            enum cudaStreamCaptureStatus *pCaptureStatus) {
    RUNTIME_CALL(cudaStreamIsCapturing_v10000, "cudaStreamIsCapturing", NULL, stream, pCaptureStatus);
    if (!pCaptureStatus) RUNTIME_RETURN(cudaErrorInvalidValue);
    *pCaptureStatus = cudaStreamCaptureStatusNone;
    RUNTIME_RETURN(cudaSuccess);
}

cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    RUNTIME_CALL(cudaStreamBeginCapture_v10000, "cudaStreamBeginCapture", NULL, stream, mode);
    egf_cpu_refuse("cudaStreamBeginCapture", "stream capture into a CUDA graph (CUDA graphs)");
    RUNTIME_RETURN(cudaErrorNotSupported);
}

cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData) {
    RUNTIME_CALL(cudaLaunchHostFunc_v10000, "cudaLaunchHostFunc", NULL, stream, fn, userData);
    RUNTIME_RETURN(egf_rt_error(cuLaunchHostFunc((CUstream)stream, (CUhostFn)fn, userData)));
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t *event) {
    RUNTIME_CALL(cudaEventCreate_v3020, "cudaEventCreate", NULL, event);
    RUNTIME_RETURN(egf_rt_error(cuEventCreate((CUevent *)event, 0)));
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    RUNTIME_CALL(cudaEventCreateWithFlags_v3020, "cudaEventCreateWithFlags", NULL, event, flags);
    RUNTIME_RETURN(egf_rt_error(cuEventCreate((CUevent *)event, flags)));
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    RUNTIME_CALL(cudaEventRecord_v3020, "cudaEventRecord", NULL, event, stream);
    RUNTIME_RETURN(egf_rt_error(cuEventRecord((CUevent)event, (CUstream)stream)));
}

cudaError_t CUDARTAPI cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                               unsigned int flags) {
    RUNTIME_CALL(cudaEventRecordWithFlags_v11010, "cudaEventRecordWithFlags", NULL, event, stream,
                 flags);
    RUNTIME_RETURN(egf_rt_error(cuEventRecordWithFlags((CUevent)event, (CUstream)stream, flags)));
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
    RUNTIME_CALL(cudaEventSynchronize_v3020, "cudaEventSynchronize", NULL, event);
    RUNTIME_RETURN(egf_rt_error(cuEventSynchronize((CUevent)event)));
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
    RUNTIME_CALL(cudaEventQuery_v3020, "cudaEventQuery", NULL, event);
    RUNTIME_RETURN(egf_rt_error(cuEventQuery((CUevent)event)));
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
    RUNTIME_CALL(cudaEventDestroy_v3020, "cudaEventDestroy", NULL, event);
    RUNTIME_RETURN(egf_rt_error(cuEventDestroy_v2((CUevent)event)));
}

cudaError_t CUDARTAPI cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    RUNTIME_CALL(cudaEventElapsedTime_v3020, "cudaEventElapsedTime", NULL, ms, start, end);
    RUNTIME_RETURN(egf_rt_error(cuEventElapsedTime_v2(ms, (CUevent)start, (CUevent)end)));
}
