// Block scheduler of the CUDA simulator (cuda_sim.h): runs each block's threads as fibers and checks barriers and warp operations.
//
// Part of cuda_sim.h, which includes it after the CUDA types it uses; not a standalone header.
//
// A block runs in rounds: every runnable fiber, in the configured order, runs until it blocks at
// a barrier or warp operation, or exits. Then make_progress() looks at what everyone waits for:
// it reports errors no further running can cure, completes the warp operations all of whose
// lanes have arrived (computing every lane's result into its own slot), releases a barrier the
// whole block reached, or reports a deadlock.
#pragma once

namespace cudasim::detail {

// printf into a std::string.
__attribute__((format(printf, 1, 2))) inline std::string strf(const char* fmt, ...) {
  va_list args, copy;
  va_start(args, fmt);
  va_copy(copy, args);
  std::string out(size_t(std::max(0, vsnprintf(nullptr, 0, fmt, copy))), '\0');
  va_end(copy);
  vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}

struct Config {
  Order order = Order::Forward;
  uint64_t seed = 0;
  unsigned char poison = 0xff;
  std::string error;  // A malformed setting: every launch fails with it.
};

// CUDASIM_ORDER and CUDASIM_POISON; a malformed value makes every launch fail, saying why.
inline Config config_from_env() {
  Config c;
  if (const char* s = getenv("CUDASIM_ORDER"); s && *s) {
    char* end = nullptr;
    if (!strcmp(s, "forward")) c.order = Order::Forward;
    else if (!strcmp(s, "reverse")) c.order = Order::Reverse;
    else if (!strncmp(s, "random:", 7) && (c.seed = strtoull(s + 7, &end, 0), end != s + 7 && !*end))
      c.order = Order::Random;
    else c.error = strf("CUDASIM_ORDER=%s is not forward, reverse or random:<seed>", s);
  }
  if (const char* s = getenv("CUDASIM_POISON"); s && *s) {
    char* end = nullptr;
    const unsigned long v = strtoul(s, &end, 0);
    if (end == s || *end || v > 255) c.error = strf("CUDASIM_POISON=%s is not a byte value", s);
    else c.poison = (unsigned char)v;
  }
  return c;
}

inline std::string order_name(const Config& c) {
  if (c.order == Order::Random) return strf("random:%llu", (unsigned long long)c.seed);
  return c.order == Order::Forward ? "forward" : "reverse";
}

// Settings are per OS thread, so that tests running in parallel can each choose theirs.
struct ThreadSettings {
  bool configured = false;  // false: take the environment's settings at the next launch.
  Config config;
  uint64_t rng = 0;  // Random order: advances across launches, reset by cudasim_configure.
  std::string last_error;
  bool in_launch = false;  // A kernel calling cudasim::launch would deadlock on the mutex.
};
inline thread_local ThreadSettings t_settings;

inline uint64_t next_random(uint64_t& state) {  // splitmix64
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

enum class State : uint8_t { Runnable, AtBarrier, AtWarpOp, Exited, Failed };
enum class Op : uint8_t {
  SyncThreads, SyncThreadsCount, SyncThreadsAnd, SyncThreadsOr,  // barriers
  SyncWarp, Ballot, Any, All, ShflIdx, ShflUp, ShflDown, ShflXor,  // warp operations
  Mma, Ldmatrix  // warp matrix instructions (warp_matrix.h): every lane of the warp, full mask
};
inline const char* op_name(Op op) {
  static const char* const names[] = {
      "__syncthreads", "__syncthreads_count", "__syncthreads_and", "__syncthreads_or",
      "__syncwarp", "__ballot_sync", "__any_sync", "__all_sync",
      "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
      "mma.sync", "ldmatrix.sync"};
  return names[int(op)];
}
struct Site { const char* file; int line; };

// A lane's registers for a warp matrix instruction (warp_matrix.h), copied in before it arrives
// and out after it is released, so the scheduler never writes into a fiber's own variables.
struct MatrixRegs {
  uint32_t a[4], b[2];  // mma operands
  float d[4];           // mma accumulators, in and out
  bool bf16;
  const void* row;      // ldmatrix: this lane's row address
  uint32_t out[4];      // ldmatrix result
  bool trans;
};

// One 16-byte cp.async a thread has issued and not yet waited for (warp_matrix.h).
struct AsyncCopy {
  void* dst;
  const void* src;
  unsigned src_bytes;  // Read from `src`; the rest of the 16 bytes is zero-filled.
  unsigned group;      // Its commit group.
};

struct Fiber {
  Context ctx;
  char* stack = nullptr;  // From allocate_stack(), reused by every launch.
  bool dirty = false;     // Abandoned mid-kernel: ASan shadow of its stack must be reset.
  void* asan_fake_stack = nullptr;
  unsigned tid = 0;  // Linear thread index in the block; warp = tid / 32, lane = tid % 32.
  uint3 idx{};
  State state = State::Exited;
  // The pending barrier or warp operation; `result` is written by the scheduler.
  Op op = Op::SyncThreads;
  Site site{};
  unsigned mask = 0;
  int arg = 0, width = 32;
  uint64_t value = 0, result = 0;
  // cp.async copies not yet performed, and the number of groups committed so far (this block).
  std::vector<AsyncCopy> copies;
  unsigned committed_groups = 0;
  MatrixRegs matrix{};
};

inline bool same_op(const Fiber& a, const Fiber& b) {
  return a.op == b.op && a.site.line == b.site.line &&
         (a.site.file == b.site.file || !strcmp(a.site.file, b.site.file));
}

// Fibers and their stacks live for the whole process; at most 1024 (the largest block).
class FiberPool {
 public:
  FiberPool() { fibers_.reserve(1024); }  // Never reallocates: Fiber addresses stay valid.
  ~FiberPool() {
    for (Fiber& f : fibers_) free_stack(f.stack);
  }
  Fiber* get(unsigned n) {  // nullptr when out of memory
    while (fibers_.size() < n) {
      char* stack = allocate_stack();
      if (!stack) return nullptr;
      fibers_.emplace_back();
      fibers_.back().stack = stack;
    }
    return fibers_.data();
  }

 private:
  std::vector<Fiber> fibers_;
};
inline FiberPool g_fiber_pool;

// -- One launch, and the built-in variables the running fiber sees.
struct Launch {
  dim3 grid, block;
  unsigned num_threads = 0;
  uint3 block_idx{};
  void (*invoke)(void*) = nullptr;  // Runs the kernel body `body` (type-erased).
  void* body = nullptr;
  Fiber* fibers = nullptr;  // num_threads of them
  Fiber* current = nullptr;
  Config config;
  uint64_t* rng = nullptr;
  DynamicShared* dynamic = nullptr;
  std::vector<unsigned> order;  // Resume order of the current round.
  std::string error;
  Context scheduler;
  void* scheduler_fake_stack = nullptr;
  const void* scheduler_stack = nullptr;
  size_t scheduler_stack_bytes = 0;
};
// One launch at a time in the process: static __shared__ variables exist once.
inline std::mutex g_launch_mutex;
inline Launch* g_launch = nullptr;
inline uint3 g_thread_idx, g_block_idx;
inline dim3 g_block_dim, g_grid_dim;

inline Launch& running_launch(const char* what) {
  if (!g_launch || !g_launch->current) {
    fprintf(stderr, "cudasim: %s called outside cudasim::launch\n", what);
    abort();
  }
  return *g_launch;
}

inline std::string describe(const Launch& L, const Fiber& f) {
  return strf("block (%u,%u,%u) thread (%u,%u,%u) [warp %u lane %u]", L.block_idx.x, L.block_idx.y,
              L.block_idx.z, f.idx.x, f.idx.y, f.idx.z, f.tid / 32, f.tid % 32);
}
inline std::string describe_op(const Fiber& f) {
  return strf("%s (%s:%d)", op_name(f.op), f.site.file, f.site.line);
}
// Records the first error of the launch, from the point of view of fiber `f`.
inline void set_error(Launch& L, const Fiber& f, const std::string& what) {
  if (L.error.empty()) L.error = describe(L, f) + " at " + describe_op(f) + ": " + what;
}

CUDASIM_NO_ASAN inline void resume(Launch& L, Fiber& f) {
  L.current = &f;
  g_thread_idx = f.idx;
  asan_start_switch(&L.scheduler_fake_stack, f.stack, CUDASIM_STACK_BYTES);
  context_switch(L.scheduler, f.ctx);
  asan_finish_switch(L.scheduler_fake_stack, nullptr, nullptr);
}

CUDASIM_NO_ASAN inline void suspend(Launch& L, Fiber& f, bool exiting) {
  asan_start_switch(exiting ? nullptr : &f.asan_fake_stack, L.scheduler_stack, L.scheduler_stack_bytes);
  context_switch(f.ctx, L.scheduler);
  asan_finish_switch(f.asan_fake_stack, nullptr, nullptr);
}

CUDASIM_NO_ASAN [[noreturn]] inline void fiber_main() {
  Launch& L = *g_launch;
  Fiber& f = *L.current;
  asan_finish_switch(nullptr, &L.scheduler_stack, &L.scheduler_stack_bytes);
  L.invoke(L.body);
  f.state = State::Exited;
  suspend(L, f, true);
  abort();  // An exited fiber is never resumed.
}

[[noreturn]] inline void fail(Launch& L, Fiber& f, const std::string& what) {
  set_error(L, f, what);
  f.state = State::Failed;
  suspend(L, f, false);
  abort();  // The scheduler stops the launch and never resumes a failed fiber.
}

// Blocks the calling fiber at a barrier or warp operation; returns the scheduler's result.
inline uint64_t arrive_and_wait(Site site, Op op, unsigned mask, uint64_t value, int arg = 0, int width = 32) {
  Launch& L = running_launch(op_name(op));
  Fiber& f = *L.current;
  f.op = op;
  f.site = site;
  f.mask = mask;
  f.value = value;
  f.arg = arg;
  f.width = width;
  if (op >= Op::SyncWarp) {
    const unsigned lane = f.tid % 32, first = f.tid - lane, lanes = std::min(32u, L.num_threads - first);
    const unsigned existing = lanes == 32 ? ~0u : (1u << lanes) - 1;
    if (!(mask >> lane & 1))
      fail(L, f, strf("mask 0x%08x does not include the calling lane %u", mask, lane));
    if (mask & ~existing)
      fail(L, f, strf("mask 0x%08x names lane %d, which does not exist: with %u threads per block, "
                      "warp %u has %u lanes", mask, __builtin_ctz(mask & ~existing), L.num_threads,
                      f.tid / 32, lanes));
    if (op >= Op::ShflIdx && (width < 1 || width > 32 || (width & (width - 1))))
      fail(L, f, strf("width %d is not a power of two from 1 to 32", width));
  }
  f.state = op >= Op::SyncWarp ? State::AtWarpOp : State::AtBarrier;
  suspend(L, f, false);
  return f.result;
}

// The lane a shuffle reads, as PTX's shfl.sync defines it (segments of `width` lanes; a lane whose
// source falls outside the allowed range reads its own value).
inline unsigned shuffle_source(Op op, unsigned lane, int arg, int width) {
  const unsigned b = unsigned(arg) & 31u, w = unsigned(width);
  const unsigned first = lane & ~(w - 1), last = first + w - 1;
  switch (op) {
    case Op::ShflUp: return lane >= first + b ? lane - b : lane;
    case Op::ShflDown: return lane + b <= last ? lane + b : lane;
    case Op::ShflXor: return (lane ^ b) <= last ? lane ^ b : lane;
    default: return first | (b & (w - 1));
  }
}

// Completes a warp matrix instruction all 32 lanes reached (defined in warp_matrix.h).
inline bool complete_matrix_op(Launch& L, Fiber* w);

// Computes the results of a warp operation all lanes of `mask` (in warp `w`) have reached.
inline bool complete_warp_op(Launch& L, Fiber* w, unsigned mask) {
  if (const Op op = w[__builtin_ctz(mask)].op; op == Op::Mma || op == Op::Ldmatrix) {
    if (!complete_matrix_op(L, w)) return false;
    for (unsigned lane = 0; lane < 32; ++lane) w[lane].state = State::Runnable;
    return true;
  }
  unsigned ballot = 0;
  for (unsigned lane = 0; lane < 32; ++lane)
    if ((mask >> lane & 1) && w[lane].value) ballot |= 1u << lane;
  for (unsigned lane = 0; lane < 32; ++lane) {
    if (!(mask >> lane & 1)) continue;
    Fiber& f = w[lane];
    switch (f.op) {
      case Op::Ballot: f.result = ballot; break;
      case Op::Any: f.result = ballot != 0; break;
      case Op::All: f.result = ballot == mask; break;
      case Op::SyncWarp: break;
      default: {
        const unsigned src = shuffle_source(f.op, lane, f.arg, f.width);
        if (!(mask >> src & 1)) {
          set_error(L, f, strf("lane %u reads lane %u, which is not in the mask 0x%08x", lane, src, mask));
          return false;
        }
        f.result = w[src].value;
      }
    }
  }
  for (unsigned lane = 0; lane < 32; ++lane)
    if (mask >> lane & 1) w[lane].state = State::Runnable;
  return true;
}

// Per warp, when every live fiber is blocked: reports the errors no further running can cure in
// its warp operations (a named lane has exited, or waits at the same operation with another
// mask), then completes every operation all of whose lanes have arrived.
inline bool advance_warp(Launch& L, Fiber* w, unsigned lanes, bool& progress, bool may_complete) {
  unsigned exited = 0, waiting = 0, ready[32], num_ready = 0;
  for (unsigned lane = 0; lane < lanes; ++lane) {
    if (w[lane].state == State::Exited) exited |= 1u << lane;
    if (w[lane].state == State::AtWarpOp) waiting |= 1u << lane;
  }
  while (waiting) {  // One group per iteration: the lanes of f.mask waiting where f waits.
    const Fiber& f = w[__builtin_ctz(waiting)];
    if (f.mask & exited) {
      set_error(L, f, strf("mask 0x%08x names lane %d, which has exited", f.mask, __builtin_ctz(f.mask & exited)));
      return false;
    }
    unsigned group = 0;
    for (unsigned m = f.mask; m; m &= m - 1) {
      const unsigned lane = unsigned(__builtin_ctz(m));
      if (w[lane].state != State::AtWarpOp || !same_op(f, w[lane])) continue;
      if (w[lane].mask != f.mask) {
        set_error(L, f, strf("lane %u arrived here with mask 0x%08x but lane %u with mask 0x%08x",
                             f.tid % 32, f.mask, lane, w[lane].mask));
        return false;
      }
      group |= 1u << lane;
    }
    waiting &= ~group;
    if (group == f.mask) ready[num_ready++] = group;
  }
  if (!may_complete) return true;
  for (unsigned g = 0; g < num_ready; ++g)
    if (!complete_warp_op(L, w, ready[g])) return false;
  progress |= num_ready > 0;
  return true;
}

// A barrier can complete only when every thread waits at the same one; some thread having exited,
// or waiting at another __syncthreads, rules that out for good.
inline bool check_barrier(Launch& L) {
  const Fiber *exited = nullptr, *barrier = nullptr;
  for (unsigned t = 0; t < L.num_threads && L.error.empty(); ++t) {
    const Fiber& f = L.fibers[t];
    if (f.state == State::Exited && !exited) exited = &f;
    if (f.state != State::AtBarrier) continue;
    if (!barrier) barrier = &f;
    else if (!same_op(*barrier, f))
      set_error(L, *barrier, strf("thread (%u,%u,%u) waits at %s instead; every thread of the block "
                                  "must reach the same __syncthreads", f.idx.x, f.idx.y, f.idx.z,
                                  describe_op(f).c_str()));
  }
  if (exited && barrier)
    set_error(L, *barrier, strf("thread (%u,%u,%u) has exited; every thread of the block must reach "
                                "the same __syncthreads", exited->idx.x, exited->idx.y, exited->idx.z));
  return L.error.empty();
}

// Releases the barrier if the whole block waits at it (check_barrier passed).
inline bool release_barrier(Launch& L) {
  unsigned count = 0;
  for (unsigned t = 0; t < L.num_threads; ++t) {
    if (L.fibers[t].state != State::AtBarrier) return false;
    count += unsigned(L.fibers[t].value);
  }
  const Op op = L.fibers[0].op;
  const uint64_t result = op == Op::SyncThreadsCount ? count
                          : op == Op::SyncThreadsAnd ? count == L.num_threads
                                                     : count > 0;
  for (unsigned t = 0; t < L.num_threads; ++t) {
    L.fibers[t].state = State::Runnable;
    L.fibers[t].result = result;
  }
  return true;
}

// Nothing can complete: some warp operation waits for a lane that is blocked somewhere else.
inline void report_deadlock(Launch& L) {
  for (unsigned t = 0; t < L.num_threads; ++t) {
    const Fiber& f = L.fibers[t];
    if (f.state != State::AtWarpOp) continue;
    const Fiber* w = L.fibers + (t & ~31u);
    for (unsigned lane = 0; lane < 32; ++lane)
      if ((f.mask >> lane & 1) && !(w[lane].state == State::AtWarpOp && same_op(f, w[lane]))) {
        set_error(L, f, strf("mask 0x%08x names lane %u, which waits at %s", f.mask, lane,
                             describe_op(w[lane]).c_str()));
        return;
      }
  }
  set_error(L, L.fibers[0], "deadlock");
}

// Called when every live fiber is blocked. The state it looks at does not depend on the order the
// fibers ran in, so neither does what it decides or reports. In the forward and reverse orders
// warps run one at a time between block barriers: only the first warp in that order whose warp
// operations can complete moves on, so it reaches the next __syncthreads (or exits) before the
// others leave their last one, and a warp that writes shared memory another warp has not read
// yet is caught. The random order moves every warp at once, in step.
inline bool make_progress(Launch& L) {
  bool progress = false;
  const bool one_warp = L.config.order != Order::Random;
  const unsigned num_warps = (L.num_threads + 31) / 32;
  for (unsigned i = 0; i < num_warps; ++i) {
    const unsigned first = 32 * (L.config.order == Order::Reverse ? num_warps - 1 - i : i);
    if (!advance_warp(L, L.fibers + first, std::min(32u, L.num_threads - first), progress, !(one_warp && progress)))
      return false;
  }
  if (!check_barrier(L)) return false;
  if (progress || release_barrier(L)) return true;
  report_deadlock(L);
  return false;
}

// Random order: a new permutation of the threads every round (forward and reverse stay fixed).
inline void draw_order(Launch& L) {
  if (L.config.order != Order::Random) return;
  for (unsigned i = L.num_threads - 1; i > 0; --i)
    std::swap(L.order[i], L.order[next_random(*L.rng) % (i + 1)]);
}

// Runs the block L.block_idx to completion; false when it failed (L.error says why).
inline bool run_block(Launch& L) {
  for (unsigned t = 0; t < L.num_threads; ++t) {
    Fiber& f = L.fibers[t];
    if (f.dirty) reset_stack_shadow(f.stack);
    f.dirty = true;  // Until it exits.
    context_init(f.ctx, f.stack, CUDASIM_STACK_BYTES, fiber_main);
    f.state = State::Runnable;
    f.copies.clear();  // A block's copies die with it, as its shared memory does.
    f.committed_groups = 0;
  }
  for (;;) {
    draw_order(L);
    unsigned exited = 0;
    for (unsigned t : L.order) {
      Fiber& f = L.fibers[t];
      if (f.state == State::Runnable) resume(L, f);
      if (!L.error.empty()) return false;
      if (f.state == State::Exited) ++exited, f.dirty = false;
    }
    L.current = nullptr;
    if (exited == L.num_threads) return true;
    if (!make_progress(L)) return false;
  }
}

inline std::string check_geometry(dim3 grid, dim3 block, size_t dynamic_shared_bytes) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (!threads || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
    return strf("block (%u,%u,%u) is not 1 to 1024 threads with x, y <= 1024 and z <= 64", block.x, block.y, block.z);
  if (!grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    return strf("grid (%u,%u,%u) is out of range", grid.x, grid.y, grid.z);
  if (dynamic_shared_bytes > 227 * 1024)
    return strf("%zu bytes of dynamic shared memory exceed the 227 KiB a block can have", dynamic_shared_bytes);
  return "";
}

// Visits the blocks in the configured order, poisoning shared memory before each.
inline void run_blocks(Launch& L, const StaticShared& statics) {
  const uint64_t num_blocks = uint64_t(L.grid.x) * L.grid.y * L.grid.z;
  std::vector<uint32_t> shuffled;  // Random order only.
  if (L.config.order == Order::Random) {
    shuffled.resize(num_blocks);
    for (uint64_t i = 0; i < num_blocks; ++i) shuffled[i] = uint32_t(i);
    for (uint64_t i = num_blocks - 1; i > 0; --i) std::swap(shuffled[i], shuffled[next_random(*L.rng) % (i + 1)]);
  }
  for (uint64_t i = 0; i < num_blocks && L.error.empty(); ++i) {
    const uint64_t b = L.config.order == Order::Forward ? i
                       : L.config.order == Order::Reverse ? num_blocks - 1 - i : shuffled[i];
    L.block_idx = g_block_idx = {unsigned(b % L.grid.x), unsigned(b / L.grid.x % L.grid.y),
                                 unsigned(b / (uint64_t(L.grid.x) * L.grid.y))};
    for (const auto& [start, bytes] : statics.ranges) std::memset(start, L.config.poison, bytes);
    L.dynamic->fill(L.config.poison);
    if (!run_block(L)) break;
    if (long offset = 0; !L.dynamic->guards_intact(offset))
      L.error = strf("block (%u,%u,%u) wrote outside its %zu bytes of dynamic shared memory (the guard "
                     "byte at offset %ld changed)", L.block_idx.x, L.block_idx.y, L.block_idx.z,
                     L.dynamic->size(), offset);
  }
}

// Runs every block of a launch whose geometry was checked; returns the error, or "".
inline std::string run_launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, void (*invoke)(void*),
                              void* body, ThreadSettings& settings) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  const StaticShared& statics = static_shared();
  if (!statics.error.empty()) return statics.error;
  const unsigned num_threads = block.x * block.y * block.z;
  Fiber* fibers = g_fiber_pool.get(num_threads);
  if (!fibers) return "cannot allocate fiber stacks";
  DynamicShared dynamic(dynamic_shared_bytes);
  Launch L;
  L.grid = grid;
  L.block = block;
  L.num_threads = num_threads;
  L.invoke = invoke;
  L.body = body;
  L.fibers = fibers;
  L.config = settings.config;
  L.rng = &settings.rng;
  L.dynamic = &dynamic;
  L.order.resize(num_threads);
  for (unsigned t = 0; t < num_threads; ++t) {
    L.order[t] = L.config.order == Order::Reverse ? num_threads - 1 - t : t;
    fibers[t].tid = t;
    fibers[t].idx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
  }
  g_launch = &L;
  g_block_dim = block;
  g_grid_dim = grid;
  settings.in_launch = true;
  run_blocks(L, statics);
  settings.in_launch = false;
  g_launch = nullptr;
  return L.error;
}

inline Status launch_erased(dim3 grid, dim3 block, size_t dynamic_shared_bytes, void (*invoke)(void*), void* body) {
  ThreadSettings& settings = t_settings;
  if (!settings.configured) {
    settings = {true, config_from_env(), 0, "", false};
    settings.rng = settings.config.seed;
  }
  Status status{settings.in_launch ? "cudasim::launch called from inside a kernel" : settings.config.error};
  if (status.ok()) status.error = check_geometry(grid, block, dynamic_shared_bytes);
  if (status.ok()) status.error = run_launch(grid, block, dynamic_shared_bytes, invoke, body, settings);
  if (!status.ok())
    status.error = strf("cudasim: launch of grid (%u,%u,%u) x block (%u,%u,%u) failed [order %s, poison 0x%02x]: %s",
                        grid.x, grid.y, grid.z, block.x, block.y, block.z, order_name(settings.config).c_str(),
                        settings.config.poison, status.error.c_str());
  settings.last_error = status.error;
  return status;
}

}  // namespace cudasim::detail
