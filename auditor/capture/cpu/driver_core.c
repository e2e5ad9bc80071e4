/* libcuda.so.1 for `egf-audit capture --cpu`: initialisation, CUPTI's callbacks, refusals.
 *
 * cuInit loads the library CUDA_INJECTION64_PATH names and calls its InitializeInjection, as
 * NVIDIA's driver does; the recorder then subscribes through the fake libcupti, and from then on
 * every API call of the fakes fires its callbacks here (egf_cpu_enter / egf_cpu_exit), with the
 * parameter structs of generated_cuda_meta.h and the callback ids of cupti_driver_cbid.h and
 * cupti_runtime_cbid.h.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver_internal.h"

/* ---- refusals ---- */
static pthread_mutex_t refuse_lock = PTHREAD_MUTEX_INITIALIZER;
static char **refused_names;
static int refused_count;

EGF_CPU_API void egf_cpu_refuse(const char *name, const char *why) {
    pthread_mutex_lock(&refuse_lock);
    for (int i = 0; i < refused_count; ++i) {
        if (strcmp(refused_names[i], name) == 0) {
            pthread_mutex_unlock(&refuse_lock);
            return;  // said once per name
        }
    }
    char **grown = realloc(refused_names, (size_t)(refused_count + 1) * sizeof *grown);
    if (grown) {
        refused_names = grown;
        refused_names[refused_count++] = strdup(name);
    }
    char line[2048];
    int n = snprintf(line, sizeof line, "%s\t%s\n", name, why);
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    for (char *p = line; p < line + n - 1; ++p)
        if (*p == '\n') *p = ' ';  // one refusal, one line
    const char *path = getenv("EGF_CPU_REFUSALS");
    if (path && *path) {
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            ssize_t written = write(fd, line, (size_t)n);
            (void)written;
            close(fd);
        }
    }
    fprintf(stderr, "egf-audit capture --cpu: refused %s: %s\n", name, why);
    pthread_mutex_unlock(&refuse_lock);
}

EGF_CPU_API CUresult egf_cpu_unmodeled(const char *name) {
    egf_cpu_refuse(name, "egf-audit capture --cpu does not model this call");
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- CUPTI's subscriber ---- */
static struct {
    CUpti_CallbackFunc callback;
    void *userdata;
    unsigned char driver[CUPTI_DRIVER_TRACE_CBID_SIZE];
    unsigned char runtime[CUPTI_RUNTIME_TRACE_CBID_SIZE];
} sub;
static pthread_mutex_t correlation_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t next_correlation = 1;

EGF_CPU_API int egf_cpu_subscribe(CUpti_CallbackFunc callback, void *userdata) {
    if (sub.callback) return 0;  // CUPTI allows one subscriber
    sub.callback = callback;
    sub.userdata = userdata;
    return 1;
}

EGF_CPU_API void egf_cpu_unsubscribe(void) {
    sub.callback = NULL;
    memset(sub.driver, 0, sizeof sub.driver);
    memset(sub.runtime, 0, sizeof sub.runtime);
}

static unsigned char *domain_table(CUpti_CallbackDomain domain, int *size) {
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
        *size = CUPTI_DRIVER_TRACE_CBID_SIZE;
        return sub.driver;
    }
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
        *size = CUPTI_RUNTIME_TRACE_CBID_SIZE;
        return sub.runtime;
    }
    *size = 0;
    return NULL;
}

EGF_CPU_API void egf_cpu_enable(CUpti_CallbackDomain domain, int cbid, int enable) {
    int size;
    unsigned char *table = domain_table(domain, &size);
    if (!table) return;
    if (cbid < 0)
        memset(table, enable ? 1 : 0, (size_t)size);
    else if (cbid < size)
        table[cbid] = enable ? 1 : 0;
}

EGF_CPU_API int egf_cpu_enabled(CUpti_CallbackDomain domain, int cbid) {
    int size;
    unsigned char *table = domain_table(domain, &size);
    return table && cbid >= 0 && cbid < size && table[cbid];
}

static CUcontext current_context(void) { return egf_cpu_primary_context(); }

EGF_CPU_API void egf_cpu_enter(EgfCall *call, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                               const char *name, const void *params, const char *symbol) {
    memset(call, 0, sizeof *call);
    call->domain = domain;
    call->cbid = cbid;
    if (!sub.callback || !egf_cpu_enabled(domain, (int)cbid)) return;
    pthread_mutex_lock(&correlation_lock);
    call->data.correlationId = next_correlation++;
    pthread_mutex_unlock(&correlation_lock);
    call->data.callbackSite = CUPTI_API_ENTER;
    call->data.functionName = name;
    call->data.functionParams = params;
    call->data.symbolName = symbol;
    call->data.context = current_context();
    call->data.contextUid = 1;
    call->data.correlationData = &call->correlation;
    call->fired = 1;
    sub.callback(sub.userdata, domain, cbid, &call->data);
}

EGF_CPU_API void egf_cpu_exit(EgfCall *call, void *result) {
    if (!call->fired || !sub.callback) return;
    call->data.callbackSite = CUPTI_API_EXIT;
    call->data.functionReturnValue = result;
    sub.callback(sub.userdata, call->domain, call->cbid, &call->data);
}

/* ---- cuInit and the injection ---- */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int initialised;

static void load_injection(void) {
    const char *path = getenv("CUDA_INJECTION64_PATH");
    if (!path || !*path) return;
    void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "egf-audit capture --cpu: CUDA_INJECTION64_PATH %s does not load: %s\n",
                path, dlerror());
        return;
    }
    int (*init)(void) = (int (*)(void))dlsym(lib, "InitializeInjection");
    if (init) init();
}

static void initialise(void) {
    egf_cpu_load_kernel_index();
    initialised = 1;
    load_injection();
}

CUresult egf_cpu_init(void) {
    pthread_once(&init_once, initialise);
    return CUDA_SUCCESS;
}

int egf_cpu_initialised(void) { return initialised; }
