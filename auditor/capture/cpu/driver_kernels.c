/* Kernels for `egf-audit capture --cpu`: the trainer's own sources compiled for the CPU.
 *
 * egf-audit compiles every kernel source of `--kernels DIR` (and the recorder's own kernels)
 * behind the CPU shim before the command runs, and the fake NVRTC compiles a program's source
 * when the trainer asks it; both describe what they built in one text form, a module index:
 *
 *     egf-audit-cpu-module/1
 *     library PATH            a shared library of kernels compiled for the CPU
 *     kernel I NAME           its I-th kernel: egf_cpu_run_I, egf_cpu_params_I, egf_cpu_fn_I
 *     refused NAME WHY        a kernel that cannot run on the CPU, and why
 *
 * EGF_CPU_KERNEL_INDEX names the file of the first; the second is the "PTX" the fake NVRTC
 * hands out, loaded back by cuModuleLoadData. A module loaded from real PTX or a cubin is
 * matched by the names it defines: a kernel is found by its exact symbol (extern "C", or
 * C++-mangled, which spells its parameter types), and where PTX gives an entry's parameters
 * they must be the source's (count and sizes). Parameters are read by the types of the
 * source's signature (the compiled library's own table of sizes and alignments).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "driver_internal.h"

#define INDEX_MAGIC "egf-audit-cpu-module/1"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t launch_lock = PTHREAD_MUTEX_INITIALIZER;
static CUfunction known;  // every function the index and the modules made, newest first

// The identifier a symbol names: itself for an extern "C" symbol, the last <source-name> of an
// Itanium-mangled one ("_Z19sp14_scale_wire_colPfPKfiiii", "_ZN2ns3fooEPf" -> "foo").
static char *identifier(const char *symbol) {
    if (strncmp(symbol, "_Z", 2) != 0) return strdup(symbol);
    const char *p = symbol + 2, *last = NULL;
    long last_len = 0;
    int nested = 0;
    if (*p == 'L') ++p;
    if (*p == 'N') {
        nested = 1;
        ++p;
        while (*p == 'K' || *p == 'V' || *p == 'r') ++p;
    }
    while (*p >= '1' && *p <= '9') {
        char *end;
        long len = strtol(p, &end, 10);
        if ((long)strnlen(end, (size_t)len) < len) break;
        last = end;
        last_len = len;
        p = end + len;
        if (!nested) break;
        if (*p == 'L') ++p;
    }
    return last ? strndup(last, (size_t)last_len) : strdup(symbol);
}

static CUfunction new_function(const char *symbol, const char *name) {
    CUfunction f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->symbol = strdup(symbol);
    f->name = name ? strdup(name) : identifier(symbol);
    pthread_mutex_lock(&lock);
    f->next = known;
    known = f;
    pthread_mutex_unlock(&lock);
    return f;
}

static CUfunction refused_function(const char *symbol, const char *why) {
    CUfunction f = new_function(symbol, NULL);
    if (f) f->why = strdup(why);
    return f;
}

// The I-th kernel of a compiled library, with its parameters' sizes and offsets.
static CUfunction library_kernel(void *lib, int i, const char *name) {
    char sym[64];
    snprintf(sym, sizeof sym, "egf_cpu_run_%d", i);
    void *run = dlsym(lib, sym);
    snprintf(sym, sizeof sym, "egf_cpu_params_%d", i);
    int (*params)(unsigned long *, unsigned long *, int) = (int (*)(unsigned long *, unsigned long *, int))dlsym(lib, sym);
    snprintf(sym, sizeof sym, "egf_cpu_fn_%d", i);
    void *(*fn)(void) = (void *(*)(void))dlsym(lib, sym);
    if (!run || !params || !fn) return NULL;
    Dl_info info;
    const char *symbol = dladdr(fn(), &info) && info.dli_sname ? info.dli_sname : name;
    CUfunction f = new_function(symbol, name);
    if (!f) return NULL;
    f->run = (void (*)(const unsigned *, const unsigned *, void **))run;
    unsigned long sizes[EGF_MAX_PARAMS], aligns[EGF_MAX_PARAMS];
    int n = params(sizes, aligns, EGF_MAX_PARAMS);
    if (n > EGF_MAX_PARAMS) {
        f->why = strdup("more than 64 parameters");
        n = 0;
    }
    size_t at = 0;
    for (int k = 0; k < n; ++k) {
        size_t align = aligns[k] ? aligns[k] : 1;
        at = (at + align - 1) / align * align;
        f->offsets[k] = at;
        f->sizes[k] = sizes[k];
        at += sizes[k];
    }
    f->nparams = n;
    return f;
}

// Read an index (a file's text or an NVRTC image); the functions it made go to `out` when
// given (a module's own), else only into the known list.
static int read_index(const char *text, CUfunction **out, int *out_count) {
    if (strncmp(text, INDEX_MAGIC, strlen(INDEX_MAGIC)) != 0) return 0;
    char *copy = strdup(text), *save = NULL;
    void *lib = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        CUfunction f = NULL;
        if (strncmp(line, "library ", 8) == 0) {
            lib = dlopen(line + 8, RTLD_NOW | RTLD_LOCAL);
            if (!lib) fprintf(stderr, "egf-audit capture --cpu: %s\n", dlerror());
        } else if (strncmp(line, "kernel ", 7) == 0) {
            int i;
            char name[1024];
            if (sscanf(line + 7, "%d %1023s", &i, name) != 2) continue;
            f = lib ? library_kernel(lib, i, name) : NULL;
            if (!f) f = refused_function(name, "its CPU library did not load");
        } else if (strncmp(line, "refused ", 8) == 0) {
            char *why = strchr(line + 8, ' ');
            if (!why) continue;
            *why++ = '\0';
            f = refused_function(line + 8, why);
        }
        if (f && out) {
            f->program = 1;
            CUfunction *grown = realloc(*out, (size_t)(*out_count + 1) * sizeof *grown);
            if (grown) {
                *out = grown;
                (*out)[(*out_count)++] = f;
            }
        }
    }
    free(copy);
    return 1;
}

static char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *grown = realloc(buf, 2 * cap + 1);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    if (size) *size = n;
    return buf;
}

HIDDEN void egf_cpu_load_kernel_index(void) {
    const char *path = getenv("EGF_CPU_KERNEL_INDEX");
    if (!path || !*path) return;
    char *text = read_file(path, NULL);
    if (!text || !read_index(text, NULL, NULL))
        fprintf(stderr, "egf-audit capture --cpu: the kernel index %s cannot be read\n", path);
    free(text);
}

/* The kernel of a symbol among the --kernels sources (never an NVRTC program's): the compiled
 * kernel of exactly that symbol, extern "C" or C++-mangled, so a C++ kernel's parameter types
 * are the program's own (its mangled name spells them). Else a refused one: a kernel of that
 * identifier the sources could not run (its reason), one of that identifier under another
 * symbol (another signature or linkage: never run in its place), or none. */
EGF_CPU_API CUfunction egf_cpu_function_named(const char *symbol) {
    char *ident = identifier(symbol);
    CUfunction exact = NULL, refused = NULL, other = NULL;
    pthread_mutex_lock(&lock);
    for (CUfunction f = known; f; f = f->next) {
        if (f->host || f->program) continue;
        if (!f->why && strcmp(f->symbol, symbol) == 0 && !exact) exact = f;
        if (strcmp(f->name, ident) == 0) {
            if (f->why && !refused) refused = f;
            if (!f->why && strcmp(f->symbol, symbol) != 0 && !other) other = f;
        }
    }
    pthread_mutex_unlock(&lock);
    free(ident);
    if (exact) return exact;
    if (refused) return refused;
    char why[1400];
    if (other)
        snprintf(why, sizeof why,
                 "the --kernels sources define it as %.600s, not as %.600s (another signature or "
                 "linkage than the program's)",
                 other->symbol, symbol);
    else
        snprintf(why, sizeof why, "no source in --kernels defines it");
    return refused_function(symbol, why);
}

EGF_CPU_API CUfunction egf_cpu_host_function(const char *symbol, void (*run)(void *), size_t bytes) {
    CUfunction f = new_function(symbol, symbol);
    if (!f) return NULL;
    f->host = run;
    f->nparams = 1;
    f->sizes[0] = bytes;
    return f;
}

EGF_CPU_API const char *egf_cpu_function_symbol(CUfunction f) { return f ? f->symbol : NULL; }

/* ---- modules ---- */
static void add_entry(CUmodule m, const char *name, size_t len, int nparams, size_t *sizes) {
    char **grown = realloc(m->entries, (size_t)(m->entry_count + 1) * sizeof *grown);
    int *counts = realloc(m->entry_params, (size_t)(m->entry_count + 1) * sizeof *counts);
    size_t **lists = realloc(m->entry_sizes, (size_t)(m->entry_count + 1) * sizeof *lists);
    if (grown) m->entries = grown;
    if (counts) m->entry_params = counts;
    if (lists) m->entry_sizes = lists;
    if (!grown || !counts || !lists) return;
    m->entries[m->entry_count] = strndup(name, len);
    m->entry_params[m->entry_count] = nparams;
    m->entry_sizes[m->entry_count++] = sizes;
}

// one `.param` declaration's bytes: `.param .u64 x`, `.param .align 8 .b8 x[24]`
static size_t ptx_param_bytes(const char *decl, const char *end) {
    const char *bracket = memchr(decl, '[', (size_t)(end - decl));
    if (bracket) return (size_t)strtoul(bracket + 1, NULL, 10);  // .b8 arrays: bytes
    static const struct {
        const char *type;
        size_t bytes;
    } types[] = {{".u64", 8}, {".s64", 8}, {".b64", 8}, {".f64", 8}, {".u32", 4}, {".s32", 4},
                 {".b32", 4}, {".f32", 4}, {".u16", 2}, {".s16", 2}, {".b16", 2}, {".f16", 2},
                 {".u8", 1},  {".s8", 1},  {".b8", 1}};
    for (size_t i = 0; i < sizeof types / sizeof *types; ++i) {
        const char *at = strstr(decl, types[i].type);
        if (at && at < end) return types[i].bytes;
    }
    return 0;
}

// `.entry NAME(.param ..., ...)` of a PTX text: each entry's name and parameter sizes
static void ptx_entries(CUmodule m, const char *ptx) {
    m->entries = calloc(1, sizeof *m->entries);
    for (const char *p = ptx; (p = strstr(p, ".entry")) != NULL; p += 6) {
        const char *s = p + 6;
        while (*s == ' ' || *s == '\t') ++s;
        const char *e = s;
        while (*e && *e != '(' && *e != ' ' && *e != '\t' && *e != '\n') ++e;
        if (e == s) continue;
        const char *open = strchr(e, '('), *close = open ? strchr(open, ')') : NULL;
        const char *body = strchr(e, '{');
        int n = -1;
        size_t *sizes = NULL;
        if (open && close && (!body || open < body)) {
            n = 0;
            sizes = calloc(EGF_MAX_PARAMS, sizeof *sizes);
            for (const char *d = open; sizes && (d = strstr(d, ".param")) && d < close && n < EGF_MAX_PARAMS; ++n) {
                const char *next = strchr(d + 6, ',');
                const char *stop = next && next < close ? next : close;
                sizes[n] = ptx_param_bytes(d, stop);
                d = stop;
            }
        }
        add_entry(m, s, (size_t)(e - s), n, sizes);
    }
}

// the kernels of an ELF cubin: its `.text.NAME` sections
static void cubin_entries(CUmodule m, const unsigned char *elf, size_t size) {
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)elf;
    if (size < sizeof *eh || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr) > size || eh->e_shstrndx >= eh->e_shnum)
        return;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(elf + eh->e_shoff);
    const Elf64_Shdr *names = &sh[eh->e_shstrndx];
    if (names->sh_offset + names->sh_size > size) return;
    m->entries = calloc(1, sizeof *m->entries);
    for (int i = 0; i < eh->e_shnum; ++i) {
        if (sh[i].sh_name >= names->sh_size) continue;
        const char *name = (const char *)elf + names->sh_offset + sh[i].sh_name;
        if (strncmp(name, ".text.", 6) == 0) add_entry(m, name + 6, strlen(name + 6), -1, NULL);
    }
}

HIDDEN CUresult egf_cpu_module_load(CUmodule *module, const void *image, size_t size) {
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    CUmodule m = calloc(1, sizeof *m);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    const char *text = image;
    if (strncmp(text, INDEX_MAGIC, strlen(INDEX_MAGIC)) == 0) {
        read_index(text, &m->own, &m->own_count);
    } else if (memcmp(image, ELFMAG, SELFMAG) == 0) {
        cubin_entries(m, image, size ? size : (size_t)-1 / 2);
    } else if (strstr(text, ".version") && strstr(text, ".target")) {
        ptx_entries(m, text);
    }  // a fatbin or anything else: not read; kernels are then looked up by name alone
    *module = m;
    return CUDA_SUCCESS;
}

HIDDEN CUresult egf_cpu_module_function(CUfunction *f, CUmodule m, const char *name) {
    if (!f || !m || !name) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < m->own_count; ++i) {
        if (strcmp(m->own[i]->symbol, name) == 0 || strcmp(m->own[i]->name, name) == 0) {
            *f = m->own[i];
            return CUDA_SUCCESS;
        }
    }
    if (m->own) return CUDA_ERROR_NOT_FOUND;  // an NVRTC program defines what it defines
    int entry = -1;
    for (int i = 0; m->entries && i < m->entry_count && entry < 0; ++i)
        if (strcmp(m->entries[i], name) == 0) entry = i;
    if (m->entries && entry < 0) return CUDA_ERROR_NOT_FOUND;
    *f = egf_cpu_function_named(name);
    if (!*f) return CUDA_ERROR_OUT_OF_MEMORY;
    // the module's own parameters (PTX says them) must be the source's
    int n = entry >= 0 ? m->entry_params[entry] : -1;
    int differ = n >= 0 && !(*f)->why && n != (*f)->nparams;
    for (int i = 0; n >= 0 && !differ && !(*f)->why && i < n; ++i)
        differ = m->entry_sizes[entry][i] != (*f)->sizes[i];
    if (differ) {
        char why[512];
        snprintf(why, sizeof why,
                 "the module's PTX gives it %d parameters, its --kernels source %d (or other "
                 "sizes): they are not the same kernel",
                 n, (*f)->nparams);
        *f = refused_function(name, why);
    }
    return *f ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* ---- launches ---- */
HIDDEN CUresult egf_cpu_param_info(CUfunction f, size_t i, size_t *offset, size_t *size) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (f->why || i >= (size_t)f->nparams) return CUDA_ERROR_INVALID_VALUE;
    if (offset) *offset = f->offsets[i];
    if (size) *size = f->sizes[i];
    return CUDA_SUCCESS;
}

// kernelParams, or the arguments packed in `extra` at the signature's offsets
static int arguments(CUfunction f, void **params, void **extra, void **store) {
    if (params) {
        for (int i = 0; i < f->nparams; ++i) store[i] = params[i];
        return 1;
    }
    if (!extra) return f->nparams == 0;
    unsigned char *buf = NULL;
    size_t size = 0;
    for (int i = 0; i < 16 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            buf = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
            size = *(size_t *)extra[i + 1];
    }
    for (int i = 0; i < f->nparams; ++i) {
        if (!buf || f->offsets[i] + f->sizes[i] > size) return 0;
        store[i] = buf + f->offsets[i];
    }
    return 1;
}

/* A kernel that faults (a read or write outside every mapping: past an allocation's end, into
 * a guard page; an integer division by zero; __trap) ends the process there, as a GPU's
 * illegal address or launch failure ends the trainer's run: one line naming the kernel, then
 * exit(128 + the signal), so the recorder's exit handler still writes every event up to this
 * launch, and the capture's manifest records the death (run --capture: incomplete). So does a
 * launch running longer than EGF_CPU_LAUNCH_TIMEOUT seconds (a hang: exit 124), and a kernel
 * that calls exit() itself (which no device code can) has the process end with status 134
 * after the recorder's exit handler ran. */
static sigjmp_buf fault_jump;
static volatile sig_atomic_t fault_signal;
static volatile int in_kernel;
static const char *running;  // the kernel being run ("kernel NAME")
static __thread timer_t tl_watchdog;
static __thread int tl_watchdog_made;
#define WATCHDOG (SIGRTMIN + 7)

static void on_fault(int sig) {
    fault_signal = sig;
    siglongjmp(fault_jump, 1);
}

static void exit_inside_kernel(void) {
    if (!in_kernel) return;
    fprintf(stderr, "egf-audit capture --cpu: %s called exit(), which no device code can: "
            "the process ends with status 134\n", running);
    fflush(stderr);
    _exit(128 + SIGABRT);
}

__attribute__((constructor)) static void watch_exits(void) {
    atexit(exit_inside_kernel);  // registered before the recorder's: it runs after it
}

static void arm(int seconds) {
    if (seconds <= 0) return;
    if (!tl_watchdog_made) {
        struct sigevent ev;
        memset(&ev, 0, sizeof ev);
        ev.sigev_notify = SIGEV_THREAD_ID;
        ev.sigev_signo = WATCHDOG;
        ev._sigev_un._tid = (int)gettid();
        tl_watchdog_made = timer_create(CLOCK_MONOTONIC, &ev, &tl_watchdog) == 0;
    }
    struct itimerspec in = {{0, 0}, {seconds, 0}};
    if (tl_watchdog_made) timer_settime(tl_watchdog, 0, &in, NULL);
}

static void disarm(void) {
    struct itimerspec off = {{0, 0}, {0, 0}};
    if (tl_watchdog_made) timer_settime(tl_watchdog, 0, &off, NULL);
}

static int launch_timeout(void) {
    const char *s = getenv("EGF_CPU_LAUNCH_TIMEOUT");
    return s && *s ? atoi(s) : 120;
}

HIDDEN void egf_cpu_run_guarded(CUfunction f, const unsigned grid[3], const unsigned block[3],
                                void **store, const char *what) {
    int signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, WATCHDOG};
    enum { N = sizeof signals / sizeof *signals };
    struct sigaction handler, before[N];
    memset(&handler, 0, sizeof handler);
    handler.sa_handler = on_fault;
    sigemptyset(&handler.sa_mask);
    handler.sa_flags = SA_NODEFER;
    int seconds = launch_timeout();
    // one launch at a time, as one device queue runs them: a kernel library's threadIdx,
    // blockIdx, ... are plain statics (cpu_kernels.py defines EGF_CPU_THREAD_LOCAL empty)
    pthread_mutex_lock(&launch_lock);
    if (sigsetjmp(fault_jump, 1)) {
        disarm();
        in_kernel = 0;
        pthread_mutex_unlock(&launch_lock);  // the trainer's exit handlers may still launch
        if (fault_signal == WATCHDOG) {
            fprintf(stderr,
                    "egf-audit capture --cpu: %s ran longer than %d s (EGF_CPU_LAUNCH_TIMEOUT): "
                    "stopped as a hang\n",
                    what, seconds);
            fflush(stderr);
            exit(124);
        }
        fprintf(stderr,
                "egf-audit capture --cpu: %s faulted (signal %d: %s): stopped, as a GPU stops "
                "at an illegal address or a failed launch\n",
                what, (int)fault_signal,
                fault_signal == SIGFPE   ? "an arithmetic fault"
                : fault_signal == SIGILL ? "a trap"
                                         : "memory outside every allocation");
        fflush(stderr);
        exit(128 + fault_signal);
    }
    for (int i = 0; i < N; ++i) sigaction(signals[i], &handler, &before[i]);
    running = what;
    in_kernel = 1;
    arm(seconds);
    if (f->host)
        f->host(store[0]);
    else
        f->run(grid, block, store);
    disarm();
    in_kernel = 0;
    for (int i = 0; i < N; ++i) sigaction(signals[i], &before[i], NULL);
    pthread_mutex_unlock(&launch_lock);
}

HIDDEN CUresult egf_cpu_launch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                               unsigned shared, void **params, void **extra) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (f->why) {
        char why[1200];
        snprintf(why, sizeof why, "kernel %s cannot run on the CPU: %s", f->name, f->why);
        egf_cpu_refuse(f->symbol, why);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (shared) {
        egf_cpu_refuse(f->symbol, "a launch with dynamic shared memory (the CPU shim models none)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    for (int d = 0; d < 3; ++d)
        if (!grid[d] || !block[d]) return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned long long)block[0] * block[1] * block[2] > 1024) return CUDA_ERROR_INVALID_VALUE;
    void *store[EGF_MAX_PARAMS];
    if (!arguments(f, params, extra, store)) return CUDA_ERROR_INVALID_VALUE;
    char after[1100];
    snprintf(after, sizeof after, "kernel %s", f->name);
    egf_cpu_run_guarded(f, grid, block, store, after);
    egf_cpu_check_guards(after);
    return CUDA_SUCCESS;
}
