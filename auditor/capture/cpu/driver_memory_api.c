/* libcuda.so.1 for `egf-audit capture --cpu`: allocations, copies and memsets.
 *
 * Device memory is host memory (driver_memory.c), so a copy is a memcpy and a memset a fill.
 * What NVIDIA's driver refuses is refused here too: a device range that leaves its allocation
 * (CUDA_ERROR_INVALID_VALUE), a free of no allocation's start.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

#include "driver_internal.h"

static void *dev(CUdeviceptr p) { return (void *)(uintptr_t)p; }
static int device_range(CUdeviceptr p, size_t bytes) { return egf_cpu_in_device(dev(p), bytes); }

static CUresult alloc_into(CUdeviceptr *dptr, size_t bytes) {
    if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    void *p = egf_cpu_alloc(bytes);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    DRIVER_CALL(cuMemAlloc_v2, NULL, dptr, bytesize);
    DRIVER_RETURN(alloc_into(dptr, bytesize));
}

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    DRIVER_CALL(cuMemAllocAsync, NULL, dptr, bytesize, hStream);
    DRIVER_RETURN(alloc_into(dptr, bytesize));
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                    size_t Height, unsigned int ElementSizeBytes) {
    DRIVER_CALL(cuMemAllocPitch_v2, NULL, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (!pPitch || !WidthInBytes || !Height) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *pPitch = (WidthInBytes + 511) / 512 * 512;
    DRIVER_RETURN(alloc_into(dptr, *pPitch * Height));
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
    DRIVER_CALL(cuMemFree_v2, NULL, dptr);
    if (!dptr) DRIVER_RETURN(CUDA_SUCCESS);
    DRIVER_RETURN(egf_cpu_free(dev(dptr)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    DRIVER_CALL(cuMemFreeAsync, NULL, dptr, hStream);
    DRIVER_RETURN(egf_cpu_free(dev(dptr)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t *free_, size_t *total) {
    DRIVER_CALL(cuMemGetInfo_v2, NULL, free_, total);
    struct sysinfo si;
    if (!free_ || !total || sysinfo(&si) != 0) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *free_ = (size_t)si.freeram * si.mem_unit;
    *total = (size_t)si.totalram * si.mem_unit;
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    DRIVER_CALL(cuMemGetAddressRange_v2, NULL, pbase, psize, dptr);
    DRIVER_RETURN(egf_cpu_unmodeled("cuMemGetAddressRange_v2"));
}

/* host memory the trainer asks to be page-locked: plain host memory here */
CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize) {
    DRIVER_CALL(cuMemAllocHost_v2, NULL, pp, bytesize);
    if (!pp) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *pp = malloc(bytesize ? bytesize : 1);
    DRIVER_RETURN(*pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
    DRIVER_CALL(cuMemHostAlloc, NULL, pp, bytesize, Flags);
    if (!pp) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    if (Flags & CU_MEMHOSTALLOC_DEVICEMAP) {
        egf_cpu_refuse("cuMemHostAlloc", "mapped host memory (CU_MEMHOSTALLOC_DEVICEMAP)");
        DRIVER_RETURN(CUDA_ERROR_NOT_SUPPORTED);
    }
    *pp = malloc(bytesize ? bytesize : 1);
    DRIVER_RETURN(*pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

CUresult CUDAAPI cuMemFreeHost(void *p) {
    DRIVER_CALL(cuMemFreeHost, NULL, p);
    free(p);
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags) {
    DRIVER_CALL(cuMemHostRegister_v2, NULL, p, bytesize, Flags);
    DRIVER_RETURN(p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

CUresult CUDAAPI cuMemHostUnregister(void *p) {
    DRIVER_CALL(cuMemHostUnregister, NULL, p);
    DRIVER_RETURN(p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    DRIVER_CALL(cuMemAllocManaged, NULL, dptr, bytesize, flags);
    egf_cpu_refuse("cuMemAllocManaged", "managed (unified) memory is not modeled");
    DRIVER_RETURN(CUDA_ERROR_NOT_SUPPORTED);
}

/* ---- copies ---- */
static CUresult copy(void *dst, const void *src, size_t n, int dst_device, int src_device) {
    if (n == 0) return CUDA_SUCCESS;
    if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
    if (dst_device && !egf_cpu_in_device(dst, n)) return CUDA_ERROR_INVALID_VALUE;
    if (src_device && !egf_cpu_in_device(src, n)) return CUDA_ERROR_INVALID_VALUE;
    memmove(dst, src, n);
    return CUDA_SUCCESS;
}

// unified addressing: a side inside an allocation is device memory, and must fit it
static CUresult copy_any(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    int dd = egf_cpu_in_device(dev(dst), 0), sd = egf_cpu_in_device(dev(src), 0);
    return copy(dev(dst), dev(src), n, dd, sd);
}

CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
    DRIVER_CALL(cuMemcpyHtoD_v2, NULL, dstDevice, srcHost, ByteCount);
    DRIVER_RETURN(copy(dev(dstDevice), srcHost, ByteCount, 1, 0));
}

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                      CUstream hStream) {
    DRIVER_CALL(cuMemcpyHtoDAsync_v2, NULL, dstDevice, srcHost, ByteCount, hStream);
    DRIVER_RETURN(copy(dev(dstDevice), srcHost, ByteCount, 1, 0));
}

CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    DRIVER_CALL(cuMemcpyDtoH_v2, NULL, dstHost, srcDevice, ByteCount);
    DRIVER_RETURN(copy(dstHost, dev(srcDevice), ByteCount, 0, 1));
}

CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                      CUstream hStream) {
    DRIVER_CALL(cuMemcpyDtoHAsync_v2, NULL, dstHost, srcDevice, ByteCount, hStream);
    DRIVER_RETURN(copy(dstHost, dev(srcDevice), ByteCount, 0, 1));
}

CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
    DRIVER_CALL(cuMemcpyDtoD_v2, NULL, dstDevice, srcDevice, ByteCount);
    DRIVER_RETURN(copy(dev(dstDevice), dev(srcDevice), ByteCount, 1, 1));
}

CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                      size_t ByteCount, CUstream hStream) {
    DRIVER_CALL(cuMemcpyDtoDAsync_v2, NULL, dstDevice, srcDevice, ByteCount, hStream);
    DRIVER_RETURN(copy(dev(dstDevice), dev(srcDevice), ByteCount, 1, 1));
}

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
    DRIVER_CALL(cuMemcpy, NULL, dst, src, ByteCount);
    DRIVER_RETURN(copy_any(dst, src, ByteCount));
}

CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
    DRIVER_CALL(cuMemcpyAsync, NULL, dst, src, ByteCount, hStream);
    DRIVER_RETURN(copy_any(dst, src, ByteCount));
}

static CUresult copy_2d(const CUDA_MEMCPY2D *c) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (c->srcMemoryType == CU_MEMORYTYPE_ARRAY || c->dstMemoryType == CU_MEMORYTYPE_ARRAY) {
        egf_cpu_refuse("cuMemcpy2D_v2", "a copy to or from a CUDA array (arrays and textures)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    const unsigned char *src = c->srcMemoryType == CU_MEMORYTYPE_HOST ? c->srcHost : dev(c->srcDevice);
    unsigned char *dst = c->dstMemoryType == CU_MEMORYTYPE_HOST ? c->dstHost : dev(c->dstDevice);
    int sd = c->srcMemoryType == CU_MEMORYTYPE_DEVICE ||
             (c->srcMemoryType == CU_MEMORYTYPE_UNIFIED && egf_cpu_in_device(src, 0));
    int dd = c->dstMemoryType == CU_MEMORYTYPE_DEVICE ||
             (c->dstMemoryType == CU_MEMORYTYPE_UNIFIED && egf_cpu_in_device(dst, 0));
    if (!src || !dst || c->WidthInBytes > c->srcPitch || c->WidthInBytes > c->dstPitch)
        return CUDA_ERROR_INVALID_VALUE;
    src += c->srcY * c->srcPitch + c->srcXInBytes;
    dst += c->dstY * c->dstPitch + c->dstXInBytes;
    for (size_t row = 0; row < c->Height; ++row) {
        CUresult rc = copy(dst + row * c->dstPitch, src + row * c->srcPitch, c->WidthInBytes, dd, sd);
        if (rc != CUDA_SUCCESS) return rc;
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy) {
    DRIVER_CALL(cuMemcpy2D_v2, NULL, pCopy);
    DRIVER_RETURN(copy_2d(pCopy));
}

CUresult CUDAAPI cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *pCopy) {
    DRIVER_CALL(cuMemcpy2DUnaligned_v2, NULL, pCopy);
    DRIVER_RETURN(copy_2d(pCopy));
}

CUresult CUDAAPI cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream) {
    DRIVER_CALL(cuMemcpy2DAsync_v2, NULL, pCopy, hStream);
    DRIVER_RETURN(copy_2d(pCopy));
}

CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                              CUcontext srcContext, size_t ByteCount) {
    DRIVER_CALL(cuMemcpyPeer, NULL, dstDevice, dstContext, srcDevice, srcContext, ByteCount);
    egf_cpu_refuse("cuMemcpyPeer", "a copy between devices (peer copies): --cpu models one device");
    DRIVER_RETURN(CUDA_ERROR_NOT_SUPPORTED);
}

/* ---- memsets ---- */
static CUresult fill(CUdeviceptr p, unsigned value, size_t n, int width) {
    if (!device_range(p, n * (size_t)width)) return CUDA_ERROR_INVALID_VALUE;
    unsigned char *b = dev(p);
    if (width == 1) {
        memset(b, (int)value, n);
    } else if (width == 2) {
        for (size_t i = 0; i < n; ++i) memcpy(b + 2 * i, &(uint16_t){(uint16_t)value}, 2);
    } else {
        for (size_t i = 0; i < n; ++i) memcpy(b + 4 * i, &value, 4);
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
    DRIVER_CALL(cuMemsetD8_v2, NULL, dstDevice, uc, N);
    DRIVER_RETURN(fill(dstDevice, uc, N, 1));
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
    DRIVER_CALL(cuMemsetD8Async, NULL, dstDevice, uc, N, hStream);
    DRIVER_RETURN(fill(dstDevice, uc, N, 1));
}

CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N) {
    DRIVER_CALL(cuMemsetD16_v2, NULL, dstDevice, us, N);
    DRIVER_RETURN(fill(dstDevice, us, N, 2));
}

CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) {
    DRIVER_CALL(cuMemsetD16Async, NULL, dstDevice, us, N, hStream);
    DRIVER_RETURN(fill(dstDevice, us, N, 2));
}

CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
    DRIVER_CALL(cuMemsetD32_v2, NULL, dstDevice, ui, N);
    DRIVER_RETURN(fill(dstDevice, ui, N, 4));
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
    DRIVER_CALL(cuMemsetD32Async, NULL, dstDevice, ui, N, hStream);
    DRIVER_RETURN(fill(dstDevice, ui, N, 4));
}

CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    DRIVER_CALL(cuPointerGetAttribute, NULL, data, attribute, ptr);
    if (!data) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    int on_device = egf_cpu_in_device(dev(ptr), 0);
    switch (attribute) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            if (!on_device) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
            *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
            DRIVER_RETURN(CUDA_SUCCESS);
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
            *(CUdeviceptr *)data = ptr;
            DRIVER_RETURN(on_device ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
        case CU_POINTER_ATTRIBUTE_CONTEXT:
            *(CUcontext *)data = egf_cpu_primary_context();
            DRIVER_RETURN(on_device ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)data = 0;
            DRIVER_RETURN(on_device ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
        default:
            DRIVER_RETURN(egf_cpu_unmodeled("cuPointerGetAttribute"));
    }
}
