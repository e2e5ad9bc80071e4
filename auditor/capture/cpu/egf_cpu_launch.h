// How `egf-audit capture --cpu` runs a trainer's kernel on the CPU: included after the CPU shim
// (kernels/cpu_shim.h) and the kernel's own source, in one translation unit per source.
//
// EGF_CPU_KERNEL(I, kernel) exports, for the launcher of the fake libcuda:
//   egf_cpu_run_I(grid, block, params)  every block, then every thread, one after another, each
//                                      calling the kernel with its arguments read from
//                                      params[i] as the signature's own types
//   egf_cpu_params_I(sizes, aligns, n)  the signature's parameter sizes and alignments
//   egf_cpu_fn_I()                      the kernel itself (its symbol names it)
#pragma once
#include <cstddef>
#include <type_traits>
#include <utility>

namespace egf_cpu {

template <typename... A, std::size_t... I>
inline void call(void (*kernel)(A...), void **params, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>> *>(params[I])...);
}

template <typename... A>
void run(void (*kernel)(A...), const unsigned *grid, const unsigned *block, void **params) {
    gridDim = {grid[0], grid[1], grid[2]};
    blockDim = {block[0], block[1], block[2]};
    for (unsigned bz = 0; bz < grid[2]; ++bz)
        for (unsigned by = 0; by < grid[1]; ++by)
            for (unsigned bx = 0; bx < grid[0]; ++bx) {
                blockIdx = {bx, by, bz};
                for (unsigned tz = 0; tz < block[2]; ++tz)
                    for (unsigned ty = 0; ty < block[1]; ++ty)
                        for (unsigned tx = 0; tx < block[0]; ++tx) {
                            threadIdx = {tx, ty, tz};
                            call(kernel, params, std::index_sequence_for<A...>{});
                        }
            }
}

template <typename... A>
int params(void (*)(A...), unsigned long *sizes, unsigned long *aligns, int most) {
    const unsigned long s[] = {sizeof(A)..., 0};
    const unsigned long a[] = {alignof(A)..., 0};
    const int n = static_cast<int>(sizeof...(A));
    for (int i = 0; i < n && i < most; ++i) sizes[i] = s[i], aligns[i] = a[i];
    return n;
}

}  // namespace egf_cpu

#define EGF_CPU_KERNEL(I, KERNEL)                                                            \
    extern "C" __attribute__((visibility("default"))) void egf_cpu_run_##I(                  \
        const unsigned *grid, const unsigned *block, void **params) {                        \
        egf_cpu::run(&KERNEL, grid, block, params);                                          \
    }                                                                                        \
    extern "C" __attribute__((visibility("default"))) int egf_cpu_params_##I(                \
        unsigned long *sizes, unsigned long *aligns, int most) {                             \
        return egf_cpu::params(&KERNEL, sizes, aligns, most);                                \
    }                                                                                        \
    extern "C" __attribute__((visibility("default"))) void *egf_cpu_fn_##I(void) {           \
        return reinterpret_cast<void *>(&KERNEL);                                            \
    }
