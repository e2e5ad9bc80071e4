/* GEMMs: every cuBLAS call as cuBLAS's own logger words it, in the same ordered stream, with
 * the scalars and pointer arrays read while the call is in progress; every cublasLtMatmul
 * through cuBLASLt's logger, its matrix layouts read from the call's own descriptors and its
 * alpha and beta read by the recorder's own cublasLtMatmul, which egf-audit capture preloads in
 * front of cuBLASLt's.
 */
#include "recorder.h"

#include <dlfcn.h>
#include <link.h>

typedef void (*CublasLogFn)(const char *);
typedef int (*LoggerConfigureFn)(int, int, int, const char *);
typedef int (*SetLoggerFn)(CublasLogFn);
typedef int (*GetPointerModeFn)(void *, int *);
static GetPointerModeFn get_pointer_mode;
static int cublas_hooked, lt_hooked;  // each logger is attached once, when its library is loaded

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
    if (!handle || !get_pointer_mode) return mode;
    tl_in_log = 1;
    get_pointer_mode((void *)(uintptr_t)handle, &mode);
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

static void write_extras(FILE *f, const GemmExtras *x) {
    static const char *keys[3] = {"a_ptrs", "b_ptrs", "c_ptrs"};
    if (x->mode >= 0) {
        fprintf(f, ",\"pointer_mode\":%d,\"scalar_bytes\":%d", x->mode, x->bytes);
        if (x->have[0]) fprintf(f, ",\"alpha_bits\":%llu", x->bits[0]);
        if (x->have[1]) fprintf(f, ",\"beta_bits\":%llu", x->bits[1]);
    }
    for (int i = 0; x->ptrs && i < 3; ++i) {
        if (!tl_arrays[i]) continue;
        fprintf(f, ",\"%s\":[", keys[i]);
        for (long long b = 0; b < x->batch; ++b)
            fprintf(f, "%s%llu", b ? "," : "", x->ptrs[i * x->batch + b]);
        fputc(']', f);
    }
}

static void on_cublas_log(const char *msg) {
    if (rec_thread.inside || tl_in_log || !msg) return;
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
    rec_thread.inside = 1;  // our own driver calls (device reads) are no events of the trainer
    if (scalars && (x.mode = pointer_mode(tl_handle)) >= 0) read_scalars(&x);
    if (batch > 0) read_pointer_arrays(&x, batch);
    rec_thread.inside = 0;
    FILE *f = begin_event("cublas");
    if (f) {
        fputs(",\"msg\":", f);
        json_string(f, msg);
        write_extras(f, &x);
        end_event(f);
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
static void write_layout(FILE *f, const char *key, unsigned long long desc) {
    static const int attrs[7][2] = {{0, 4}, {1, 4}, {2, 8}, {3, 8}, {4, 8}, {5, 4}, {6, 8}};
    fprintf(f, ",\"%s\":", key);
    if (!desc) {
        fputs("null", f);
        return;
    }
    for (int i = 0; i < 7; ++i)
        fprintf(f, "%c%lld", i ? ',' : '[', lt_attr(g_lt_layout_get, desc, attrs[i][0],
                                                          attrs[i][1]));
    fputc(']', f);
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

static void lt_scalars(FILE *f) {
    if (tl_lt_have)
        fprintf(f, ",\"alpha_bits\":%llu,\"beta_bits\":%llu", tl_lt_bits[0], tl_lt_bits[1]);
}

static void on_cublaslt_log(int level, const char *function, const char *msg) {
    (void)level;
    if (rec_thread.inside || !function || !msg || strcmp(function, "cublasLtMatmul") != 0) return;
    static int shown;  // the first call's log line, as a note: what the fields were read from
    if (!shown++) {
        char line[512];
        snprintf(line, sizeof line, "cublasLtMatmul log: %s", msg);
        note(line);
    }
    unsigned long long desc = lt_field(msg, "computeDesc");
    FILE *f = begin_event("ltmatmul");
    if (!f) return;
    fprintf(f, ",\"a\":%llu,\"b\":%llu,\"c\":%llu,\"d\":%llu", lt_field(msg, "A"),
            lt_field(msg, "B"), lt_field(msg, "C"), lt_field(msg, "D"));
    write_layout(f, "adesc", lt_field(msg, "Adesc"));
    write_layout(f, "bdesc", lt_field(msg, "Bdesc"));
    write_layout(f, "cdesc", lt_field(msg, "Cdesc"));
    write_layout(f, "ddesc", lt_field(msg, "Ddesc"));
    // compute type, scale type, pointer mode, transa, transb (MATMUL_DESC attributes 0..4), then
    // the epilogue (7) and the pointers it reads or writes besides A, B, C and D: the bias (8),
    // the auxiliary matrix (11) and that matrix's leading dimension (12); -1 where unreadable
    static const int desc_attrs[9][2] = {{0, 4}, {1, 4}, {2, 4}, {3, 4}, {4, 4},
                                         {7, 4}, {8, 8}, {11, 8}, {12, 8}};
    fputs(",\"desc\":[", f);
    for (int i = 0; i < 9; ++i)
        fprintf(f, "%s%lld", i ? "," : "",
                lt_attr(g_lt_desc_get, desc, desc_attrs[i][0], desc_attrs[i][1]));
    fputc(']', f);
    lt_scalars(f);
    end_event(f);
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
    if (!get)
        get = g_lt_desc_get ? g_lt_desc_get
                            : (LtGetAttrFn)lt_symbol("cublasLtMatmulDescGetAttribute");
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
    int was_inside = rec_thread.inside;
    rec_thread.inside = 1;  // our own driver calls are no events of the trainer
    int ok =
        device_read(&tl_lt_bits[0], (unsigned long long)(uintptr_t)alpha, n, (CUstream)stream) &&
        device_read(&tl_lt_bits[1], (unsigned long long)(uintptr_t)beta, n, (CUstream)stream);
    rec_thread.inside = was_inside;
    return ok;
}

int cublasLtMatmul(
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

void try_hook_cublas(void) {
    if (cublas_hooked && lt_hooked) return;
    static const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    static const char *lt_names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    for (size_t i = 0; !lt_hooked && i < sizeof lt_names / sizeof *lt_names; ++i) {
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
            lt_hooked = 1;
            char msg[256];
            snprintf(msg, sizeof msg, "cublasLt logger attached: %s", lt_names[i]);
            note(msg);
        }
    }
    for (size_t i = 0; !cublas_hooked && i < sizeof names / sizeof *names; ++i) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
        if (!h) continue;
        LoggerConfigureFn configure = (LoggerConfigureFn)dlsym(h, "cublasLoggerConfigure");
        SetLoggerFn set_logger = (SetLoggerFn)dlsym(h, "cublasSetLoggerCallback");
        get_pointer_mode = (GetPointerModeFn)dlsym(h, "cublasGetPointerMode_v2");
        g_get_stream = (GetStreamFn)dlsym(h, "cublasGetStream_v2");
        if (configure && set_logger) {
            configure(1, 0, 0, NULL);
            set_logger(on_cublas_log);
            cublas_hooked = 1;
            char msg[256];
            snprintf(msg, sizeof msg, "cublas logger attached: %s", names[i]);
            note(msg);
        }
    }
}

