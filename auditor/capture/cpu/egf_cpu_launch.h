// How `egf-audit capture --cpu` runs a trainer's kernel on the CPU: included after the CPU shim
// (kernels/cpu_shim.h) and the kernel's own source, in one translation unit per source.
//
// EGF_CPU_KERNEL(I, kernel) exports, for the launcher of the fake libcuda:
//   egf_cpu_run_I(grid, block, params)  the arguments read from params[i] as the signature's
//                                      own types, then every block, and every thread in it,
//                                      one after another, calling the kernel with them
//   egf_cpu_params_I(sizes, aligns, n)  the signature's parameter sizes and alignments
//   egf_cpu_fn_I()                      the kernel itself (its symbol names it)
#pragma once
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace egf_cpu {

template <typename T> using value_t = std::remove_cv_t<std::remove_reference_t<T>>;

// the arguments read once, as the signature's types, then every thread called with them: the
// kernel is a template argument, so each launcher calls (and may inline) it directly
template <auto Kernel, typename... A, std::size_t... I>
inline void grid(void (*)(A...), const unsigned *g, const unsigned *b, void **params,
                 std::index_sequence<I...>) {
    std::tuple<value_t<A>...> args{*static_cast<value_t<A> *>(params[I])...};
    gridDim = {g[0], g[1], g[2]};
    blockDim = {b[0], b[1], b[2]};
    for (unsigned bz = 0; bz < g[2]; ++bz)
        for (unsigned by = 0; by < g[1]; ++by)
            for (unsigned bx = 0; bx < g[0]; ++bx) {
                blockIdx = {bx, by, bz};
                for (unsigned tz = 0; tz < b[2]; ++tz)
                    for (unsigned ty = 0; ty < b[1]; ++ty)
                        for (unsigned tx = 0; tx < b[0]; ++tx) {
                            threadIdx = {tx, ty, tz};
                            Kernel(std::get<I>(args)...);
                        }
            }
}

template <auto Kernel, typename... A>
void run(void (*kernel)(A...), const unsigned *g, const unsigned *b, void **params) {
    grid<Kernel>(kernel, g, b, params, std::index_sequence_for<A...>{});
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
        egf_cpu::run<&KERNEL>(&KERNEL, grid, block, params);                                          \
    }                                                                                        \
    extern "C" __attribute__((visibility("default"))) int egf_cpu_params_##I(                \
        unsigned long *sizes, unsigned long *aligns, int most) {                             \
        return egf_cpu::params(&KERNEL, sizes, aligns, most);                                \
    }                                                                                        \
    extern "C" __attribute__((visibility("default"))) void *egf_cpu_fn_##I(void) {           \
        return reinterpret_cast<void *>(&KERNEL);                                            \
    }
