// Warp matrix instructions of the CUDA simulator (cuda_sim.h): mma.sync m16n8k16, ldmatrix x4 and cp.async.
//
// Part of cuda_sim.h, which includes it after scheduler.h; not a standalone header. Kernels reach
// these through kernels/mma.cuh, which maps the same names to inline PTX for nvcc.
//
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 and ldmatrix.sync.aligned.m8n8.x4
// [.trans].shared.b16 are warp collectives: every lane of a full warp must reach the same call
// site (a lane elsewhere, exited, or a partial warp stops the launch, as for the shuffles). Each
// lane copies its registers into its fiber's `MatrixRegs`, the scheduler computes every lane's
// result there once all 32 have arrived, and the lane copies it back (never a write into a
// fiber's variables behind the compiler's back: a pointer handed over that way was miscompiled
// under ASan with UBSan's overflow checks at -O2), with the fragment layouts of the PTX ISA ("Matrix Fragments for mma.m16n8k16",
// "ldmatrix"): with g = lane / 4 and t = lane % 4,
//   A (16x16, row-major) a[r] holds row g + 8*(r & 1), columns 2t + 8*(r >> 1) and the next;
//   B (16x8, column-major) b[r] holds rows 2t + 8*r and the next, column g;
//   C/D (16x8, f32) d[i] holds row g + 8*(i >> 1), column 2t + (i & 1);
//   the lower-indexed element of a 32-bit register is in its low 16 bits.
// Products of 16-bit floats are exact in f32; the sum runs in k order with f32 fused
// multiply-adds starting from c (the hardware's order is unspecified: tests keep a tolerance).
// ldmatrix: lane l names row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned, inside the
// launch's dynamic shared memory, else the launch stops); lane l receives, from matrix i, row
// l / 4, elements 2(l % 4) and the next (or with .trans, column l / 4, rows 2(l % 4) and the next).
//
// cp.async.cg.shared.global (16 bytes, src-size 0..16, the rest zero-filled), commit_group and
// wait_group N: a thread's copies are queued per commit group and performed when it waits for
// their group; in the reverse order, and for a random half of the copies in a random order, a
// copy is performed at once instead. Both are legal timings on a GPU, so a kernel that reads a
// destination before waiting for it, or overwrites a buffer a pending copy still targets, gets
// wrong values under one order or the other. Copies still pending when a block ends are dropped.
#pragma once

namespace cudasim::detail {

inline float element16(uint32_t reg, int half, bool bf16) {
  const uint16_t bits = uint16_t(half ? reg >> 16 : reg & 0xffffu);
  return bf16 ? bits_float(uint32_t(bits) << 16) : half_bits_to_float(bits);
}

inline bool complete_mma(Launch& L, Fiber* w) {
  float a[16][16], b[16][8];
  for (unsigned lane = 0; lane < 32; ++lane) {
    const MatrixRegs& m = w[lane].matrix;
    if (m.bf16 != w[0].matrix.bf16) {
      set_error(L, w[lane], "lanes disagree on the operand type");
      return false;
    }
    const unsigned g = lane / 4, t = lane % 4;
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) a[g + 8 * (r & 1)][2 * t + 8 * (r >> 1) + h] = element16(m.a[r], h, m.bf16);
    for (int r = 0; r < 2; ++r)
      for (int h = 0; h < 2; ++h) b[2 * t + 8 * r + h][g] = element16(m.b[r], h, m.bf16);
  }
  for (unsigned lane = 0; lane < 32; ++lane) {
    const unsigned g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
      float acc = w[lane].matrix.d[i];
      for (int k = 0; k < 16; ++k) acc = std::fma(a[row][k], b[k][col], acc);
      w[lane].matrix.d[i] = acc;
    }
  }
  return true;
}

inline bool complete_ldmatrix(Launch& L, Fiber* w) {
  const unsigned char* lo = L.dynamic->data();
  const unsigned char* hi = lo + L.dynamic->size();
  for (unsigned lane = 0; lane < 32; ++lane) {
    const auto* p = static_cast<const unsigned char*>(w[lane].matrix.row);
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      set_error(L, w[lane], strf("ldmatrix: row address %p is not 16-byte aligned", w[lane].matrix.row));
      return false;
    }
    if (p < lo || p + 16 > hi) {
      set_error(L, w[lane], strf("ldmatrix: row address %p is outside the block's %zu bytes of dynamic shared memory",
                                 w[lane].matrix.row, L.dynamic->size()));
      return false;
    }
    if (w[lane].matrix.trans != w[0].matrix.trans) {
      set_error(L, w[lane], "lanes disagree on .trans");
      return false;
    }
  }
  // Element (row, col) of matrix i, as its 16 bits.
  auto element = [&](int i, int row, int col) {
    uint16_t bits;
    std::memcpy(&bits, static_cast<const unsigned char*>(w[8 * i + row].matrix.row) + 2 * col, 2);
    return uint32_t(bits);
  };
  for (unsigned lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const int g = int(lane) / 4, t = int(lane) % 4;
      w[lane].matrix.out[i] = w[0].matrix.trans ? element(i, 2 * t, g) | element(i, 2 * t + 1, g) << 16
                                                : element(i, g, 2 * t) | element(i, g, 2 * t + 1) << 16;
    }
  return true;
}

inline bool complete_matrix_op(Launch& L, Fiber* w) {
  return w[0].op == Op::Mma ? complete_mma(L, w) : complete_ldmatrix(L, w);
}

inline void perform(const AsyncCopy& c) {
  std::memcpy(c.dst, c.src, c.src_bytes);
  std::memset(static_cast<unsigned char*>(c.dst) + c.src_bytes, 0, 16 - c.src_bytes);
}

}  // namespace cudasim::detail

namespace cudasim {

// cp.async.cg.shared.global [dst], [src], 16, src_bytes.
inline void cp_async_16(void* dst, const void* src, unsigned src_bytes) {
  detail::Launch& L = detail::running_launch("cp.async");
  detail::Fiber& f = *L.current;
  const auto* d = static_cast<unsigned char*>(dst);
  if (reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16)
    detail::fail(L, f, detail::strf("cp.async: %p or %p is not 16-byte aligned", dst, src));
  if (d < L.dynamic->data() || d + 16 > L.dynamic->data() + L.dynamic->size())
    detail::fail(L, f, detail::strf("cp.async: destination %p is outside the block's dynamic shared memory", dst));
  if (src_bytes > 16) detail::fail(L, f, detail::strf("cp.async: src-size %u exceeds 16", src_bytes));
  const detail::AsyncCopy copy{dst, src, src_bytes, f.committed_groups};
  const bool now = L.config.order == Order::Reverse ||
                   (L.config.order == Order::Random && detail::next_random(*L.rng) % 2 == 0);
  if (now) detail::perform(copy);
  else f.copies.push_back(copy);
}

// cp.async.commit_group.
inline void cp_async_commit() {
  detail::Launch& L = detail::running_launch("cp.async.commit_group");
  ++L.current->committed_groups;
}

// cp.async.wait_group n: every committed group but the n most recent is complete.
inline void cp_async_wait(unsigned n) {
  detail::Launch& L = detail::running_launch("cp.async.wait_group");
  detail::Fiber& f = *L.current;
  std::vector<detail::AsyncCopy> pending;
  for (const detail::AsyncCopy& c : f.copies) {
    if (c.group + n < f.committed_groups) detail::perform(c);
    else pending.push_back(c);
  }
  f.copies.swap(pending);
}

}  // namespace cudasim
