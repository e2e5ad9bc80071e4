/* The default capture's evidence around a kernel egf-audit does not know: a launch whose name and
 * parameter sizes are in no entry of EGF_CAPTURE_KNOWN (egf-audit's kernel table, as the reader
 * decodes it) may write anything its pointers reach, so every allocation one of its parameters
 * points into (8-byte parameters, and the aligned words of struct parameters) is compared before
 * and after it, as --deep compares every allocation after every call: the recorder keeps a
 * device copy of each such allocation (made on its first guarded launch), brings it up to date
 * just before the launch, and after the launch the same comparison kernel (egf_deep_diff) sets a
 * bit per changed word. One `guard` event per launch names the allocations compared and the runs
 * of bytes that changed, so the audit decides whether that launch wrote into a buffer an
 * invariant protects (target_params, grad_buf's dW, d_h_s2, isv_signals, the dX concat).
 *
 * Launches cuBLAS makes inside a GEMM call are that GEMM's and are not guarded. The copies are
 * bounded by EGF_CAPTURE_GUARD_MAX bytes; past it, or when a driver call fails, guarding stops
 * (said once in a note) and later launches have no guard event, which the audit reads as no
 * evidence (it then fails closed where it needed it). Not used in a --deep capture, which
 * compares everything.
 */
#include "recorder.h"

#define GUARD_ROUND 256  // allocations are this aligned: the slack after one is compared too
#define GUARD_HANDED 64  // allocations one launch can be handed

typedef struct {
    unsigned long long base, bytes;
    CUdeviceptr shadow;  // 0 until a guarded launch is handed a pointer into it
} GuardAlloc;
typedef struct {
    unsigned long long base, shadow, words, bitmap;  // as egf_deep_diff's EgfDeepEntry
} GuardEntry;

static struct {
    pthread_mutex_t lock;
    GuardAlloc *a;  // every live allocation, sorted by base
    int n, cap;
    unsigned long long shadow_bytes;
    int stopped;
    CUdeviceptr table, bitmap, counts;
    size_t table_cap, bitmap_cap, counts_cap;  // bytes each
    unsigned int *bits;
    size_t bits_cap;  // words
    RunList list;
} guard = {.lock = PTHREAD_MUTEX_INITIALIZER};

// the allocations (by base) the launch entered on this thread was handed, compared at its exit
static __thread unsigned long long tl_bases[GUARD_HANDED];
static __thread int tl_count;

static void guard_stop(const char *why) {
    if (guard.stopped) return;
    guard.stopped = 1;
    char msg[320];
    snprintf(msg, sizeof msg, "guard stopped: %s; later unknown kernels have no guard event", why);
    note(msg);
}

void guard_track(unsigned long long base, long long bytes) {
    if (!rec_options.guard || bytes <= 0) return;
    pthread_mutex_lock(&guard.lock);
    if (guard.n == guard.cap) {
        int cap = guard.cap ? 2 * guard.cap : 256;
        GuardAlloc *grown = realloc(guard.a, (size_t)cap * sizeof *grown);
        if (!grown) {
            guard_stop("realloc failed");
            pthread_mutex_unlock(&guard.lock);
            return;
        }
        guard.a = grown;
        guard.cap = cap;
    }
    int i = guard.n;
    while (i > 0 && guard.a[i - 1].base > base) {
        guard.a[i] = guard.a[i - 1];
        --i;
    }
    guard.a[i] = (GuardAlloc){base, (unsigned long long)bytes, 0};
    ++guard.n;
    pthread_mutex_unlock(&guard.lock);
}

void guard_untrack(unsigned long long base) {
    if (!rec_options.guard) return;
    pthread_mutex_lock(&guard.lock);
    for (int i = 0; i < guard.n; ++i) {
        if (guard.a[i].base != base) continue;
        if (guard.a[i].shadow) {
            rec_driver.mem_free(guard.a[i].shadow);
            guard.shadow_bytes -= (guard.a[i].bytes + GUARD_ROUND - 1) / GUARD_ROUND * GUARD_ROUND;
        }
        memmove(&guard.a[i], &guard.a[i + 1], (size_t)(guard.n - i - 1) * sizeof guard.a[0]);
        --guard.n;
        break;
    }
    pthread_mutex_unlock(&guard.lock);
}

// Bytes of allocation i compared: up to its 256-byte-rounded end, never into the next one.
static unsigned long long scanned(int i) {
    unsigned long long bytes = (guard.a[i].bytes + GUARD_ROUND - 1) / GUARD_ROUND * GUARD_ROUND;
    if (i + 1 < guard.n && guard.a[i + 1].base - guard.a[i].base < bytes)
        bytes = guard.a[i + 1].base - guard.a[i].base;
    return bytes / 4 * 4;
}

// The live allocation holding `p` (up to its rounded end), or -1.
static int holding(unsigned long long p) {
    int lo = 0, hi = guard.n - 1, found = -1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (guard.a[mid].base <= p) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found >= 0 && p < guard.a[found].base + scanned(found) ? found : -1;
}

static void hand(unsigned long long p) {
    int i = holding(p);
    if (i < 0) return;
    for (int k = 0; k < tl_count; ++k)
        if (tl_bases[k] == guard.a[i].base) return;
    if (tl_count < GUARD_HANDED) tl_bases[tl_count++] = guard.a[i].base;
}

static int grow_device(CUdeviceptr *p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return 1;
    if (*p) rec_driver.mem_free(*p);
    *p = 0;
    *cap = 0;
    if (rec_driver.mem_alloc(p, bytes * 2) != CUDA_SUCCESS) return 0;
    *cap = bytes * 2;
    return 1;
}

// The comparison over tl_bases: each allocation's changed words set in guard.bitmap and its
// copy brought up to date; `*words` the bitmap's length. 0 on failure (said).
static int compare(int *index, size_t *bit_words) {
    GuardEntry entries[GUARD_HANDED];
    unsigned long long longest = 1;
    *bit_words = 0;
    for (int k = 0; k < tl_count; ++k) {
        int i = index[k];
        unsigned long long words = scanned(i) / 4;
        entries[k] = (GuardEntry){guard.a[i].base, guard.a[i].shadow, words, *bit_words};
        *bit_words += (words + 31) / 32;
        longest = words > longest ? words : longest;
    }
    size_t table_bytes = (size_t)tl_count * sizeof entries[0];
    if (!(grow_device(&guard.table, &guard.table_cap, table_bytes) &&
          grow_device(&guard.bitmap, &guard.bitmap_cap, (*bit_words + 1) * 4) &&
          grow_device(&guard.counts, &guard.counts_cap, (size_t)tl_count * 4))) {
        guard_stop("cuMemAlloc for the guard's buffers failed");
        return 0;
    }
    CUresult rc = kernels_load();  // the comparison kernel, loaded once
    if (rc == CUDA_SUCCESS) rc = rec_driver.htod(guard.table, entries, table_bytes);
    if (rc == CUDA_SUCCESS) rc = rec_driver.memset32(guard.bitmap, 0, *bit_words + 1);
    if (rc == CUDA_SUCCESS) rc = rec_driver.memset32(guard.counts, 0, (size_t)tl_count);
    if (rc == CUDA_SUCCESS)
        rc = gpu_deep_diff(guard.table, (unsigned)tl_count, longest, guard.bitmap, guard.counts);
    if (rc == CUDA_SUCCESS) rc = rec_driver.ctx_sync();
    if (rc != CUDA_SUCCESS) {
        char why[96];
        snprintf(why, sizeof why, "comparing the allocations failed (%d)", (int)rc);
        guard_stop(why);
        return 0;
    }
    return 1;
}

// tl_bases as indices into guard.a; 0 where one was freed meanwhile (by another thread).
static int indices(int *index) {
    for (int k = 0; k < tl_count; ++k) {
        index[k] = holding(tl_bases[k]);
        if (index[k] < 0 || guard.a[index[k]].base != tl_bases[k]) return 0;
    }
    return 1;
}

int guard_before(void **params, const size_t *sizes, int n) {
    tl_count = 0;
    if (!rec_options.guard || !params) return 0;
    pthread_mutex_lock(&guard.lock);
    for (int i = 0; i < n && !guard.stopped; ++i) {
        if (sizes[i] == 8) {
            unsigned long long p;
            memcpy(&p, params[i], 8);
            hand(p);
        } else if (sizes[i] > 8 && sizes[i] <= 4096) {  // a struct: pointers hide in its words
            for (size_t at = 0; at + 8 <= sizes[i]; at += 8) {
                unsigned long long p;
                memcpy(&p, (const unsigned char *)params[i] + at, 8);
                hand(p);
            }
        }
    }
    for (int k = 1; k < tl_count; ++k)  // in address order, as the event lists them
        for (int j = k; j > 0 && tl_bases[j - 1] > tl_bases[j]; --j) {
            unsigned long long t = tl_bases[j];
            tl_bases[j] = tl_bases[j - 1];
            tl_bases[j - 1] = t;
        }
    int index[GUARD_HANDED];
    size_t bit_words;
    int ok = !guard.stopped && tl_count > 0 && indices(index);
    for (int k = 0; ok && k < tl_count; ++k) {
        GuardAlloc *a = &guard.a[index[k]];
        if (a->shadow) continue;
        unsigned long long bytes = (a->bytes + GUARD_ROUND - 1) / GUARD_ROUND * GUARD_ROUND;
        if (guard.shadow_bytes + bytes > rec_options.guard_max) {
            char why[160];
            snprintf(why, sizeof why, "the copies would pass %llu bytes (EGF_CAPTURE_GUARD_MAX)",
                     rec_options.guard_max);
            guard_stop(why);
            ok = 0;
        } else if (rec_driver.mem_alloc(&a->shadow, bytes) != CUDA_SUCCESS) {
            a->shadow = 0;
            guard_stop("cuMemAlloc for an allocation's copy failed");
            ok = 0;
        } else {
            guard.shadow_bytes += bytes;
        }
    }
    // everything before the launch has run; the copies then equal what the launch will see
    ok = ok && rec_driver.ctx_sync() == CUDA_SUCCESS && compare(index, &bit_words);
    if (!ok) tl_count = 0;
    pthread_mutex_unlock(&guard.lock);
    return ok;
}

void guard_after(unsigned long long launch) {
    if (!tl_count) return;
    pthread_mutex_lock(&guard.lock);
    int index[GUARD_HANDED];
    size_t bit_words = 0, runs = 0;
    int ok = !guard.stopped && indices(index) && compare(index, &bit_words);
    unsigned int counts[GUARD_HANDED];
    if (ok) ok = rec_driver.dtoh(counts, guard.counts, (size_t)tl_count * 4) == CUDA_SUCCESS;
    size_t offset = 0;
    for (int k = 0; ok && k < tl_count; ++k) {
        size_t words = (size_t)((scanned(index[k]) / 4 + 31) / 32);
        if (counts[k]) {
            if (words > guard.bits_cap) {
                unsigned int *grown = realloc(guard.bits, words * 2 * sizeof *grown);
                ok = grown != NULL;
                if (ok) guard.bits = grown, guard.bits_cap = words * 2;
            }
            ok = ok && rec_driver.dtoh(guard.bits, guard.bitmap + offset * 4, words * 4) ==
                           CUDA_SUCCESS;
            ok = ok && runs_from_bitmap(&guard.list, &runs, tl_bases[k], guard.bits, words);
        }
        offset += words;
    }
    if (!ok) guard_stop("reading the comparison back failed");
    FILE *f = ok ? begin_event("guard") : NULL;
    if (f) {
        fprintf(f, ",\"launch\":%llu,\"compared\":[", launch);
        for (int k = 0; k < tl_count; ++k)
            fprintf(f, "%s[%llu,%llu]", k ? "," : "", tl_bases[k], scanned(index[k]));
        fputs("],\"changed\":[", f);
        write_runs(f, &guard.list, runs);
        fputc(']', f);
        end_event(f);
    }
    tl_count = 0;
    pthread_mutex_unlock(&guard.lock);
}

int guard_wanted(const char *name, const size_t *sizes, int n) {
    if (!rec_options.guard) return 0;
    // EGF_CAPTURE_KNOWN: "name:8,8,4;other:8,4" (each kernel egf-audit decodes, with its sizes)
    size_t len = strlen(name);
    for (const char *entry = rec_options.known; entry && *entry;) {
        const char *colon = strchr(entry, ':');
        const char *end = strchr(entry, ';');
        if (!end) end = entry + strlen(entry);
        if (colon && colon < end && (size_t)(colon - entry) == len && !strncmp(entry, name, len)) {
            int k = 0, same = 1;
            for (const char *s = colon + 1; s < end; ++k) {
                char *next;
                unsigned long size = strtoul(s, &next, 10);
                if (next == s) break;
                same = same && k < n && sizes[k] == size;
                s = *next == ',' ? next + 1 : next;
            }
            if (same && k == n) return 0;
        }
        entry = *end ? end + 1 : end;
    }
    return 1;
}
