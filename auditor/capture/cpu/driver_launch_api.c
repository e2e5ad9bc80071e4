/* libcuda.so.1 for `egf-audit capture --cpu`: modules, functions and launches.
 *
 * A launch runs its kernel on the CPU before it returns: every block and every thread of the
 * grid one after another, in the trainer's process, as its compiled source (driver_kernels.c).
 * The launch callbacks carry the kernel's symbol, as CUPTI's do.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_internal.h"

static char *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = '\0', *size = (size_t)n;
    return buf;
}

CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname) {
    DRIVER_CALL(cuModuleLoad, NULL, module, fname);
    size_t size = 0;
    char *image = fname ? read_all(fname, &size) : NULL;
    if (!image) DRIVER_RETURN(CUDA_ERROR_FILE_NOT_FOUND);
    CUresult rc = egf_cpu_module_load(module, image, size);
    free(image);
    DRIVER_RETURN(rc);
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image) {
    DRIVER_CALL(cuModuleLoadData, NULL, module, image);
    DRIVER_RETURN(egf_cpu_module_load(module, image, 0));
}

CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                    CUjit_option *options, void **optionValues) {
    DRIVER_CALL(cuModuleLoadDataEx, NULL, module, image, numOptions, options, optionValues);
    DRIVER_RETURN(egf_cpu_module_load(module, image, 0));
}

CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin) {
    DRIVER_CALL(cuModuleLoadFatBinary, NULL, module, fatCubin);
    DRIVER_RETURN(egf_cpu_module_load(module, fatCubin, 0));
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
    DRIVER_CALL(cuModuleUnload, NULL, hmod);
    DRIVER_RETURN(hmod ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);  // kept: functions outlive it
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    DRIVER_CALL(cuModuleGetFunction, NULL, hfunc, hmod, name);
    DRIVER_RETURN(egf_cpu_module_function(hfunc, hmod, name));
}

CUresult CUDAAPI cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod,
                                      const char *name) {
    DRIVER_CALL(cuModuleGetGlobal_v2, NULL, dptr, bytes, hmod, name);
    egf_cpu_refuse("cuModuleGetGlobal_v2", "a module's __device__ or __constant__ variables");
    DRIVER_RETURN(CUDA_ERROR_NOT_SUPPORTED);
}

CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                                    size_t *paramSize) {
    DRIVER_CALL(cuFuncGetParamInfo, NULL, func, paramIndex, paramOffset, paramSize);
    DRIVER_RETURN(egf_cpu_param_info(func, paramIndex, paramOffset, paramSize));
}

CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset,
                                      size_t *paramSize) {
    DRIVER_CALL(cuKernelGetParamInfo, NULL, kernel, paramIndex, paramOffset, paramSize);
    DRIVER_RETURN(egf_cpu_param_info((CUfunction)kernel, paramIndex, paramOffset, paramSize));
}

CUresult CUDAAPI cuFuncGetName(const char **name, CUfunction hfunc) {
    DRIVER_CALL(cuFuncGetName, NULL, name, hfunc);
    if (!name || !hfunc) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *name = hfunc->symbol;
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc) {
    DRIVER_CALL(cuFuncGetAttribute, NULL, pi, attrib, hfunc);
    if (!pi || !hfunc) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    *pi = attrib == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024
          : attrib == CU_FUNC_ATTRIBUTE_PTX_VERSION || attrib == CU_FUNC_ATTRIBUTE_BINARY_VERSION
              ? 90
              : 0;
    DRIVER_RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
    DRIVER_CALL(cuFuncSetAttribute, NULL, hfunc, attrib, value);
    DRIVER_RETURN(hfunc ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
    DRIVER_CALL(cuFuncSetCacheConfig, NULL, hfunc, config);
    DRIVER_RETURN(hfunc ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX,
                                unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                                void **extra) {
    DRIVER_CALL(cuLaunchKernel, egf_cpu_function_symbol(f), f, gridDimX, gridDimY, gridDimZ,
                blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra);
    const unsigned grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned block[3] = {blockDimX, blockDimY, blockDimZ};
    DRIVER_RETURN(egf_cpu_launch(f, grid, block, sharedMemBytes, kernelParams, extra));
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                  void **extra) {
    DRIVER_CALL(cuLaunchKernelEx, egf_cpu_function_symbol(f), config, f, kernelParams, extra);
    if (!config) DRIVER_RETURN(CUDA_ERROR_INVALID_VALUE);
    for (unsigned i = 0; i < config->numAttrs; ++i) {
        CUlaunchAttributeID id = config->attrs[i].id;
        if (id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && config->attrs[i].value.cooperative) {
            egf_cpu_refuse("cuLaunchKernelEx", "a cooperative launch (grid-wide synchronisation)");
            DRIVER_RETURN(CUDA_ERROR_NOT_SUPPORTED);
        }
        if (id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
            egf_cpu_refuse("cuLaunchKernelEx", "a launch in thread block clusters");
            DRIVER_RETURN(CUDA_ERROR_NOT_SUPPORTED);
        }
    }
    const unsigned grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
    const unsigned block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
    DRIVER_RETURN(egf_cpu_launch(f, grid, block, config->sharedMemBytes, kernelParams, extra));
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                           unsigned int gridDimY, unsigned int gridDimZ,
                                           unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int sharedMemBytes,
                                           CUstream hStream, void **kernelParams) {
    DRIVER_CALL(cuLaunchCooperativeKernel, egf_cpu_function_symbol(f), f, gridDimX, gridDimY,
                gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams);
    egf_cpu_refuse("cuLaunchCooperativeKernel", "a cooperative launch (grid-wide synchronisation)");
    DRIVER_RETURN(CUDA_ERROR_NOT_SUPPORTED);
}
