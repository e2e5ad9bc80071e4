/* The driver's entry points, looked up with dlsym in the process's own libcuda (so the library
 * links against libcupti alone and loads where the toolkit has no libcuda stub), and the
 * recorder's own reads of device memory through them: device-pointer-mode scalars and batched
 * GEMMs' pointer arrays.
 */
#include "recorder.h"

#include <dlfcn.h>

struct RecDriver rec_driver;

static void *driver_symbol(const char *name) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *fn = h ? dlsym(h, name) : NULL;
    return fn ? fn : dlsym(RTLD_DEFAULT, name);
}

void driver_lookup(void) {
    rec_driver.param_info = (ParamInfoFn)driver_symbol("cuFuncGetParamInfo");
    rec_driver.kernel_param_info = (ParamInfoFn)driver_symbol("cuKernelGetParamInfo");
    rec_driver.ctx_sync = (CtxSyncFn)driver_symbol("cuCtxSynchronize");
    rec_driver.dtoh = (DtoHFn)driver_symbol("cuMemcpyDtoH_v2");
    rec_driver.is_capturing = (IsCapturingFn)driver_symbol("cuStreamIsCapturing");
    rec_driver.mem_alloc = (MemAllocFn)driver_symbol("cuMemAlloc_v2");
    rec_driver.mem_free = (MemFreeFn)driver_symbol("cuMemFree_v2");
    rec_driver.htod = (CopyHtoDFn)driver_symbol("cuMemcpyHtoD_v2");
    rec_driver.memset32 = (MemsetD32Fn)driver_symbol("cuMemsetD32_v2");
    rec_driver.module_load = (ModuleLoadFn)driver_symbol("cuModuleLoadData");
    rec_driver.module_function = (ModuleFunctionFn)driver_symbol("cuModuleGetFunction");
    rec_driver.launch = (LaunchFn)driver_symbol("cuLaunchKernel");
    rec_driver.host_alloc = (HostAllocFn)driver_symbol("cuMemAllocHost_v2");
    rec_driver.host_free = (HostFreeFn)driver_symbol("cuMemFreeHost");
}

int stream_capturing(CUstream s) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (rec_driver.is_capturing && rec_driver.is_capturing(s, &status) != CUDA_SUCCESS) return 0;
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

// `bytes` from device memory once every earlier launch of the context has finished: what a call
// enqueued now reads there. 0 (nothing read) while the stream is being captured into a graph.
int device_read(void *host, unsigned long long ptr, size_t bytes, CUstream stream) {
    if (!ptr || !rec_driver.dtoh || !rec_driver.ctx_sync || stream_capturing(stream)) return 0;
    if (rec_driver.ctx_sync() != CUDA_SUCCESS) return 0;
    return rec_driver.dtoh(host, (CUdeviceptr)ptr, bytes) == CUDA_SUCCESS;
}
