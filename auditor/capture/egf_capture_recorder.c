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
 * Driver entry points are looked up with dlsym in the process's own libcuda, so the library
 * links against libcupti alone and loads on machines whose toolkit has no libcuda stub.
 *
 * Longer than a Python module here, on purpose: the injected library is one compilation unit
 * (built on first use with one compiler call), read top to bottom as event writer, cuBLAS
 * logger, cuBLASLt logger, snapshots, launches, runtime-API functions, driver callbacks and
 * InitializeInjection.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cupti.h>
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
typedef CUresult (*HostAllocFn)(void **, size_t);
typedef CUresult (*HostFreeFn)(void *);

static struct {
    pthread_mutex_t lock;
    FILE *events;
    FILE *snapshots;
    long long snapshot_bytes;
    // --deep's values file (values-<pid>.bin): the bytes of every change and of every new
    // allocation's non-zero words, in the order the events name them (docs/capture.md)
    FILE *values;
    int values_on;                  // deep and EGF_CAPTURE_DEEP_VALUES_MAX > 0
    unsigned long long values_bytes;  // written to this process's values file
    unsigned long long deep_values_max;  // EGF_CAPTURE_DEEP_VALUES_MAX
    pid_t pid;
    char dir[4096];
    char snapshot_kernels[1024];
    long long values_max;  // elements of a region kept as values (the hash covers all)
    unsigned long long seq;
    ParamInfoFn param_info;
    ParamInfoFn kernel_param_info;  // cuKernelGetParamInfo, with the handle taken as a CUkernel
    CtxSyncFn ctx_sync;
    DtoHFn dtoh;
    IsCapturingFn is_capturing;
    GetPointerModeFn get_pointer_mode;
    HostAllocFn host_alloc;  // cuMemAllocHost: the snapshots' page-locked staging buffer
    HostFreeFn host_free;
    int cublas_hooked;
    int lt_hooked;
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
static __thread int tl_rt_launch;   // that runtime call is a launch, recorded with its arguments
static __thread const char *tl_rt_name;  // that runtime call's name (a launch made inside it says)

/* ---- output ---- */
// values-<pid>.bin, opened anew. A forked child leaves its copy of the parent's stream alone,
// as it does the events' (closing it would write what it buffered into the parent's file;
// before_fork empties it, and the child never writes to it).
static void open_values_locked(pid_t pid) {
    char path[4200];
    snprintf(path, sizeof path, "%s/values-%d.bin", g.dir, (int)pid);
    g.values = fopen(path, "wb");
    g.values_bytes = 0;
}

static void open_files_locked(void) {
    pid_t pid = getpid();
    if (g.events && g.pid == pid) {
        if (g.values_on && !g.values) open_values_locked(pid);  // values turned on after the first event
        return;
    }
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
    if (g.values_on) open_values_locked(pid);
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
    if (g.values && g.pid == getpid()) fflush(g.values);
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
    if (g.values && g.pid == pid) fflush(g.values);
    pthread_mutex_unlock(&g.lock);
}

// fork: no event is half written across it, and the streams are empty when the child inherits
// them (it would flush the parent's buffered lines into the parent's files a second time).
static void before_fork(void) {
    pthread_mutex_lock(&g.lock);
    if (g.events && g.pid == getpid()) fflush(g.events);
    if (g.snapshots && g.pid == getpid()) fflush(g.snapshots);
    if (g.values && g.pid == getpid()) fflush(g.values);
}

static void after_fork(void) { pthread_mutex_unlock(&g.lock); }

/* ---- device reads (device-pointer-mode scalars, batched GEMMs' pointer arrays) ---- */
static int stream_capturing(CUstream s) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (g.is_capturing && g.is_capturing(s, &status) != CUDA_SUCCESS) return 0;
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

// `bytes` from device memory once every earlier launch of the context has finished: what a call
// enqueued now reads there. 0 (nothing read) while the stream is being captured into a graph.
static int device_read(void *host, unsigned long long ptr, size_t bytes, CUstream stream) {
    if (!ptr || !g.dtoh || !g.ctx_sync || stream_capturing(stream)) return 0;
    if (g.ctx_sync() != CUDA_SUCCESS) return 0;
    return g.dtoh(host, (CUdeviceptr)ptr, bytes) == CUDA_SUCCESS;
}

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

static long long int_after(const char *line, const char *key) {
    const char *p = strstr(line, key);
    const char *v = p ? strstr(p, "val=") : NULL;
    return v ? strtoll(v + 4, NULL, 10) : -1;
}

// cuBLAS hands its log to the callback a line or a few at a time: "I! ... cublasSgemm_v2(...)
// called:" opens a call, "i!  handle: ...", "i!  alpha: ..." lines follow, in the prototype's
// order. The call is still in progress on this thread: alpha and beta are read while it is, from
// host memory in host pointer mode, from device memory (after the context's earlier work) in
// device mode, once their type is known (the alpha line's type, or for the Ex calls, whose
// scalars are void*, the computeType line). A batched call's pointer arrays (device memory) are
// read at its batchCount line, so every batch's operands can be bound.
#define MAX_BATCH_POINTERS 4096
typedef int (*GetStreamFn)(void *, CUstream *);
static __thread int tl_in_log;      // our own cublasGetPointerMode call logs too: ignore it
static __thread int tl_gemm_call;   // the open call is a GEMM
static __thread unsigned long long tl_handle, tl_alpha, tl_beta, tl_arrays[3];
static __thread int tl_scalar_bytes;  // 2, 4, 8 or 16; 0 while the compute type decides
static GetStreamFn g_get_stream;

static int pointer_mode(unsigned long long handle) {
    int mode = -1;
    if (!handle || !g.get_pointer_mode) return mode;
    tl_in_log = 1;
    g.get_pointer_mode((void *)(uintptr_t)handle, &mode);
    tl_in_log = 0;
    return mode;
}

static CUstream handle_stream(unsigned long long handle) {
    CUstream s = NULL;
    if (handle && g_get_stream) {
        tl_in_log = 1;
        g_get_stream((void *)(uintptr_t)handle, &s);
        tl_in_log = 0;
    }
    return s;
}

static int scalar_bytes_of_type(const char *msg) {
    if (strstr(msg, "type=float;")) return 4;
    if (strstr(msg, "type=double;")) return 8;
    if (strstr(msg, "type=__half;")) return 2;
    if (strstr(msg, "type=cuComplex;")) return 8;
    if (strstr(msg, "type=cuDoubleComplex;")) return 16;
    return 0;  // void: the Ex calls, typed by their compute type
}

static int scalar_bytes_of_compute(const char *msg) {
    if (strstr(msg, "COMPUTE_64F")) return 8;
    if (strstr(msg, "COMPUTE_16F")) return 2;
    if (strstr(msg, "COMPUTE_32I") || strstr(msg, "COMPUTE_32F")) return 4;
    return 0;
}

// Read while the call is in progress, before its event line is opened: a device read is a
// driver call, which must neither be recorded as the trainer's nor wait on the events lock.
typedef struct {
    int mode, bytes, have[2];
    unsigned long long bits[2];
    long long batch;           // pointers read per array (0: none)
    unsigned long long *ptrs;  // 3 * batch: Aarray's, Barray's, Carray's (0 where unread)
} GemmExtras;

// alpha's and beta's first min(bytes, 8) bytes as little-endian integers
static void read_scalars(GemmExtras *x) {
    size_t n = x->bytes < 8 ? (size_t)x->bytes : 8;
    unsigned long long values[2] = {tl_alpha, tl_beta};
    CUstream stream = x->mode == 1 ? handle_stream(tl_handle) : NULL;
    for (int i = 0; i < 2; ++i) {
        x->bits[i] = 0;
        if (x->mode == 0 && values[i]) {
            memcpy(&x->bits[i], (const void *)(uintptr_t)values[i], n);
            x->have[i] = 1;
        } else if (x->mode == 1) {
            x->have[i] = device_read(&x->bits[i], values[i], n, stream);
        }
    }
}

static void read_pointer_arrays(GemmExtras *x, long long batch) {
    if (batch <= 0 || batch > MAX_BATCH_POINTERS) return;
    x->ptrs = calloc(3 * (size_t)batch, sizeof *x->ptrs);
    if (!x->ptrs) return;
    x->batch = batch;
    CUstream stream = handle_stream(tl_handle);
    for (int i = 0; i < 3; ++i) {
        unsigned long long *dst = x->ptrs + i * batch;
        if (!tl_arrays[i] || !device_read(dst, tl_arrays[i], (size_t)batch * sizeof *dst, stream))
            dst[0] = 0, tl_arrays[i] = 0;  // unread: not written
    }
}

static void write_extras(const GemmExtras *x) {
    static const char *keys[3] = {"a_ptrs", "b_ptrs", "c_ptrs"};
    if (x->mode >= 0) {
        fprintf(g.events, ",\"pointer_mode\":%d,\"scalar_bytes\":%d", x->mode, x->bytes);
        if (x->have[0]) fprintf(g.events, ",\"alpha_bits\":%llu", x->bits[0]);
        if (x->have[1]) fprintf(g.events, ",\"beta_bits\":%llu", x->bits[1]);
    }
    for (int i = 0; x->ptrs && i < 3; ++i) {
        if (!tl_arrays[i]) continue;
        fprintf(g.events, ",\"%s\":[", keys[i]);
        for (long long b = 0; b < x->batch; ++b)
            fprintf(g.events, "%s%llu", b ? "," : "", x->ptrs[i * x->batch + b]);
        fputc(']', g.events);
    }
}

static void on_cublas_log(const char *msg) {
    if (tl_inside || tl_in_log || !msg) return;
    const char *header = strstr(msg, "I! cuBLAS");
    if (header) {
        tl_gemm_call = strstr(header, "emm") != NULL;  // cublasSgemm_v2, cublasGemmEx, ...
        tl_handle = tl_alpha = tl_beta = 0;
        tl_arrays[0] = tl_arrays[1] = tl_arrays[2] = 0;
        tl_scalar_bytes = -1;
    }
    unsigned long long handle = hex_after(msg, "handle:");
    if (handle) tl_handle = handle;
    int scalars = 0;  // this line completes alpha and beta: write them on its event
    long long batch = -1;
    if (tl_gemm_call) {
        if (strstr(msg, "i!  alpha:")) {
            tl_alpha = hex_after(msg, "alpha:");
            tl_scalar_bytes = scalar_bytes_of_type(msg);
        } else if (strstr(msg, "i!  beta:")) {
            tl_beta = hex_after(msg, "beta:");
            scalars = tl_scalar_bytes > 0;
        } else if (strstr(msg, "i!  computeType:") && tl_scalar_bytes == 0) {
            tl_scalar_bytes = scalar_bytes_of_compute(msg);
            scalars = tl_scalar_bytes > 0;
        } else if (strstr(msg, "i!  Aarray:")) {
            tl_arrays[0] = hex_after(msg, "Aarray:");
        } else if (strstr(msg, "i!  Barray:")) {
            tl_arrays[1] = hex_after(msg, "Barray:");
        } else if (strstr(msg, "i!  Carray:")) {
            tl_arrays[2] = hex_after(msg, "Carray:");
        } else if (strstr(msg, "i!  batchCount:") && (tl_arrays[0] || tl_arrays[2])) {
            batch = int_after(msg, "batchCount:");
        }
    }
    GemmExtras x = {.mode = -1, .bytes = tl_scalar_bytes};
    tl_inside = 1;  // our own driver calls (device reads) are no events of the trainer
    if (scalars && (x.mode = pointer_mode(tl_handle)) >= 0) read_scalars(&x);
    if (batch > 0) read_pointer_arrays(&x, batch);
    tl_inside = 0;
    if (begin_event("cublas")) {
        fputs(",\"msg\":", g.events);
        json_string(g.events, msg);
        write_extras(&x);
        end_event();
    }
    free(x.ptrs);
}

/* ---- cuBLASLt: its own logger, API calls only; a matmul's layouts from its descriptors ---- */
typedef int (*LtGetAttrFn)(void *, int, void *, size_t, size_t *);
typedef void (*LtLoggerFn)(int, const char *, const char *);
typedef int (*LtSetCallbackFn)(LtLoggerFn);
typedef int (*LtSetMaskFn)(int);
typedef int (*LtSetFileFn)(FILE *);
static LtGetAttrFn g_lt_layout_get, g_lt_desc_get;
#define LT_LOG_API 16  // cublasLtLoggerSetMask: the API trace alone

// "A=0X7F00 Adesc=0X55..." -> the value of `key` (a whole word of the message), 0 if absent
static unsigned long long lt_field(const char *msg, const char *key) {
    size_t n = strlen(key);
    for (const char *p = msg; (p = strstr(p, key)) != NULL; p += n) {
        if ((p == msg || p[-1] == ' ') && p[n] == '=') return strtoull(p + n + 1, NULL, 16);
    }
    return 0;
}

static long long lt_attr(LtGetAttrFn get, unsigned long long desc, int attr, int bytes) {
    int64_t wide = 0;
    int32_t narrow = 0;
    size_t written = 0;
    void *buf = bytes == 4 ? (void *)&narrow : (void *)&wide;
    if (!get || !desc || get((void *)(uintptr_t)desc, attr, buf, (size_t)bytes, &written) != 0)
        return -1;
    return bytes == 4 ? (long long)narrow : (long long)wide;
}

// [type, order, rows, cols, ld, batch count, batch stride] of one matrix layout (-1: unreadable)
static void write_layout(const char *key, unsigned long long desc) {
    static const int attrs[7][2] = {{0, 4}, {1, 4}, {2, 8}, {3, 8}, {4, 8}, {5, 4}, {6, 8}};
    fprintf(g.events, ",\"%s\":", key);
    if (!desc) {
        fputs("null", g.events);
        return;
    }
    for (int i = 0; i < 7; ++i)
        fprintf(g.events, "%c%lld", i ? ',' : '[', lt_attr(g_lt_layout_get, desc, attrs[i][0],
                                                          attrs[i][1]));
    fputc(']', g.events);
}

// Bytes of a cudaDataType scale (capture/gemms.py's TYPE_BYTES; 0: not read)
static int scale_bytes(long long type) {
    switch (type) {
        case 0: case 6: case 10: case 15: return 4;   // R_32F, R_32F-like ints
        case 1: case 4: return 8;                      // R_64F, C_32F
        case 5: return 16;                             // C_64F (its real part is read)
        case 2: case 7: case 14: return 2;             // R_16F, C_16F, R_16BF
        default: return 0;
    }
}

// alpha and beta of a cublasLtMatmul: cuBLASLt's log never prints them, so the preloaded
// cublasLtMatmul below reads them before the call starts (host memory in host pointer mode,
// device memory after the context's earlier work in device mode, never under graph capture)
// and keeps their bits for the call's log line, written while the call is in progress.
static __thread int tl_lt_depth, tl_lt_have;
static __thread unsigned long long tl_lt_bits[2];

static void lt_scalars(void) {
    if (tl_lt_have)
        fprintf(g.events, ",\"alpha_bits\":%llu,\"beta_bits\":%llu", tl_lt_bits[0], tl_lt_bits[1]);
}

static void on_cublaslt_log(int level, const char *function, const char *msg) {
    (void)level;
    if (tl_inside || !function || !msg || strcmp(function, "cublasLtMatmul") != 0) return;
    static int shown;  // the first call's log line, as a note: what the fields were read from
    if (!shown++) {
        char line[512];
        snprintf(line, sizeof line, "cublasLtMatmul log: %s", msg);
        note(line);
    }
    unsigned long long desc = lt_field(msg, "computeDesc");
    if (!begin_event("ltmatmul")) return;
    fprintf(g.events, ",\"a\":%llu,\"b\":%llu,\"c\":%llu,\"d\":%llu", lt_field(msg, "A"),
            lt_field(msg, "B"), lt_field(msg, "C"), lt_field(msg, "D"));
    write_layout("adesc", lt_field(msg, "Adesc"));
    write_layout("bdesc", lt_field(msg, "Bdesc"));
    write_layout("cdesc", lt_field(msg, "Cdesc"));
    write_layout("ddesc", lt_field(msg, "Ddesc"));
    // compute type, scale type, pointer mode, transa, transb (MATMUL_DESC attributes 0..4)
    fputs(",\"desc\":[", g.events);
    long long attrs[5];
    for (int attr = 0; attr <= 4; ++attr) {
        attrs[attr] = lt_attr(g_lt_desc_get, desc, attr, 4);
        fprintf(g.events, "%s%lld", attr ? "," : "", attrs[attr]);
    }
    fputc(']', g.events);
    lt_scalars();
    end_event();
}

// cublasLtMatmul itself, where egf-audit capture preloads the recorder (LD_PRELOAD): it reads
// the call's alpha and beta (lt_scalars) and calls the real function, the next definition in
// the lookup order or, for a cuBLASLt loaded into a local scope (a Python extension's), the one
// in the loaded library. The same arguments go through and its status comes back.
typedef int (*LtMatmulFn)(void *, void *, const void *, const void *, void *, const void *,
                          void *, const void *, const void *, void *, void *, void *,
                          const void *, void *, size_t, void *);
// A loaded cuBLASLt, whatever its soname (a wheel's, a renamed bundled copy): its handle.
static int find_loaded_lt(struct dl_phdr_info *info, size_t size, void *handle) {
    (void)size;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "libcublasLt")) return 0;
    void *h = dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD);
    if (h) *(void **)handle = h;
    return h != NULL;
}

static void *lt_symbol(const char *name) {
    void *found = dlsym(RTLD_NEXT, name);
    void *h = NULL;
    if (!found && dl_iterate_phdr(find_loaded_lt, &h) && h) found = dlsym(h, name);
    return found;
}

// The scalars' bits, read before the call: 1 when both were read.
static int lt_read_scalars(void *desc, const void *alpha, const void *beta, void *stream) {
    static LtGetAttrFn get;
    if (!get) get = g_lt_desc_get ? g_lt_desc_get : (LtGetAttrFn)lt_symbol("cublasLtMatmulDescGetAttribute");
    long long type = lt_attr(get, (unsigned long long)(uintptr_t)desc, 1, 4);
    long long mode = lt_attr(get, (unsigned long long)(uintptr_t)desc, 2, 4);
    int bytes = scale_bytes(type);
    size_t n = bytes < 8 ? (size_t)bytes : 8;
    tl_lt_bits[0] = tl_lt_bits[1] = 0;
    if (!n || !alpha || !beta) return 0;
    if (mode == 0) {
        memcpy(&tl_lt_bits[0], alpha, n);
        memcpy(&tl_lt_bits[1], beta, n);
        return 1;
    }
    if (mode != 1) return 0;  // per-row scale vectors: not one alpha and beta
    int was_inside = tl_inside;
    tl_inside = 1;  // our own driver calls are no events of the trainer
    int ok = device_read(&tl_lt_bits[0], (unsigned long long)(uintptr_t)alpha, n, (CUstream)stream) &&
             device_read(&tl_lt_bits[1], (unsigned long long)(uintptr_t)beta, n, (CUstream)stream);
    tl_inside = was_inside;
    return ok;
}

__attribute__((visibility("default"))) int cublasLtMatmul(
    void *handle, void *desc, const void *alpha, const void *A, void *adesc, const void *B,
    void *bdesc, const void *beta, const void *C, void *cdesc, void *D, void *ddesc,
    const void *algo, void *workspace, size_t workspace_bytes, void *stream) {
    static LtMatmulFn real;
    if (!real) real = (LtMatmulFn)lt_symbol("cublasLtMatmul");
    if (!real || real == (LtMatmulFn)cublasLtMatmul) return 14;  // CUBLAS_STATUS_INTERNAL_ERROR
    int outer_have = tl_lt_have;
    unsigned long long outer[2] = {tl_lt_bits[0], tl_lt_bits[1]};
    if (tl_lt_depth++ == 0) tl_lt_have = lt_read_scalars(desc, alpha, beta, stream);
    int rc = real(handle, desc, alpha, A, adesc, B, bdesc, beta, C, cdesc, D, ddesc, algo,
                  workspace, workspace_bytes, stream);
    --tl_lt_depth;
    tl_lt_have = outer_have;
    tl_lt_bits[0] = outer[0];
    tl_lt_bits[1] = outer[1];
    return rc;
}

static void try_hook_cublas(void) {
    static const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    static const char *lt_names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    for (size_t i = 0; !g.lt_hooked && i < sizeof lt_names / sizeof *lt_names; ++i) {
        void *h = dlopen(lt_names[i], RTLD_NOW | RTLD_NOLOAD);
        if (!h) continue;
        LtSetCallbackFn set_cb = (LtSetCallbackFn)dlsym(h, "cublasLtLoggerSetCallback");
        LtSetMaskFn set_mask = (LtSetMaskFn)dlsym(h, "cublasLtLoggerSetMask");
        g_lt_layout_get = (LtGetAttrFn)dlsym(h, "cublasLtMatrixLayoutGetAttribute");
        g_lt_desc_get = (LtGetAttrFn)dlsym(h, "cublasLtMatmulDescGetAttribute");
        LtSetFileFn set_file = (LtSetFileFn)dlsym(h, "cublasLtLoggerSetFile");
        // the logger also prints every line to its file (stdout by default): the trainer's
        // output must stay its own
        FILE *quiet = set_file ? fopen("/dev/null", "w") : NULL;
        if (set_cb && set_mask && quiet) {
            set_file(quiet);
            set_cb(on_cublaslt_log);
            set_mask(LT_LOG_API);
            g.lt_hooked = 1;
            char msg[256];
            snprintf(msg, sizeof msg, "cublasLt logger attached: %s", lt_names[i]);
            note(msg);
        }
    }
    for (size_t i = 0; !g.cublas_hooked && i < sizeof names / sizeof *names; ++i) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
        if (!h) continue;
        LoggerConfigureFn configure = (LoggerConfigureFn)dlsym(h, "cublasLoggerConfigure");
        SetLoggerFn set_logger = (SetLoggerFn)dlsym(h, "cublasSetLoggerCallback");
        g.get_pointer_mode = (GetPointerModeFn)dlsym(h, "cublasGetPointerMode_v2");
        g_get_stream = (GetStreamFn)dlsym(h, "cublasGetStream_v2");
        if (configure && set_logger) {
            configure(1, 0, 0, NULL);
            set_logger(on_cublas_log);
            g.cublas_hooked = 1;
            char msg[256];
            snprintf(msg, sizeof msg, "cublas logger attached: %s", names[i]);
            note(msg);
        }
    }
}

/* ---- snapshots ---- */
/* ---- region hash (begin): tests/test_capture_region_hash.py compiles this part alone ---- */
// A snapshot region's hash, "mix64" (the init event names it): the sum modulo 2^64 of
// splitmix64's finaliser applied to each element's 32 bits plus its index times 2^64/phi.
// Every element is mixed on its own, so the loop runs at memory speed here (the byte-by-byte
// FNV-1a it replaces took about 4 cycles a byte, most of a prod capture's cost) and the reader
// recomputes it over every kept value with numpy. The elements of column `skip_col` of rows of
// `ld` are left out, keeping their indices for the rest.
static uint64_t mix64_element(uint32_t bits, uint64_t index) {
    uint64_t z = (uint64_t)bits + index * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t region_hash(const float *values, long long count, long long ld,
                            long long skip_col) {
    uint64_t h = 0;
    long long col = 0;
    for (long long i = 0; i < count; ++i) {
        uint32_t bits;
        memcpy(&bits, &values[i], sizeof bits);
        if (skip_col < 0 || col != skip_col) h += mix64_element(bits, (uint64_t)i);
        if (ld > 0 && ++col == ld) col = 0;
    }
    return h;
}
/* ---- region hash (end) ---- */

// A region's values on the host, in this thread's staging buffer (grown, never shrunk), page-
// locked where the driver gives one (a device-to-host copy into pageable memory is staged by
// the driver, at a fraction of the speed): a fresh allocation per region paid its page faults
// again each time. Valid until this thread's next copy; NULL when the copy fails.
static __thread float *tl_stage;
static __thread size_t tl_stage_count;
static __thread int tl_stage_pinned;

static float *copy_to_host(CUdeviceptr ptr, long long count) {
    if (count <= 0 || !g.dtoh) return NULL;
    if ((size_t)count > tl_stage_count) {
        if (tl_stage && tl_stage_pinned) g.host_free(tl_stage);
        if (tl_stage && !tl_stage_pinned) free(tl_stage);
        tl_stage = NULL;
        tl_stage_count = 0;
        void *grown = NULL;
        size_t bytes = (size_t)count * sizeof(float);
        tl_stage_pinned = g.host_alloc && g.host_free && g.host_alloc(&grown, bytes) == CUDA_SUCCESS;
        if (!tl_stage_pinned) grown = malloc(bytes);
        if (!grown) return NULL;
        tl_stage = grown;
        tl_stage_count = (size_t)count;
    }
    if (g.dtoh(tl_stage, ptr, (size_t)count * sizeof(float)) != CUDA_SUCCESS) return NULL;
    return tl_stage;
}

static int device_hash(CUdeviceptr p, long long count, long long ld, long long skip_col,
                       uint64_t *out);

// One region: its hash `h` over all `count` elements (those of column `skip_col` left out when
// skip_col >= 0) and, up to values_max, the values themselves from `host`.
static void write_region(unsigned long long launch, const char *when, const char *region,
                         CUdeviceptr ptr, const float *host, uint64_t h, long long count,
                         long long rows, long long ld, long long skip_col) {
    long long keep = count < g.values_max ? count : g.values_max;
    if (skip_col >= 0 || !host) keep = 0;  // the body of a matrix: its hash is what the audit reads
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

// A region of `count` elements: hashed on the GPU where the recorder's kernels load (then only
// the values kept are copied), else hashed here over a copy of all of it.
static void snap(unsigned long long launch, const char *when, const char *region, CUdeviceptr p,
                 long long count) {
    uint64_t h = 0;
    long long keep = count < g.values_max ? count : g.values_max;
    float *host = NULL;
    if (device_hash(p, count, count, -1, &h)) {
        if (keep > 0 && !(host = copy_to_host(p, keep))) return;
    } else {
        if (!(host = copy_to_host(p, count))) return;
        h = region_hash(host, count, count, -1);
    }
    write_region(launch, when, region, p, host, h, count, 1, count, -1);
}

// The wire column (values) and the rest of a [rows, ld] dX concat (hash only).
static void snap_concat(unsigned long long launch, const char *when, CUdeviceptr p, long long rows,
                        long long ld) {
    float *host = copy_to_host(p, rows * ld);
    if (!host) return;
    uint64_t body = 0;
    if (!device_hash(p, rows * ld, ld, ld - 1, &body)) body = region_hash(host, rows * ld, ld, ld - 1);
    float *wire = malloc((size_t)rows * sizeof(float));
    for (long long b = 0; wire && b < rows; ++b) wire[b] = host[b * ld + ld - 1];
    if (wire) write_region(launch, when, "wire", p, wire, region_hash(wire, rows, 1, -1), rows, rows, 1, -1);
    write_region(launch, when, "body", p, NULL, body, rows * ld, rows, ld, ld - 1);
    free(wire);
}

/* ---- --deep: every allocation compared after every launch, memset and copy ---- */
// The recorder keeps a device copy (shadow) of every live allocation. After each call of the
// trainer has finished, one kernel (egf_deep_diff in egf_recorder_kernels.cu, loaded by the recorder
// itself) compares every allocation with its copy word by word on the GPU, sets a bit per
// changed word and brings the copy up to date; only the bitmaps of allocations that changed
// come back to the host, as runs of changed bytes in an `effect` event. Meant for smoke tests
// at small shapes: it doubles the device memory and synchronises after every call.
// PTX of egf_recorder_kernels.cu: `nvcc -ptx -arch=compute_75`, its .version lowered to 7.0 so
// that older drivers load it too (tests/test_capture_deep.py compiles the source and compares).
static const char KERNELS_PTX[] =
/* ---- kernels ptx ---- */
    ".version 7.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    "\n"
    "\t// .globl\tegf_region_hash\n"
    "\n"
    ".visible .entry egf_region_hash(\n"
    "\t.param .u64 egf_region_hash_param_0,\n"
    "\t.param .u64 egf_region_hash_param_1,\n"
    "\t.param .u64 egf_region_hash_param_2,\n"
    "\t.param .u64 egf_region_hash_param_3,\n"
    "\t.param .u64 egf_region_hash_param_4\n"
    ")\n"
    "{\n"
    "\t.reg .pred \t%p<25>;\n"
    "\t.reg .b32 \t%r<50>;\n"
    "\t.reg .b64 \t%rd<110>;\n"
    "\n"
    "\n"
    "\tld.param.u64 \t%rd25, [egf_region_hash_param_0];\n"
    "\tld.param.u64 \t%rd26, [egf_region_hash_param_1];\n"
    "\tld.param.u64 \t%rd27, [egf_region_hash_param_2];\n"
    "\tld.param.u64 \t%rd28, [egf_region_hash_param_3];\n"
    "\tld.param.u64 \t%rd29, [egf_region_hash_param_4];\n"
    "\tmov.u32 \t%r1, %ntid.x;\n"
    "\tmov.u32 \t%r2, %ctaid.x;\n"
    "\tmul.wide.u32 \t%rd31, %r2, %r1;\n"
    "\tmov.u32 \t%r3, %tid.x;\n"
    "\tcvt.u64.u32 \t%rd32, %r3;\n"
    "\tadd.s64 \t%rd105, %rd31, %rd32;\n"
    "\tsetp.ge.u64 \t%p1, %rd105, %rd26;\n"
    "\tmov.u64 \t%rd109, 0;\n"
    "\t@%p1 bra \t$L__BB0_16;\n"
    "\n"
    "\tsetp.gt.s64 \t%p2, %rd27, 0;\n"
    "\t@%p2 bra \t$L__BB0_9;\n"
    "\tbra.uni \t$L__BB0_2;\n"
    "\n"
    "$L__BB0_9:\n"
    "\tmov.u64 \t%rd109, 0;\n"
    "\tcvt.u32.u64 \t%r16, %rd27;\n"
    "\tmov.u32 \t%r19, %nctaid.x;\n"
    "\n"
    "$L__BB0_10:\n"
    "\tor.b64  \t%rd71, %rd105, %rd27;\n"
    "\tand.b64  \t%rd72, %rd71, -4294967296;\n"
    "\tsetp.eq.s64 \t%p7, %rd72, 0;\n"
    "\t@%p7 bra \t$L__BB0_12;\n"
    "\n"
    "\trem.u64 \t%rd107, %rd105, %rd27;\n"
    "\tbra.uni \t$L__BB0_13;\n"
    "\n"
    "$L__BB0_12:\n"
    "\tcvt.u32.u64 \t%r17, %rd105;\n"
    "\trem.u32 \t%r18, %r17, %r16;\n"
    "\tcvt.u64.u32 \t%rd107, %r18;\n"
    "\n"
    "$L__BB0_13:\n"
    "\tsetp.eq.s64 \t%p8, %rd107, %rd28;\n"
    "\tsetp.gt.s64 \t%p9, %rd28, -1;\n"
    "\tand.pred  \t%p10, %p9, %p8;\n"
    "\t@%p10 bra \t$L__BB0_15;\n"
    "\n"
    "\tcvta.to.global.u64 \t%rd73, %rd25;\n"
    "\tshl.b64 \t%rd74, %rd105, 2;\n"
    "\tadd.s64 \t%rd75, %rd73, %rd74;\n"
    "\tld.global.u32 \t%rd76, [%rd75];\n"
    "\tmul.lo.s64 \t%rd77, %rd105, -7046029254386353131;\n"
    "\tadd.s64 \t%rd78, %rd77, %rd76;\n"
    "\tshr.u64 \t%rd79, %rd78, 30;\n"
    "\txor.b64  \t%rd80, %rd79, %rd78;\n"
    "\tmul.lo.s64 \t%rd81, %rd80, -4658895280553007687;\n"
    "\tshr.u64 \t%rd82, %rd81, 27;\n"
    "\txor.b64  \t%rd83, %rd82, %rd81;\n"
    "\tmul.lo.s64 \t%rd84, %rd83, -7723592293110705685;\n"
    "\tshr.u64 \t%rd85, %rd84, 31;\n"
    "\txor.b64  \t%rd86, %rd85, %rd84;\n"
    "\tadd.s64 \t%rd109, %rd86, %rd109;\n"
    "\n"
    "$L__BB0_15:\n"
    "\tmul.wide.u32 \t%rd87, %r19, %r1;\n"
    "\tadd.s64 \t%rd105, %rd105, %rd87;\n"
    "\tsetp.lt.u64 \t%p11, %rd105, %rd26;\n"
    "\t@%p11 bra \t$L__BB0_10;\n"
    "\tbra.uni \t$L__BB0_16;\n"
    "\n"
    "$L__BB0_2:\n"
    "\tsetp.lt.s64 \t%p3, %rd28, 0;\n"
    "\t@%p3 bra \t$L__BB0_7;\n"
    "\n"
    "\tadd.s64 \t%rd100, %rd31, %rd32;\n"
    "\tmov.u64 \t%rd109, 0;\n"
    "\tmov.u32 \t%r7, %nctaid.x;\n"
    "\n"
    "$L__BB0_4:\n"
    "\tsetp.eq.s64 \t%p4, %rd28, 0;\n"
    "\t@%p4 bra \t$L__BB0_6;\n"
    "\n"
    "\tcvta.to.global.u64 \t%rd37, %rd25;\n"
    "\tshl.b64 \t%rd38, %rd100, 2;\n"
    "\tadd.s64 \t%rd39, %rd37, %rd38;\n"
    "\tld.global.u32 \t%rd40, [%rd39];\n"
    "\tmul.lo.s64 \t%rd41, %rd100, -7046029254386353131;\n"
    "\tadd.s64 \t%rd42, %rd41, %rd40;\n"
    "\tshr.u64 \t%rd43, %rd42, 30;\n"
    "\txor.b64  \t%rd44, %rd43, %rd42;\n"
    "\tmul.lo.s64 \t%rd45, %rd44, -4658895280553007687;\n"
    "\tshr.u64 \t%rd46, %rd45, 27;\n"
    "\txor.b64  \t%rd47, %rd46, %rd45;\n"
    "\tmul.lo.s64 \t%rd48, %rd47, -7723592293110705685;\n"
    "\tshr.u64 \t%rd49, %rd48, 31;\n"
    "\txor.b64  \t%rd50, %rd49, %rd48;\n"
    "\tadd.s64 \t%rd109, %rd50, %rd109;\n"
    "\n"
    "$L__BB0_6:\n"
    "\tmul.wide.u32 \t%rd51, %r7, %r1;\n"
    "\tadd.s64 \t%rd100, %rd100, %rd51;\n"
    "\tsetp.lt.u64 \t%p5, %rd100, %rd26;\n"
    "\t@%p5 bra \t$L__BB0_4;\n"
    "\tbra.uni \t$L__BB0_16;\n"
    "\n"
    "$L__BB0_7:\n"
    "\tadd.s64 \t%rd103, %rd31, %rd32;\n"
    "\tcvta.to.global.u64 \t%rd8, %rd25;\n"
    "\tmov.u32 \t%r12, %nctaid.x;\n"
    "\tmul.wide.u32 \t%rd9, %r12, %r1;\n"
    "\tmov.u64 \t%rd109, 0;\n"
    "\n"
    "$L__BB0_8:\n"
    "\tshl.b64 \t%rd55, %rd103, 2;\n"
    "\tadd.s64 \t%rd56, %rd8, %rd55;\n"
    "\tld.global.u32 \t%rd57, [%rd56];\n"
    "\tmul.lo.s64 \t%rd58, %rd103, -7046029254386353131;\n"
    "\tadd.s64 \t%rd59, %rd58, %rd57;\n"
    "\tshr.u64 \t%rd60, %rd59, 30;\n"
    "\txor.b64  \t%rd61, %rd60, %rd59;\n"
    "\tmul.lo.s64 \t%rd62, %rd61, -4658895280553007687;\n"
    "\tshr.u64 \t%rd63, %rd62, 27;\n"
    "\txor.b64  \t%rd64, %rd63, %rd62;\n"
    "\tmul.lo.s64 \t%rd65, %rd64, -7723592293110705685;\n"
    "\tshr.u64 \t%rd66, %rd65, 31;\n"
    "\txor.b64  \t%rd67, %rd66, %rd65;\n"
    "\tadd.s64 \t%rd109, %rd67, %rd109;\n"
    "\tadd.s64 \t%rd103, %rd103, %rd9;\n"
    "\tsetp.lt.u64 \t%p6, %rd103, %rd26;\n"
    "\t@%p6 bra \t$L__BB0_8;\n"
    "\n"
    "$L__BB0_16:\n"
    "\t// begin inline asm\n"
    "\tmov.b64 {%r21,%r22}, %rd109;\n"
    "\t// end inline asm\n"
    "\tmov.u32 \t%r41, 2;\n"
    "\tmov.u32 \t%r42, 31;\n"
    "\tmov.u32 \t%r43, 16;\n"
    "\tmov.u32 \t%r44, -1;\n"
    "\tshfl.sync.down.b32 \t%r24|%p12, %r22, %r43, %r42, %r44;\n"
    "\tshfl.sync.down.b32 \t%r23|%p13, %r21, %r43, %r42, %r44;\n"
    "\t// begin inline asm\n"
    "\tmov.b64 %rd89, {%r23,%r24};\n"
    "\t// end inline asm\n"
    "\tadd.s64 \t%rd90, %rd89, %rd109;\n"
    "\t// begin inline asm\n"
    "\tmov.b64 {%r25,%r26}, %rd90;\n"
    "\t// end inline asm\n"
    "\tmov.u32 \t%r45, 8;\n"
    "\tshfl.sync.down.b32 \t%r28|%p14, %r26, %r45, %r42, %r44;\n"
    "\tshfl.sync.down.b32 \t%r27|%p15, %r25, %r45, %r42, %r44;\n"
    "\t// begin inline asm\n"
    "\tmov.b64 %rd91, {%r27,%r28};\n"
    "\t// end inline asm\n"
    "\tadd.s64 \t%rd92, %rd91, %rd90;\n"
    "\t// begin inline asm\n"
    "\tmov.b64 {%r29,%r30}, %rd92;\n"
    "\t// end inline asm\n"
    "\tmov.u32 \t%r46, 4;\n"
    "\tshfl.sync.down.b32 \t%r32|%p16, %r30, %r46, %r42, %r44;\n"
    "\tshfl.sync.down.b32 \t%r31|%p17, %r29, %r46, %r42, %r44;\n"
    "\t// begin inline asm\n"
    "\tmov.b64 %rd93, {%r31,%r32};\n"
    "\t// end inline asm\n"
    "\tadd.s64 \t%rd94, %rd93, %rd92;\n"
    "\t// begin inline asm\n"
    "\tmov.b64 {%r33,%r34}, %rd94;\n"
    "\t// end inline asm\n"
    "\tshfl.sync.down.b32 \t%r36|%p18, %r34, %r41, %r42, %r44;\n"
    "\tshfl.sync.down.b32 \t%r35|%p19, %r33, %r41, %r42, %r44;\n"
    "\t// begin inline asm\n"
    "\tmov.b64 %rd95, {%r35,%r36};\n"
    "\t// end inline asm\n"
    "\tadd.s64 \t%rd96, %rd95, %rd94;\n"
    "\t// begin inline asm\n"
    "\tmov.b64 {%r37,%r38}, %rd96;\n"
    "\t// end inline asm\n"
    "\tmov.u32 \t%r47, 1;\n"
    "\tshfl.sync.down.b32 \t%r40|%p20, %r38, %r47, %r42, %r44;\n"
    "\tshfl.sync.down.b32 \t%r39|%p21, %r37, %r47, %r42, %r44;\n"
    "\t// begin inline asm\n"
    "\tmov.b64 %rd97, {%r39,%r40};\n"
    "\t// end inline asm\n"
    "\tadd.s64 \t%rd24, %rd97, %rd96;\n"
    "\tand.b32  \t%r49, %r3, 31;\n"
    "\tsetp.ne.s32 \t%p22, %r49, 0;\n"
    "\tsetp.eq.s64 \t%p23, %rd24, 0;\n"
    "\tor.pred  \t%p24, %p22, %p23;\n"
    "\t@%p24 bra \t$L__BB0_18;\n"
    "\n"
    "\tcvta.to.global.u64 \t%rd98, %rd29;\n"
    "\tatom.global.add.u64 \t%rd99, [%rd98], %rd24;\n"
    "\n"
    "$L__BB0_18:\n"
    "\tret;\n"
    "\n"
    "}\n"
    "\t// .globl\tegf_deep_diff\n"
    ".visible .entry egf_deep_diff(\n"
    "\t.param .u64 egf_deep_diff_param_0,\n"
    "\t.param .u64 egf_deep_diff_param_1,\n"
    "\t.param .u64 egf_deep_diff_param_2\n"
    ")\n"
    "{\n"
    "\t.reg .pred \t%p<5>;\n"
    "\t.reg .b32 \t%r<23>;\n"
    "\t.reg .b64 \t%rd<32>;\n"
    "\n"
    "\n"
    "\tld.param.u64 \t%rd16, [egf_deep_diff_param_0];\n"
    "\tld.param.u64 \t%rd14, [egf_deep_diff_param_1];\n"
    "\tld.param.u64 \t%rd15, [egf_deep_diff_param_2];\n"
    "\tmov.u32 \t%r7, %ctaid.y;\n"
    "\tcvt.u64.u32 \t%rd1, %r7;\n"
    "\tcvta.to.global.u64 \t%rd17, %rd16;\n"
    "\tmul.wide.u32 \t%rd18, %r7, 32;\n"
    "\tadd.s64 \t%rd2, %rd17, %rd18;\n"
    "\tmov.u32 \t%r8, %ntid.x;\n"
    "\tcvt.u64.u32 \t%rd3, %r8;\n"
    "\tmov.u32 \t%r9, %ctaid.x;\n"
    "\tmul.wide.u32 \t%rd19, %r9, %r8;\n"
    "\tmov.u32 \t%r10, %tid.x;\n"
    "\tcvt.u64.u32 \t%rd20, %r10;\n"
    "\tadd.s64 \t%rd31, %rd19, %rd20;\n"
    "\tld.global.u64 \t%rd5, [%rd2+16];\n"
    "\tsetp.ge.u64 \t%p1, %rd31, %rd5;\n"
    "\tmov.u32 \t%r21, 0;\n"
    "\t@%p1 bra \t$L__BB1_5;\n"
    "\n"
    "\tld.global.u64 \t%rd6, [%rd2];\n"
    "\tld.global.u64 \t%rd7, [%rd2+8];\n"
    "\tld.global.u64 \t%rd8, [%rd2+24];\n"
    "\tmov.u32 \t%r12, %nctaid.x;\n"
    "\tcvt.u64.u32 \t%rd21, %r12;\n"
    "\tmul.lo.s64 \t%rd9, %rd21, %rd3;\n"
    "\tcvta.to.global.u64 \t%rd10, %rd14;\n"
    "\tmov.u32 \t%r21, 0;\n"
    "\n"
    "$L__BB1_2:\n"
    "\tshl.b64 \t%rd22, %rd31, 2;\n"
    "\tadd.s64 \t%rd12, %rd7, %rd22;\n"
    "\tld.u32 \t%r13, [%rd12];\n"
    "\tadd.s64 \t%rd23, %rd6, %rd22;\n"
    "\tld.u32 \t%r2, [%rd23];\n"
    "\tsetp.eq.s32 \t%p2, %r2, %r13;\n"
    "\t@%p2 bra \t$L__BB1_4;\n"
    "\n"
    "\tst.u32 \t[%rd12], %r2;\n"
    "\tshr.u64 \t%rd24, %rd31, 5;\n"
    "\tadd.s64 \t%rd25, %rd24, %rd8;\n"
    "\tshl.b64 \t%rd26, %rd25, 2;\n"
    "\tadd.s64 \t%rd27, %rd10, %rd26;\n"
    "\tcvt.u32.u64 \t%r14, %rd31;\n"
    "\tand.b32  \t%r15, %r14, 31;\n"
    "\tmov.u32 \t%r16, 1;\n"
    "\tshl.b32 \t%r17, %r16, %r15;\n"
    "\tatom.global.or.b32 \t%r18, [%rd27], %r17;\n"
    "\tadd.s32 \t%r21, %r21, 1;\n"
    "\n"
    "$L__BB1_4:\n"
    "\tadd.s64 \t%rd31, %rd31, %rd9;\n"
    "\tsetp.lt.u64 \t%p3, %rd31, %rd5;\n"
    "\t@%p3 bra \t$L__BB1_2;\n"
    "\n"
    "$L__BB1_5:\n"
    "\tsetp.eq.s32 \t%p4, %r21, 0;\n"
    "\t@%p4 bra \t$L__BB1_7;\n"
    "\n"
    "\tcvta.to.global.u64 \t%rd28, %rd15;\n"
    "\tshl.b64 \t%rd29, %rd1, 2;\n"
    "\tadd.s64 \t%rd30, %rd28, %rd29;\n"
    "\tatom.global.add.u32 \t%r19, [%rd30], %r21;\n"
    "\n"
    "$L__BB1_7:\n"
    "\tret;\n"
    "\n"
    "}\n"
    "\n"
/* ---- kernels ptx (end) ---- */
    ;
#define DEEP_ROUND 256  // allocations are this aligned: the slack after one is read too
typedef CUresult (*MemAllocFn)(CUdeviceptr *, size_t);
typedef CUresult (*MemFreeFn)(CUdeviceptr);
typedef CUresult (*CopyHtoDFn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*MemsetD32Fn)(CUdeviceptr, unsigned int, size_t);
typedef CUresult (*ModuleLoadFn)(CUmodule *, const void *);
typedef CUresult (*ModuleFunctionFn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*LaunchFn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
typedef struct {
    unsigned long long base, shadow, words, bitmap;  // as egf_deep_diff's EgfDeepEntry
} DeepEntry;
typedef struct {
    unsigned long long base, shadow, bytes, words;
} DeepAlloc;
static struct {
    pthread_mutex_t lock;
    int on, failed, dirty;
    MemAllocFn alloc;
    MemFreeFn free_;
    CopyHtoDFn htod;
    MemsetD32Fn memset32;
    ModuleLoadFn load;
    ModuleFunctionFn function;
    LaunchFn launch;
    CUfunction diff;
    DeepAlloc *a;  // sorted by base
    int n, cap;
    CUdeviceptr table, bitmap, counts;
    size_t table_cap, bitmap_cap, counts_cap;  // words each
    CUdeviceptr one, scratch;  // a new allocation's copy is made by the kernel: its table, bits
    size_t one_cap, scratch_cap;
    unsigned int *host_counts, *host_bits;
    size_t host_counts_cap, host_bits_cap;
    unsigned long long *runs;  // (address, bytes) pairs of one effect, gathered before it is written
    size_t runs_cap;
    unsigned char *vals, *span;  // the runs' new bytes; one allocation's span of its copy
    size_t vals_cap, span_cap;   // bytes
    int values_stopped;          // the values file reached EGF_CAPTURE_DEEP_VALUES_MAX
} deep = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void deep_fail(const char *what, int rc) {
    if (deep.failed) return;
    deep.failed = 1;  // said once; every later call then lacks its effect, which the reader fails
    char msg[256];
    snprintf(msg, sizeof msg, "deep capture stopped: %s failed (%d)", what, rc);
    note(msg);
}

static int deep_grow(CUdeviceptr *p, size_t *cap, size_t want_words) {
    if (want_words <= *cap) return 1;
    size_t words = want_words * 2;
    if (*p) deep.free_(*p);
    *p = 0;
    *cap = 0;
    CUresult rc = deep.alloc(p, words * 4);
    if (rc != CUDA_SUCCESS) {
        deep_fail("cuMemAlloc for the deep capture's buffers", (int)rc);
        return 0;
    }
    *cap = words;
    return 1;
}

// `p` grown to hold `want` words (NULL when it cannot be; `p` is then kept as it was).
static void *host_grow(void *p, size_t *cap, size_t want) {
    if (want <= *cap) return p;
    void *grown = realloc(p, want * 2 * sizeof(unsigned int));
    if (grown) *cap = want * 2;
    return grown;
}

// The recorder's kernels, loaded once into the context current at the first use.
static pthread_once_t kernels_once = PTHREAD_ONCE_INIT;
static CUfunction hash_fn;
static CUdeviceptr hash_out;
static CUresult kernels_rc = CUDA_ERROR_NOT_INITIALIZED;
static void load_kernels(void) {
    CUmodule mod;
    if (!deep.load || !deep.function || !deep.launch || !deep.alloc) return;
    kernels_rc = deep.load(&mod, KERNELS_PTX);
    if (kernels_rc == CUDA_SUCCESS) kernels_rc = deep.function(&deep.diff, mod, "egf_deep_diff");
    if (kernels_rc == CUDA_SUCCESS) kernels_rc = deep.function(&hash_fn, mod, "egf_region_hash");
    if (kernels_rc == CUDA_SUCCESS) kernels_rc = deep.alloc(&hash_out, 16);
    if (kernels_rc != CUDA_SUCCESS) {
        char msg[128];
        snprintf(msg, sizeof msg, "the recorder's kernels did not load (%d): hashing on the host",
                 (int)kernels_rc);
        note(msg);
    }
}

static int deep_module(void) {
    pthread_once(&kernels_once, load_kernels);
    if (kernels_rc != CUDA_SUCCESS) deep_fail("loading the deep capture's kernel", (int)kernels_rc);
    return kernels_rc == CUDA_SUCCESS;
}

// A region's mix64 hash computed on the GPU (1), or 0 where the kernels are not loaded or a
// call failed: the caller then hashes a host copy.
static int device_hash(CUdeviceptr p, long long count, long long ld, long long skip_col,
                       uint64_t *out) {
    pthread_once(&kernels_once, load_kernels);
    if (kernels_rc != CUDA_SUCCESS || count <= 0) return 0;
    unsigned long long n = (unsigned long long)count;
    unsigned grid = (unsigned)((n + 1023) / 1024 < 4096 ? (n + 1023) / 1024 : 4096);
    void *args[5] = {&p, &n, &ld, &skip_col, &hash_out};
    CUresult rc = deep.memset32(hash_out, 0, 2);
    if (rc == CUDA_SUCCESS)
        rc = deep.launch(hash_fn, grid ? grid : 1, 1, 1, 256, 1, 1, 0, NULL, args, NULL);
    if (rc == CUDA_SUCCESS) rc = g.ctx_sync();
    if (rc == CUDA_SUCCESS) rc = g.dtoh(out, hash_out, sizeof *out);
    return rc == CUDA_SUCCESS;
}

static CUresult deep_run(CUdeviceptr table, unsigned rows, unsigned long long longest,
                         CUdeviceptr bitmap, CUdeviceptr counts) {
    unsigned grid_x = (unsigned)((longest + 255) / 256 < 1024 ? (longest + 255) / 256 : 1024);
    void *args[3] = {&table, &bitmap, &counts};
    return deep.launch(deep.diff, grid_x ? grid_x : 1, rows, 1, 256, 1, 1, 0, NULL, args, NULL);
}

static void deep_untrack(unsigned long long base) {
    if (!deep.on) return;
    pthread_mutex_lock(&deep.lock);
    for (int i = 0; i < deep.n; ++i) {
        if (deep.a[i].base != base) continue;
        deep.free_(deep.a[i].shadow);
        memmove(&deep.a[i], &deep.a[i + 1], (size_t)(deep.n - i - 1) * sizeof deep.a[0]);
        --deep.n;
        deep.dirty = 1;
        break;
    }
    pthread_mutex_unlock(&deep.lock);
}

// The words of allocation i compared: up to its 256-byte-rounded end, never into the next
// allocation (one pool may pack them closer), so no byte is compared, or reported, twice.
static unsigned long long deep_scan(int i) {
    unsigned long long words = deep.a[i].words;
    if (i + 1 < deep.n) {
        unsigned long long room = (deep.a[i + 1].base - deep.a[i].base) / 4;
        if (room < words) words = room;
    }
    return words;
}

// The table, the bitmaps and the counters for the allocations live now.
static int deep_prepare(void) {
    if (!deep_module()) return 0;
    if (!deep.dirty) return 1;
    size_t bitmap_words = 0;
    DeepEntry *entries = malloc((size_t)(deep.n ? deep.n : 1) * sizeof *entries);
    if (!entries) return 0;
    for (int i = 0; i < deep.n; ++i) {
        entries[i] = (DeepEntry){deep.a[i].base, deep.a[i].shadow, deep_scan(i), bitmap_words};
        bitmap_words += (deep_scan(i) + 31) / 32;
    }
    int ok = deep_grow(&deep.table, &deep.table_cap, (size_t)deep.n * sizeof(DeepEntry) / 4 + 1) &&
             deep_grow(&deep.bitmap, &deep.bitmap_cap, bitmap_words + 1) &&
             deep_grow(&deep.counts, &deep.counts_cap, (size_t)deep.n + 1);
    if (ok && deep.n) {
        CUresult rc = deep.htod(deep.table, entries, (size_t)deep.n * sizeof(DeepEntry));
        if (rc == CUDA_SUCCESS) rc = deep.memset32(deep.bitmap, 0, bitmap_words);
        if (rc != CUDA_SUCCESS) {
            deep_fail("uploading the deep capture's table", (int)rc);
            ok = 0;
        }
    }
    free(entries);
    deep.dirty = !ok;
    return ok;
}

// The changed words of the allocation at `base`, read from its bitmap `slice` (then cleared),
// appended to deep.runs as (address, bytes) pairs; a run that meets the last one extends it.
// 0 on failure.
static int deep_bitmap_runs(unsigned long long base, CUdeviceptr slice, size_t words,
                            size_t *runs) {
    unsigned int *bits = host_grow(deep.host_bits, &deep.host_bits_cap, words);
    if (!bits) return 0;
    deep.host_bits = bits;
    if (g.dtoh(bits, slice, words * 4) != CUDA_SUCCESS) return 0;
    if (deep.memset32(slice, 0, words) != CUDA_SUCCESS) return 0;
    for (size_t w = 0; w < words; ++w) {
        for (unsigned int word = bits[w]; word; word &= word - 1) {
            unsigned long long at = base + 4ULL * (w * 32 + (size_t)__builtin_ctz(word));
            if (*runs && deep.runs[2 * *runs - 2] + deep.runs[2 * *runs - 1] == at) {
                deep.runs[2 * *runs - 1] += 4;
                continue;
            }
            if (2 * (*runs + 1) > deep.runs_cap) {
                size_t cap = deep.runs_cap ? 2 * deep.runs_cap : 1024;
                unsigned long long *grown = realloc(deep.runs, cap * sizeof *grown);
                if (!grown) return 0;
                deep.runs = grown;
                deep.runs_cap = cap;
            }
            deep.runs[2 * *runs] = at;
            deep.runs[2 * *runs + 1] = 4;
            ++*runs;
        }
    }
    return 1;
}

// `*p` grown to hold `want` bytes (0 when it cannot be; `*p` is then kept as it was).
static int bytes_grow(unsigned char **p, size_t *cap, size_t want) {
    if (want <= *cap) return 1;
    unsigned char *grown = realloc(*p, want * 2);
    if (!grown) return 0;
    *p = grown;
    *cap = want * 2;
    return 1;
}

// The new bytes of deep.runs[0 .. runs) into deep.vals, read from the recorder's copies (which
// the comparison has just brought up to date): one copy back per allocation, of the span from
// its first changed byte to its last. `*total` is their count. 0 on failure.
static int deep_values(size_t runs, size_t *total) {
    *total = 0;
    for (size_t r = 0; r < runs; ++r) *total += deep.runs[2 * r + 1];
    if (!bytes_grow(&deep.vals, &deep.vals_cap, *total + 1)) return 0;
    size_t pos = 0;
    int i = 0, span_of = -1;
    unsigned long long span_at = 0;
    for (size_t r = 0; r < runs; ++r) {
        unsigned long long at = deep.runs[2 * r], left = deep.runs[2 * r + 1];
        while (left) {
            while (i < deep.n && deep.a[i].base + 4 * deep_scan(i) <= at) ++i;
            if (i == deep.n || deep.a[i].base > at) return 0;  // in no allocation: cannot be
            unsigned long long end = deep.a[i].base + 4 * deep_scan(i);
            if (span_of != i) {
                unsigned long long last = at + left < end ? at + left : end;
                for (size_t q = r + 1; q < runs && deep.runs[2 * q] < end; ++q) {
                    unsigned long long stop = deep.runs[2 * q] + deep.runs[2 * q + 1];
                    last = stop < end ? stop : end;
                }
                if (!bytes_grow(&deep.span, &deep.span_cap, last - at)) return 0;
                if (g.dtoh(deep.span, deep.a[i].shadow + (at - deep.a[i].base), last - at) !=
                    CUDA_SUCCESS)
                    return 0;
                span_of = i;
                span_at = at;
            }
            unsigned long long piece = left < end - at ? left : end - at;
            memcpy(deep.vals + pos, deep.span + (at - span_at), piece);
            pos += piece;
            at += piece;
            left -= piece;
        }
    }
    return 1;
}

// Whether `bytes` more values may be written; past EGF_CAPTURE_DEEP_VALUES_MAX the values
// stop (said once): every later event lacks "values", which the reader takes as unknown memory.
static int values_fit(size_t bytes) {
    if (deep.values_stopped == 2) {  // write_values failed (under the lock): said here
        deep.values_stopped = 1;
        note("deep values stopped: writing the values file failed; later effects carry no values");
    }
    if (!g.values_on || deep.values_stopped) return 0;
    if (g.values_bytes + bytes <= g.deep_values_max) return 1;
    deep.values_stopped = 1;
    char msg[256];
    snprintf(msg, sizeof msg,
             "deep values stopped: the values file would pass %llu bytes "
             "(EGF_CAPTURE_DEEP_VALUES_MAX); later effects carry no values",
             g.deep_values_max);
    note(msg);
    return 0;
}

// Within an event (g.lock held): `"values":offset` and the bytes at that offset of the
// values file; nothing where the file cannot take them.
static void write_values(size_t bytes) {
    if (!g.values || deep.values_stopped) return;
    if (bytes && fwrite(deep.vals, 1, bytes, g.values) != bytes) {
        deep.values_stopped = 2;  // the file now holds a partial write: no later offset is true
        return;
    }
    fprintf(g.events, ",\"values\":%llu", g.values_bytes);
    g.values_bytes += bytes;
}

// The runs of one event, as JSON pairs.
static void write_runs(size_t runs) {
    for (size_t r = 0; r < runs; ++r)
        fprintf(g.events, "%s[%llu,%llu]", r ? "," : "", deep.runs[2 * r], deep.runs[2 * r + 1]);
}

// A new allocation (its alloc event has seq `seq`): its copy starts as what it holds now. The
// copy is zeroed and then brought up to date by the comparison kernel (not cuMemcpy, which
// refuses the slack after the allocation's end), so the bits it sets are the allocation's
// non-zero words: with values on, a `contents` event names them and their bytes, and memory is
// known from the allocation on.
static void deep_track(unsigned long long seq, unsigned long long base, long long bytes) {
    if (!deep.on || bytes <= 0) return;
    pthread_mutex_lock(&deep.lock);
    unsigned long long scanned = ((unsigned long long)bytes + DEEP_ROUND - 1) / DEEP_ROUND * DEEP_ROUND;
    CUdeviceptr shadow = 0;
    CUresult rc = deep.failed || !deep_module() ? CUDA_ERROR_UNKNOWN : deep.alloc(&shadow, scanned);
    if (rc != CUDA_SUCCESS) {
        deep_fail("allocating a new allocation's copy", (int)rc);
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    if (deep.n == deep.cap) {
        int cap = deep.cap ? 2 * deep.cap : 256;
        DeepAlloc *grown = realloc(deep.a, (size_t)cap * sizeof *grown);
        if (!grown) {
            deep.free_(shadow);
            deep_fail("realloc", 0);
            pthread_mutex_unlock(&deep.lock);
            return;
        }
        deep.a = grown;
        deep.cap = cap;
    }
    int i = deep.n;
    while (i > 0 && deep.a[i - 1].base > base) {
        deep.a[i] = deep.a[i - 1];
        --i;
    }
    deep.a[i] = (DeepAlloc){base, shadow, (unsigned long long)bytes, scanned / 4};
    ++deep.n;
    deep.dirty = 1;
    unsigned long long words = deep_scan(i);  // never into the next allocation
    size_t bit_words = (size_t)(words + 31) / 32;
    if (!(deep_grow(&deep.one, &deep.one_cap, sizeof(DeepEntry) / 4 + 1) &&
          deep_grow(&deep.scratch, &deep.scratch_cap, bit_words + 1))) {
        pthread_mutex_unlock(&deep.lock);  // deep_grow said why
        return;
    }
    DeepEntry one = {base, shadow, words, 0};  // its bits from word 1 of scratch; word 0 counts
    unsigned int found = 0;
    rc = g.ctx_sync();
    if (rc == CUDA_SUCCESS) rc = deep.memset32(shadow, 0, (size_t)(scanned / 4));
    if (rc == CUDA_SUCCESS) rc = deep.memset32(deep.scratch, 0, bit_words + 1);
    if (rc == CUDA_SUCCESS) rc = deep.htod(deep.one, &one, sizeof one);
    if (rc == CUDA_SUCCESS) rc = deep_run(deep.one, 1, words, deep.scratch + 4, deep.scratch);
    if (rc == CUDA_SUCCESS) rc = g.ctx_sync();
    if (rc == CUDA_SUCCESS) rc = g.dtoh(&found, deep.scratch, sizeof found);
    if (rc != CUDA_SUCCESS) {
        deep_fail("copying a new allocation", (int)rc);
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    if (!g.values_on) {
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    size_t runs = 0, total = 0;
    if (found && !(deep_bitmap_runs(base, deep.scratch + 4, bit_words, &runs) &&
                   (deep.values_stopped || deep_values(runs, &total)))) {
        deep_fail("reading a new allocation's contents", 0);
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    int with_values = values_fit(total);
    if (begin_event("contents")) {
        fprintf(g.events, ",\"alloc\":%llu,\"changed\":[", seq);
        write_runs(runs);
        fputc(']', g.events);
        if (with_values) write_values(total);
        end_event();
    }
    pthread_mutex_unlock(&deep.lock);
}

// After the call of seq `launch` finished: what it changed, as runs of bytes.
static void deep_effect(unsigned long long launch) {
    if (!deep.on) return;
    pthread_mutex_lock(&deep.lock);
    CUresult rc = deep.failed ? CUDA_ERROR_UNKNOWN : g.ctx_sync ? g.ctx_sync() : CUDA_ERROR_UNKNOWN;
    if (rc != CUDA_SUCCESS || !deep_prepare()) {
        if (rc != CUDA_SUCCESS) deep_fail("cuCtxSynchronize before comparing", (int)rc);
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    int n = deep.n;
    unsigned int *counts = host_grow(deep.host_counts, &deep.host_counts_cap, (size_t)n + 1);
    if (!counts) {
        deep_fail("malloc", 0);
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    deep.host_counts = counts;
    if (n) {
        unsigned long long longest = 1;
        for (int i = 0; i < n; ++i) longest = deep_scan(i) > longest ? deep_scan(i) : longest;
        rc = deep.memset32(deep.counts, 0, (size_t)n);
        for (int first = 0; rc == CUDA_SUCCESS && first < n; first += 65535) {
            unsigned rows = (unsigned)(n - first < 65535 ? n - first : 65535);
            CUdeviceptr table = deep.table + (CUdeviceptr)first * sizeof(DeepEntry);
            rc = deep_run(table, rows, longest, deep.bitmap, deep.counts + (CUdeviceptr)first * 4);
        }
        if (rc == CUDA_SUCCESS) rc = g.ctx_sync();
        if (rc == CUDA_SUCCESS) rc = g.dtoh(deep.host_counts, deep.counts, (size_t)n * 4);
        if (rc != CUDA_SUCCESS) {
            deep_fail("comparing the allocations", (int)rc);
            pthread_mutex_unlock(&deep.lock);
            return;
        }
    }
    // every changed run is gathered before the event is written: a bitmap that cannot be read
    // back leaves the call without an effect (which the reader fails), never with a short one
    unsigned long long offset = 0, total = 0;
    size_t runs = 0;
    for (int i = 0; i < n; ++i) {
        total += deep.a[i].bytes;
        size_t words = (size_t)((deep_scan(i) + 31) / 32);
        if (deep.host_counts[i] &&
            !deep_bitmap_runs(deep.a[i].base, deep.bitmap + offset * 4, words, &runs)) {
            deep_fail("reading a bitmap back", 0);
            pthread_mutex_unlock(&deep.lock);
            return;
        }
        offset += words;
    }
    size_t changed = 0;
    if (g.values_on && !deep.values_stopped && !deep_values(runs, &changed)) {
        deep_fail("reading changed values back", 0);
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    int with_values = values_fit(changed);
    if (!begin_event("effect")) {
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    fprintf(g.events, ",\"launch\":%llu,\"allocations\":%d,\"bytes\":%llu,\"changed\":[", launch, n,
            total);
    write_runs(runs);
    fputc(']', g.events);
    if (with_values) write_values(changed);
    end_event();
    pthread_mutex_unlock(&deep.lock);
}

// The library that made the current call: the first frame of the call stack outside libcuda,
// CUPTI, the CUDA runtime and this recorder ("?" where the stack cannot be walked). Its name
// tells a launch cuBLAS made inside a GEMM call from the trainer's own.
static void write_caller(void) {
    void *frames[48];
    int n = backtrace(frames, 48);
    const char *found = "?";
    for (int i = 1; i < n; ++i) {
        Dl_info info;
        if (!dladdr(frames[i], &info) || !info.dli_fname) continue;
        const char *base = strrchr(info.dli_fname, '/');
        base = base ? base + 1 : info.dli_fname;
        if (strstr(base, "libcuda.so") || strstr(base, "libcupti") ||
            strstr(base, "egf_capture_recorder") || strstr(base, "libcudart"))
            continue;
        found = base[0] ? base : "?";
        break;
    }
    fputs(",\"by\":", g.events);
    json_string(g.events, found);
}

// A deep capture's struct parameters (more than 8 bytes): their bytes, where pointers hide.
static void write_blobs(void **params, const size_t *sizes, int n) {
    int first = 1;
    fputs(",\"blobs\":[", g.events);
    for (int i = 0; i < n; ++i) {
        if (sizes[i] <= 8 || sizes[i] > 4096) continue;
        fprintf(g.events, "%s[%d,\"", first ? "" : ",", i);
        const unsigned char *b = params[i];
        for (size_t k = 0; k < sizes[i]; ++k) fprintf(g.events, "%02x", b[k]);
        fputs("\"]", g.events);
        first = 0;
    }
    fputc(']', g.events);
}

// A kernel's name as its source spells it: the symbol itself for an extern "C" kernel, the last
// identifier of an Itanium-mangled C++ name ("_Z19sp14_scale_wire_colPfPKfiiii",
// "_ZN4sp1419sp14_scale_wire_colE...") otherwise. `out` holds it when it had to be cut out.
static const char *source_name(const char *symbol, char *out, size_t size) {
    if (!symbol || strncmp(symbol, "_Z", 2) != 0) return symbol;
    const char *p = symbol + 2, *last = NULL;
    long last_len = 0;
    int nested = 0;
    if (*p == 'L') ++p;  // internal linkage
    if (*p == 'N') {
        nested = 1;
        ++p;
        while (*p == 'K' || *p == 'V' || *p == 'r') ++p;  // cv-qualifiers of a member
    }
    while (*p >= '1' && *p <= '9') {
        char *end;
        long len = strtol(p, &end, 10);
        if (len <= 0 || (long)strnlen(end, (size_t)len) < len) return symbol;
        last = end;
        last_len = len;
        p = end + len;
        if (!nested) break;
        if (*p == 'L') ++p;
    }
    if (!last || (size_t)last_len >= size) return symbol;
    memcpy(out, last, (size_t)last_len);
    out[last_len] = '\0';
    return out;
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

// The ABI kernels' parameter sizes (SPEC section 3): their snapshots read the arguments by these,
// so a kernel of the same name with another signature is never snapshotted.
static int abi_signature(const char *name, const size_t *sizes, int n) {
    static const struct {
        const char *name;
        int n;
        size_t sizes[8];
    } abi[] = {
        {"sp14_scale_wire_col", 6, {8, 8, 4, 4, 4, 4}},
        {"accumulate_d_h_s2_from_concat", 5, {8, 8, 4, 4, 4}},
        {"polyak_ema", 4, {8, 8, 4, 8}},
        {"sp14_dir_concat_qaux", 8, {8, 8, 8, 4, 4, 4, 4, 4}},
    };
    for (size_t k = 0; k < sizeof abi / sizeof *abi; ++k) {
        if (strcmp(name, abi[k].name) != 0) continue;
        if (n != abi[k].n) return 0;
        for (int i = 0; i < n; ++i)
            if (sizes[i] != abi[k].sizes[i]) return 0;
        return 1;
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

/* ---- kernel launches ---- */
// A launched function's parameter `i`: the handle a launch passes is a CUfunction, or a CUkernel
// (a library-loaded kernel, which cuLaunchKernel also accepts: the CUDA runtime's own launches
// pass these), for which cuFuncGetParamInfo answers CUDA_ERROR_INVALID_HANDLE.
static CUresult param_info(CUfunction f, size_t i, size_t *offset, size_t *size) {
    if (!g.param_info) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = g.param_info(f, i, offset, size);
    if (rc == CUDA_ERROR_INVALID_HANDLE && g.kernel_param_info)
        rc = g.kernel_param_info(f, i, offset, size);
    return rc;
}

// A launch's argument pointers where it passes them packed in `extra`
// (CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE) instead of kernelParams, as a runtime may do
// internally: pointers into that buffer at the offsets cuFuncGetParamInfo gives, each checked
// to lie inside the buffer's stated size. NULL when there is no such buffer or an offset
// falls outside it (the launch is then recorded without arguments).
static void **packed_args(CUfunction f, void **extra, void **store) {
    if (!extra || !f || !g.param_info) return NULL;
    const unsigned char *buf = NULL;
    size_t size = 0;
    for (int i = 0; i < 16 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            buf = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
            size = *(const size_t *)extra[i + 1];
        else
            return NULL;  // a key this reader does not know: decode nothing rather than guess
    }
    if (!buf) return NULL;
    for (int n = 0; n < MAX_PARAMS; ++n) {
        size_t offset, bytes;
        if (param_info(f, (size_t)n, &offset, &bytes) != CUDA_SUCCESS) break;
        if (offset + bytes > size) return NULL;
        store[n] = (void *)(buf + offset);
    }
    return store;
}

static __thread int tl_snapshot;  // the launch entered on this thread is snapshotted at its exit
static __thread int tl_effect;    // ... and, in a deep capture, compared at its exit

// One launch, through the driver API (cuLaunchKernel, cuLaunchKernelEx) or the runtime API
// (cudaLaunchKernel, cudaLaunchKernelExC, <<<>>>): its event at the call's entry, its ABI
// snapshots before it, and after it at the call's exit.
static void on_launch(const CUpti_CallbackData *cb, CUfunction f, const unsigned int grid[3],
                      const unsigned int block[3], CUstream stream, void **params) {
    char buf[256];
    const char *symbol = cb->symbolName ? cb->symbolName : "?";
    const char *name = source_name(symbol, buf, sizeof buf);
    if (cb->callbackSite == CUPTI_API_EXIT) {
        unsigned long long seq = *(unsigned long long *)cb->correlationData;
        if (tl_snapshot && g.ctx_sync && g.ctx_sync() == CUDA_SUCCESS) {
            abi_snapshots(seq, "after", name, params);
            flush_all();
        }
        tl_snapshot = 0;
        if (tl_effect) deep_effect(seq);
        tl_effect = 0;
        return;
    }
    if (!g.cublas_hooked || !g.lt_hooked) try_hook_cublas();
    size_t offsets[MAX_PARAMS], sizes[MAX_PARAMS];
    int n = 0;
    while (params && f && g.param_info && n < MAX_PARAMS &&
           param_info(f, (size_t)n, &offsets[n], &sizes[n]) == CUDA_SUCCESS)
        ++n;
    tl_snapshot = params && wants_snapshot(name) && abi_signature(name, sizes, n) &&
                  !stream_capturing(stream);
    if (!begin_event("kernel")) return;
    unsigned long long seq = g.seq - 1;
    *(unsigned long long *)cb->correlationData = seq;
    fputs(",\"api\":", g.events);
    json_string(g.events, cb->functionName);
    fputs(",\"name\":", g.events);
    json_string(g.events, symbol);
    fprintf(g.events, ",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"params\":[", grid[0], grid[1],
            grid[2], block[0], block[1], block[2]);
    for (int i = 0; i < n; ++i) {
        unsigned long long raw = 0;
        if (sizes[i] <= sizeof raw) memcpy(&raw, params[i], sizes[i]);
        fprintf(g.events, "%s[%zu,%llu]", i ? "," : "", sizes[i], raw);
    }
    fputc(']', g.events);
    if (stream_capturing(stream)) fputs(",\"captured\":true", g.events);  // into a graph
    if (tl_rt_depth > 0 && tl_rt_name && cb->functionName &&
        strcmp(cb->functionName, tl_rt_name) != 0) {
        fputs(",\"via\":", g.events);  // a driver launch the runtime made for this runtime call
        json_string(g.events, tl_rt_name);
    }
    tl_effect = deep.on && !stream_capturing(stream);
    write_caller();  // every launch: a launch cuBLAS made inside a GEMM call is that GEMM's
    if (deep.on && params) write_blobs(params, sizes, n);
    if (params && n == 0) {
        // no parameter could be read: say why (no CUfunction, or the driver's answer for the
        // first one), so an unreadable launch names its cause
        size_t o, z;
        int rc = !f ? -1 : !g.param_info ? -2 : (int)param_info(f, 0, &o, &z);
        fprintf(g.events, ",\"param_info_rc\":%d", rc);
    }
    end_event();
    if (g.step_start_pending && g.polyak_target && !stream_capturing(stream)) {
        // the first launch of the next step, not launched yet: the target as that step starts,
        // named by this launch's seq (like the snapshots before it)
        g.step_start_pending = 0;
        if (g.ctx_sync && g.ctx_sync() == CUDA_SUCCESS)
            snap(seq, "step_start", "target", g.polyak_target, g.polyak_n);
    }
    if (tl_snapshot && g.ctx_sync && g.ctx_sync() == CUDA_SUCCESS) {
        abi_snapshots(seq, "before", name, params);
        flush_all();
    }
}

/* ---- a runtime launch's CUfunction: the process's own cudaGetFuncBySymbol ---- */
// The host stub a runtime launch names is registered with the copy of the CUDA runtime that the
// code holding it was linked with: a shared libcudart (found with dlsym), or a static one inside
// the executable or a library (found in that file's symbol table, as nvcc links by default).
// Each candidate is asked in turn; a failed ask clears that runtime's last error, so the
// trainer's own cudaGetLastError() never sees it. Answers are cached by stub.
typedef int (*GetFuncFn)(CUfunction *, const void *);
typedef int (*LastErrorFn)(void);
#define MAX_RUNTIMES 8
#define FUNC_CACHE 4096
static struct {
    pthread_once_t once;
    pthread_mutex_t lock;
    int count;
    GetFuncFn get[MAX_RUNTIMES];
    LastErrorFn clear[MAX_RUNTIMES];
    const void *stub[FUNC_CACHE];
    CUfunction fn[FUNC_CACHE];
} rt = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static void add_runtime(void *get, void *clear) {
    if (!get || rt.count >= MAX_RUNTIMES) return;
    for (int i = 0; i < rt.count; ++i)
        if (rt.get[i] == (GetFuncFn)get) return;
    rt.get[rt.count] = (GetFuncFn)get;
    rt.clear[rt.count] = (LastErrorFn)clear;
    ++rt.count;
}

// Defined functions `names[i]` of an ELF file's static symbol table (.symtab), 0 where absent.
static void elf_symbols(const char *path, const char *const *names, uintptr_t *found, int n) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(Elf64_Ehdr)) {
        close(fd);
        return;
    }
    size_t size = (size_t)st.st_size;
    unsigned char *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)map;
    int ok = memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
             eh->e_shentsize == sizeof(Elf64_Shdr) &&
             eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr) <= size;
    const Elf64_Shdr *sh = ok ? (const Elf64_Shdr *)(map + eh->e_shoff) : NULL;
    for (int i = 0; ok && i < eh->e_shnum; ++i) {
        if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
        const Elf64_Shdr *strtab = &sh[sh[i].sh_link];
        if (sh[i].sh_offset + sh[i].sh_size > size || strtab->sh_offset + strtab->sh_size > size)
            continue;
        const Elf64_Sym *sym = (const Elf64_Sym *)(map + sh[i].sh_offset);
        const char *str = (const char *)(map + strtab->sh_offset);
        size_t count = sh[i].sh_size / sizeof(Elf64_Sym);
        for (size_t k = 0; k < count; ++k) {
            if (sym[k].st_shndx == SHN_UNDEF || ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC ||
                sym[k].st_name >= strtab->sh_size)
                continue;
            for (int j = 0; j < n; ++j)
                if (!found[j] && strcmp(str + sym[k].st_name, names[j]) == 0)
                    found[j] = sym[k].st_value;
        }
    }
    munmap(map, size);
}

static int find_runtime_in(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    static const char *const names[2] = {"cudaGetFuncBySymbol", "cudaGetLastError"};
    const char *path = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "/proc/self/exe";
    if (strstr(path, "libcupti") || strstr(path, "egf_capture_recorder") ||
        strstr(path, "linux-vdso") || strstr(path, "libcuda.so"))
        return 0;
    if (info->dlpi_name && info->dlpi_name[0]) {
        void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
        if (h) add_runtime(dlsym(h, names[0]), dlsym(h, names[1]));
    }
    uintptr_t found[2] = {0, 0};
    elf_symbols(path, names, found, 2);
    if (found[0] && found[1])
        add_runtime((void *)(info->dlpi_addr + found[0]), (void *)(info->dlpi_addr + found[1]));
    return 0;
}

static void find_runtimes(void) {
    add_runtime(dlsym(RTLD_DEFAULT, "cudaGetFuncBySymbol"), dlsym(RTLD_DEFAULT, "cudaGetLastError"));
    dl_iterate_phdr(find_runtime_in, NULL);
    char msg[128];
    snprintf(msg, sizeof msg, "cudaGetFuncBySymbol: %d copies of the CUDA runtime found", rt.count);
    note(msg);
}

static CUfunction function_of(const void *stub) {
    pthread_once(&rt.once, find_runtimes);
    size_t slot = ((uintptr_t)stub >> 4) % FUNC_CACHE;
    pthread_mutex_lock(&rt.lock);
    for (size_t probe = 0; probe < FUNC_CACHE; ++probe, slot = (slot + 1) % FUNC_CACHE) {
        if (rt.stub[slot] == stub) {
            CUfunction f = rt.fn[slot];
            pthread_mutex_unlock(&rt.lock);
            return f;
        }
        if (!rt.stub[slot]) break;
    }
    pthread_mutex_unlock(&rt.lock);
    CUfunction f = NULL;
    for (int i = 0; i < rt.count && !f; ++i) {
        if (rt.get[i](&f, stub) != 0) {
            f = NULL;
            if (rt.clear[i]) rt.clear[i]();
        }
    }
    pthread_mutex_lock(&rt.lock);
    if (!rt.stub[slot]) {  // a full cache only forgets: the next launch of this stub asks again
        rt.stub[slot] = stub;
        rt.fn[slot] = f;
    }
    pthread_mutex_unlock(&rt.lock);
    return f;
}

// One memory event; returns its seq + 1 (0: not written). A deep capture starts comparing an
// allocation from its event on and stops at its free's.
static unsigned long long memory_event(const char *ev, const char *api, unsigned long long dst,
                                       unsigned long long src, long long bytes, long long value) {
    if (!strcmp(ev, "free")) deep_untrack(dst);
    if (!begin_event(ev)) return 0;
    unsigned long long seq = g.seq - 1;
    fputs(",\"api\":", g.events);
    json_string(g.events, api);
    fprintf(g.events, ",\"dst\":%llu,\"src\":%llu,\"bytes\":%lld,\"value\":%lld", dst, src, bytes,
            value);
    end_event();
    if (!strcmp(ev, "alloc")) deep_track(seq, dst, bytes);
    return seq + 1;
}

// A launch of a CUDA graph: it replays launches recorded at its capture, which the reader
// says it cannot follow.
static void graph_event(const char *api) {
    if (!begin_event("graph")) return;
    fputs(",\"api\":", g.events);
    json_string(g.events, api);
    end_event();
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
    switch (id) {
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
            if (tl_rt_depth > 0 && tl_rt_launch) return;  // the runtime launch recorded it
            break;
        default:
            break;
    }
    switch (id) {
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: {
            const cuLaunchKernel_params *a = p;
            unsigned int grid[3] = {a->gridDimX, a->gridDimY, a->gridDimZ};
            unsigned int block[3] = {a->blockDimX, a->blockDimY, a->blockDimZ};
            void *store[MAX_PARAMS];
            void **params = a->kernelParams ? a->kernelParams : packed_args(a->f, a->extra, store);
            on_launch(cb, a->f, grid, block, a->hStream, params);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: {
            // the same arguments as cuLaunchKernel's, without `extra`
            const cuLaunchCooperativeKernel_params *a = p;
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
            void *store[MAX_PARAMS];
            void **params = a->kernelParams ? a->kernelParams : packed_args(a->f, a->extra, store);
            on_launch(cb, a->f, grid, block, c->hStream, params);
            return;
        }
        default:
            break;
    }
    if (!g.cublas_hooked || !g.lt_hooked) try_hook_cublas();
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
        if (deep.on && is_memory_call(id) && *corr) deep_effect(*corr - 1);
        return;
    }
    switch (id) {
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz: {
            const cuMemsetD8Async_params *a = p;  // cuMemsetD8_v2's fields lead the same way
            *corr = memory_event("memset", cb->functionName, a->dstDevice, 0, (long long)a->N, a->uc);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz: {
            const cuMemsetD32Async_params *a = p;
            *corr = memory_event("memset", cb->functionName, a->dstDevice, 0, 4 * (long long)a->N, a->ui);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz: {
            const cuMemcpyHtoDAsync_v2_params *a = p;
            *corr = memory_event("copy", cb->functionName, a->dstDevice, 0, (long long)a->ByteCount, 0);
            return;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz: {
            const cuMemcpyDtoHAsync_v2_params *a = p;
            *corr = memory_event("copy", cb->functionName, 0, a->srcDevice, (long long)a->ByteCount, 0);
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
            *corr = memory_event("copy", cb->functionName, a->dst, a->src, (long long)a->ByteCount, 0);
            return;
        }
        default:
            return;
    }
}

/* ---- runtime API ---- */
// A runtime launch is recorded at its own entry, with its arguments, from the CUfunction behind
// its host stub: the driver's launch callbacks do not fire for it (the runtime reaches the
// driver through no public entry point), and where a driver callback does fire inside it, that
// is the same launch (tl_rt_launch), not recorded twice. Memsets, copies and allocations
// through the runtime are recorded at their exit, only where no driver callback wrote one
// inside the call (tl_rt_covered).
enum { RT_ENTER, RT_EXIT, RT_UNDECODED };

// ENTER: the launch with its arguments (0 when its CUfunction cannot be found); EXIT: the
// snapshots after it; UNDECODED: its name, grid and block only (the reader refuses an ABI kernel
// launched so, naming it).
static int runtime_launch(const CUpti_CallbackData *cb, CUpti_CallbackId id, int what) {
    const void *p = cb->functionParams;
    const void *stub;
    unsigned int grid[3], block[3];
    CUstream stream;
    void **args;
    if (id == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060 ||
        id == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060) {
        const cudaLaunchKernelExC_v11060_params *a = p;
        const cudaLaunchConfig_t *c = a->config;
        if (!c) return 0;
        stub = a->func;
        args = a->args;
        stream = (CUstream)c->stream;
        grid[0] = c->gridDim.x, grid[1] = c->gridDim.y, grid[2] = c->gridDim.z;
        block[0] = c->blockDim.x, block[1] = c->blockDim.y, block[2] = c->blockDim.z;
    } else {
        const cudaLaunchKernel_v7000_params *a = p;
        stub = a->func;
        args = a->args;
        stream = (CUstream)a->stream;
        grid[0] = a->gridDim.x, grid[1] = a->gridDim.y, grid[2] = a->gridDim.z;
        block[0] = a->blockDim.x, block[1] = a->blockDim.y, block[2] = a->blockDim.z;
    }
    if (what == RT_ENTER) {
        CUfunction f = function_of(stub);
        if (!f) return 0;
        on_launch(cb, f, grid, block, stream, args);
        return 1;
    }
    if (what == RT_EXIT) {
        on_launch(cb, NULL, grid, block, stream, args);
        return 1;
    }
    if (!begin_event("kernel")) return 1;
    fputs(",\"api\":", g.events);
    json_string(g.events, cb->functionName);
    fputs(",\"name\":", g.events);
    json_string(g.events, cb->symbolName ? cb->symbolName : "?");
    fprintf(g.events, ",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"params\":null", grid[0],
            grid[1], grid[2], block[0], block[1], block[2]);
    unsigned long long seq = g.seq - 1;
    write_caller();
    end_event();
    if (!stream_capturing(stream)) deep_effect(seq);
    return 1;
}

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
        if (tl_rt_depth++ == 0) {
            tl_rt_covered = tl_rt_launch = 0;
            tl_rt_name = cb->functionName;
        }
        if (launch && tl_rt_depth == 1 && runtime_launch(cb, id, RT_ENTER)) tl_rt_launch = 1;
        return;
    }
    if (--tl_rt_depth > 0) return;
    if (launch && tl_rt_launch) {
        tl_rt_launch = 0;
        runtime_launch(cb, id, RT_EXIT);
        return;
    }
    if (tl_rt_covered) return;
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
    g.kernel_param_info = (ParamInfoFn)driver_symbol("cuKernelGetParamInfo");
    g.ctx_sync = (CtxSyncFn)driver_symbol("cuCtxSynchronize");
    g.dtoh = (DtoHFn)driver_symbol("cuMemcpyDtoH_v2");
    g.is_capturing = (IsCapturingFn)driver_symbol("cuStreamIsCapturing");
    deep.alloc = (MemAllocFn)driver_symbol("cuMemAlloc_v2");
    deep.free_ = (MemFreeFn)driver_symbol("cuMemFree_v2");
    deep.htod = (CopyHtoDFn)driver_symbol("cuMemcpyHtoD_v2");
    deep.memset32 = (MemsetD32Fn)driver_symbol("cuMemsetD32_v2");
    deep.load = (ModuleLoadFn)driver_symbol("cuModuleLoadData");
    deep.function = (ModuleFunctionFn)driver_symbol("cuModuleGetFunction");
    deep.launch = (LaunchFn)driver_symbol("cuLaunchKernel");
    g.host_alloc = (HostAllocFn)driver_symbol("cuMemAllocHost_v2");
    g.host_free = (HostFreeFn)driver_symbol("cuMemFreeHost");
    const char *deep_env = getenv("EGF_CAPTURE_DEEP");
    deep.on = deep_env && !strcmp(deep_env, "1") && deep.alloc && deep.free_ && deep.htod &&
              deep.memset32 && deep.load && deep.function && deep.launch && g.ctx_sync && g.dtoh;
    const char *values_env = getenv("EGF_CAPTURE_DEEP_VALUES_MAX");
    g.deep_values_max = values_env ? strtoull(values_env, NULL, 10) : 1ULL << 30;
    g.values_on = deep.on && g.deep_values_max > 0;
    atexit(on_exit_event);
    pthread_atfork(before_fork, after_fork, after_fork);

    uint32_t version = 0;
    cuptiGetVersion(&version);
    CUpti_SubscriberHandle subscriber;
    CUptiResult status = cuptiSubscribe(&subscriber, callback, NULL);
    if (begin_event("init")) {
        fprintf(g.events, ",\"pid\":%d,\"ppid\":%d,\"cupti_version\":%u,\"subscribe\":%d", (int)getpid(),
                (int)getppid(), version, (int)status);
        fprintf(g.events, ",\"param_info\":%s,\"hash\":\"mix64\"",
                g.param_info ? "true" : "false");
        if (deep.on) fputs(",\"deep\":true", g.events);
        if (g.values_on) fputs(",\"values\":true", g.events);
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
