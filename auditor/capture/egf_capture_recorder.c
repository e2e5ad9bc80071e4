/* egf-audit's in-process recorder: a CUPTI injection library.
 *
 * The CUDA driver loads this library into the audited process when CUDA_INJECTION64_PATH names
 * it, and calls InitializeInjection() at cuInit. From then on every driver (and runtime) API
 * call of interest becomes one JSON line in EGF_CAPTURE_DIR/events-<pid>.jsonl, in program
 * order: kernel launches with their raw parameters (sizes from cuFuncGetParamInfo; a runtime-API
 * launch's CUfunction from the process's own cudaGetFuncBySymbol), memsets, copies,
 * allocations, every cuBLAS call as cuBLAS's own logger words it, and every cublasLtMatmul with
 * its matrix layouts read from the call's own descriptors. Around the ABI
 * kernels named in EGF_CAPTURE_SNAPSHOT the recorder synchronises and copies the regions the
 * audit needs into EGF_CAPTURE_DIR/snapshots-<pid>.bin (only reads: results never change).
 * When the process ends through exit(), its last line is an "exit" event: a file without one
 * was cut short (the process was killed or crashed), and the audit calls the capture incomplete.
 *
 * One shared library built from these units with one compiler call (capture/build.py), sharing
 * recorder.h:
 *   egf_capture_recorder.c  InitializeInjection, the CUPTI subscription and its callback: each
 *                           driver and runtime call handed on, memsets, copies, allocations,
 *                           frees and graph launches recorded here
 *   rec_launch.c            kernel launches, driver and runtime (cudaGetFuncBySymbol)
 *   rec_gemm.c              the cuBLAS and cuBLASLt loggers, the preloaded cublasLtMatmul
 *   rec_snapshot.c          snapshots of the ABI kernels' regions and their hash
 *   rec_kernels.c           the recorder's own kernels (egf_recorder_kernels.cu as PTX)
 *   rec_deep.c              --deep: every allocation compared after every call, and its values
 *   rec_guard.c             the allocations a kernel egf-audit does not know is handed,
 *                           compared around its launch (the default capture's evidence)
 *   rec_writer.c            the event writer: the files, their lock, fork and exit
 *   rec_device.c            the driver's entry points, and the recorder's own device reads
 */
#include "recorder.h"

#include <unistd.h>

#define DEFAULT_SNAPSHOT "sp14_scale_wire_col,accumulate_d_h_s2_from_concat,polyak_ema"

struct RecOptions rec_options = {.values_max = 1LL << 22};
__thread struct RecThread rec_thread;

// One memory event; returns its seq + 1 (0: not written). A deep capture starts comparing an
// allocation from its event on and stops at its free's.
static unsigned long long memory_event(const char *ev, const char *api, unsigned long long dst,
                                       unsigned long long src, long long bytes, long long value) {
    if (!strcmp(ev, "free")) {
        deep_untrack(dst);
        guard_untrack(dst);
    }
    FILE *f = begin_event(ev);
    if (!f) return 0;
    unsigned long long seq = event_seq();
    fputs(",\"api\":", f);
    json_string(f, api);
    fprintf(f, ",\"dst\":%llu,\"src\":%llu,\"bytes\":%lld,\"value\":%lld", dst, src, bytes,
            value);
    end_event(f);
    if (!strcmp(ev, "alloc")) {
        deep_track(seq, dst, bytes);
        guard_track(dst, bytes);
    }
    return seq + 1;
}

// A launch of a CUDA graph: it replays launches recorded at its capture, which the reader
// says it cannot follow.
static void graph_event(const char *api) {
    FILE *f = begin_event("graph");
    if (!f) return;
    fputs(",\"api\":", f);
    json_string(f, api);
    end_event(f);
}

static int is_memory_call(CUpti_CallbackId id) {
    switch (id) {
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpy:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz:
            return 1;
        default:
            return 0;
    }
}

static void on_driver(const CUpti_CallbackData *cb, CUpti_CallbackId id) {
    const void *p = cb->functionParams;
    int enter = cb->callbackSite == CUPTI_API_ENTER;
    if (driver_launch(cb, id)) return;
    try_hook_cublas();
    if ((id == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch ||
         id == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz) && enter) {
        graph_event(cb->functionName);
        return;
    }
    if (!enter && cb->functionReturnValue && *(const CUresult *)cb->functionReturnValue == 0) {
        // allocations, at the call's exit, where it succeeded: every driver entry point that
        // gives device memory a pointer (ordinary, stream-ordered, pool, managed, pitched)
        CUdeviceptr *out = NULL;
        long long bytes = 0;
        switch (id) {
            case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2: {
                const cuMemAlloc_v2_params *a = p;
                out = a->dptr, bytes = (long long)a->bytesize;
                break;
            }
            case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync:
            case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz: {
                const cuMemAllocAsync_params *a = p;
                out = a->dptr, bytes = (long long)a->bytesize;
                break;
            }
            case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync:
            case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz: {
                const cuMemAllocFromPoolAsync_params *a = p;
                out = a->dptr, bytes = (long long)a->bytesize;
                break;
            }
            case CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged: {
                const cuMemAllocManaged_params *a = p;
                out = a->dptr, bytes = (long long)a->bytesize;
                break;
            }
            case CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2: {
                const cuMemAllocPitch_v2_params *a = p;
                out = a->dptr, bytes = a->pPitch ? (long long)(*a->pPitch * a->Height) : 0;
                break;
            }
            default:
                break;
        }
        if (out) {
            memory_event("alloc", cb->functionName, *out, 0, bytes, 0);
            return;
        }
    }
    if (enter && (id == CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2 ||
                  id == CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync ||
                  id == CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz)) {
        // cuMemFree_v2's and cuMemFreeAsync's parameters both lead with the pointer
        const cuMemFree_v2_params *a = p;
        memory_event("free", cb->functionName, a->dptr, 0, 0, 0);
        return;
    }
    unsigned long long *corr = (unsigned long long *)cb->correlationData;
    if (!enter) {
        // a deep capture compares memory once the memset or copy recorded at its entry is done
        if (rec_options.deep && is_memory_call(id) && *corr) deep_effect(*corr - 1);
        return;
    }
    switch (id) {
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz: {
            const cuMemsetD8Async_params *a = p;  // cuMemsetD8_v2's fields lead the same way
            *corr = memory_event("memset", cb->functionName, a->dstDevice, 0, (long long)a->N,
                                 a->uc);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz: {
            const cuMemsetD32Async_params *a = p;
            *corr = memory_event("memset", cb->functionName, a->dstDevice, 0,
                                 4 * (long long)a->N, a->ui);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz: {
            const cuMemcpyHtoDAsync_v2_params *a = p;
            *corr = memory_event("copy", cb->functionName, a->dstDevice, 0,
                                 (long long)a->ByteCount, 0);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz: {
            const cuMemcpyDtoHAsync_v2_params *a = p;
            *corr = memory_event("copy", cb->functionName, 0, a->srcDevice,
                                 (long long)a->ByteCount, 0);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz: {
            const cuMemcpyDtoDAsync_v2_params *a = p;
            *corr = memory_event("copy", cb->functionName, a->dstDevice, a->srcDevice,
                                 (long long)a->ByteCount, 0);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpy:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz: {
            const cuMemcpyAsync_params *a = p;  // unified addressing: either side may be host
            *corr = memory_event("copy", cb->functionName, a->dst, a->src,
                                 (long long)a->ByteCount, 0);
            return;
        }
        default:
            return;
    }
}

// The runtime API: a launch is recorded at its own entry (runtime_launch, rec_launch.c).
// Memsets, copies and allocations through the runtime are recorded at their exit, only where no
// driver callback wrote one inside the call (rec_thread.rt_covered).
static void on_runtime(const CUpti_CallbackData *cb, CUpti_CallbackId id) {
    int launch = id == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000 ||
                 id == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000 ||
                 id == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060 ||
                 id == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060;
    int memset_ = id == CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020 ||
                  id == CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020 ||
                  id == CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000;
    int copy = id == CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020 ||
               id == CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020 ||
               id == CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000;
    int alloc = id == CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020 ||
                id == CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020 ||
                id == CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020 ||
                id == CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000 ||
                id == CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020;
    int free_ = id == CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020 ||
                id == CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020 ||
                id == CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020;
    int graph = id == CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000 ||
                id == CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000;
    if (!launch && !memset_ && !copy && !alloc && !graph && !free_) return;
    if (cb->callbackSite == CUPTI_API_ENTER) {
        if (rec_thread.rt_depth++ == 0) {
            rec_thread.rt_covered = rec_thread.rt_launch = 0;
            rec_thread.rt_name = cb->functionName;
        }
        if (launch && rec_thread.rt_depth == 1 && runtime_launch(cb, id, RT_ENTER))
            rec_thread.rt_launch = 1;
        return;
    }
    if (--rec_thread.rt_depth > 0) return;
    if (launch && rec_thread.rt_launch) {
        rec_thread.rt_launch = 0;
        runtime_launch(cb, id, RT_EXIT);
        return;
    }
    if (rec_thread.rt_covered) return;
    const void *p = cb->functionParams;
    if (launch) {
        runtime_launch(cb, id, RT_UNDECODED);
    } else if (graph) {
        graph_event(cb->functionName);
    } else if (memset_) {
        const cudaMemsetAsync_v3020_params *a = p;
        unsigned long long seq = memory_event("memset", cb->functionName, (uintptr_t)a->devPtr, 0,
                                              (long long)a->count, a->value);
        if (seq) deep_effect(seq - 1);
    } else if (copy) {
        const cudaMemcpyAsync_v3020_params *a = p;
        unsigned long long seq = memory_event("copy", cb->functionName, (uintptr_t)a->dst,
                                              (uintptr_t)a->src, (long long)a->count, a->kind);
        if (seq) deep_effect(seq - 1);
    } else if (free_) {
        const cudaFree_v3020_params *a = p;  // cudaFreeAsync's parameters lead the same way
        memory_event("free", cb->functionName, (uintptr_t)a->devPtr, 0, 0, 0);
    } else if (cb->functionReturnValue && *(const int *)cb->functionReturnValue == 0) {
        // cudaMalloc, cudaMallocAsync, cudaMallocManaged lead with (devPtr, size); the pitched
        // one's size is its pitch times its height
        const cudaMalloc_v3020_params *a = p;
        long long bytes = (long long)a->size;
        if (id == CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020) {
            const cudaMallocPitch_v3020_params *m = p;
            bytes = m->pitch ? (long long)(*m->pitch * m->height) : 0;
        }
        if (a->devPtr) memory_event("alloc", cb->functionName, (uintptr_t)*a->devPtr, 0, bytes, 0);
    }
}

static void CUPTIAPI callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                              const void *data) {
    (void)userdata;
    if (rec_thread.inside) return;
    rec_thread.inside = 1;
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API)
        on_driver(data, id);
    else if (domain == CUPTI_CB_DOMAIN_RUNTIME_API)
        on_runtime(data, id);
    rec_thread.inside = 0;
}

int InitializeInjection(void) {
    const char *dir = getenv("EGF_CAPTURE_DIR");
    if (!dir || !*dir) return 1;  // injected outside `egf-audit capture`: stay out of the way
    if (!writer_start(dir)) return 1;  // a folder that is a link, or none: nothing is recorded
    const char *kernels = getenv("EGF_CAPTURE_SNAPSHOT");
    snprintf(rec_options.snapshot_kernels, sizeof rec_options.snapshot_kernels, "%s",
             kernels ? kernels : DEFAULT_SNAPSHOT);
    const char *values_max = getenv("EGF_CAPTURE_VALUES_MAX");
    if (values_max && *values_max) rec_options.values_max = atoll(values_max);
    driver_lookup();
    const char *deep_env = getenv("EGF_CAPTURE_DEEP");
    const struct RecDriver *d = &rec_driver;
    rec_options.deep = deep_env && !strcmp(deep_env, "1") && d->mem_alloc && d->mem_free &&
                       d->htod && d->memset32 && d->module_load && d->module_function &&
                       d->launch && d->ctx_sync && d->dtoh;
    const char *values_env = getenv("EGF_CAPTURE_DEEP_VALUES_MAX");
    rec_options.deep_values_max = values_env ? strtoull(values_env, NULL, 10) : 1ULL << 30;
    rec_options.values_on = rec_options.deep && rec_options.deep_values_max > 0;
    const char *guard_env = getenv("EGF_CAPTURE_GUARD");
    rec_options.guard = !rec_options.deep && guard_env && !strcmp(guard_env, "1") &&
                        d->mem_alloc && d->mem_free && d->htod && d->memset32 &&
                        d->module_load && d->module_function && d->launch && d->ctx_sync &&
                        d->dtoh;
    const char *guard_max = getenv("EGF_CAPTURE_GUARD_MAX");
    rec_options.guard_max = guard_max && *guard_max ? strtoull(guard_max, NULL, 10) : 1ULL << 32;
    rec_options.known = getenv("EGF_CAPTURE_KNOWN");

    uint32_t version = 0;
    cuptiGetVersion(&version);
    CUpti_SubscriberHandle subscriber;
    CUptiResult status = cuptiSubscribe(&subscriber, callback, NULL);
    FILE *f = begin_event("init");
    if (f) {
        fprintf(f, ",\"pid\":%d,\"ppid\":%d,\"cupti_version\":%u,\"subscribe\":%d",
                (int)getpid(), (int)getppid(), version, (int)status);
        fprintf(f, ",\"param_info\":%s,\"hash\":\"mix64\"",
                rec_driver.param_info ? "true" : "false");
        if (rec_options.deep) fputs(",\"deep\":true", f);
        if (rec_options.values_on) fputs(",\"values\":true", f);
        if (rec_options.guard) fputs(",\"guard\":true", f);
        end_event(f);
    }
    if (status != CUPTI_SUCCESS) {
        const char *why = NULL;
        cuptiGetResultString(status, &why);
        char msg[512];
        snprintf(msg, sizeof msg, "cuptiSubscribe failed (%d: %s)", (int)status, why ? why : "?");
        note(msg);
        return 1;
    }
    cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
    cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
    flush_all();
    return 1;
}
