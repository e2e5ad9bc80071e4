// libcuda.so.1 for the host replay: the driver entry points the recorder looks up, over host
// memory. "Device" memory is a bump allocator in a fixed arena; the recorder's own two kernels
// (egf_recorder_kernels.cu) run here as loops that compute what they compute on the GPU.
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fake_abi.h"

typedef int CUresult;  // 0 CUDA_SUCCESS, 1 INVALID_VALUE, 2 OUT_OF_MEMORY, 400 INVALID_HANDLE
typedef unsigned long long CUdeviceptr;

static unsigned long long device_next = FAKE_DEVICE_BASE, host_next = FAKE_HOST_BASE;
static const char diff_fn[] = "egf_deep_diff", hash_fn[] = "egf_region_hash";

__attribute__((constructor)) static void map_arenas(void) {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE | MAP_NORESERVE;
    if (mmap((void *)FAKE_DEVICE_BASE, FAKE_DEVICE_BYTES, PROT_READ | PROT_WRITE, flags, -1, 0) !=
            (void *)FAKE_DEVICE_BASE ||
        mmap((void *)FAKE_HOST_BASE, FAKE_HOST_BYTES, PROT_READ | PROT_WRITE, flags, -1, 0) !=
            (void *)FAKE_HOST_BASE)
        abort();
}

void *fake_host(size_t bytes) {
    void *p = (void *)host_next;
    host_next += (bytes + 63) / 64 * 64;
    if (host_next > FAKE_HOST_BASE + FAKE_HOST_BYTES) abort();
    return p;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    if (device_next + bytes > FAKE_DEVICE_BASE + FAKE_DEVICE_BYTES) return 2;
    *p = device_next;
    device_next += (bytes + 511) / 512 * 512;  // as the driver rounds
    memset((void *)*p, 0xAB, bytes);             // fresh memory is not zero
    return 0;
}

unsigned long long fake_device(size_t bytes) {
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, bytes) != 0) abort();
    return p;
}

CUresult cuMemFree_v2(CUdeviceptr p) { return p ? 0 : 1; }
CUresult cuMemAllocHost_v2(void **p, size_t bytes) { return (*p = malloc(bytes)) ? 0 : 2; }
CUresult cuMemFreeHost(void *p) {
    free(p);
    return 0;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
    memcpy((void *)dst, src, bytes);
    return 0;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
    memcpy(dst, (const void *)src, bytes);
    return 0;
}
CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned value, size_t words) {
    for (size_t i = 0; i < words; ++i) ((unsigned *)dst)[i] = value;
    return 0;
}
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuStreamIsCapturing(void *stream, int *status) {
    *status = stream == FAKE_CAPTURING_STREAM;  // CU_STREAM_CAPTURE_STATUS_ACTIVE is 1
    return 0;
}

size_t fake_param_offset(const FakeFunction *f, int i) {
    size_t at = 0;
    for (int k = 0; k <= i; ++k) {
        size_t align = f->sizes[k] >= 8 ? 8 : f->sizes[k];
        at = (at + align - 1) / align * align;
        if (k < i) at += f->sizes[k];
    }
    return at;
}

static CUresult param_info(const void *handle, unsigned magic, size_t i, size_t *offset,
                           size_t *size) {
    const FakeFunction *f = handle;
    if (!f || f->magic != magic) return 400;
    if ((int)i >= f->n) return 1;
    *offset = fake_param_offset(f, (int)i);
    *size = f->sizes[i];
    return 0;
}
CUresult cuFuncGetParamInfo(void *f, size_t i, size_t *offset, size_t *size) {
    return param_info(f, FAKE_FUNCTION, i, offset, size);
}
CUresult cuKernelGetParamInfo(void *k, size_t i, size_t *offset, size_t *size) {
    return param_info(k, FAKE_KERNEL, i, offset, size);
}

CUresult cuModuleLoadData(void **module, const void *image) {
    if (getenv("FAKE_CUDA_NO_MODULE")) return 218;  // CUDA_ERROR_INVALID_PTX: an older driver
    if (strncmp(image, ".version", 8) != 0) return 1;
    *module = (void *)diff_fn;
    return 0;
}
CUresult cuModuleGetFunction(void **f, void *module, const char *name) {
    (void)module;
    *f = !strcmp(name, diff_fn) ? (void *)diff_fn : !strcmp(name, hash_fn) ? (void *)hash_fn : NULL;
    return *f ? 0 : 500;
}

static unsigned long long mix64(unsigned bits, unsigned long long index) {
    unsigned long long z = bits + index * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

typedef struct {
    unsigned long long base, shadow, words, bitmap;  // egf_deep_diff's EgfDeepEntry
} Entry;

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *stream, void **args, void **extra) {
    (void)gx, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)stream, (void)extra;
    if (f == hash_fn) {
        const unsigned *values = *(const unsigned **)args[0];
        unsigned long long count = *(unsigned long long *)args[1];
        long long ld = *(long long *)args[2], skip = *(long long *)args[3];
        unsigned long long h = 0;
        for (unsigned long long i = 0; i < count; ++i) {
            long long col = ld > 0 ? (long long)(i % (unsigned long long)ld) : 0;
            if (skip < 0 || col != skip) h += mix64(values[i], i);
        }
        **(unsigned long long **)args[4] += h;
        return 0;
    }
    if (f != diff_fn) return 400;
    const Entry *table = *(const Entry **)args[0];
    unsigned *bitmap = *(unsigned **)args[1], *counts = *(unsigned **)args[2];
    for (unsigned y = 0; y < gy; ++y) {
        Entry e = table[y];
        const unsigned *now = (const unsigned *)e.base;
        unsigned *copy = (unsigned *)e.shadow;
        for (unsigned long long i = 0; i < e.words; ++i) {
            if (now[i] != copy[i]) {
                copy[i] = now[i];
                bitmap[e.bitmap + (i >> 5)] |= 1u << (i & 31);
                ++counts[y];
            }
        }
    }
    return 0;
}
