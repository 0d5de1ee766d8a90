// Fibers for the CUDA simulator (cuda_sim.h): stacks, context switches, and the ASan annotations they need.
//
// x86-64: a 20-instruction switch that saves the callee-saved registers and the FP control words
// on the old stack and swaps stack pointers (about 40 M switches/s). Elsewhere, or with
// -DCUDASIM_USE_UCONTEXT: ucontext, whose swapcontext makes a sigprocmask system call per switch
// (about 3 M/s). Under ASan every switch is announced with __sanitizer_{start,finish}_switch_fiber.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if !defined(__x86_64__) || defined(CUDASIM_USE_UCONTEXT)
#define CUDASIM_UCONTEXT 1
#include <ucontext.h>
#endif

#ifndef CUDASIM_STACK_BYTES
#if defined(__SANITIZE_ADDRESS__)
#define CUDASIM_STACK_BYTES (256 * 1024)  // ASan frames carry redzones.
#else
#define CUDASIM_STACK_BYTES (64 * 1024)
#endif
#endif

namespace cudasim::detail {

// Context: a suspended fiber. context_init() prepares `c` to run `entry`, which must never
// return, on `stack`; context_switch() saves the running fiber into `from` and resumes `to`.
#if defined(CUDASIM_UCONTEXT)
struct Context { ucontext_t uc; };
inline void context_init(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
inline void context_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#else
// Local (not .globl) symbols: any number of translation units may carry their own copy.
extern "C" __attribute__((visibility("hidden"))) void cudasim_switch_stack(void** save, void* load);
extern "C" __attribute__((visibility("hidden"))) void cudasim_fiber_trampoline();
asm(R"(
	.pushsection .text
	.p2align 4
	.type	cudasim_switch_stack, @function
cudasim_switch_stack:           # rdi: where to save this stack pointer, rsi: stack to resume
	pushq	%rbp
	pushq	%rbx
	pushq	%r12
	pushq	%r13
	pushq	%r14
	pushq	%r15
	subq	$8, %rsp
	stmxcsr	(%rsp)
	fnstcw	4(%rsp)
	movq	%rsp, (%rdi)
	movq	%rsi, %rsp
	ldmxcsr	(%rsp)
	fldcw	4(%rsp)
	addq	$8, %rsp
	popq	%r15
	popq	%r14
	popq	%r13
	popq	%r12
	popq	%rbx
	popq	%rbp
	ret
	.size	cudasim_switch_stack, .-cudasim_switch_stack
	.p2align 4
	.type	cudasim_fiber_trampoline, @function
cudasim_fiber_trampoline:       # first "return" of a new fiber; r13 holds its entry function
	.cfi_startproc
	.cfi_undefined rip
	callq	*%r13
	ud2
	.cfi_endproc
	.size	cudasim_fiber_trampoline, .-cudasim_fiber_trampoline
	.popsection
)");
struct Context { void* sp = nullptr; };
// Lays out the frame cudasim_switch_stack pops: control words, r15..r12, rbx, rbp, return address.
inline void context_init(Context& c, char* stack, size_t bytes, void (*entry)()) {
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  auto* frame = reinterpret_cast<uint64_t*>(top - 64);
  const uint64_t words[8] = {0x0000037f00001f80ull,  // default MXCSR and x87 control word
                             0, 0, reinterpret_cast<uint64_t>(entry), 0, 0, 0,
                             reinterpret_cast<uint64_t>(&cudasim_fiber_trampoline)};
  std::memcpy(frame, words, sizeof words);
  c.sp = frame;
}
inline void context_switch(Context& from, Context& to) { cudasim_switch_stack(&from.sp, to.sp); }
#endif

// A stack of CUDASIM_STACK_BYTES above a PROT_NONE guard page, so that an overflow faults
// instead of corrupting memory; nullptr when out of memory.
inline size_t page_bytes() { return size_t(sysconf(_SC_PAGESIZE)); }
inline char* allocate_stack() {
  void* p = mmap(nullptr, page_bytes() + CUDASIM_STACK_BYTES, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  mprotect(p, page_bytes(), PROT_NONE);
  return static_cast<char*>(p) + page_bytes();
}
inline void free_stack(char* stack) { munmap(stack - page_bytes(), page_bytes() + CUDASIM_STACK_BYTES); }

// The ASan protocol: before each switch, start_switch names the stack being entered (and saves
// the leaving fiber's fake stack, or passes nullptr when it leaves for good); right after it,
// finish_switch restores the fake stack and can report the stack that was left.
// CUDASIM_NO_ASAN marks the functions whose frames stay on a fiber's stack when it exits: without
// redzones there, the stack can be reused as it is.
#if defined(__SANITIZE_ADDRESS__)
#define CUDASIM_NO_ASAN __attribute__((no_sanitize_address))
inline void asan_start_switch(void** fake, const void* bottom, size_t bytes) { __sanitizer_start_switch_fiber(fake, bottom, bytes); }
inline void asan_finish_switch(void* fake, const void** bottom, size_t* bytes) { __sanitizer_finish_switch_fiber(fake, bottom, bytes); }
// A fiber abandoned mid-kernel leaves its frames' redzones poisoned; clear them before reuse.
inline void reset_stack_shadow(char* stack) { ASAN_UNPOISON_MEMORY_REGION(stack, CUDASIM_STACK_BYTES); }
#else
#define CUDASIM_NO_ASAN
inline void asan_start_switch(void**, const void*, size_t) {}
inline void asan_finish_switch(void*, const void**, size_t*) {}
inline void reset_stack_shadow(char*) {}
#endif

}  // namespace cudasim::detail
