/* Device memory for `egf-audit capture --cpu`: host memory, one mapping per allocation.
 *
 * Each allocation gets its own mapping: an inaccessible guard page, the pages holding it, an
 * inaccessible guard page. It is placed so that its end rounded up to 256 bytes (the
 * allocation granularity the recorder's --deep comparison reads, the slack included) is the end
 * of its pages: a write past that end, or a read of it, faults at once (the process dies of
 * SIGSEGV, caught: driver_kernels.c ends the process as a GPU's illegal address ends the run,
 * and the capture is incomplete). The bytes before the allocation in its first page hold a
 * canary, checked after every launch; a changed canary ends the process the same way, naming
 * the kernel. Its start is 256-byte aligned, as
 * cudaMalloc's is.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "driver_internal.h"

#define ROUND 256
#define CANARY 0xA5

typedef struct {
    unsigned char *map;  // the whole mapping, guard pages included
    size_t map_bytes;
    unsigned char *base;  // what the trainer is handed
    size_t bytes;
} Allocation;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Allocation *allocs;  // sorted by base
static int count, cap;

static size_t page_size(void) {
    static size_t page;
    if (!page) page = (size_t)sysconf(_SC_PAGESIZE);
    return page;
}

static int find_locked(const void *ptr) {  // the allocation holding ptr, or -1
    int lo = 0, hi = count - 1;
    const unsigned char *p = ptr;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (p < allocs[mid].base) {
            hi = mid - 1;
        } else if (p >= allocs[mid].base + (allocs[mid].bytes ? allocs[mid].bytes : 1)) {
            lo = mid + 1;
        } else {
            return mid;
        }
    }
    return -1;
}

EGF_CPU_API void *egf_cpu_alloc(size_t bytes) {
    size_t page = page_size();
    size_t rounded = (bytes + ROUND - 1) / ROUND * ROUND;
    if (!rounded) rounded = ROUND;
    size_t body = (rounded + page - 1) / page * page;
    size_t total = body + 2 * page;
    unsigned char *map = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                              -1, 0);
    if (map == MAP_FAILED) return NULL;
    if (mprotect(map + page, body, PROT_READ | PROT_WRITE) != 0) {
        munmap(map, total);
        return NULL;
    }
    unsigned char *base = map + page + body - rounded;
    memset(map + page, CANARY, (size_t)(base - (map + page)));
    pthread_mutex_lock(&lock);
    if (count == cap) {
        int grown_cap = cap ? 2 * cap : 256;
        Allocation *grown = realloc(allocs, (size_t)grown_cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&lock);
            munmap(map, total);
            return NULL;
        }
        allocs = grown;
        cap = grown_cap;
    }
    int i = count;
    while (i > 0 && allocs[i - 1].base > base) {
        allocs[i] = allocs[i - 1];
        --i;
    }
    allocs[i] = (Allocation){map, total, base, bytes};
    ++count;
    pthread_mutex_unlock(&lock);
    return base;
}

EGF_CPU_API int egf_cpu_free(void *ptr) {
    pthread_mutex_lock(&lock);
    int i = find_locked(ptr);
    if (i < 0 || allocs[i].base != ptr) {
        pthread_mutex_unlock(&lock);
        return 0;
    }
    Allocation gone = allocs[i];
    memmove(&allocs[i], &allocs[i + 1], (size_t)(count - i - 1) * sizeof *allocs);
    --count;
    pthread_mutex_unlock(&lock);
    munmap(gone.map, gone.map_bytes);
    return 1;
}

EGF_CPU_API int egf_cpu_in_device(const void *ptr, size_t bytes) {
    pthread_mutex_lock(&lock);
    int i = find_locked(ptr);
    int inside = i >= 0 && (const unsigned char *)ptr + bytes <= allocs[i].base + allocs[i].bytes;
    pthread_mutex_unlock(&lock);
    return inside;
}

/* The canaries before every allocation; a changed one ends the process as a fault would. */
EGF_CPU_API void egf_cpu_check_guards(const char *after) {
    size_t page = page_size();
    pthread_mutex_lock(&lock);
    for (int i = 0; i < count; ++i) {
        const unsigned char *start = allocs[i].map + page;
        for (const unsigned char *p = start; p < allocs[i].base; ++p) {
            if (*p == CANARY) continue;
            fprintf(stderr,
                    "egf-audit capture --cpu: %s wrote %zu bytes before the start of the "
                    "allocation at %p (%zu bytes): stopped, as a GPU stops at an illegal "
                    "address\n",
                    after, (size_t)(allocs[i].base - p), (void *)allocs[i].base,
                    allocs[i].bytes);
            fflush(stderr);
            pthread_mutex_unlock(&lock);
            exit(128 + SIGSEGV);  // as a fault in the kernel ends it (driver_kernels.c)
        }
    }
    pthread_mutex_unlock(&lock);
}
