// The shipped recorder library, preloaded as `egf-audit capture` preloads it, driven on the host:
// CUPTI, the driver, the runtime, cuBLAS and cuBLASLt are the stand-ins beside this file
// (fake_*.c), and this program calls the recorder's CUPTI callback as CUPTI would around each
// API call, doing what the call does in between. tests/test_recorder_replay.py builds it and
// compares what the recorder wrote with tests/recorder_host/expected/.
//
//   EGF_CAPTURE_DIR=DIR LD_PRELOAD=recorder.so replay [fork] [descriptors] [plant=WHAT]
//                                                     [outside=PATH]
//
// The calls: allocations (driver, stream-ordered, pitched, runtime), copies and memsets (driver
// and runtime, one runtime copy with its driver call inside), the four ABI kernels through
// cuLaunchKernel, cuLaunchKernelEx (a library kernel, mangled) and a packed `extra` buffer, a
// launch on a capturing stream, runtime launches (decoded, one the runtime's own stub table does
// not know, cudaLaunchKernelExC), cuBLAS calls in host and device pointer mode and a batched one,
// two cublasLtMatmul calls through the preloaded interposer, graph launches, a free. `fork`: a
// child forked without exec records a launch and a memset under its own pid. `descriptors`:
// prints how many descriptors lead into DIR once the recorder started, and how many of them an
// exec would hand on. `plant=events`, `snapshots` or `values` puts a link to PATH (a file
// holding "planted" without `outside`) where this process's file goes before the recorder
// starts; `plant=child` puts one where the forked child's events file goes.
#define _GNU_SOURCE
#include <cuda.h>
#include <cupti.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_abi.h"

static CUpti_CallbackFunc subscriber;
static void *subscriber_data;
static const char *plant, *outside;

// ---- one API call, as CUPTI reports it ----
typedef struct {
    CUpti_CallbackDomain domain;
    CUpti_CallbackId id;
    const char *name, *symbol;
    const void *params;
    int rc;
    uint64_t correlation;
} Call;

static void site(Call *c, CUpti_ApiCallbackSite where) {
    CUpti_CallbackData d = {0};
    d.callbackSite = where;
    d.functionName = c->name;
    d.functionParams = c->params;
    d.functionReturnValue = &c->rc;
    d.symbolName = c->symbol;
    d.correlationData = &c->correlation;
    subscriber(subscriber_data, c->domain, c->id, &d);
}

static void call(CUpti_CallbackDomain domain, CUpti_CallbackId id, const char *name,
                 const void *params, const char *symbol, void (*body)(void *), void *arg) {
    Call c = {domain, id, name, symbol, params, 0, 0};
    site(&c, CUPTI_API_ENTER);
    if (body) body(arg);
    site(&c, CUPTI_API_EXIT);
}
#define DRIVER(cbid, params, body, arg) \
    call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_##cbid, #cbid, params, NULL, body, arg)
// a runtime call's functionName is the API's name without the CBID's version (cudaMemset)
#define RUNTIME(cbid, name, params, body, arg) \
    call(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_##cbid, name, params, NULL, body, arg)

// ---- the trainer's memory ----
enum { ROWS = 8, SH2 = 8, LD = SH2 + 1, ISV = 512, ISV_INDEX = 393, N = 64 };
static CUdeviceptr isv, concat, d_h_s2, d_concat, target, online, act, arrays;
#define F(p) ((float *)(uintptr_t)(p))

static void alloc_into(void *out) {
    const cuMemAlloc_v2_params *a = out;  // every allocation's parameters lead with (dptr, bytes)
    *a->dptr = fake_device(a->bytesize);
}

static CUdeviceptr driver_alloc(size_t bytes) {
    CUdeviceptr p = 0;
    cuMemAlloc_v2_params a = {&p, bytes};
    DRIVER(cuMemAlloc_v2, &a, alloc_into, &a);
    return p;
}

static void copy_in(void *params) {
    const cuMemcpyHtoD_v2_params *a = params;
    memcpy(F(a->dstDevice), a->srcHost, a->ByteCount);
}

static void upload(CUdeviceptr dst, const float *src, size_t count) {
    cuMemcpyHtoD_v2_params a = {dst, src, count * sizeof(float)};
    DRIVER(cuMemcpyHtoD_v2, &a, copy_in, &a);
}

static void memset_words(void *params) {
    const cuMemsetD32_v2_params *a = params;
    for (size_t i = 0; i < a->N; ++i) ((unsigned *)(uintptr_t)a->dstDevice)[i] = a->ui;
}

// ---- kernels: a handle per kernel, its body run between the two callbacks ----
static FakeFunction concat_fn = {FAKE_FUNCTION, 8, {8, 8, 8, 4, 4, 4, 4, 4}};
static FakeFunction scale_fn = {FAKE_FUNCTION, 6, {8, 8, 4, 4, 4, 4}};
static FakeFunction accumulate_fn = {FAKE_KERNEL, 5, {8, 8, 4, 4, 4}};  // a library kernel
static FakeFunction polyak_fn = {FAKE_FUNCTION, 4, {8, 8, 4, 8}};
static FakeFunction relu_fn = {FAKE_FUNCTION, 2, {8, 4}};
static FakeFunction gemm_fn = {FAKE_FUNCTION, 1, {48}};  // one struct parameter, as cuBLAS's

static int arg_int(void **args, int i) { return *(int *)args[i]; }
static CUdeviceptr arg_ptr(void **args, int i) { return *(CUdeviceptr *)args[i]; }

static void run_concat(void **args) {
    float *dx = F(arg_ptr(args, 0));
    for (int b = 0; b < ROWS; ++b)
        for (int j = 0; j < LD; ++j) dx[b * LD + j] = j == SH2 ? 1.0f : 0.25f * (float)(b * LD + j);
}
static void run_scale(void **args) {
    float *dx = F(arg_ptr(args, 0));
    float alpha = F(arg_ptr(args, 1))[arg_int(args, 5)];
    for (int b = 0; b < arg_int(args, 2); ++b) dx[b * arg_int(args, 3) + arg_int(args, 4)] *= alpha;
}
static void run_accumulate(void **args) {
    float *d = F(arg_ptr(args, 0));
    const float *c = F(arg_ptr(args, 1));
    for (int b = 0; b < arg_int(args, 2); ++b)
        for (int j = 0; j < arg_int(args, 3); ++j) d[b * SH2 + j] += c[b * arg_int(args, 4) + j];
}
static void run_polyak(void **args) {
    float *t = F(arg_ptr(args, 0));
    const float *o = F(arg_ptr(args, 1));
    float tau = *(float *)args[2];
    for (long long i = 0; i < *(long long *)args[3]; ++i) t[i] = tau * o[i] + (1 - tau) * t[i];
}
static void run_relu(void **args) {
    float *x = F(arg_ptr(args, 0));
    for (int i = 0; i < arg_int(args, 1); ++i) x[i] = x[i] > 0 ? x[i] : 0.0f;
}

typedef struct {
    cuLaunchKernel_params p;
    void (*run)(void **);
    void **args;
} DriverLaunch;

static void run_launch(void *arg) {
    DriverLaunch *l = arg;
    if (l->run) l->run(l->args);
}

static void driver_launch(FakeFunction *f, const char *symbol, void **args, void (*run)(void **),
                          CUstream stream) {
    DriverLaunch l = {{(CUfunction)f, 2, 1, 1, 128, 1, 1, 0, stream, args, NULL}, run, args};
    Call c = {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, "cuLaunchKernel",
              symbol, &l.p, 0, 0};
    site(&c, CUPTI_API_ENTER);
    run_launch(&l);
    site(&c, CUPTI_API_EXIT);
}

// cuLaunchKernelEx, with its arguments in kernelParams or packed into `extra`
static void launch_ex_call(FakeFunction *f, const char *symbol, const CUlaunchConfig *config,
                           void **params, void **extra, void **args, void (*run)(void **)) {
    cuLaunchKernelEx_params p = {config, (CUfunction)f, params, extra};
    Call c = {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
              "cuLaunchKernelEx", symbol, &p, 0, 0};
    site(&c, CUPTI_API_ENTER);
    if (run) run(args);
    site(&c, CUPTI_API_EXIT);
}

static void launch_ex(FakeFunction *f, const char *symbol, void **args, void (*run)(void **)) {
    CUlaunchConfig config = {1, ROWS, 1, 32, 1, 1, 0, NULL, NULL, 0};
    launch_ex_call(f, symbol, &config, args, NULL, args, run);
}

// ... as a runtime may launch internally (CU_LAUNCH_PARAM_BUFFER_POINTER)
static void packed_launch(FakeFunction *f, const char *symbol, void **args, void (*run)(void **)) {
    unsigned char buffer[64] = {0};
    size_t size = 0;
    for (int i = 0; i < f->n; ++i) {
        size_t at = fake_param_offset(f, i);
        memcpy(buffer + at, args[i], f->sizes[i]);
        size = at + f->sizes[i];
    }
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    CUlaunchConfig config = {4, 1, 1, 64, 1, 1, 0, NULL, NULL, 0};
    launch_ex_call(f, symbol, &config, NULL, extra, args, run);
}

// ---- runtime launches: host stubs, one of them registered with the runtime ----
static void stub_relu(void) {}
static void stub_unknown(void) {}

static void runtime_launch(const void *stub, const char *symbol, void **args, int with_driver) {
    cudaLaunchKernel_v7000_params p = {stub, {2, 1, 1}, {64, 1, 1}, args, 0, NULL};
    Call c = {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
              "cudaLaunchKernel", symbol, &p, 0, 0};
    site(&c, CUPTI_API_ENTER);
    if (with_driver) driver_launch(&relu_fn, symbol, args, run_relu, NULL);  // the same launch
    site(&c, CUPTI_API_EXIT);
}

static void runtime_launch_ex(const void *stub, const char *symbol, void **args) {
    cudaLaunchConfig_t config = {{3, 1, 1}, {32, 1, 1}, 0, NULL, NULL, 0};
    cudaLaunchKernelExC_v11060_params p = {&config, stub, args};
    Call c = {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
              "cudaLaunchKernelExC", symbol, &p, 0, 0};
    site(&c, CUPTI_API_ENTER);
    run_relu(args);
    site(&c, CUPTI_API_EXIT);
}

static void runtime_memset(void *params) {
    const cudaMemset_v3020_params *a = params;
    memset(a->devPtr, a->value, a->count);
}

static void runtime_copy(void *params) {  // the runtime's copy reaches the driver's
    const cudaMemcpy_v3020_params *a = params;
    cuMemcpyHtoD_v2_params d = {(CUdeviceptr)(uintptr_t)a->dst, a->src, a->count};
    DRIVER(cuMemcpyHtoD_v2, &d, copy_in, &d);
}

static void runtime_malloc(void *params) {
    const cudaMalloc_v3020_params *a = params;
    *a->devPtr = (void *)(uintptr_t)fake_device(a->size);
}

// ---- cuBLAS and cuBLASLt ----
static char handle_line[128], handle_device_line[128];
static char alpha_line[128], beta_line[128], alpha_dev_line[128], beta_dev_line[128];
static char a_line[96], b_line[96], c_line[96], arrays_line[3][96];

static void gemm_inside(void) {  // the kernel cuBLAS launches for the call it logged
    unsigned char params[48] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    void *args[] = {params};
    launch_ex(&gemm_fn, "_Z11gemm_kernelv", args, NULL);
}

static void cublas_calls(void) {
    FakeHandle *host_mode = fake_host(sizeof *host_mode), *device_mode = fake_host(sizeof *host_mode);
    host_mode->pointer_mode = 0;
    device_mode->pointer_mode = 1;
    float *scalars = fake_host(2 * sizeof(float));
    scalars[0] = 1.0f;
    scalars[1] = 0.5f;
    CUdeviceptr dev_scalars = fake_device(2 * sizeof(float));
    F(dev_scalars)[0] = 2.0f;
    F(dev_scalars)[1] = 0.0f;
#define HEX(line, name, p) \
    snprintf(line, sizeof line, "i!  " name ": type=%s; val=POINTER (IN HEX:0x0x%llx)\n", \
             strcmp(name, "handle") ? "float" : "cublasHandle_t", (unsigned long long)(p))
    HEX(handle_line, "handle", (uintptr_t)host_mode);
    HEX(handle_device_line, "handle", (uintptr_t)device_mode);
    HEX(alpha_line, "alpha", (uintptr_t)&scalars[0]);
    HEX(beta_line, "beta", (uintptr_t)&scalars[1]);
    snprintf(alpha_dev_line, sizeof alpha_dev_line,
             "i!  alpha: type=void; val=POINTER (IN HEX:0x0x%llx)\n", dev_scalars);
    snprintf(beta_dev_line, sizeof beta_dev_line,
             "i!  beta: type=void; val=POINTER (IN HEX:0x0x%llx)\n", dev_scalars + 4);
    HEX(a_line, "A", act);
    HEX(b_line, "B", online);
    HEX(c_line, "C", target);
    const char *sgemm[] = {
        "I! cuBLAS (v13.1.0) function cublasStatus_t cublasSgemm_v2(cublasHandle_t, "
        "cublasOperation_t, cublasOperation_t, int, int, int, const float*, const float*, int, "
        "const float*, int, const float*, float*, int) called:\n",
        handle_line,
        "i!  transa: type=cublasOperation_t; val=CUBLAS_OP_T(1)\n"
        "i!  transb: type=cublasOperation_t; val=CUBLAS_OP_N(0)\n",  // two lines in one message
        "i!  m: type=int; val=8\n",
        "i!  n: type=int; val=8\n",
        "i!  k: type=int; val=8\n",
        alpha_line,
        a_line,
        "i!  lda: type=int; val=8\n",
        b_line,
        "i!  ldb: type=int; val=8\n",
        beta_line,
        c_line,
        "i!  ldc: type=int; val=8\n",
    };
    fake_cublas_call(sgemm, sizeof sgemm / sizeof *sgemm, gemm_inside);
    const char *gemm_ex[] = {
        "I! cuBLAS (v13.1.0) function cublasStatus_t cublasGemmEx(cublasHandle_t, "
        "cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*, "
        "cudaDataType, int, const void*, cudaDataType, int, const void*, void*, cudaDataType, "
        "int, cublasComputeType_t, cublasGemmAlgo_t) called:\n",
        handle_device_line,
        "i!  transa: type=cublasOperation_t; val=CUBLAS_OP_N(0)\n",
        alpha_dev_line,
        beta_dev_line,
        "i!  computeType: type=cublasComputeType_t; val=CUBLAS_COMPUTE_32F(68)\n",
        "i!  algo: type=SOME TYPE; val=CUBLAS_GEMM_DEFAULT(-1)\n",
    };
    fake_cublas_call(gemm_ex, sizeof gemm_ex / sizeof *gemm_ex, gemm_inside);
    unsigned long long *pointers = (unsigned long long *)F(arrays);
    for (int i = 0; i < 9; ++i) pointers[i] = act + 64 * (unsigned long long)i;
    const char *names[3] = {"Aarray", "Barray", "Carray"};
    for (int i = 0; i < 3; ++i)
        snprintf(arrays_line[i], sizeof arrays_line[i],
                 "i!  %s: type=SOME TYPE; val=POINTER (IN HEX:0x0x%llx)\n", names[i],
                 arrays + 24 * (unsigned long long)i);
    const char *batched[] = {
        "I! cuBLAS (v13.1.0) function cublasStatus_t cublasSgemmBatched(cublasHandle_t, "
        "cublasOperation_t, cublasOperation_t, int, int, int, const float*, const float* const*, "
        "int, const float* const*, int, const float*, float* const*, int, int) called:\n",
        handle_line, alpha_line, arrays_line[0], arrays_line[1], beta_line, arrays_line[2],
        "i!  batchCount: type=int; val=3\n",
    };
    fake_cublas_call(batched, sizeof batched / sizeof *batched, gemm_inside);
    const char *not_a_gemm[] = {
        "I! cuBLAS (v13.1.0) function cublasStatus_t cublasSetStream_v2(cublasHandle_t, "
        "cudaStream_t) called:\n",
        handle_line,
    };
    fake_cublas_call(not_a_gemm, 2, NULL);
}

int cublasLtMatmul(void *, void *, const void *, const void *, void *, const void *, void *,
                   const void *, const void *, void *, void *, void *, const void *, void *, size_t,
                   void *);

static void lt_calls(void) {
    FakeLayout *a = fake_host(sizeof *a), *b = fake_host(sizeof *b), *c = fake_host(sizeof *c);
    *a = (FakeLayout){{0, 0, 8, 8, 8, 1, 0}};
    *b = (FakeLayout){{0, 0, 8, 8, 8, 1, 0}};
    *c = (FakeLayout){{0, 0, 8, 8, 8, 3, 64}};
    FakeMatmulDesc *host_desc = fake_host(sizeof *host_desc);
    FakeMatmulDesc *device_desc = fake_host(sizeof *device_desc);
    // 32F compute, R_32F scale, host scalars, the default epilogue; then device scalars with a
    // bias epilogue (CUBLASLT_EPILOGUE_BIAS) whose vector is the first of A's
    *host_desc = (FakeMatmulDesc){{68, 0, 0, 1, 0}, 1, 0, 0, 0};
    *device_desc = (FakeMatmulDesc){{68, 0, 1, 0, 0}, 4, 0, 0, 0};
    float *scalars = fake_host(2 * sizeof(float));
    scalars[0] = 1.5f;
    scalars[1] = 0.0f;
    CUdeviceptr dev_scalars = fake_device(2 * sizeof(float));
    F(dev_scalars)[0] = -1.0f;
    F(dev_scalars)[1] = 1.0f;
    void *A = F(act), *B = F(online), *C = F(target);
    device_desc->bias = (int64_t)(uintptr_t)A;
    cublasLtMatmul(NULL, host_desc, &scalars[0], A, a, B, b, &scalars[1], C, c, C, c, NULL, NULL,
                   0, NULL);
    cublasLtMatmul(NULL, device_desc, F(dev_scalars), A, a, B, b, F(dev_scalars + 4), C, c, C, c,
                   NULL, NULL, 0, NULL);
}

// ---- a process forked without exec: its own files ----
// Something at `path` before the recorder makes it: a link to `outside`, or without `outside` a
// regular file holding "planted".
static void plant_at(const char *path) {
    FILE *f = outside ? NULL : fopen(path, "wx");
    if (outside ? symlink(outside, path) == 0 : f && fputs("planted\n", f) >= 0 && !fclose(f))
        return;
    perror("plant");
    exit(3);
}

static void plant_file(const char *prefix, const char *ext) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s-%d.%s", getenv("EGF_CAPTURE_DIR"), prefix, (int)getpid(),
             ext);
    plant_at(path);
}

static void child(void) {
    if (plant && !strcmp(plant, "child")) plant_file("events", "jsonl");
    int n = 32;
    void *args[] = {&act, &n};
    driver_launch(&relu_fn, "relu_fwd", args, run_relu, NULL);
    cuMemsetD32_v2_params m = {act, 7, 4};
    DRIVER(cuMemsetD32_v2, &m, memset_words, &m);
    exit(0);
}

// How many of this process's descriptors lead into the capture folder, and how many of those
// an exec would hand on (no FD_CLOEXEC).
static void report_descriptors(void) {
    char folder[4096], link[4200], target[4200];
    if (!realpath(getenv("EGF_CAPTURE_DIR"), folder)) return;
    int into = 0, inherited = 0;
    for (int fd = 0; fd < 1024; ++fd) {
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = '\0';
        if (strncmp(target, folder, strlen(folder)) != 0) continue;
        ++into;
        inherited += !(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    }
    printf("descriptors %d %d\n", into, inherited);
}

int main(int argc, char **argv) {
    int fork_child = 0, descriptors = 0;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "fork")) fork_child = 1;
        else if (!strcmp(argv[i], "descriptors")) descriptors = 1;
        else if (!strncmp(argv[i], "plant=", 6)) plant = argv[i] + 6;
        else if (!strncmp(argv[i], "outside=", 8)) outside = argv[i] + 8;
    }
    printf("pid %d\n", (int)getpid());
    fflush(stdout);
    if (plant && strcmp(plant, "child") != 0)
        plant_file(plant, strcmp(plant, "events") ? "bin" : "jsonl");  // events, snapshots, values
    int (*initialize)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "InitializeInjection");
    if (!initialize) {
        fprintf(stderr, "replay: the recorder is not preloaded\n");
        return 3;
    }
    initialize();  // as the driver does at cuInit
    subscriber = (CUpti_CallbackFunc)fake_cupti_subscriber(&subscriber_data);
    if (!subscriber) return 0;  // the recorder stayed out (no capture folder)
    if (descriptors) report_descriptors();

    isv = driver_alloc(ISV * sizeof(float));
    concat = driver_alloc(ROWS * LD * sizeof(float));
    d_h_s2 = driver_alloc(ROWS * SH2 * sizeof(float));
    d_concat = driver_alloc(ROWS * LD * sizeof(float));
    target = driver_alloc(N * sizeof(float));
    online = driver_alloc(N * sizeof(float));
    act = driver_alloc(N * sizeof(float));
    arrays = driver_alloc(9 * sizeof(unsigned long long));
    static float host[ISV];
    for (int i = 0; i < ISV; ++i) host[i] = i == ISV_INDEX ? 0.5f : (float)i;
    upload(isv, host, ISV);
    for (int i = 0; i < N; ++i) host[i] = (float)(i - 20);
    upload(online, host, N);
    upload(act, host, N);
    for (int i = 0; i < ROWS * LD; ++i) host[i] = 0.125f * (float)i;
    upload(d_concat, host, ROWS * LD);
    cuMemsetD32_v2_params zero_target = {target, 0, N};
    DRIVER(cuMemsetD32_v2, &zero_target, memset_words, &zero_target);

    int rows = ROWS, sh2 = SH2, ld = LD, wire = SH2, index = ISV_INDEX, n = N, zero = 0;
    CUdeviceptr save = d_h_s2, softmax = d_concat;
    void *concat_args[] = {&concat, &save, &softmax, &rows, &sh2, &ld, &wire, &zero};
    driver_launch(&concat_fn, "sp14_dir_concat_qaux", concat_args, run_concat, NULL);
    void *scale_args[] = {&concat, &isv, &rows, &ld, &wire, &index};
    driver_launch(&scale_fn, "_Z19sp14_scale_wire_colPfPKfiiii", scale_args, run_scale, NULL);
    void *accumulate_args[] = {&d_h_s2, &d_concat, &rows, &sh2, &ld};
    launch_ex(&accumulate_fn, "accumulate_d_h_s2_from_concat", accumulate_args, run_accumulate);
    void *relu_args[] = {&act, &n};
    packed_launch(&relu_fn, "relu_fwd", relu_args, run_relu);
    float tau = 0.005f;
    long long count = N;
    void *polyak_args[] = {&target, &online, &tau, &count};
    driver_launch(&polyak_fn, "polyak_ema", polyak_args, run_polyak, NULL);
    driver_launch(&relu_fn, "relu_fwd", relu_args, NULL, FAKE_CAPTURING_STREAM);  // into a graph

    fake_cudart_register((const void *)stub_relu, &relu_fn);
    runtime_launch((const void *)stub_relu, "relu_fwd", relu_args, 1);
    runtime_launch((const void *)stub_unknown, "mystery", relu_args, 0);
    if (fake_cudart_last_error() != 0) return 4;  // the recorder's failed ask is cleared
    runtime_launch_ex((const void *)stub_relu, "relu_fwd", relu_args);
    cudaMemset_v3020_params rt_memset = {F(act), 0, 16};
    RUNTIME(cudaMemset_v3020, "cudaMemset", &rt_memset, runtime_memset, &rt_memset);
    cudaMemcpy_v3020_params rt_copy = {F(act), host, 32, cudaMemcpyHostToDevice};
    RUNTIME(cudaMemcpy_v3020, "cudaMemcpy", &rt_copy, runtime_copy, &rt_copy);
    void *rt_block = NULL;
    cudaMalloc_v3020_params rt_malloc = {&rt_block, 1000};
    RUNTIME(cudaMalloc_v3020, "cudaMalloc", &rt_malloc, runtime_malloc, &rt_malloc);
    cudaFree_v3020_params rt_free = {rt_block};
    RUNTIME(cudaFree_v3020, "cudaFree", &rt_free, NULL, NULL);
    CUdeviceptr pooled = 0;
    cuMemAllocAsync_params async = {&pooled, 4096, NULL};
    DRIVER(cuMemAllocAsync, &async, alloc_into, &async);
    cuMemFreeAsync_params async_free = {pooled, NULL};
    DRIVER(cuMemFreeAsync, &async_free, NULL, NULL);
    CUdeviceptr pitched = 0;
    size_t pitch = 512;
    cuMemAllocPitch_v2_params pitched_alloc = {&pitched, &pitch, 100, 3, 4};
    cuMemAlloc_v2_params pitched_bytes = {&pitched, 512 * 3};
    DRIVER(cuMemAllocPitch_v2, &pitched_alloc, alloc_into, &pitched_bytes);
    cuMemcpyDtoD_v2_params d2d = {online, act, 64};
    DRIVER(cuMemcpyDtoD_v2, &d2d, NULL, NULL);

    cublas_calls();
    lt_calls();
    cuGraphLaunch_params graph = {NULL, NULL};
    DRIVER(cuGraphLaunch, &graph, NULL, NULL);
    cudaGraphLaunch_v10000_params rt_graph = {NULL, NULL};
    RUNTIME(cudaGraphLaunch_v10000, "cudaGraphLaunch", &rt_graph, NULL, NULL);

    if (fork_child) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) child();
        printf("pid %d\n", (int)pid);
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 5;
    }
    cuMemFree_v2_params release = {act};
    DRIVER(cuMemFree_v2, &release, NULL, NULL);
    return 0;
}
