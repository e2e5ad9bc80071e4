/* Kernel launches, through the driver API and the runtime API, each one event with its name,
 * grid, block and raw parameters (sizes from cuFuncGetParamInfo), the library that made it, and
 * in a deep capture its struct parameters' bytes; the ABI kernels' snapshots are taken around
 * it (rec_snapshot.c) and, in a deep capture, what it changed after it (rec_deep.c).
 *
 * A runtime launch is recorded at its own entry, with its arguments, from the CUfunction behind
 * its host stub: the driver's launch callbacks do not fire for it (the runtime reaches the
 * driver through no public entry point), and where a driver callback does fire inside it, that
 * is the same launch (rec_thread.rt_launch), not recorded twice. Its CUfunction comes from the
 * process's own cudaGetFuncBySymbol.
 */
#include "recorder.h"

#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_PARAMS 64

// The library that made the current call: the first frame of the call stack outside libcuda,
// CUPTI, the CUDA runtime and this recorder ("?" where the stack cannot be walked). Its name
// tells a launch cuBLAS made inside a GEMM call from the trainer's own: 1 for such a launch.
static int write_caller(FILE *f) {
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
    fputs(",\"by\":", f);
    json_string(f, found);
    return !strncmp(found, "libcublas", 9);
}

// A deep capture's struct parameters (more than 8 bytes): their bytes, where pointers hide.
static void write_blobs(FILE *f, void **params, const size_t *sizes, int n) {
    int first = 1;
    fputs(",\"blobs\":[", f);
    for (int i = 0; i < n; ++i) {
        if (sizes[i] <= 8 || sizes[i] > 4096) continue;
        fprintf(f, "%s[%d,\"", first ? "" : ",", i);
        const unsigned char *b = params[i];
        for (size_t k = 0; k < sizes[i]; ++k) fprintf(f, "%02x", b[k]);
        fputs("\"]", f);
        first = 0;
    }
    fputc(']', f);
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

// A launched function's parameter `i`: the handle a launch passes is a CUfunction, or a CUkernel
// (a library-loaded kernel, which cuLaunchKernel also accepts: the CUDA runtime's own launches
// pass these), for which cuFuncGetParamInfo answers CUDA_ERROR_INVALID_HANDLE.
static CUresult param_info(CUfunction f, size_t i, size_t *offset, size_t *size) {
    if (!rec_driver.param_info) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = rec_driver.param_info(f, i, offset, size);
    if (rc == CUDA_ERROR_INVALID_HANDLE && rec_driver.kernel_param_info)
        rc = rec_driver.kernel_param_info(f, i, offset, size);
    return rc;
}

// A launch's argument pointers where it passes them packed in `extra`
// (CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE) instead of kernelParams, as a runtime may do
// internally: pointers into that buffer at the offsets cuFuncGetParamInfo gives, each checked
// to lie inside the buffer's stated size. NULL when there is no such buffer or an offset
// falls outside it (the launch is then recorded without arguments).
static void **packed_args(CUfunction f, void **extra, void **store) {
    if (!extra || !f || !rec_driver.param_info) return NULL;
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
static __thread int tl_guard;     // ... and its allocations compared at its exit (rec_guard.c)

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
        if (tl_snapshot) snapshot_abi(seq, "after", name, params);
        tl_snapshot = 0;
        if (tl_effect) deep_effect(seq);
        tl_effect = 0;
        if (tl_guard) guard_after(seq);
        tl_guard = 0;
        return;
    }
    try_hook_cublas();
    size_t offsets[MAX_PARAMS], sizes[MAX_PARAMS];
    int n = 0;
    while (params && f && rec_driver.param_info && n < MAX_PARAMS &&
           param_info(f, (size_t)n, &offsets[n], &sizes[n]) == CUDA_SUCCESS)
        ++n;
    tl_snapshot = params && snapshot_wanted(name, sizes, n) && !stream_capturing(stream);
    FILE *out = begin_event("kernel");
    if (!out) return;
    unsigned long long seq = event_seq();
    *(unsigned long long *)cb->correlationData = seq;
    fputs(",\"api\":", out);
    json_string(out, cb->functionName);
    fputs(",\"name\":", out);
    json_string(out, symbol);
    fprintf(out, ",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"params\":[", grid[0], grid[1],
            grid[2], block[0], block[1], block[2]);
    for (int i = 0; i < n; ++i) {
        unsigned long long raw = 0;
        if (sizes[i] <= sizeof raw) memcpy(&raw, params[i], sizes[i]);
        fprintf(out, "%s[%zu,%llu]", i ? "," : "", sizes[i], raw);
    }
    fputc(']', out);
    if (stream_capturing(stream)) fputs(",\"captured\":true", out);  // into a graph
    if (rec_thread.rt_depth > 0 && rec_thread.rt_name && cb->functionName &&
        strcmp(cb->functionName, rec_thread.rt_name) != 0) {
        fputs(",\"via\":", out);  // a driver launch the runtime made for this runtime call
        json_string(out, rec_thread.rt_name);
    }
    tl_effect = rec_options.deep && !stream_capturing(stream);
    // every launch: a launch cuBLAS made inside a GEMM call is that GEMM's
    int by_cublas = write_caller(out);
    if (rec_options.deep && params) write_blobs(out, params, sizes, n);
    if (params && n == 0) {
        // no parameter could be read: say why (no CUfunction, or the driver's answer for the
        // first one), so an unreadable launch names its cause
        size_t o, z;
        int rc = !f ? -1 : !rec_driver.param_info ? -2 : (int)param_info(f, 0, &o, &z);
        fprintf(out, ",\"param_info_rc\":%d", rc);
    }
    end_event(out);
    snapshot_step_start(seq, stream);  // the first launch after a polyak_ema starts a step
    if (tl_snapshot) snapshot_abi(seq, "before", name, params);
    tl_guard = !by_cublas && !stream_capturing(stream) && guard_wanted(name, sizes, n) &&
               guard_before(params, sizes, n);
}

// A driver-API launch (cuLaunchKernel, cuLaunchCooperativeKernel, cuLaunchKernelEx and their
// per-thread-stream forms), at its entry or its exit: 1, and 0 for any other call. One made
// inside a runtime launch already recorded is that launch, not recorded twice.
int driver_launch(const CUpti_CallbackData *cb, CUpti_CallbackId id) {
    const void *p = cb->functionParams;
    switch (id) {
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
            if (rec_thread.rt_depth > 0 && rec_thread.rt_launch) return 1;  // the runtime's
            break;
        default:
            return 0;
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
            return 1;
        }
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: {
            // the same arguments as cuLaunchKernel's, without `extra`
            const cuLaunchCooperativeKernel_params *a = p;
            unsigned int grid[3] = {a->gridDimX, a->gridDimY, a->gridDimZ};
            unsigned int block[3] = {a->blockDimX, a->blockDimY, a->blockDimZ};
            on_launch(cb, a->f, grid, block, a->hStream, a->kernelParams);
            return 1;
        }
        default: {  // cuLaunchKernelEx, cuLaunchKernelEx_ptsz
            const cuLaunchKernelEx_params *a = p;
            const CUlaunchConfig *c = a->config;
            unsigned int grid[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
            unsigned int block[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
            void *store[MAX_PARAMS];
            void **params = a->kernelParams ? a->kernelParams : packed_args(a->f, a->extra, store);
            on_launch(cb, a->f, grid, block, c->hStream, params);
            return 1;
        }
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
    add_runtime(dlsym(RTLD_DEFAULT, "cudaGetFuncBySymbol"),
                dlsym(RTLD_DEFAULT, "cudaGetLastError"));
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


// ENTER: the launch with its arguments (0 when its CUfunction cannot be found); EXIT: the
// snapshots after it; UNDECODED: its name, grid and block only (the reader refuses an ABI kernel
// launched so, naming it).
int runtime_launch(const CUpti_CallbackData *cb, CUpti_CallbackId id, int what) {
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
    FILE *out = begin_event("kernel");
    if (!out) return 1;
    fputs(",\"api\":", out);
    json_string(out, cb->functionName);
    fputs(",\"name\":", out);
    json_string(out, cb->symbolName ? cb->symbolName : "?");
    fprintf(out, ",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"params\":null", grid[0],
            grid[1], grid[2], block[0], block[1], block[2]);
    unsigned long long seq = event_seq();
    write_caller(out);
    end_event(out);
    if (!stream_capturing(stream)) deep_effect(seq);
    return 1;
}
