// The recorder's --deep bookkeeping run on the host: the recorder's units compiled in whole
// with this file, the driver calls they make for --deep answered over host memory and
// egf_deep_diff run as egf_recorder_kernels.cu writes it (fake_cuda.c, linked as libcuda.so.1:
// its fresh memory is not zero). tests/test_recorder_values.py builds and runs it.
//
//   deep_values DIR [fork]
//
// A 1024-byte allocation holding non-zero words 0, 1 and 40 is tracked (its `contents`), word
// 100 changes (an effect), the process forks if asked (the child records one note and leaves
// with _exit), word 101 changes (a second effect). A second allocation packed right after the
// first 256 bytes of a third tests a run that crosses from one allocation into the next.
#include "recorder.h"

#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    writer_start(argv[1]);
    driver_lookup();
    rec_options.deep = 1;
    rec_options.values_on = 1;
    rec_options.deep_values_max = 1ULL << 30;

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
           (unsigned long long)(uintptr_t)packed, values_written());
    return 0;
}
