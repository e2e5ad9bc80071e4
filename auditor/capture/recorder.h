/* What the recorder's units share (egf_capture_recorder.c says what each unit does): the
 * driver's entry points, the options read from the environment, this thread's place in the API
 * calls, and each unit's functions the others call. Every unit includes this file first.
 *
 * Nothing declared between the visibility marks is exported from the library: it is loaded into
 * the traced process, whose own symbols of the same names (a trainer's `note` or `snap`) must
 * neither be called by the recorder nor be taken by it. InitializeInjection and the preloaded
 * cublasLtMatmul, below the marks, are the library's only exports.
 */
#ifndef EGF_RECORDER_H
#define EGF_RECORDER_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <cupti.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC visibility push(hidden)

/* ---- the driver's entry points: looked up in the process's own libcuda (rec_device.c) ---- */
typedef CUresult (*ParamInfoFn)(CUfunction, size_t, size_t *, size_t *);
typedef CUresult (*CtxSyncFn)(void);
typedef CUresult (*DtoHFn)(void *, CUdeviceptr, size_t);
typedef CUresult (*IsCapturingFn)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (*HostAllocFn)(void **, size_t);
typedef CUresult (*HostFreeFn)(void *);
typedef CUresult (*MemAllocFn)(CUdeviceptr *, size_t);
typedef CUresult (*MemFreeFn)(CUdeviceptr);
typedef CUresult (*CopyHtoDFn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*MemsetD32Fn)(CUdeviceptr, unsigned int, size_t);
typedef CUresult (*ModuleLoadFn)(CUmodule *, const void *);
typedef CUresult (*ModuleFunctionFn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*LaunchFn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);

struct RecDriver {
    ParamInfoFn param_info;         // cuFuncGetParamInfo
    ParamInfoFn kernel_param_info;  // cuKernelGetParamInfo, with the handle taken as a CUkernel
    CtxSyncFn ctx_sync;
    DtoHFn dtoh;
    IsCapturingFn is_capturing;
    HostAllocFn host_alloc;  // cuMemAllocHost: the snapshots' page-locked staging buffer
    HostFreeFn host_free;
    // the recorder's own kernels and --deep's copies of every allocation
    MemAllocFn mem_alloc;
    MemFreeFn mem_free;
    CopyHtoDFn htod;
    MemsetD32Fn memset32;
    ModuleLoadFn module_load;
    ModuleFunctionFn module_function;
    LaunchFn launch;
};
extern struct RecDriver rec_driver;

void driver_lookup(void);
int stream_capturing(CUstream s);
int device_read(void *host, unsigned long long ptr, size_t bytes, CUstream stream);

/* ---- what the environment asked for (InitializeInjection, egf_capture_recorder.c) ---- */
struct RecOptions {
    char snapshot_kernels[1024];         // EGF_CAPTURE_SNAPSHOT: the ABI kernels snapshotted
    long long values_max;                // a region's elements kept as values (hashed: all)
    int deep;                            // EGF_CAPTURE_DEEP=1, and the driver has what it needs
    int values_on;                       // deep and EGF_CAPTURE_DEEP_VALUES_MAX > 0
    unsigned long long deep_values_max;  // EGF_CAPTURE_DEEP_VALUES_MAX
    int guard;                           // EGF_CAPTURE_GUARD=1 (not deep): rec_guard.c
    unsigned long long guard_max;        // EGF_CAPTURE_GUARD_MAX: bytes of the guard's copies
    const char *known;                   // EGF_CAPTURE_KNOWN: kernels egf-audit decodes
};
extern struct RecOptions rec_options;

/* ---- this thread's place in the API calls (egf_capture_recorder.c's callback) ---- */
struct RecThread {
    int inside;           // our own driver calls re-enter the callback: ignore them
    int rt_depth;         // inside a runtime API call
    int rt_covered;       // a driver event was written inside that runtime call
    int rt_launch;        // that runtime call is a launch, recorded with its arguments
    const char *rt_name;  // that runtime call's name (a launch made inside it says)
};
extern __thread struct RecThread rec_thread;

/* ---- the event writer (rec_writer.c) ---- */
int writer_start(const char *dir);  // 0: the folder cannot be written (said on stderr)
FILE *begin_event(const char *ev);  // holds the writer's lock until end_event; NULL: not recorded
void end_event(FILE *f);
unsigned long long event_seq(void);  // within an event: its seq
void json_string(FILE *f, const char *s);
void note(const char *msg);
void flush_all(void);
long long write_snapshot_values(const float *values, long long count);
int write_values(FILE *event, const void *bytes, size_t n);
unsigned long long values_written(void);

/* ---- kernel launches, driver and runtime (rec_launch.c) ---- */
enum { RT_ENTER, RT_EXIT, RT_UNDECODED };
int driver_launch(const CUpti_CallbackData *cb, CUpti_CallbackId id);
int runtime_launch(const CUpti_CallbackData *cb, CUpti_CallbackId id, int what);

/* ---- cuBLAS and cuBLASLt (rec_gemm.c) ---- */
void try_hook_cublas(void);

/* ---- snapshots and their hash (rec_snapshot.c) ---- */
uint64_t region_hash(const float *values, long long count, long long ld, long long skip_col);
void snapshot_region(unsigned long long launch, const char *when, const char *region,
                     CUdeviceptr p, long long count);
int snapshot_wanted(const char *name, const size_t *sizes, int n);
void snapshot_abi(unsigned long long launch, const char *when, const char *name, void **params);
void snapshot_step_start(unsigned long long seq, CUstream stream);

/* ---- the recorder's own kernels (rec_kernels.c) ---- */
CUresult kernels_load(void);
int gpu_region_hash(CUdeviceptr p, long long count, long long ld, long long skip_col,
                    uint64_t *out);
CUresult gpu_deep_diff(CUdeviceptr table, unsigned rows, unsigned long long longest,
                       CUdeviceptr bitmap, CUdeviceptr counts);

/* ---- runs of changed bytes, as --deep and the guard write them (rec_deep.c) ---- */
typedef struct {
    unsigned long long *at;  // (address, bytes) pairs
    size_t cap;              // entries of `at`
} RunList;
int runs_from_bitmap(RunList *list, size_t *n, unsigned long long base, const unsigned int *bits,
                     size_t words);
void write_runs(FILE *f, const RunList *list, size_t n);

/* ---- --deep: every allocation compared after every call (rec_deep.c) ---- */
void deep_track(unsigned long long seq, unsigned long long base, long long bytes);
void deep_untrack(unsigned long long base);
void deep_effect(unsigned long long launch);

/* ---- the guard: allocations an unknown kernel is handed, compared around it (rec_guard.c) -- */
void guard_track(unsigned long long base, long long bytes);
void guard_untrack(unsigned long long base);
int guard_wanted(const char *name, const size_t *sizes, int n);
int guard_before(void **params, const size_t *sizes, int n);  // 1: guard_after at its exit
void guard_after(unsigned long long launch);

#pragma GCC visibility pop

/* ---- the library's exports ---- */
#define REC_EXPORT __attribute__((visibility("default")))
REC_EXPORT int InitializeInjection(void);
REC_EXPORT int cublasLtMatmul(void *handle, void *desc, const void *alpha, const void *A,
                              void *adesc, const void *B, void *bdesc, const void *beta,
                              const void *C, void *cdesc, void *D, void *ddesc, const void *algo,
                              void *workspace, size_t workspace_bytes, void *stream);

#endif
