/* Snapshots: the regions the audit reads around the ABI kernels named in EGF_CAPTURE_SNAPSHOT
 * (kernels/CONTRACT.md, the fixed kernels), copied once every earlier launch has finished (only reads: results never
 * change), each as an event with its "mix64" hash over all of it and, up to
 * EGF_CAPTURE_VALUES_MAX elements, its values in snapshots-<pid>.bin. snapshot_region takes any
 * region; the ABI kernels' are chosen by snapshot_abi from the launch's own arguments.
 */
#include "recorder.h"

// The last polyak_ema's target region: snapshotted again at the first launch of the next step,
// so "target untouched between two Polyak updates" is decidable without a layout.
static CUdeviceptr polyak_target;
static long long polyak_n;
static int step_start_pending;

/* ---- region hash (begin): tests/test_capture_region_hash.py compiles this part alone ---- */
// A snapshot region's hash, "mix64" (the init event names it): the sum modulo 2^64 of
// splitmix64's finaliser applied to each element's 32 bits plus its index times 2^64/phi.
// Every element is mixed on its own, so the loop runs at memory speed here (the byte-by-byte
// FNV-1a it replaces took about 4 cycles a byte, most of a prod capture's cost) and the reader
// recomputes it over every kept value with numpy. The elements of column `skip_col` of rows of
// `ld` are left out, keeping their indices for the rest.
static uint64_t mix64_element(uint32_t bits, uint64_t index) {
    uint64_t z = (uint64_t)bits + index * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

uint64_t region_hash(const float *values, long long count, long long ld, long long skip_col) {
    uint64_t h = 0;
    long long col = 0;
    for (long long i = 0; i < count; ++i) {
        uint32_t bits;
        memcpy(&bits, &values[i], sizeof bits);
        if (skip_col < 0 || col != skip_col) h += mix64_element(bits, (uint64_t)i);
        if (ld > 0 && ++col == ld) col = 0;
    }
    return h;
}
/* ---- region hash (end) ---- */

// A region's values on the host, in this thread's staging buffer (grown, never shrunk), page-
// locked where the driver gives one (a device-to-host copy into pageable memory is staged by
// the driver, at a fraction of the speed): a fresh allocation per region paid its page faults
// again each time. Valid until this thread's next copy; NULL when the copy fails.
static __thread float *tl_stage;
static __thread size_t tl_stage_count;
static __thread int tl_stage_pinned;

static float *copy_to_host(CUdeviceptr ptr, long long count) {
    if (count <= 0 || !rec_driver.dtoh) return NULL;
    if ((size_t)count > tl_stage_count) {
        if (tl_stage && tl_stage_pinned) rec_driver.host_free(tl_stage);
        if (tl_stage && !tl_stage_pinned) free(tl_stage);
        tl_stage = NULL;
        tl_stage_count = 0;
        void *grown = NULL;
        size_t bytes = (size_t)count * sizeof(float);
        tl_stage_pinned = rec_driver.host_alloc && rec_driver.host_free &&
                          rec_driver.host_alloc(&grown, bytes) == CUDA_SUCCESS;
        if (!tl_stage_pinned) grown = malloc(bytes);
        if (!grown) return NULL;
        tl_stage = grown;
        tl_stage_count = (size_t)count;
    }
    if (rec_driver.dtoh(tl_stage, ptr, (size_t)count * sizeof(float)) != CUDA_SUCCESS) return NULL;
    return tl_stage;
}

// One region: its hash `h` over all `count` elements (those of column `skip_col` left out when
// skip_col >= 0) and, up to values_max, the values themselves from `host`.
static void write_region(unsigned long long launch, const char *when, const char *region,
                         CUdeviceptr ptr, const float *host, uint64_t h, long long count,
                         long long rows, long long ld, long long skip_col) {
    long long keep = count < rec_options.values_max ? count : rec_options.values_max;
    if (skip_col >= 0 || !host) keep = 0;  // the body of a matrix: its hash is what the audit reads
    FILE *f = begin_event("snapshot");
    if (!f) return;
    long long offset = write_snapshot_values(host, keep);
    fprintf(f,
            ",\"launch\":%llu,\"when\":\"%s\",\"region\":\"%s\",\"ptr\":%llu,\"elements\":%lld,"
            "\"rows\":%lld,\"ld\":%lld,\"skip_col\":%lld,\"hash\":\"%016llx\",\"offset\":%lld,"
            "\"count\":%lld",
            launch, when, region, (unsigned long long)ptr, count, rows, ld, skip_col,
            (unsigned long long)h, offset, keep);
    end_event(f);
}

// A region of `count` elements at `p`, named `region`, as it is at the launch of seq `launch`
// (`when`: before it, after it, at a step's start): hashed on the GPU where the recorder's
// kernels load (then only the values kept are copied), else hashed here over a copy of all of
// it.
void snapshot_region(unsigned long long launch, const char *when, const char *region,
                     CUdeviceptr p, long long count) {
    uint64_t h = 0;
    long long keep = count < rec_options.values_max ? count : rec_options.values_max;
    float *host = NULL;
    if (gpu_region_hash(p, count, count, -1, &h)) {
        if (keep > 0 && !(host = copy_to_host(p, keep))) return;
    } else {
        if (!(host = copy_to_host(p, count))) return;
        h = region_hash(host, count, count, -1);
    }
    write_region(launch, when, region, p, host, h, count, 1, count, -1);
}

// The wire column (values) and the rest of a [rows, ld] dX concat (hash only).
static void snap_concat(unsigned long long launch, const char *when, CUdeviceptr p,
                        long long rows, long long ld) {
    float *host = copy_to_host(p, rows * ld);
    if (!host) return;
    uint64_t body = 0;
    if (!gpu_region_hash(p, rows * ld, ld, ld - 1, &body))
        body = region_hash(host, rows * ld, ld, ld - 1);
    float *wire = malloc((size_t)rows * sizeof(float));
    for (long long b = 0; wire && b < rows; ++b) wire[b] = host[b * ld + ld - 1];
    if (wire)
        write_region(launch, when, "wire", p, wire, region_hash(wire, rows, 1, -1), rows, rows, 1,
                     -1);
    write_region(launch, when, "body", p, NULL, body, rows * ld, rows, ld, ld - 1);
    free(wire);
}

static int wants_snapshot(const char *name) {
    if (!name || !rec_options.snapshot_kernels[0]) return 0;
    size_t n = strlen(name);
    for (const char *p = rec_options.snapshot_kernels; (p = strstr(p, name)) != NULL; p += n) {
        int starts = p == rec_options.snapshot_kernels || p[-1] == ',';
        int ends = p[n] == '\0' || p[n] == ',';
        if (starts && ends) return 1;
    }
    return 0;
}

// The ABI kernels' parameter sizes (kernels/CONTRACT.md, the fixed kernels): their snapshots read the arguments by these,
// so a kernel of the same name with another signature is never snapshotted.
static int abi_signature(const char *name, const size_t *sizes, int n) {
    static const struct {
        const char *name;
        int n;
        size_t sizes[8];
    } abi[] = {
        {"sp14_scale_wire_col", 6, {8, 8, 4, 4, 4, 4}},
        {"accumulate_d_h_s2_from_concat", 5, {8, 8, 4, 4, 4}},
        {"polyak_ema", 4, {8, 8, 4, 8}},
        {"sp14_dir_concat_qaux", 8, {8, 8, 8, 4, 4, 4, 4, 4}},
    };
    for (size_t k = 0; k < sizeof abi / sizeof *abi; ++k) {
        if (strcmp(name, abi[k].name) != 0) continue;
        if (n != abi[k].n) return 0;
        for (int i = 0; i < n; ++i)
            if (sizes[i] != abi[k].sizes[i]) return 0;
        return 1;
    }
    return 0;
}

static long long arg_i(void **params, int i) { return (long long)*(int *)params[i]; }
static CUdeviceptr arg_p(void **params, int i) { return *(CUdeviceptr *)params[i]; }

// The ABI kernels (kernels/CONTRACT.md, the fixed kernels) by name: which regions to copy, before and after.
static void abi_snapshots(unsigned long long launch, const char *when, const char *name,
                          void **params) {
    if (strcmp(name, "sp14_scale_wire_col") == 0) {
        // (dx_concat, isv, rows, ld, wire_col, isv_index)
        CUdeviceptr dx = arg_p(params, 0), isv = arg_p(params, 1);
        long long rows = arg_i(params, 2), ld = arg_i(params, 3), index = arg_i(params, 5);
        snap_concat(launch, when, dx, rows, ld);
        if (when[0] == 'b') snapshot_region(launch, when, "alpha", isv + 4 * (CUdeviceptr)index, 1);
    } else if (strcmp(name, "accumulate_d_h_s2_from_concat") == 0) {
        // (d_h_s2, d_concat, rows, sh2, ld_concat)
        long long rows = arg_i(params, 2), sh2 = arg_i(params, 3), ld = arg_i(params, 4);
        snapshot_region(launch, when, "d_h_s2", arg_p(params, 0), rows * sh2);
        if (when[0] == 'b') snapshot_region(launch, when, "d_concat", arg_p(params, 1), rows * ld);
    } else if (strcmp(name, "polyak_ema") == 0) {
        // (target, online, tau, n)
        long long n = *(long long *)params[3];
        snapshot_region(launch, when, "target", arg_p(params, 0), n);
        if (when[0] == 'b') snapshot_region(launch, when, "online", arg_p(params, 1), n);
        if (when[0] == 'a') {
            polyak_target = arg_p(params, 0);
            polyak_n = n;
            step_start_pending = 1;
        }
    }
}


// Whether a launch of `name` with parameters of these sizes is snapshotted: it is named in
// EGF_CAPTURE_SNAPSHOT, and it is the ABI kernel of that name.
int snapshot_wanted(const char *name, const size_t *sizes, int n) {
    return wants_snapshot(name) && abi_signature(name, sizes, n);
}

// The ABI regions of the launch of seq `launch` ("before" or "after" it), read once every
// earlier launch of the context has finished.
void snapshot_abi(unsigned long long launch, const char *when, const char *name, void **params) {
    if (!rec_driver.ctx_sync || rec_driver.ctx_sync() != CUDA_SUCCESS) return;
    abi_snapshots(launch, when, name, params);
    flush_all();
}

// Before the launch of seq `seq` on `stream` (recorded, not launched yet): the first launch after
// a polyak_ema starts the next step, and the target is snapshotted as that step starts, named
// by this launch's seq (like the snapshots before it).
void snapshot_step_start(unsigned long long seq, CUstream stream) {
    if (!(step_start_pending && polyak_target && !stream_capturing(stream))) return;
    step_start_pending = 0;
    if (rec_driver.ctx_sync && rec_driver.ctx_sync() == CUDA_SUCCESS)
        snapshot_region(seq, "step_start", "target", polyak_target, polyak_n);
}
