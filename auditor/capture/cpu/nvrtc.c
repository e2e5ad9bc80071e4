/* libnvrtc for `egf-audit capture --cpu`: a program is compiled from the source string the
 * trainer hands it, for the CPU, behind the shim the CPU backend uses.
 *
 * nvrtcCompileProgram hands it to egf-audit's own compiler (`EGF_CPU_PYTHON -m
 * egf_audit.capture.cpu_kernels`, one process kept for all the programs of the trainer, which
 * builds through the CPU backend's compile rules and cache) and keeps what it answers: a module
 * index naming the compiled library and each kernel (or why one is refused). That index is the program's "PTX" and "CUBIN": cuModuleLoadData of
 * the fake libcuda loads it back. Options it keeps: -D NAME[=VALUE] (prepended as #define) and
 * -I DIR / --include-path=DIR (headers under DIR); the others (the architecture, -std, ...) do
 * not change what runs on the CPU.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "egf_cpu.h"

#define EXPORT __attribute__((visibility("default")))
extern char **environ;

enum {
    NVRTC_SUCCESS = 0,
    NVRTC_ERROR_OUT_OF_MEMORY = 1,
    NVRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
    NVRTC_ERROR_INVALID_INPUT = 3,
    NVRTC_ERROR_INVALID_PROGRAM = 4,
    NVRTC_ERROR_INVALID_OPTION = 5,
    NVRTC_ERROR_COMPILATION = 6,
    NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION = 8,
    NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID = 10,
    NVRTC_ERROR_INTERNAL_ERROR = 11,
};

typedef struct {
    char *name, *source;
    int headers;
    char **header_names, **header_texts;
    char *index;  // after compiling: the module index
    char *log;
    char **expressions, **lowered;
    int expression_count;
} Program;

static char *dup_or_empty(const char *s) { return strdup(s ? s : ""); }

EXPORT int nvrtcVersion(int *major, int *minor) {
    if (!major || !minor) return NVRTC_ERROR_INVALID_INPUT;
    *major = 13, *minor = 0;
    return NVRTC_SUCCESS;
}

EXPORT const char *nvrtcGetErrorString(int result) {
    switch (result) {
        case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
        case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
        case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
        case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
        case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
        case NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID: return "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID";
        default: return "NVRTC_ERROR_INTERNAL_ERROR";
    }
}

EXPORT int nvrtcGetNumSupportedArchs(int *numArchs) {
    if (!numArchs) return NVRTC_ERROR_INVALID_INPUT;
    *numArchs = 6;
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcGetSupportedArchs(int *supportedArchs) {
    static const int archs[] = {75, 80, 86, 89, 90, 100};
    if (!supportedArchs) return NVRTC_ERROR_INVALID_INPUT;
    memcpy(supportedArchs, archs, sizeof archs);
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcCreateProgram(Program **prog, const char *src, const char *name, int numHeaders,
                              const char *const *headers, const char *const *includeNames) {
    if (!prog || !src || numHeaders < 0 || (numHeaders && (!headers || !includeNames)))
        return NVRTC_ERROR_INVALID_INPUT;
    Program *p = calloc(1, sizeof *p);
    if (!p) return NVRTC_ERROR_OUT_OF_MEMORY;
    p->source = strdup(src);
    p->name = dup_or_empty(name && *name ? name : "default_program");
    p->headers = numHeaders;
    p->header_names = calloc((size_t)numHeaders + 1, sizeof(char *));
    p->header_texts = calloc((size_t)numHeaders + 1, sizeof(char *));
    for (int i = 0; i < numHeaders; ++i) {
        p->header_names[i] = dup_or_empty(includeNames[i]);
        p->header_texts[i] = dup_or_empty(headers[i]);
    }
    *prog = p;
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcDestroyProgram(Program **prog) {
    if (!prog || !*prog) return NVRTC_ERROR_INVALID_PROGRAM;
    Program *p = *prog;
    for (int i = 0; i < p->headers; ++i) free(p->header_names[i]), free(p->header_texts[i]);
    for (int i = 0; i < p->expression_count; ++i) free(p->expressions[i]), free(p->lowered[i]);
    free(p->header_names), free(p->header_texts), free(p->expressions), free(p->lowered);
    free(p->name), free(p->source), free(p->index), free(p->log);
    free(p);
    *prog = NULL;
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcAddNameExpression(Program *prog, const char *name_expression) {
    if (!prog || !name_expression) return NVRTC_ERROR_INVALID_INPUT;
    if (prog->index) return NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION;
    char **e = realloc(prog->expressions, (size_t)(prog->expression_count + 1) * sizeof *e);
    char **l = e ? realloc(prog->lowered, (size_t)(prog->expression_count + 1) * sizeof *l) : NULL;
    if (!e || !l) return NVRTC_ERROR_OUT_OF_MEMORY;
    prog->expressions = e, prog->lowered = l;
    prog->expressions[prog->expression_count] = strdup(name_expression);
    prog->lowered[prog->expression_count++] = NULL;
    return NVRTC_SUCCESS;
}

/* ---- the compile: egf-audit's own compiler in a child process ---- */
typedef struct {
    char *data;
    size_t size, cap;
} Buffer;

static void put(Buffer *b, const char *s, size_t n) {
    if (b->size + n + 1 > b->cap) {
        size_t cap = (b->size + n + 1) * 2;
        char *grown = realloc(b->data, cap);
        if (!grown) return;
        b->data = grown, b->cap = cap;
    }
    memcpy(b->data + b->size, s, n);
    b->size += n;
    b->data[b->size] = '\0';
}

static void put_str(Buffer *b, const char *s) { put(b, s, strlen(s)); }

static void put_block(Buffer *b, const char *word, const char *name, const char *text) {
    char head[4200];
    snprintf(head, sizeof head, "%s%s%s %zu\n", word, name ? " " : "", name ? name : "", strlen(text));
    put_str(b, head);
    put_str(b, text);
}

// the request the compiler reads: the program, the headers it was handed, its options
static Buffer request(const Program *p, int numOptions, const char *const *options) {
    Buffer b = {0};
    char line[4200];
    snprintf(line, sizeof line, "name %s\n", p->name);
    put_str(&b, line);
    for (int i = 0; i < numOptions; ++i) {
        const char *o = options[i];
        const char *value = NULL, *word = NULL;
        if (!strncmp(o, "-D", 2)) word = "define", value = o[2] ? o + 2 : (i + 1 < numOptions ? options[++i] : "");
        else if (!strncmp(o, "--define-macro=", 15)) word = "define", value = o + 15;
        else if (!strncmp(o, "-I", 2)) word = "include", value = o[2] ? o + 2 : (i + 1 < numOptions ? options[++i] : "");
        else if (!strncmp(o, "--include-path=", 15)) word = "include", value = o + 15;
        if (word) {
            snprintf(line, sizeof line, "%s %s\n", word, value);
            put_str(&b, line);
        }
    }
    for (int i = 0; i < p->headers; ++i) put_block(&b, "header", p->header_names[i], p->header_texts[i]);
    put_block(&b, "source", NULL, p->source);
    return b;
}

// the environment of the compiler: the trainer's, without the recorder and the capture
static char **compiler_environment(void) {
    int n = 0;
    while (environ[n]) ++n;
    char **env = calloc((size_t)n + 1, sizeof *env);
    int k = 0;
    for (int i = 0; env && i < n; ++i) {
        if (!strncmp(environ[i], "LD_PRELOAD=", 11) || !strncmp(environ[i], "CUDA_INJECTION64_PATH=", 22) ||
            !strncmp(environ[i], "EGF_CAPTURE_DIR=", 16))
            continue;
        env[k++] = environ[i];
    }
    return env;
}

/* One compiler per process, started at the first compile and kept: it answers each request
 * with "ok BYTES\n" and the module index, or "error BYTES\n" and why. */
static struct {
    pthread_mutex_t lock;
    pid_t owner, pid;  // the process that started it (a forked child starts its own)
    FILE *to, *from;
} helper = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int helper_start(Buffer *err) {
    const char *python = getenv("EGF_CPU_PYTHON");
    if (!python || !*python) {
        put_str(err, "EGF_CPU_PYTHON is not set: the program was not run by egf-audit capture --cpu");
        return 0;
    }
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) || pipe2(from, O_CLOEXEC)) return 0;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from[1], 1);
    char *argv[] = {(char *)python, "-m", "egf_audit.capture.cpu_kernels", NULL};
    char **env = compiler_environment();
    int rc = posix_spawn(&helper.pid, python, &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    close(to[0]), close(from[1]);
    if (rc != 0) {
        close(to[1]), close(from[0]);
        put_str(err, strerror(rc));
        return 0;
    }
    helper.to = fdopen(to[1], "w");
    helper.from = fdopen(from[0], "r");
    helper.owner = getpid();
    return helper.to && helper.from;
}

// one request to the compiler: 0 with the index in *out, or -1 with why in *err
static int run_compiler(const Buffer *in, Buffer *out, Buffer *err) {
    pthread_mutex_lock(&helper.lock);
    int ok = helper.owner == getpid() || helper_start(err);
    char head[64];
    size_t bytes = 0;
    if (ok) ok = fwrite(in->data, 1, in->size, helper.to) == in->size && fputs("end\n", helper.to) >= 0 &&
                 fflush(helper.to) == 0 && fgets(head, sizeof head, helper.from) != NULL;
    if (ok) ok = sscanf(head + (head[0] == 'o' ? 3 : 6), "%zu", &bytes) == 1;
    Buffer *into = ok && !strncmp(head, "ok ", 3) ? out : err;
    char chunk[65536];
    for (size_t got; ok && bytes > 0; bytes -= got) {
        got = fread(chunk, 1, bytes < sizeof chunk ? bytes : sizeof chunk, helper.from);
        if (!got) ok = 0;
        else put(into, chunk, got);
    }
    if (!ok) {
        put_str(err, "egf-audit's compiler for the CPU ended without an answer");
        helper.owner = 0;  // the next compile starts another
    }
    pthread_mutex_unlock(&helper.lock);
    return ok && into == out ? 0 : -1;
}

// a name expression's kernel ("foo", "&foo", "ns::foo") lowered to its symbol, from the index
static char *lowered_name(const char *index, const char *expression) {
    const char *e = expression;
    while (*e == '&' || *e == ' ') ++e;
    const char *colon = strrchr(e, ':');
    const char *ident = colon ? colon + 1 : e;
    char *copy = strdup(index), *save = NULL, *found = NULL;
    void *lib = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line && !found; line = strtok_r(NULL, "\n", &save)) {
        int i;
        char name[1024];
        if (!strncmp(line, "library ", 8)) lib = dlopen(line + 8, RTLD_NOW | RTLD_LOCAL);
        if (strncmp(line, "kernel ", 7) || sscanf(line + 7, "%d %1023s", &i, name) != 2 || strcmp(name, ident))
            continue;
        char sym[64];
        snprintf(sym, sizeof sym, "egf_cpu_fn_%d", i);
        void *(*fn)(void) = lib ? (void *(*)(void))dlsym(lib, sym) : NULL;
        Dl_info info;
        if (fn && dladdr(fn(), &info) && info.dli_sname) found = strdup(info.dli_sname);
    }
    free(copy);
    return found;
}

EXPORT int nvrtcCompileProgram(Program *prog, int numOptions, const char *const *options) {
    if (!prog) return NVRTC_ERROR_INVALID_PROGRAM;
    if (numOptions < 0 || (numOptions && !options)) return NVRTC_ERROR_INVALID_OPTION;
    Buffer in = request(prog, numOptions, options), out = {0}, err = {0};
    int status = run_compiler(&in, &out, &err);
    free(in.data);
    free(prog->log);
    prog->log = err.data ? err.data : strdup("");
    if (status != 0 || !out.data) {
        char why[1400];
        snprintf(why, sizeof why, "egf-audit's compiler for the CPU failed on program %s: %.1200s",
                 prog->name, prog->log);
        egf_cpu_refuse("nvrtcCompileProgram", why);
        free(out.data);
        return NVRTC_ERROR_COMPILATION;
    }
    free(prog->index);
    prog->index = out.data;
    for (int i = 0; i < prog->expression_count; ++i)
        prog->lowered[i] = lowered_name(prog->index, prog->expressions[i]);
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcGetLoweredName(Program *prog, const char *name_expression, const char **lowered_name_out) {
    if (!prog || !name_expression || !lowered_name_out) return NVRTC_ERROR_INVALID_INPUT;
    for (int i = 0; i < prog->expression_count; ++i) {
        if (strcmp(prog->expressions[i], name_expression) != 0) continue;
        if (!prog->lowered[i]) return NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID;
        *lowered_name_out = prog->lowered[i];
        return NVRTC_SUCCESS;
    }
    return NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID;
}

static int get_size(Program *prog, size_t *size) {
    if (!prog || !size) return NVRTC_ERROR_INVALID_INPUT;
    if (!prog->index) return NVRTC_ERROR_INVALID_PROGRAM;
    *size = strlen(prog->index) + 1;
    return NVRTC_SUCCESS;
}

static int get(Program *prog, char *out) {
    if (!prog || !out) return NVRTC_ERROR_INVALID_INPUT;
    if (!prog->index) return NVRTC_ERROR_INVALID_PROGRAM;
    memcpy(out, prog->index, strlen(prog->index) + 1);
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcGetPTXSize(Program *prog, size_t *ptxSizeRet) { return get_size(prog, ptxSizeRet); }
EXPORT int nvrtcGetPTX(Program *prog, char *ptx) { return get(prog, ptx); }
EXPORT int nvrtcGetCUBINSize(Program *prog, size_t *cubinSizeRet) { return get_size(prog, cubinSizeRet); }
EXPORT int nvrtcGetCUBIN(Program *prog, char *cubin) { return get(prog, cubin); }

EXPORT int nvrtcGetProgramLogSize(Program *prog, size_t *logSizeRet) {
    if (!prog || !logSizeRet) return NVRTC_ERROR_INVALID_INPUT;
    *logSizeRet = (prog->log ? strlen(prog->log) : 0) + 1;
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcGetProgramLog(Program *prog, char *log) {
    if (!prog || !log) return NVRTC_ERROR_INVALID_INPUT;
    const char *text = prog->log ? prog->log : "";
    memcpy(log, text, strlen(text) + 1);
    return NVRTC_SUCCESS;
}
