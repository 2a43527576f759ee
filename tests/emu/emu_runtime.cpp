// Runs a kernel grid on the CPU: blocks one after another, the threads of a block as fibers on one
// OS thread. A fiber runs until it reaches a barrier (__syncthreads, or a warp shuffle) or exits;
// a barrier opens once every thread it involves has arrived. Barriers that can never open (some
// threads exited, or a warp diverged across different barriers) fail the launch, as they would
// hang or be undefined on a GPU.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_emu.h"

#if defined(__x86_64__)
// Cooperative switching between C++ functions only has to keep what the System V ABI calls
// callee-saved: six registers and the stack pointer. ucontext's swapcontext also saves the signal
// mask, a system call per switch that made the emulator ~50x slower.
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
)");

struct Context {
    void* sp;
};

// A context that starts `entry` on the stack [stack, stack + size) at its first switch.
void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
    void** sp = (void**)(((uintptr_t)(stack + size)) & ~(uintptr_t)15);
    *--sp = nullptr;           // where entry's return address would be: keeps the ABI's alignment
    *--sp = (void*)entry;      // emu_switch's `ret` lands here
    for (int i = 0; i < 6; i++) *--sp = nullptr;  // the registers emu_switch pops
    c.sp = sp;
}

void switch_context(Context& from, Context& to) { emu_switch(&from.sp, to.sp); }
#else
#include <ucontext.h>

struct Context {
    ucontext_t uc;
};

void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}

void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

namespace emu {
namespace {

enum State { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE, FAILED };

struct Fiber {
    Context context;
    uint3 idx;
    int lane, warp;
    State state;
    unsigned exchanges;  // parity picks the slot bank, so a lane one exchange ahead cannot clobber
};

constexpr size_t STACK_BYTES = 256 * 1024;
constexpr int MAX_THREADS = 1024;

std::vector<Fiber> fibers(MAX_THREADS);
std::vector<char> stacks((size_t)MAX_THREADS * STACK_BYTES);
std::vector<unsigned long long> slots(2 * MAX_THREADS);  // [bank][thread]
Context scheduler;
Fiber* current;
void (*kernel_thunk)(void**);
void** kernel_args;
char error[512];
int block_threads;

void fiber_main() {
    kernel_thunk(kernel_args);
    current->state = DONE;
    switch_context(current->context, scheduler);
    std::abort();  // a finished fiber is never resumed
}

void wait(State state) {
    current->state = state;
    switch_context(current->context, scheduler);
}

void set_error(const char* what) {
    std::snprintf(error, sizeof error, "%s (block %u,%u,%u)", what, block_idx.x, block_idx.y, block_idx.z);
}

// Opens the barriers whose threads have all arrived; false when none can open.
bool release(int nthreads) {
    bool released = false;
    int at_block = 0, done = 0;
    for (int w = 0; w * 32 < nthreads; w++) {
        const int first = w * 32, last = first + 32 < nthreads ? first + 32 : nthreads;
        int waiting = 0, exited = 0;
        for (int t = first; t < last; t++) {
            waiting += fibers[t].state == AT_WARP_BARRIER;
            exited += fibers[t].state == DONE;
        }
        if (waiting && exited) {
            set_error("warp shuffle with lanes that have exited");
            return false;
        }
        if (waiting == last - first) {
            for (int t = first; t < last; t++) fibers[t].state = RUNNABLE;
            released = true;
        }
    }
    for (int t = 0; t < nthreads; t++) {
        at_block += fibers[t].state == AT_BLOCK_BARRIER;
        done += fibers[t].state == DONE;
    }
    if (at_block && done) {
        set_error("__syncthreads with threads that have exited");
        return false;
    }
    if (at_block == nthreads) {
        for (int t = 0; t < nthreads; t++) fibers[t].state = RUNNABLE;
        released = true;
    }
    if (!released) set_error("deadlock: threads wait at barriers that cannot open");
    return released;
}

int run_block(int nthreads) {
    block_threads = nthreads;
    for (int t = 0; t < nthreads; t++) {
        Fiber& f = fibers[t];
        f.idx = {t % block_dim.x, (t / block_dim.x) % block_dim.y, t / (block_dim.x * block_dim.y)};
        f.lane = t % 32;
        f.warp = t / 32;
        f.state = RUNNABLE;
        f.exchanges = 0;
        make_context(f.context, &stacks[(size_t)t * STACK_BYTES], STACK_BYTES, fiber_main);
    }
    for (;;) {
        for (int t = 0; t < nthreads; t++) {
            if (fibers[t].state != RUNNABLE) continue;
            current = &fibers[t];
            switch_context(scheduler, current->context);
            if (current->state == FAILED) return 1;
        }
        int done = 0;
        for (int t = 0; t < nthreads; t++) done += fibers[t].state == DONE;
        if (done == nthreads) return 0;
        if (!release(nthreads)) return 1;
    }
}

}  // namespace

uint3 block_idx, block_dim, grid_dim;

const uint3& thread_idx() { return current->idx; }

int lane() { return current->lane; }

void sync_block() { wait(AT_BLOCK_BARRIER); }

unsigned long long exchange(unsigned long long value, int src) {
    const int bank = current->exchanges++ & 1, base = current->warp * 32;
    slots[bank * MAX_THREADS + base + current->lane] = value;
    wait(AT_WARP_BARRIER);
    if (src < 0 || src >= 32 || base + src >= block_threads) fail("shuffle from a lane outside the block");
    return slots[bank * MAX_THREADS + base + src];
}

void fail(const char* what) {
    set_error(what);
    current->state = FAILED;
    switch_context(current->context, scheduler);
    std::abort();  // a failed fiber is never resumed
}

}  // namespace emu

extern "C" {

// Runs thunk(args) for every thread of the grid; returns 0, or 1 with emu_error() saying why.
int emu_launch(void (*thunk)(void**), void** args, const unsigned* grid, const unsigned* block) {
    using namespace emu;
    const unsigned nthreads = block[0] * block[1] * block[2];
    if (nthreads == 0 || nthreads > MAX_THREADS || grid[0] == 0 || grid[1] == 0 || grid[2] == 0 ||
        grid[0] > 0x7FFFFFFFu || grid[1] > 65535 || grid[2] > 65535 || block[2] > 64) {
        std::snprintf(error, sizeof error, "invalid launch: grid (%u,%u,%u), block (%u,%u,%u)", grid[0], grid[1],
                      grid[2], block[0], block[1], block[2]);
        return 1;
    }
    kernel_thunk = thunk;
    kernel_args = args;
    grid_dim = {grid[0], grid[1], grid[2]};
    block_dim = {block[0], block[1], block[2]};
    for (unsigned z = 0; z < grid[2]; z++)
        for (unsigned y = 0; y < grid[1]; y++)
            for (unsigned x = 0; x < grid[0]; x++) {
                block_idx = {x, y, z};
                if (run_block((int)nthreads)) return 1;
            }
    return 0;
}

const char* emu_error() { return emu::error; }

}  // extern "C"
