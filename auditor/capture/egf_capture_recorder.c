/* egf-audit's in-process recorder: a CUPTI injection library.
 *
 * The CUDA driver loads this library into the audited process when CUDA_INJECTION64_PATH names
 * it, and calls InitializeInjection() at cuInit. From then on every driver (and runtime) API
 * call of interest becomes one JSON line in EGF_CAPTURE_DIR/events-<pid>.jsonl, in program
 * order: kernel launches with their raw parameters (sizes from cuFuncGetParamInfo), memsets,
 * copies, allocations, and every cuBLAS call as cuBLAS's own logger words it. Around the ABI
 * kernels named in EGF_CAPTURE_SNAPSHOT the recorder synchronises and copies the regions the
 * audit needs into EGF_CAPTURE_DIR/snapshots-<pid>.bin (only reads: results never change).
 * When the process ends through exit(), its last line is an "exit" event: a file without one
 * was cut short (the process was killed or crashed), and the audit calls the capture incomplete.
 *
 * Driver entry points are looked up with dlsym in the process's own libcuda, so the library
 * links against libcupti alone and loads on machines whose toolkit has no libcuda stub.
 *
 * Longer than a Python module here, on purpose: the injected library is one compilation unit
 * (built on first use with one compiler call), read top to bottom as event writer, snapshots,
 * cuBLAS logger, driver callbacks and InitializeInjection.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PARAMS 64
#define DEFAULT_SNAPSHOT "sp14_scale_wire_col,accumulate_d_h_s2_from_concat,polyak_ema"

typedef CUresult (*ParamInfoFn)(CUfunction, size_t, size_t *, size_t *);
typedef CUresult (*CtxSyncFn)(void);
typedef CUresult (*DtoHFn)(void *, CUdeviceptr, size_t);
typedef CUresult (*IsCapturingFn)(CUstream, CUstreamCaptureStatus *);
typedef void (*CublasLogFn)(const char *);
typedef int (*LoggerConfigureFn)(int, int, int, const char *);
typedef int (*SetLoggerFn)(CublasLogFn);
typedef int (*GetPointerModeFn)(void *, int *);

static struct {
    pthread_mutex_t lock;
    FILE *events;
    FILE *snapshots;
    long long snapshot_bytes;
    pid_t pid;
    char dir[4096];
    char snapshot_kernels[1024];
    long long values_max;  // elements of a region kept as values (the hash covers all)
    unsigned long long seq;
    ParamInfoFn param_info;
    CtxSyncFn ctx_sync;
    DtoHFn dtoh;
    IsCapturingFn is_capturing;
    GetPointerModeFn get_pointer_mode;
    int cublas_hooked;
    // The last polyak_ema's target region: snapshotted again at the first launch of the next
    // step, so "target untouched between two Polyak updates" is decidable without a layout.
    CUdeviceptr polyak_target;
    long long polyak_n;
    int step_start_pending;
    int exited;  // the exit event is written: nothing follows it in the file
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .values_max = 1LL << 22};

static __thread int tl_inside;      // our own driver calls re-enter the callback: ignore them
static __thread int tl_rt_depth;    // inside a runtime API call
static __thread int tl_rt_covered;  // a driver event was written inside that runtime call

/* ---- output ---- */
static void open_files_locked(void) {
    pid_t pid = getpid();
    if (g.events && g.pid == pid) return;
    // A fork without exec inherits our FILE*s: the child writes its own files. (Their buffers
    // were flushed just before the fork, before_fork: the child never writes the parent's
    // lines a second time when it flushes every stream at exit.)
    g.pid = pid;
    char path[4200];
    snprintf(path, sizeof path, "%s/events-%d.jsonl", g.dir, (int)pid);
    g.events = fopen(path, "w");
    snprintf(path, sizeof path, "%s/snapshots-%d.bin", g.dir, (int)pid);
    g.snapshots = fopen(path, "wb");
    g.snapshot_bytes = 0;
    if (g.events) setvbuf(g.events, NULL, _IOFBF, 1 << 16);
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; ++s) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c == '\n') {
            fputs("\\n", f);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}

// Starts one event line; the caller adds fields, then end_event(). Holds the lock.
static int begin_event(const char *ev) {
    pthread_mutex_lock(&g.lock);
    if (g.exited && g.pid == getpid()) {  // teardown after the exit event: not recorded
        pthread_mutex_unlock(&g.lock);
        return 0;
    }
    open_files_locked();
    if (!g.events) {
        pthread_mutex_unlock(&g.lock);
        return 0;
    }
    fprintf(g.events, "{\"ev\":\"%s\",\"seq\":%llu,\"tid\":%lu", ev, g.seq++,
            (unsigned long)pthread_self() & 0xffffffUL);
    if (tl_rt_depth > 0) tl_rt_covered = 1;
    return 1;
}

static void end_event(void) {
    fputs("}\n", g.events);
    pthread_mutex_unlock(&g.lock);
}

static void note(const char *msg) {
    if (!begin_event("note")) return;
    fputs(",\"msg\":", g.events);
    json_string(g.events, msg);
    end_event();
    pthread_mutex_lock(&g.lock);
    if (g.events) fflush(g.events);
    pthread_mutex_unlock(&g.lock);
}

static void flush_all(void) {
    pthread_mutex_lock(&g.lock);
    if (g.events && g.pid == getpid()) fflush(g.events);
    if (g.snapshots && g.pid == getpid()) fflush(g.snapshots);
    pthread_mutex_unlock(&g.lock);
}

// atexit: the process ends through exit(). Only the process that owns the files writes the exit
// event (a child forked without exec that recorded nothing owns none, and writes nothing); it is
// the file's last line: whatever the teardown launches or logs after it is not recorded.
static void on_exit_event(void) {
    pthread_mutex_lock(&g.lock);
    pid_t pid = getpid();
    if (g.events && g.pid == pid && !g.exited) {
        fprintf(g.events, "{\"ev\":\"exit\",\"seq\":%llu,\"tid\":%lu,\"pid\":%d}\n", g.seq++,
                (unsigned long)pthread_self() & 0xffffffUL, (int)pid);
        g.exited = 1;
    }
    if (g.events && g.pid == pid) fflush(g.events);
    if (g.snapshots && g.pid == pid) fflush(g.snapshots);
    pthread_mutex_unlock(&g.lock);
}

// fork: no event is half written across it, and the streams are empty when the child inherits
// them (it would flush the parent's buffered lines into the parent's files a second time).
static void before_fork(void) {
    pthread_mutex_lock(&g.lock);
    if (g.events && g.pid == getpid()) fflush(g.events);
    if (g.snapshots && g.pid == getpid()) fflush(g.snapshots);
}

static void after_fork(void) { pthread_mutex_unlock(&g.lock); }

/* ---- cuBLAS: its own logger, in the same ordered stream ---- */
static unsigned long long hex_after(const char *line, const char *key) {
    // "alpha: type=float; val=POINTER (IN HEX:0x0x1560cca0)" -> 0x1560cca0
    const char *p = strstr(line, key);
    if (!p) return 0;
    const char *h = strstr(p, "HEX:");
    const char *eol = strchr(p, '\n');
    if (!h || (eol && h > eol)) return 0;
    h += 4;
    while (*h == '0' && (h[1] == 'x' || h[1] == 'X')) h += 2;  // "0x0x..." as cuBLAS writes it
    return strtoull(h, NULL, 16);
}

// cuBLAS hands its log to the callback a line or a few at a time: "I! ... cublasSgemm_v2(...)
// called:" opens a call, "i!  handle: ...", "i!  alpha: ..." lines follow. The call is still in
// progress on this thread, so alpha and beta (host pointers) are readable when the handle's
// pointer mode is host; the recorder reads them then, and only then.
static __thread int tl_in_log;            // our own cublasGetPointerMode call logs too: ignore it
static __thread int tl_gemm_call;         // the open call is a GEMM
static __thread unsigned long long tl_handle;

static int pointer_mode(unsigned long long handle) {
    int mode = -1;
    if (!handle || !g.get_pointer_mode) return mode;
    tl_in_log = 1;
    g.get_pointer_mode((void *)(uintptr_t)handle, &mode);
    tl_in_log = 0;
    return mode;
}

static void on_cublas_log(const char *msg) {
    if (tl_inside || tl_in_log || !msg) return;
    const char *header = strstr(msg, "I! cuBLAS");
    if (header) {
        tl_gemm_call = strstr(header, "emm") != NULL;  // cublasSgemm_v2, cublasGemmEx, ...
        tl_handle = 0;
    }
    unsigned long long handle = hex_after(msg, "handle:");
    if (handle) tl_handle = handle;
    unsigned long long alpha = 0, beta = 0;
    int mode = -1;
    if (tl_gemm_call && strstr(msg, "type=float;")) {
        alpha = hex_after(msg, "alpha:");
        beta = hex_after(msg, "beta:");
        if (alpha || beta) mode = pointer_mode(tl_handle);
    }
    if (!begin_event("cublas")) return;
    fputs(",\"msg\":", g.events);
    json_string(g.events, msg);
    if (mode >= 0) fprintf(g.events, ",\"pointer_mode\":%d", mode);
    uint32_t bits;
    if (mode == 0 && alpha) {
        memcpy(&bits, (const void *)(uintptr_t)alpha, sizeof bits);
        fprintf(g.events, ",\"alpha_bits\":%u", bits);
    }
    if (mode == 0 && beta) {
        memcpy(&bits, (const void *)(uintptr_t)beta, sizeof bits);
        fprintf(g.events, ",\"beta_bits\":%u", bits);
    }
    end_event();
}

static void try_hook_cublas(void) {
    static const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    for (size_t i = 0; i < sizeof names / sizeof *names; ++i) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
        if (!h) continue;
        LoggerConfigureFn configure = (LoggerConfigureFn)dlsym(h, "cublasLoggerConfigure");
        SetLoggerFn set_logger = (SetLoggerFn)dlsym(h, "cublasSetLoggerCallback");
        g.get_pointer_mode = (GetPointerModeFn)dlsym(h, "cublasGetPointerMode_v2");
        if (configure && set_logger) {
            configure(1, 0, 0, NULL);
            set_logger(on_cublas_log);
            g.cublas_hooked = 1;
            char msg[256];
            snprintf(msg, sizeof msg, "cublas logger attached: %s", names[i]);
            note(msg);
            return;
        }
    }
}

/* ---- snapshots ---- */
static uint64_t fnv1a(const unsigned char *p, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static float *copy_to_host(CUdeviceptr ptr, long long count) {
    if (count <= 0 || !g.dtoh) return NULL;
    float *host = malloc((size_t)count * sizeof(float));
    if (host && g.dtoh(host, ptr, (size_t)count * sizeof(float)) != CUDA_SUCCESS) {
        free(host);
        return NULL;
    }
    return host;
}

// One region: the hash of all `count` elements (those of column `skip_col` left out when
// skip_col >= 0) and, up to values_max, the values themselves.
static void write_region(unsigned long long launch, const char *when, const char *region,
                         CUdeviceptr ptr, const float *host, long long count, long long rows,
                         long long ld, long long skip_col) {
    uint64_t h = 1469598103934665603ULL;
    for (long long i = 0; i < count; ++i) {
        if (skip_col >= 0 && ld > 0 && i % ld == skip_col) continue;
        h = fnv1a((const unsigned char *)&host[i], sizeof(float), h);
    }
    long long keep = count < g.values_max ? count : g.values_max;
    if (skip_col >= 0) keep = 0;  // the body of a matrix: its hash is what the audit reads
    if (!begin_event("snapshot")) return;
    long long offset = g.snapshot_bytes;
    if (keep > 0 && g.snapshots) {
        fwrite(host, sizeof(float), (size_t)keep, g.snapshots);
        g.snapshot_bytes += keep * (long long)sizeof(float);
    }
    fprintf(g.events,
            ",\"launch\":%llu,\"when\":\"%s\",\"region\":\"%s\",\"ptr\":%llu,\"elements\":%lld,"
            "\"rows\":%lld,\"ld\":%lld,\"skip_col\":%lld,\"hash\":\"%016llx\",\"offset\":%lld,"
            "\"count\":%lld",
            launch, when, region, (unsigned long long)ptr, count, rows, ld, skip_col,
            (unsigned long long)h, offset, keep);
    end_event();
}

static void snap(unsigned long long launch, const char *when, const char *region, CUdeviceptr p,
                 long long count) {
    float *host = copy_to_host(p, count);
    if (!host) return;
    write_region(launch, when, region, p, host, count, 1, count, -1);
    free(host);
}

// The wire column (values) and the rest of a [rows, ld] dX concat (hash only).
static void snap_concat(unsigned long long launch, const char *when, CUdeviceptr p, long long rows,
                        long long ld) {
    float *host = copy_to_host(p, rows * ld);
    if (!host) return;
    float *wire = malloc((size_t)rows * sizeof(float));
    for (long long b = 0; wire && b < rows; ++b) wire[b] = host[b * ld + ld - 1];
    if (wire) write_region(launch, when, "wire", p, wire, rows, rows, 1, -1);
    write_region(launch, when, "body", p, host, rows * ld, rows, ld, ld - 1);
    free(wire);
    free(host);
}

static int wants_snapshot(const char *name) {
    if (!name || !g.snapshot_kernels[0]) return 0;
    size_t n = strlen(name);
    for (const char *p = g.snapshot_kernels; (p = strstr(p, name)) != NULL; p += n) {
        int starts = p == g.snapshot_kernels || p[-1] == ',';
        int ends = p[n] == '\0' || p[n] == ',';
        if (starts && ends) return 1;
    }
    return 0;
}

static long long arg_i(void **params, int i) { return (long long)*(int *)params[i]; }
static CUdeviceptr arg_p(void **params, int i) { return *(CUdeviceptr *)params[i]; }

// The ABI kernels (SPEC section 3) by name: which regions to copy, before and after.
static void abi_snapshots(unsigned long long launch, const char *when, const char *name,
                          void **params) {
    if (strcmp(name, "sp14_scale_wire_col") == 0) {
        // (dx_concat, isv, rows, ld, wire_col, isv_index)
        CUdeviceptr dx = arg_p(params, 0), isv = arg_p(params, 1);
        long long rows = arg_i(params, 2), ld = arg_i(params, 3), index = arg_i(params, 5);
        snap_concat(launch, when, dx, rows, ld);
        if (when[0] == 'b') snap(launch, when, "alpha", isv + 4 * (CUdeviceptr)index, 1);
    } else if (strcmp(name, "accumulate_d_h_s2_from_concat") == 0) {
        // (d_h_s2, d_concat, rows, sh2, ld_concat)
        long long rows = arg_i(params, 2), sh2 = arg_i(params, 3), ld = arg_i(params, 4);
        snap(launch, when, "d_h_s2", arg_p(params, 0), rows * sh2);
        if (when[0] == 'b') snap(launch, when, "d_concat", arg_p(params, 1), rows * ld);
    } else if (strcmp(name, "polyak_ema") == 0) {
        // (target, online, tau, n)
        long long n = *(long long *)params[3];
        snap(launch, when, "target", arg_p(params, 0), n);
        if (when[0] == 'b') snap(launch, when, "online", arg_p(params, 1), n);
        if (when[0] == 'a') {
            g.polyak_target = arg_p(params, 0);
            g.polyak_n = n;
            g.step_start_pending = 1;
        }
    }
}

static int stream_capturing(CUstream s) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (g.is_capturing && g.is_capturing(s, &status) != CUDA_SUCCESS) return 0;
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* ---- kernel launches ---- */
static void on_launch(const CUpti_CallbackData *cb, CUfunction f, const unsigned int grid[3],
                      const unsigned int block[3], CUstream stream, void **params) {
    const char *name = cb->symbolName ? cb->symbolName : "?";
    int snapshot = params && wants_snapshot(name) && !stream_capturing(stream);
    if (cb->callbackSite == CUPTI_API_EXIT) {
        if (snapshot && g.ctx_sync && g.ctx_sync() == CUDA_SUCCESS) {
            abi_snapshots(*(unsigned long long *)cb->correlationData, "after", name, params);
            flush_all();
        }
        return;
    }
    if (!g.cublas_hooked) try_hook_cublas();
    size_t offsets[MAX_PARAMS], sizes[MAX_PARAMS];
    int n = 0;
    while (params && g.param_info && n < MAX_PARAMS &&
           g.param_info(f, (size_t)n, &offsets[n], &sizes[n]) == CUDA_SUCCESS)
        ++n;
    if (!begin_event("kernel")) return;
    unsigned long long seq = g.seq - 1;
    *(unsigned long long *)cb->correlationData = seq;
    fputs(",\"api\":", g.events);
    json_string(g.events, cb->functionName);
    fputs(",\"name\":", g.events);
    json_string(g.events, name);
    fprintf(g.events, ",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"params\":[", grid[0], grid[1],
            grid[2], block[0], block[1], block[2]);
    for (int i = 0; i < n; ++i) {
        unsigned long long raw = 0;
        if (sizes[i] <= sizeof raw) memcpy(&raw, params[i], sizes[i]);
        fprintf(g.events, "%s[%zu,%llu]", i ? "," : "", sizes[i], raw);
    }
    fputc(']', g.events);
    end_event();
    if (g.step_start_pending && g.polyak_target && !stream_capturing(stream)) {
        // the first launch of the next step, not launched yet: the target as that step starts,
        // named by this launch's seq (like the snapshots before it)
        g.step_start_pending = 0;
        if (g.ctx_sync && g.ctx_sync() == CUDA_SUCCESS)
            snap(seq, "step_start", "target", g.polyak_target, g.polyak_n);
    }
    if (snapshot && g.ctx_sync && g.ctx_sync() == CUDA_SUCCESS) {
        abi_snapshots(seq, "before", name, params);
        flush_all();
    }
}

static void memory_event(const char *ev, const char *api, unsigned long long dst,
                         unsigned long long src, long long bytes, long long value) {
    if (!begin_event(ev)) return;
    fputs(",\"api\":", g.events);
    json_string(g.events, api);
    fprintf(g.events, ",\"dst\":%llu,\"src\":%llu,\"bytes\":%lld,\"value\":%lld", dst, src, bytes,
            value);
    end_event();
}

static void on_driver(const CUpti_CallbackData *cb, CUpti_CallbackId id) {
    const void *p = cb->functionParams;
    int enter = cb->callbackSite == CUPTI_API_ENTER;
    switch (id) {
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: {
            const cuLaunchKernel_params *a = p;
            unsigned int grid[3] = {a->gridDimX, a->gridDimY, a->gridDimZ};
            unsigned int block[3] = {a->blockDimX, a->blockDimY, a->blockDimZ};
            on_launch(cb, a->f, grid, block, a->hStream, a->kernelParams);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
            const cuLaunchKernelEx_params *a = p;
            const CUlaunchConfig *c = a->config;
            unsigned int grid[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
            unsigned int block[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
            on_launch(cb, a->f, grid, block, c->hStream, a->kernelParams);
            return;
        }
        default:
            break;
    }
    if (!g.cublas_hooked) try_hook_cublas();
    if (id == CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2 && !enter) {
        const cuMemAlloc_v2_params *a = p;
        memory_event("alloc", cb->functionName, *a->dptr, 0, (long long)a->bytesize, 0);
        return;
    }
    if (!enter) return;
    switch (id) {
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz: {
            const cuMemsetD8Async_params *a = p;  // cuMemsetD8_v2's fields lead the same way
            memory_event("memset", cb->functionName, a->dstDevice, 0, (long long)a->N, a->uc);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz: {
            const cuMemsetD32Async_params *a = p;
            memory_event("memset", cb->functionName, a->dstDevice, 0, 4 * (long long)a->N, a->ui);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz: {
            const cuMemcpyHtoDAsync_v2_params *a = p;
            memory_event("copy", cb->functionName, a->dstDevice, 0, (long long)a->ByteCount, 0);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz: {
            const cuMemcpyDtoHAsync_v2_params *a = p;
            memory_event("copy", cb->functionName, 0, a->srcDevice, (long long)a->ByteCount, 0);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz: {
            const cuMemcpyDtoDAsync_v2_params *a = p;
            memory_event("copy", cb->functionName, a->dstDevice, a->srcDevice,
                         (long long)a->ByteCount, 0);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpy:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz: {
            const cuMemcpyAsync_params *a = p;  // unified addressing: either side may be host
            memory_event("copy", cb->functionName, a->dst, a->src, (long long)a->ByteCount, 0);
            return;
        }
        default:
            return;
    }
}

/* ---- runtime API: only what reached no driver callback of its own ---- */
static void on_runtime(const CUpti_CallbackData *cb, CUpti_CallbackId id) {
    int launch = id == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000 ||
                 id == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000;
    int memset_ = id == CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020 ||
                  id == CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020 ||
                  id == CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000;
    int copy = id == CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020 ||
               id == CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020 ||
               id == CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000;
    if (!launch && !memset_ && !copy) return;
    if (cb->callbackSite == CUPTI_API_ENTER) {
        if (tl_rt_depth++ == 0) tl_rt_covered = 0;
        return;
    }
    if (--tl_rt_depth > 0 || tl_rt_covered) return;
    const void *p = cb->functionParams;
    if (launch) {
        const cudaLaunchKernel_v7000_params *a = p;
        if (!begin_event("kernel")) return;
        fputs(",\"api\":", g.events);
        json_string(g.events, cb->functionName);
        fputs(",\"name\":", g.events);
        json_string(g.events, cb->symbolName ? cb->symbolName : "?");
        fprintf(g.events, ",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"params\":null",
                a->gridDim.x, a->gridDim.y, a->gridDim.z, a->blockDim.x, a->blockDim.y,
                a->blockDim.z);
        end_event();
    } else if (memset_) {
        const cudaMemsetAsync_v3020_params *a = p;
        memory_event("memset", cb->functionName, (uintptr_t)a->devPtr, 0, (long long)a->count,
                     a->value);
    } else {
        const cudaMemcpyAsync_v3020_params *a = p;
        memory_event("copy", cb->functionName, (uintptr_t)a->dst, (uintptr_t)a->src,
                     (long long)a->count, a->kind);
    }
}

static void CUPTIAPI callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                              const void *data) {
    (void)userdata;
    if (tl_inside) return;
    tl_inside = 1;
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API)
        on_driver(data, id);
    else if (domain == CUPTI_CB_DOMAIN_RUNTIME_API)
        on_runtime(data, id);
    tl_inside = 0;
}

static void *driver_symbol(const char *name) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *fn = h ? dlsym(h, name) : NULL;
    return fn ? fn : dlsym(RTLD_DEFAULT, name);
}

int InitializeInjection(void) {
    const char *dir = getenv("EGF_CAPTURE_DIR");
    if (!dir || !*dir) return 1;  // injected outside `egf-audit capture`: stay out of the way
    snprintf(g.dir, sizeof g.dir, "%s", dir);
    const char *kernels = getenv("EGF_CAPTURE_SNAPSHOT");
    snprintf(g.snapshot_kernels, sizeof g.snapshot_kernels, "%s",
             kernels ? kernels : DEFAULT_SNAPSHOT);
    const char *values_max = getenv("EGF_CAPTURE_VALUES_MAX");
    if (values_max && *values_max) g.values_max = atoll(values_max);
    g.param_info = (ParamInfoFn)driver_symbol("cuFuncGetParamInfo");
    g.ctx_sync = (CtxSyncFn)driver_symbol("cuCtxSynchronize");
    g.dtoh = (DtoHFn)driver_symbol("cuMemcpyDtoH_v2");
    g.is_capturing = (IsCapturingFn)driver_symbol("cuStreamIsCapturing");
    atexit(on_exit_event);
    pthread_atfork(before_fork, after_fork, after_fork);

    uint32_t version = 0;
    cuptiGetVersion(&version);
    CUpti_SubscriberHandle subscriber;
    CUptiResult status = cuptiSubscribe(&subscriber, callback, NULL);
    if (begin_event("init")) {
        fprintf(g.events, ",\"pid\":%d,\"ppid\":%d,\"cupti_version\":%u,\"subscribe\":%d", (int)getpid(),
                (int)getppid(), version, (int)status);
        fprintf(g.events, ",\"param_info\":%s", g.param_info ? "true" : "false");
        end_event();
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
