// Host emulation of the CUDA subset the kernels in this directory use, so that the same .cu
// source runs on a CPU (tests on machines without a GPU; kernels/src/emu.rs).
//
// A block's threads are fibers (ucontext) on the calling OS thread, run one after another
// until each reaches a barrier; when all have, they all go on. Warp intrinsics are barriers
// with a vote buffer. `__shared__` variables become thread_local statics: shared by a block's
// fibers, separate for blocks emulated at once on different OS threads. Control flow that
// reaches a barrier with some threads but not others (undefined on a GPU) is reported as an
// error instead of hanging.

#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static thread_local

struct emu_dim3 {
    unsigned x, y, z;
};

enum emu_state { EMU_RUNNING, EMU_BARRIER, EMU_DONE };

// One block can have at most this many threads here (the kernels use one warp).
#define EMU_MAX_THREADS 32
// Stack per emulated thread; the kernels keep a few scalars on it.
#define EMU_STACK_BYTES (64 * 1024)

struct emu_thread {
    ucontext_t ctx;
    emu_state state;
    unsigned parity; // which vote buffer this thread's next collective uses
};

struct emu_block {
    emu_thread threads[EMU_MAX_THREADS];
    char* stacks;
    ucontext_t sched;
    unsigned nthreads;
    unsigned cur;
    emu_dim3 block_idx, block_dim, grid_dim;
    void (*body)(void*);
    void* arg;
    // Two vote buffers, alternated by each collective, so a collective's buffer is never
    // overwritten before every thread has read it (the next collective's barrier orders it).
    unsigned votes[2][EMU_MAX_THREADS];
    bool diverged;
};

static thread_local emu_block* emu_blk;

static inline emu_dim3 emu_thread_idx() { return emu_dim3{emu_blk->cur, 0, 0}; }
#define threadIdx (emu_thread_idx())
#define blockIdx (emu_blk->block_idx)
#define blockDim (emu_blk->block_dim)
#define gridDim (emu_blk->grid_dim)

// Parks the current thread at a barrier and returns when every thread of the block is there.
static inline void emu_barrier()
{
    emu_block* b = emu_blk;
    emu_thread* t = &b->threads[b->cur];
    t->state = EMU_BARRIER;
    swapcontext(&t->ctx, &b->sched);
}

static inline void __syncwarp(unsigned = 0xffffffffu) { emu_barrier(); }
static inline void __syncthreads() { emu_barrier(); }

// Every thread publishes `v`; after the barrier each reads all of them from `out`.
static inline unsigned* emu_exchange(unsigned v)
{
    emu_block* b = emu_blk;
    unsigned me = b->cur;
    unsigned par = b->threads[me].parity;
    b->threads[me].parity ^= 1;
    b->votes[par][me] = v;
    emu_barrier();
    return b->votes[par];
}

static inline unsigned __ballot_sync(unsigned, int pred)
{
    unsigned n = emu_blk->nthreads;
    unsigned* v = emu_exchange(pred != 0);
    unsigned r = 0;
    for (unsigned i = 0; i < n; i++)
        r |= (unsigned)(v[i] != 0) << i;
    return r;
}

static inline unsigned __match_any_sync(unsigned, unsigned x)
{
    unsigned n = emu_blk->nthreads;
    unsigned* v = emu_exchange(x);
    unsigned r = 0;
    for (unsigned i = 0; i < n; i++)
        r |= (unsigned)(v[i] == x) << i;
    return r;
}

static inline unsigned __shfl_sync(unsigned, unsigned x, int src)
{
    unsigned* v = emu_exchange(x);
    return v[src];
}

static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
static inline int __clz(unsigned x) { return x == 0 ? 32 : __builtin_clz(x); }

static void emu_entry()
{
    emu_block* b = emu_blk;
    b->body(b->arg);
    b->threads[emu_blk->cur].state = EMU_DONE;
    // Returning resumes `sched` (uc_link).
}

// Runs blocks [first, first + count) of a grid of `grid` blocks of `threads` threads each;
// `body(arg)` is the kernel call. Returns 0, or -1 if threads diverged at a barrier.
static int emu_run_blocks(unsigned grid, unsigned first, unsigned count, unsigned threads,
                          void (*body)(void*), void* arg)
{
    if (threads == 0 || threads > EMU_MAX_THREADS)
        return -1;
    emu_block* b = (emu_block*)calloc(1, sizeof(emu_block));
    b->stacks = (char*)malloc((size_t)threads * EMU_STACK_BYTES);
    b->nthreads = threads;
    b->block_dim = emu_dim3{threads, 1, 1};
    b->grid_dim = emu_dim3{grid, 1, 1};
    b->body = body;
    b->arg = arg;
    emu_block* saved = emu_blk;
    emu_blk = b;
    int rc = 0;
    for (unsigned blk = first; blk < first + count && rc == 0; blk++) {
        b->block_idx = emu_dim3{blk, 0, 0};
        for (unsigned i = 0; i < threads; i++) {
            emu_thread* t = &b->threads[i];
            getcontext(&t->ctx);
            t->ctx.uc_stack.ss_sp = b->stacks + (size_t)i * EMU_STACK_BYTES;
            t->ctx.uc_stack.ss_size = EMU_STACK_BYTES;
            t->ctx.uc_link = &b->sched;
            makecontext(&t->ctx, emu_entry, 0);
            t->state = EMU_RUNNING;
            t->parity = 0;
        }
        for (;;) {
            unsigned at_barrier = 0, done = 0;
            for (unsigned i = 0; i < threads; i++) {
                if (b->threads[i].state != EMU_RUNNING)
                    continue;
                b->cur = i;
                swapcontext(&b->sched, &b->threads[i].ctx);
            }
            for (unsigned i = 0; i < threads; i++) {
                at_barrier += b->threads[i].state == EMU_BARRIER;
                done += b->threads[i].state == EMU_DONE;
            }
            if (done == threads)
                break;
            if (done != 0) {
                // Some threads returned while others wait at a barrier: on a GPU this hangs
                // or is undefined. The waiting fibers are abandoned (their stacks are freed).
                rc = -1;
                break;
            }
            for (unsigned i = 0; i < threads; i++)
                b->threads[i].state = EMU_RUNNING;
            (void)at_barrier;
        }
    }
    emu_blk = saved;
    free(b->stacks);
    free(b);
    return rc;
}
