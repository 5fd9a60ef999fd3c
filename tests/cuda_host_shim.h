// Host build of kv_indices.cu (CI without a GPU): the CUDA keywords become plain C++ and a launch runs
// every block one after another. A block's threads run one after another too, unless they meet at
// __syncthreads(): then each thread is a fiber (ucontext) that runs until its next barrier, and the block
// moves on once every thread has arrived. __shared__ variables are per OS thread, hence per block. That is
// exact for these kernels because their threads communicate only through shared memory at barriers (no warp
// operations, no atomics). A barrier met by some threads of a block only (undefined on a GPU) aborts.
//
// Usage (one translation unit):  #include "cuda_host_shim.h"  #include "kv_indices.cu"  KV_HOST_EXPORT(kernel)
// exports `void host_<kernel>(unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned threads,
// void** args)`, where args[i] points at the i-th kernel argument, as with cuLaunchKernel.
#pragma once

#include <ucontext.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

#define __global__ inline  // emitted only where KV_HOST_EXPORT exports it
#define __device__
#define __forceinline__ inline
#define __shared__ static thread_local

struct kv_dim3 {
    unsigned x, y, z;
};

static thread_local kv_dim3 blockIdx, threadIdx, blockDim, gridDim;

namespace kv_host {

constexpr std::size_t fiber_stack_bytes = 256 * 1024;  // an AddressSanitizer build's frames included

enum class state { running, at_barrier, done };

// One block's threads: run in turn on the caller's stack, or as fibers once thread 0 has met a barrier.
struct block_run {
    void (*body)(void*);
    void* kernel_call;
    bool fibers = false;
    unsigned current = 0;
    ucontext_t scheduler;
    std::vector<ucontext_t> contexts;
    std::vector<state> states;
#if defined(__SANITIZE_ADDRESS__)
    const void* scheduler_stack = nullptr;
    std::size_t scheduler_stack_bytes = 0;
    void* scheduler_fake_stack = nullptr;
#endif
};

static thread_local block_run* active = nullptr;
static thread_local std::unique_ptr<char[]> stacks;
static thread_local std::size_t stack_count = 0;

[[noreturn]] inline void divergent_barrier() {
    std::fprintf(stderr, "kv_indices host build: block (%u, %u, %u) met __syncthreads() with some of its threads "
                 "only\n", blockIdx.x, blockIdx.y, blockIdx.z);
    std::abort();
}

inline void switch_to(ucontext_t* from, ucontext_t* to, const void* to_stack, std::size_t to_bytes) {
#if defined(__SANITIZE_ADDRESS__)
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, to_stack, to_bytes);
    swapcontext(from, to);
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
    (void)to_stack;
    (void)to_bytes;
    swapcontext(from, to);
#endif
}

inline char* stack_of(unsigned thread) { return stacks.get() + thread * fiber_stack_bytes; }

inline void to_scheduler(block_run* run) {
#if defined(__SANITIZE_ADDRESS__)
    switch_to(&run->contexts[run->current], &run->scheduler, run->scheduler_stack, run->scheduler_stack_bytes);
#else
    switch_to(&run->contexts[run->current], &run->scheduler, nullptr, 0);
#endif
}

inline void fiber_main() {
    block_run* run = active;
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(nullptr, &run->scheduler_stack, &run->scheduler_stack_bytes);
#endif
    run->body(run->kernel_call);
    run->states[run->current] = state::done;
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_start_switch_fiber(nullptr, run->scheduler_stack, run->scheduler_stack_bytes);
#endif
    setcontext(&run->scheduler);  // never returns: this fiber's stack is dropped
}

inline void resume(block_run* run, unsigned thread) {
    threadIdx = {thread, 0, 0};
    run->current = thread;
    run->states[thread] = state::running;
    switch_to(&run->scheduler, &run->contexts[thread], stack_of(thread), fiber_stack_bytes);
}

inline void start_fiber(block_run* run, unsigned thread) {
    ucontext_t& context = run->contexts[thread];
    getcontext(&context);
    context.uc_stack.ss_sp = stack_of(thread);
    context.uc_stack.ss_size = fiber_stack_bytes;
    context.uc_link = nullptr;
    makecontext(&context, fiber_main, 0);
    resume(run, thread);
}

inline void run_block(block_run* run, unsigned threads) {
    if (stack_count < threads) {
        stacks.reset(new char[threads * fiber_stack_bytes]);
        stack_count = threads;
    }
    run->fibers = false;
    run->contexts.resize(threads);
    run->states.assign(threads, state::running);
    start_fiber(run, 0);
    if (run->states[0] == state::done) {  // no barrier in thread 0: none in any thread of this block
        for (unsigned t = 1; t < threads; ++t) {
            threadIdx = {t, 0, 0};
            run->current = t;
            run->body(run->kernel_call);
        }
        return;
    }
    run->fibers = true;
    for (unsigned t = 1; t < threads; ++t) start_fiber(run, t);
    for (;;) {
        unsigned done = 0;
        for (unsigned t = 0; t < threads; ++t) done += run->states[t] == state::done;
        if (done == threads) return;
        if (done != 0) divergent_barrier();
        for (unsigned t = 0; t < threads; ++t) resume(run, t);
    }
}

template <typename... Args>
struct kernel_call {
    void (*kernel)(Args...);
    void** args;
};

template <typename... Args, std::size_t... I>
void invoke(void (*kernel)(Args...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<typename std::remove_cv<Args>::type*>(args[I])...);
}

template <typename... Args>
void run_thread(void* call) {
    auto* c = static_cast<kernel_call<Args...>*>(call);
    invoke(c->kernel, c->args, std::index_sequence_for<Args...>{});
}

template <typename... Args>
void launch(void (*kernel)(Args...), unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned threads,
            void** args) {
    kernel_call<Args...> call{kernel, args};
    block_run run;
    run.body = run_thread<Args...>;
    run.kernel_call = &call;
    block_run* outer = active;
    active = &run;
    gridDim = {grid_x, grid_y, grid_z};
    blockDim = {threads, 1, 1};
    for (unsigned z = 0; z < grid_z; ++z)
        for (unsigned y = 0; y < grid_y; ++y)
            for (unsigned x = 0; x < grid_x; ++x) {
                blockIdx = {x, y, z};
                run_block(&run, threads);
            }
    active = outer;
}

}  // namespace kv_host

inline void __syncthreads() {
    kv_host::block_run* run = kv_host::active;
    if (run == nullptr) std::abort();
    if (!run->fibers && run->current != 0) kv_host::divergent_barrier();
    run->states[run->current] = kv_host::state::at_barrier;
    kv_host::to_scheduler(run);
}

#define KV_HOST_EXPORT(kernel)                                                                          \
    extern "C" void host_##kernel(unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned threads,  \
                                  void** args) {                                                        \
        kv_host::launch(kernel, grid_x, grid_y, grid_z, threads, args);                                 \
    }
