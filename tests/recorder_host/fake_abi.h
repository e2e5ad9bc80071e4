// What the host replay's stand-ins share (tests/recorder_host/replay.c drives the shipped recorder
// through them; tests/test_recorder_replay.py builds and runs it). Every address the recorder
// writes into an event lies in one of two arenas mapped at fixed addresses, so two recorders given
// the same calls write the same bytes whatever the loader's address randomisation does.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define FAKE_DEVICE_BASE 0x600000000000ULL  // "device" memory: cuMemAlloc and the scalars read back
#define FAKE_DEVICE_BYTES (64ULL << 20)
#define FAKE_HOST_BASE 0x610000000000ULL  // host memory whose address a log line prints
#define FAKE_HOST_BYTES (1ULL << 20)
#define FAKE_CAPTURING_STREAM ((void *)0x5)  // cuStreamIsCapturing says this stream is capturing

// A kernel of the replayed "trainer": the handle cuFuncGetParamInfo (or, for a library kernel,
// cuKernelGetParamInfo) answers for; parameters packed at their natural alignment.
typedef struct {
    unsigned magic;  // FAKE_FUNCTION or FAKE_KERNEL
    int n;
    size_t sizes[16];
} FakeFunction;
#define FAKE_FUNCTION 0xF00Du
#define FAKE_KERNEL 0xCAFEu

// fake_cuda.c
void *fake_host(size_t bytes);                // from the host arena, zeroed
unsigned long long fake_device(size_t bytes);  // cuMemAlloc_v2 as the trainer calls it
size_t fake_param_offset(const FakeFunction *f, int i);

// fake_cudart.c: the stub a runtime launch names, and the CUfunction behind it
void fake_cudart_register(const void *stub, void *function);

// fake_cublas.c: cuBLAS's logger called with each message, then `inside` (the launches it makes)
typedef struct {
    int pointer_mode;  // 0 host, 1 device
    void *stream;
} FakeHandle;
void fake_cublas_call(const char *const *messages, int n, void (*inside)(void));

// fake_cublaslt.c: a matrix layout's attributes 0..6 and a matmul descriptor's 0..4, then its
// epilogue (7), bias pointer (8), auxiliary pointer (11) and that matrix's leading dimension (12)
typedef struct {
    int64_t attrs[7];
} FakeLayout;
typedef struct {
    int32_t attrs[5];
    int32_t epilogue;
    int64_t bias, aux, aux_ld;
} FakeMatmulDesc;

// fake_cupti.c: the callback the recorder subscribed (a CUpti_CallbackFunc), NULL before
void *fake_cupti_subscriber(void **userdata);
int fake_cudart_last_error(void);  // what cudaGetLastError would answer now, left as it is
