// The recorder's --deep bookkeeping run on the host: egf_capture_recorder.c compiled in whole,
// with the driver calls it makes for --deep stood in by host memory and egf_deep_diff run as
// egf_recorder_kernels.cu writes it. tests/test_recorder_values.py builds and runs it.
//
//   deep_values DIR [fork]
//
// A 1024-byte allocation holding non-zero words 0, 1 and 40 is tracked (its `contents`), word
// 100 changes (an effect), the process forks if asked (the child records one note and leaves
// with _exit), word 101 changes (a second effect). A second allocation packed right after the
// first 256 bytes of a third tests a run that crosses from one allocation into the next.
#include EGF_RECORDER_SOURCE
#include <sys/wait.h>

CUptiResult cuptiGetVersion(uint32_t *v) { *v = 0; return CUPTI_SUCCESS; }

static CUresult host_alloc(CUdeviceptr *p, size_t n) {
    *p = (CUdeviceptr)malloc(n);
    memset((void *)*p, 0xAB, n);  // fresh memory is not zero
    return CUDA_SUCCESS;
}
static CUresult host_free(CUdeviceptr p) { free((void *)p); return CUDA_SUCCESS; }
static CUresult host_htod(CUdeviceptr d, const void *s, size_t n) {
    memcpy((void *)d, s, n);
    return CUDA_SUCCESS;
}
static CUresult host_dtoh(void *d, CUdeviceptr s, size_t n) {
    memcpy(d, (const void *)s, n);
    return CUDA_SUCCESS;
}
static CUresult host_memset32(CUdeviceptr d, unsigned v, size_t n) {
    for (size_t i = 0; i < n; ++i) ((unsigned *)d)[i] = v;
    return CUDA_SUCCESS;
}
static CUresult host_sync(void) { return CUDA_SUCCESS; }
static CUresult host_diff(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned shared, CUstream stream, void **args,
                          void **extra) {
    (void)f, (void)gx, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)stream;
    (void)extra;
    const DeepEntry *table = *(const DeepEntry **)args[0];
    unsigned *bitmap = *(unsigned **)args[1], *counts = *(unsigned **)args[2];
    for (unsigned y = 0; y < gy; ++y) {
        DeepEntry e = table[y];
        const unsigned *now = (const unsigned *)e.base;
        unsigned *copy = (unsigned *)e.shadow;
        for (unsigned long long i = 0; i < e.words; ++i) {
            if (now[i] != copy[i]) {
                copy[i] = now[i];
                bitmap[e.bitmap + (i >> 5)] |= 1u << (i & 31);
                ++counts[y];
            }
        }
    }
    return CUDA_SUCCESS;
}
static void loaded(void) {}

int main(int argc, char **argv) {
    snprintf(g.dir, sizeof g.dir, "%s", argv[1]);
    deep.alloc = host_alloc;
    deep.free_ = host_free;
    deep.htod = host_htod;
    deep.memset32 = host_memset32;
    deep.launch = host_diff;
    g.ctx_sync = host_sync;
    g.dtoh = host_dtoh;
    pthread_once(&kernels_once, loaded);
    kernels_rc = CUDA_SUCCESS;
    deep.on = 1;
    g.values_on = 1;
    g.deep_values_max = 1ULL << 30;
    pthread_atfork(before_fork, after_fork, after_fork);

    unsigned *mem = aligned_alloc(256, 1024);
    memset(mem, 0, 1024);
    mem[0] = 0x3f800000;
    mem[1] = 0x40000000;
    mem[40] = 0x40400000;
    note("start");
    deep_track(0, (unsigned long long)(uintptr_t)mem, 1024);
    mem[100] = 0x40800000;
    deep_effect(1);
    if (argc > 2) {
        pid_t child = fork();
        if (child == 0) {
            note("child");
            _exit(0);
        }
        waitpid(child, NULL, 0);
    }
    mem[101] = 0x40a00000;
    deep_effect(2);

    // two allocations packed closer than 256 bytes: a change across the boundary is one run,
    // whose bytes come from both copies
    unsigned *packed = aligned_alloc(256, 2048);
    memset(packed, 0, 2048);
    deep_track(3, (unsigned long long)(uintptr_t)packed, 1000);
    deep_track(4, (unsigned long long)(uintptr_t)(packed + 250), 1024);
    packed[249] = 0x11111111;
    packed[250] = 0x22222222;
    packed[251] = 0x33333333;
    deep_effect(5);
    fflush(NULL);
    printf("%llu %llu %llu\n", (unsigned long long)(uintptr_t)mem,
           (unsigned long long)(uintptr_t)packed, g.values_bytes);
    return 0;
}
