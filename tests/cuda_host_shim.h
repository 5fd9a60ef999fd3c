// Host build of kv_indices.cu (CI without a GPU): the CUDA keywords become plain C++ and a launch runs
// every thread of every block one after another. That is exact for these kernels because their
// threads never communicate (no shared memory, no barriers, no warp operations).
//
// Usage (one translation unit):  #include "cuda_host_shim.h"  #include "kv_indices.cu"  KV_HOST_EXPORT(kernel)
// exports `void host_<kernel>(unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned threads,
// void** args)`, where args[i] points at the i-th kernel argument, as with cuLaunchKernel.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __forceinline__ inline

struct kv_dim3 {
    unsigned x, y, z;
};

static thread_local kv_dim3 blockIdx, threadIdx, blockDim, gridDim;

namespace kv_host {

template <typename... Args, std::size_t... I>
void invoke(void (*kernel)(Args...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<typename std::remove_cv<Args>::type*>(args[I])...);
}

template <typename... Args>
void launch(void (*kernel)(Args...), unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned threads,
            void** args) {
    gridDim = {grid_x, grid_y, grid_z};
    blockDim = {threads, 1, 1};
    for (unsigned z = 0; z < grid_z; ++z)
        for (unsigned y = 0; y < grid_y; ++y)
            for (unsigned x = 0; x < grid_x; ++x)
                for (unsigned t = 0; t < threads; ++t) {
                    blockIdx = {x, y, z};
                    threadIdx = {t, 0, 0};
                    invoke(kernel, args, std::index_sequence_for<Args...>{});
                }
}

}  // namespace kv_host

#define KV_HOST_EXPORT(kernel)                                                                          \
    extern "C" void host_##kernel(unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned threads,  \
                                  void** args) {                                                        \
        kv_host::launch(kernel, grid_x, grid_y, grid_z, threads, args);                                 \
    }
