// The capture recorder's own kernels (egf_capture_recorder.c embeds this file's PTX and loads
// it itself: the recorder is built with the host C compiler alone).
//
// egf_region_hash: a snapshot region's "mix64" hash on the GPU, the same sum the recorder's
// region_hash computes on the host: modulo 2^64, over every element not in column `skip_col`
// of rows of `ld`, of splitmix64's finaliser applied to the element's bits plus its index times
// 2^64/phi. A sum is order-free, so every thread adds its share and one atomicAdd per warp
// adds it to `out`; the region is never copied to the host to be hashed. (Compiled for the CPU
// behind kernels/cpu_shim.h by `egf-audit capture --cpu`, each thread adds its own share: a sum
// modulo 2^64 is the same in any order.)
//
// egf_deep_diff (egf-audit capture --deep): after a call of the trainer has finished, every live
// allocation is compared word by word with the recorder's device copy of it. A word that
// differs sets its bit in the allocation's slice of `bitmap`, is counted in `counts`, and is
// copied, so the next call is compared with what this one left. One grid row (blockIdx.y) per
// allocation.

__device__ unsigned long long egf_mix64(unsigned int bits, unsigned long long index) {
    unsigned long long z = (unsigned long long)bits + index * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

extern "C" __global__ void egf_region_hash(const unsigned int *values, unsigned long long count,
                                           long long ld, long long skip_col,
                                           unsigned long long *out) {
    unsigned long long h = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < count; i += stride) {
        const long long col = ld > 0 ? (long long)(i % (unsigned long long)ld) : 0;
        if (skip_col < 0 || col != skip_col) h += egf_mix64(values[i], i);
    }
#ifdef EGF_CPU_SHIM  // egf-audit capture --cpu: threads run one at a time, each adds its share
    if (h) atomicAdd(out, h);
#else
    for (int offset = 16; offset > 0; offset >>= 1) h += __shfl_down_sync(0xffffffffu, h, offset);
    if ((threadIdx.x & 31) == 0 && h) atomicAdd(out, h);
#endif
}

struct EgfDeepEntry {
    unsigned long long base;    // the trainer's allocation
    unsigned long long shadow;  // the recorder's copy of it
    unsigned long long words;   // 4-byte words compared
    unsigned long long bitmap;  // the allocation's first word in `bitmap`
};

extern "C" __global__ void egf_deep_diff(const EgfDeepEntry *table, unsigned int *bitmap,
                                         unsigned int *counts) {
    const EgfDeepEntry e = table[blockIdx.y];
    const unsigned int *now = (const unsigned int *)e.base;
    unsigned int *copy = (unsigned int *)e.shadow;
    unsigned int found = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < e.words; i += stride) {
        const unsigned int v = now[i];
        if (v != copy[i]) {
            copy[i] = v;
            atomicOr(&bitmap[e.bitmap + (i >> 5)], 1u << (i & 31));
            ++found;
        }
    }
    if (found) atomicAdd(&counts[blockIdx.y], found);
}
