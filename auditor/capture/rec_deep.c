/* --deep: every allocation compared after every launch, memset and copy. The recorder keeps a
 * device copy (shadow) of every live allocation. After each call of the trainer has finished,
 * one kernel (egf_deep_diff, rec_kernels.c) compares every allocation with its copy word by word
 * on the GPU, sets a bit per changed word and brings the copy up to date; only the bitmaps of
 * allocations that changed come back to the host, as runs of changed bytes in an `effect` event,
 * and with values on their new bytes go to values-<pid>.bin. A new allocation's non-zero words
 * are its `contents`. Meant for smoke tests at small shapes: it doubles the device memory and
 * synchronises after every call.
 */
#include "recorder.h"

#define DEEP_ROUND 256  // allocations are this aligned: the slack after one is read too

typedef struct {
    unsigned long long base, shadow, words, bitmap;  // as egf_deep_diff's EgfDeepEntry
} DeepEntry;
typedef struct {
    unsigned long long base, shadow, bytes, words;
} DeepAlloc;
static struct {
    pthread_mutex_t lock;
    int failed, dirty;
    DeepAlloc *a;  // sorted by base
    int n, cap;
    CUdeviceptr table, bitmap, counts;
    size_t table_cap, bitmap_cap, counts_cap;  // words each
    CUdeviceptr one, scratch;  // a new allocation's copy is made by the kernel: its table, bits
    size_t one_cap, scratch_cap;
    unsigned int *host_counts, *host_bits;
    size_t host_counts_cap, host_bits_cap;
    RunList list;  // (address, bytes) pairs of one effect, gathered before writing
    unsigned char *vals, *span;  // the runs' new bytes; one allocation's span of its copy
    size_t vals_cap, span_cap;   // bytes
    int values_stopped;          // the values file reached EGF_CAPTURE_DEEP_VALUES_MAX
} deep = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void deep_fail(const char *what, int rc) {
    if (deep.failed) return;
    deep.failed = 1;  // said once; every later call then lacks its effect, which the reader fails
    char msg[256];
    snprintf(msg, sizeof msg, "deep capture stopped: %s failed (%d)", what, rc);
    note(msg);
}

static int deep_grow(CUdeviceptr *p, size_t *cap, size_t want_words) {
    if (want_words <= *cap) return 1;
    size_t words = want_words * 2;
    if (*p) rec_driver.mem_free(*p);
    *p = 0;
    *cap = 0;
    CUresult rc = rec_driver.mem_alloc(p, words * 4);
    if (rc != CUDA_SUCCESS) {
        deep_fail("cuMemAlloc for the deep capture's buffers", (int)rc);
        return 0;
    }
    *cap = words;
    return 1;
}

// `p` grown to hold `want` words (NULL when it cannot be; `p` is then kept as it was).
static void *host_grow(void *p, size_t *cap, size_t want) {
    if (want <= *cap) return p;
    void *grown = realloc(p, want * 2 * sizeof(unsigned int));
    if (grown) *cap = want * 2;
    return grown;
}

static int deep_module(void) {
    CUresult rc = kernels_load();
    if (rc != CUDA_SUCCESS) deep_fail("loading the deep capture's kernel", (int)rc);
    return rc == CUDA_SUCCESS;
}

void deep_untrack(unsigned long long base) {
    if (!rec_options.deep) return;
    pthread_mutex_lock(&deep.lock);
    for (int i = 0; i < deep.n; ++i) {
        if (deep.a[i].base != base) continue;
        rec_driver.mem_free(deep.a[i].shadow);
        memmove(&deep.a[i], &deep.a[i + 1], (size_t)(deep.n - i - 1) * sizeof deep.a[0]);
        --deep.n;
        deep.dirty = 1;
        break;
    }
    pthread_mutex_unlock(&deep.lock);
}

// The words of allocation i compared: up to its 256-byte-rounded end, never into the next
// allocation (one pool may pack them closer), so no byte is compared, or reported, twice.
static unsigned long long deep_scan(int i) {
    unsigned long long words = deep.a[i].words;
    if (i + 1 < deep.n) {
        unsigned long long room = (deep.a[i + 1].base - deep.a[i].base) / 4;
        if (room < words) words = room;
    }
    return words;
}

// The table, the bitmaps and the counters for the allocations live now.
static int deep_prepare(void) {
    if (!deep_module()) return 0;
    if (!deep.dirty) return 1;
    size_t bitmap_words = 0;
    DeepEntry *entries = malloc((size_t)(deep.n ? deep.n : 1) * sizeof *entries);
    if (!entries) return 0;
    for (int i = 0; i < deep.n; ++i) {
        entries[i] = (DeepEntry){deep.a[i].base, deep.a[i].shadow, deep_scan(i), bitmap_words};
        bitmap_words += (deep_scan(i) + 31) / 32;
    }
    int ok = deep_grow(&deep.table, &deep.table_cap, (size_t)deep.n * sizeof(DeepEntry) / 4 + 1) &&
             deep_grow(&deep.bitmap, &deep.bitmap_cap, bitmap_words + 1) &&
             deep_grow(&deep.counts, &deep.counts_cap, (size_t)deep.n + 1);
    if (ok && deep.n) {
        CUresult rc = rec_driver.htod(deep.table, entries, (size_t)deep.n * sizeof(DeepEntry));
        if (rc == CUDA_SUCCESS) rc = rec_driver.memset32(deep.bitmap, 0, bitmap_words);
        if (rc != CUDA_SUCCESS) {
            deep_fail("uploading the deep capture's table", (int)rc);
            ok = 0;
        }
    }
    free(entries);
    deep.dirty = !ok;
    return ok;
}

// The changed words of the allocation at `base`, read from its bitmap `slice` (then cleared),
// appended to deep.list. 0 on failure.
static int deep_bitmap_runs(unsigned long long base, CUdeviceptr slice, size_t words,
                            size_t *runs) {
    unsigned int *bits = host_grow(deep.host_bits, &deep.host_bits_cap, words);
    if (!bits) return 0;
    deep.host_bits = bits;
    if (rec_driver.dtoh(bits, slice, words * 4) != CUDA_SUCCESS) return 0;
    if (rec_driver.memset32(slice, 0, words) != CUDA_SUCCESS) return 0;
    return runs_from_bitmap(&deep.list, runs, base, bits, words);
}

// Bit w of `bits` set: the 4-byte word at base + 4w changed. Appended to `list` from `*n` on
// as (address, bytes) pairs; a run that meets the last one extends it. 0 on failure.
int runs_from_bitmap(RunList *list, size_t *n, unsigned long long base, const unsigned int *bits,
                     size_t words) {
    for (size_t w = 0; w < words; ++w) {
        for (unsigned int word = bits[w]; word; word &= word - 1) {
            unsigned long long at = base + 4ULL * (w * 32 + (size_t)__builtin_ctz(word));
            if (*n && list->at[2 * *n - 2] + list->at[2 * *n - 1] == at) {
                list->at[2 * *n - 1] += 4;
                continue;
            }
            if (2 * (*n + 1) > list->cap) {
                size_t cap = list->cap ? 2 * list->cap : 1024;
                unsigned long long *grown = realloc(list->at, cap * sizeof *grown);
                if (!grown) return 0;
                list->at = grown;
                list->cap = cap;
            }
            list->at[2 * *n] = at;
            list->at[2 * *n + 1] = 4;
            ++*n;
        }
    }
    return 1;
}

// `*p` grown to hold `want` bytes (0 when it cannot be; `*p` is then kept as it was).
static int bytes_grow(unsigned char **p, size_t *cap, size_t want) {
    if (want <= *cap) return 1;
    unsigned char *grown = realloc(*p, want * 2);
    if (!grown) return 0;
    *p = grown;
    *cap = want * 2;
    return 1;
}

// The new bytes of deep.list.at[0 .. runs) into deep.vals, read from the recorder's copies (which
// the comparison has just brought up to date): one copy back per allocation, of the span from
// its first changed byte to its last. `*total` is their count. 0 on failure.
static int deep_values(size_t runs, size_t *total) {
    *total = 0;
    for (size_t r = 0; r < runs; ++r) *total += deep.list.at[2 * r + 1];
    if (!bytes_grow(&deep.vals, &deep.vals_cap, *total + 1)) return 0;
    size_t pos = 0;
    int i = 0, span_of = -1;
    unsigned long long span_at = 0;
    for (size_t r = 0; r < runs; ++r) {
        unsigned long long at = deep.list.at[2 * r], left = deep.list.at[2 * r + 1];
        while (left) {
            while (i < deep.n && deep.a[i].base + 4 * deep_scan(i) <= at) ++i;
            if (i == deep.n || deep.a[i].base > at) return 0;  // in no allocation: cannot be
            unsigned long long end = deep.a[i].base + 4 * deep_scan(i);
            if (span_of != i) {
                unsigned long long last = at + left < end ? at + left : end;
                for (size_t q = r + 1; q < runs && deep.list.at[2 * q] < end; ++q) {
                    unsigned long long stop = deep.list.at[2 * q] + deep.list.at[2 * q + 1];
                    last = stop < end ? stop : end;
                }
                if (!bytes_grow(&deep.span, &deep.span_cap, last - at)) return 0;
                CUdeviceptr from = deep.a[i].shadow + (at - deep.a[i].base);
                if (rec_driver.dtoh(deep.span, from, last - at) != CUDA_SUCCESS) return 0;
                span_of = i;
                span_at = at;
            }
            unsigned long long piece = left < end - at ? left : end - at;
            memcpy(deep.vals + pos, deep.span + (at - span_at), piece);
            pos += piece;
            at += piece;
            left -= piece;
        }
    }
    return 1;
}

// Whether `bytes` more values may be written; past EGF_CAPTURE_DEEP_VALUES_MAX the values
// stop (said once): every later event lacks "values", which the reader takes as unknown memory.
static int values_fit(size_t bytes) {
    if (deep.values_stopped == 2) {  // write_values failed (under the lock): said here
        deep.values_stopped = 1;
        note("deep values stopped: writing the values file failed; later effects carry no values");
    }
    if (!rec_options.values_on || deep.values_stopped) return 0;
    if (values_written() + bytes <= rec_options.deep_values_max) return 1;
    deep.values_stopped = 1;
    char msg[256];
    snprintf(msg, sizeof msg,
             "deep values stopped: the values file would pass %llu bytes "
             "(EGF_CAPTURE_DEEP_VALUES_MAX); later effects carry no values",
             rec_options.deep_values_max);
    note(msg);
    return 0;
}

// Within an event (the writer's lock held): `"values":offset` and the bytes at that offset of
// the values file; nothing where the file cannot take them.
static void write_changed_values(FILE *f, size_t bytes) {
    if (deep.values_stopped) return;
    if (write_values(f, deep.vals, bytes) < 0)
        deep.values_stopped = 2;  // the file now holds a partial write: no later offset is true
}

// The first `n` runs of `list`, as JSON pairs.
void write_runs(FILE *f, const RunList *list, size_t n) {
    for (size_t r = 0; r < n; ++r)
        fprintf(f, "%s[%llu,%llu]", r ? "," : "", list->at[2 * r], list->at[2 * r + 1]);
}

// A new allocation (its alloc event has seq `seq`): its copy starts as what it holds now. The
// copy is zeroed and then brought up to date by the comparison kernel (not cuMemcpy, which
// refuses the slack after the allocation's end), so the bits it sets are the allocation's
// non-zero words: with values on, a `contents` event names them and their bytes, and memory is
// known from the allocation on.
void deep_track(unsigned long long seq, unsigned long long base, long long bytes) {
    if (!rec_options.deep || bytes <= 0) return;
    pthread_mutex_lock(&deep.lock);
    unsigned long long scanned =
        ((unsigned long long)bytes + DEEP_ROUND - 1) / DEEP_ROUND * DEEP_ROUND;
    CUdeviceptr shadow = 0;
    CUresult rc = deep.failed || !deep_module() ? CUDA_ERROR_UNKNOWN
                                                : rec_driver.mem_alloc(&shadow, scanned);
    if (rc != CUDA_SUCCESS) {
        deep_fail("allocating a new allocation's copy", (int)rc);
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    if (deep.n == deep.cap) {
        int cap = deep.cap ? 2 * deep.cap : 256;
        DeepAlloc *grown = realloc(deep.a, (size_t)cap * sizeof *grown);
        if (!grown) {
            rec_driver.mem_free(shadow);
            deep_fail("realloc", 0);
            pthread_mutex_unlock(&deep.lock);
            return;
        }
        deep.a = grown;
        deep.cap = cap;
    }
    int i = deep.n;
    while (i > 0 && deep.a[i - 1].base > base) {
        deep.a[i] = deep.a[i - 1];
        --i;
    }
    deep.a[i] = (DeepAlloc){base, shadow, (unsigned long long)bytes, scanned / 4};
    ++deep.n;
    deep.dirty = 1;
    unsigned long long words = deep_scan(i);  // never into the next allocation
    size_t bit_words = (size_t)(words + 31) / 32;
    if (!(deep_grow(&deep.one, &deep.one_cap, sizeof(DeepEntry) / 4 + 1) &&
          deep_grow(&deep.scratch, &deep.scratch_cap, bit_words + 1))) {
        pthread_mutex_unlock(&deep.lock);  // deep_grow said why
        return;
    }
    DeepEntry one = {base, shadow, words, 0};  // its bits from word 1 of scratch; word 0 counts
    unsigned int found = 0;
    rc = rec_driver.ctx_sync();
    if (rc == CUDA_SUCCESS) rc = rec_driver.memset32(shadow, 0, (size_t)(scanned / 4));
    if (rc == CUDA_SUCCESS) rc = rec_driver.memset32(deep.scratch, 0, bit_words + 1);
    if (rc == CUDA_SUCCESS) rc = rec_driver.htod(deep.one, &one, sizeof one);
    if (rc == CUDA_SUCCESS)
        rc = gpu_deep_diff(deep.one, 1, words, deep.scratch + 4, deep.scratch);
    if (rc == CUDA_SUCCESS) rc = rec_driver.ctx_sync();
    if (rc == CUDA_SUCCESS) rc = rec_driver.dtoh(&found, deep.scratch, sizeof found);
    if (rc != CUDA_SUCCESS) {
        deep_fail("copying a new allocation", (int)rc);
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    if (!rec_options.values_on) {
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    size_t runs = 0, total = 0;
    if (found && !(deep_bitmap_runs(base, deep.scratch + 4, bit_words, &runs) &&
                   (deep.values_stopped || deep_values(runs, &total)))) {
        deep_fail("reading a new allocation's contents", 0);
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    int with_values = values_fit(total);
    FILE *f = begin_event("contents");
    if (f) {
        fprintf(f, ",\"alloc\":%llu,\"changed\":[", seq);
        write_runs(f, &deep.list, runs);
        fputc(']', f);
        if (with_values) write_changed_values(f, total);
        end_event(f);
    }
    pthread_mutex_unlock(&deep.lock);
}

// After the call of seq `launch` finished: what it changed, as runs of bytes.
void deep_effect(unsigned long long launch) {
    if (!rec_options.deep) return;
    pthread_mutex_lock(&deep.lock);
    CUresult rc = deep.failed          ? CUDA_ERROR_UNKNOWN
                  : rec_driver.ctx_sync ? rec_driver.ctx_sync()
                                        : CUDA_ERROR_UNKNOWN;
    if (rc != CUDA_SUCCESS || !deep_prepare()) {
        if (rc != CUDA_SUCCESS) deep_fail("cuCtxSynchronize before comparing", (int)rc);
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    int n = deep.n;
    unsigned int *counts = host_grow(deep.host_counts, &deep.host_counts_cap, (size_t)n + 1);
    if (!counts) {
        deep_fail("malloc", 0);
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    deep.host_counts = counts;
    if (n) {
        unsigned long long longest = 1;
        for (int i = 0; i < n; ++i) longest = deep_scan(i) > longest ? deep_scan(i) : longest;
        rc = rec_driver.memset32(deep.counts, 0, (size_t)n);
        for (int first = 0; rc == CUDA_SUCCESS && first < n; first += 65535) {
            unsigned rows = (unsigned)(n - first < 65535 ? n - first : 65535);
            CUdeviceptr table = deep.table + (CUdeviceptr)first * sizeof(DeepEntry);
            rc = gpu_deep_diff(table, rows, longest, deep.bitmap,
                               deep.counts + (CUdeviceptr)first * 4);
        }
        if (rc == CUDA_SUCCESS) rc = rec_driver.ctx_sync();
        if (rc == CUDA_SUCCESS) rc = rec_driver.dtoh(deep.host_counts, deep.counts, (size_t)n * 4);
        if (rc != CUDA_SUCCESS) {
            deep_fail("comparing the allocations", (int)rc);
            pthread_mutex_unlock(&deep.lock);
            return;
        }
    }
    // every changed run is gathered before the event is written: a bitmap that cannot be read
    // back leaves the call without an effect (which the reader fails), never with a short one
    unsigned long long offset = 0, total = 0;
    size_t runs = 0;
    for (int i = 0; i < n; ++i) {
        total += deep.a[i].bytes;
        size_t words = (size_t)((deep_scan(i) + 31) / 32);
        if (deep.host_counts[i] &&
            !deep_bitmap_runs(deep.a[i].base, deep.bitmap + offset * 4, words, &runs)) {
            deep_fail("reading a bitmap back", 0);
            pthread_mutex_unlock(&deep.lock);
            return;
        }
        offset += words;
    }
    size_t changed = 0;
    if (rec_options.values_on && !deep.values_stopped && !deep_values(runs, &changed)) {
        deep_fail("reading changed values back", 0);
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    int with_values = values_fit(changed);
    FILE *f = begin_event("effect");
    if (!f) {
        pthread_mutex_unlock(&deep.lock);
        return;
    }
    fprintf(f, ",\"launch\":%llu,\"allocations\":%d,\"bytes\":%llu,\"changed\":[", launch, n,
            total);
    write_runs(f, &deep.list, runs);
    fputc(']', f);
    if (with_values) write_changed_values(f, changed);
    end_event(f);
    pthread_mutex_unlock(&deep.lock);
}

// The library that made the current call: the first frame of the call stack outside libcuda,
// CUPTI, the CUDA runtime and this recorder ("?" where the stack cannot be walked). Its name
