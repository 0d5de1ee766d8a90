// Shared memory for the CUDA simulator (cuda_sim.h): finding static __shared__ variables, guarding dynamic shared memory.
//
// Both are filled with the poison byte before every block, so reading memory no thread of the
// block wrote gives a recognisable value.
//
// Static __shared__ variables are `static` variables that cuda_sim.h's `__shared__` macro tags
// with abi_tag(CUDASIM_SHARED_TAG): g++ writes "B14cudasim_shared" into their mangled names,
// whatever the scope (namespace, function, function template, inline function). At the first
// launch we read the ELF symbol table of the module holding this code and keep those symbols'
// address ranges. Simpler schemes fail on g++ 12: a linker section with __start_/__stop_ symbols
// is ignored for statics inside templates, and statics of inline and non-inline functions in one
// named section are a "section type conflict". The cost: a stripped binary cannot be simulated
// (every launch fails and says so).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#define CUDASIM_SHARED_TAG "cudasim_shared"

namespace cudasim::detail {

#if defined(__SANITIZE_ADDRESS__)
inline void asan_poison(const void* p, size_t n) { ASAN_POISON_MEMORY_REGION(p, n); }
inline void asan_unpoison(const void* p, size_t n) { ASAN_UNPOISON_MEMORY_REGION(p, n); }
#else
inline void asan_poison(const void*, size_t) {}
inline void asan_unpoison(const void*, size_t) {}
#endif

// Address ranges of all static __shared__ variables, sorted, or why they could not be found.
struct StaticShared {
  std::vector<std::pair<unsigned char*, size_t>> ranges;
  std::string error;
};

// Bounds-checked, alignment-safe read of an ELF structure; clears `ok` when out of bounds.
template <class T> inline T read_at(const unsigned char* file, size_t size, size_t offset, bool& ok) {
  T value{};
  if (offset > size || size - offset < sizeof(T)) ok = false;
  else std::memcpy(&value, file + offset, sizeof(T));
  return value;
}

// Adds every object symbol of the ELF image `file` whose name carries the tag to out.ranges.
inline void scan_symbol_table(const unsigned char* file, size_t size, uintptr_t load_bias, StaticShared& out) {
  const std::string marker = "B" + std::to_string(strlen(CUDASIM_SHARED_TAG)) + CUDASIM_SHARED_TAG;
  bool ok = size >= SELFMAG && !memcmp(file, ELFMAG, SELFMAG), found_symtab = false;
  const auto eh = read_at<ElfW(Ehdr)>(file, size, 0, ok);
  size_t num_sections = eh.e_shnum;
  if (ok && num_sections == 0 && eh.e_shoff) num_sections = read_at<ElfW(Shdr)>(file, size, eh.e_shoff, ok).sh_size;
  for (size_t i = 0; ok && i < num_sections; ++i) {
    const auto sh = read_at<ElfW(Shdr)>(file, size, eh.e_shoff + i * sizeof(ElfW(Shdr)), ok);
    if (!ok || sh.sh_type != SHT_SYMTAB || sh.sh_entsize != sizeof(ElfW(Sym))) continue;
    const auto strtab = read_at<ElfW(Shdr)>(file, size, eh.e_shoff + sh.sh_link * sizeof(ElfW(Shdr)), ok);
    if (!ok || strtab.sh_offset > size || strtab.sh_size > size - strtab.sh_offset) break;
    found_symtab = true;
    const char* names = reinterpret_cast<const char*>(file + strtab.sh_offset);
    for (size_t j = 0; ok && j < sh.sh_size / sizeof(ElfW(Sym)); ++j) {
      const auto sym = read_at<ElfW(Sym)>(file, size, sh.sh_offset + j * sizeof(ElfW(Sym)), ok);
      if (!ok || ELF64_ST_TYPE(sym.st_info) != STT_OBJECT || sym.st_size == 0 ||
          sym.st_shndx == SHN_UNDEF || sym.st_name >= strtab.sh_size ||
          !memchr(names + sym.st_name, 0, strtab.sh_size - sym.st_name) ||
          !strstr(names + sym.st_name, marker.c_str()))
        continue;
      out.ranges.emplace_back(reinterpret_cast<unsigned char*>(load_bias + sym.st_value), sym.st_size);
    }
  }
  if (!ok) out.error = "malformed ELF file";
  else if (!found_symtab) out.error = "no symbol table (stripped binary?)";
}

// Finds the module (executable or shared library) holding this code, then scans its file.
inline StaticShared find_static_shared() {
  struct Query { uintptr_t address; uintptr_t bias; std::string path; bool found; };
  Query q{reinterpret_cast<uintptr_t>(&find_static_shared), 0, "", false};
  dl_iterate_phdr([](dl_phdr_info* info, size_t, void* data) {
    auto& q = *static_cast<Query*>(data);
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& ph = info->dlpi_phdr[i];
      const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
      if (ph.p_type == PT_LOAD && q.address - start < ph.p_memsz) {
        const bool main_program = !info->dlpi_name || !*info->dlpi_name;
        q = {q.address, info->dlpi_addr, main_program ? "/proc/self/exe" : info->dlpi_name, true};
        return 1;
      }
    }
    return 0;
  }, &q);
  StaticShared out;
  const int fd = q.found ? open(q.path.c_str(), O_RDONLY | O_CLOEXEC) : -1;
  struct stat st{};
  void* map = fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0
                  ? mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  if (fd >= 0) close(fd);
  if (map == MAP_FAILED) out.error = "cannot read the file";
  else scan_symbol_table(static_cast<const unsigned char*>(map), size_t(st.st_size), q.bias, out);
  if (map != MAP_FAILED) munmap(map, size_t(st.st_size));
  if (!out.error.empty())
    out.error = "cannot locate static __shared__ variables in " + q.path + ": " + out.error;
  std::sort(out.ranges.begin(), out.ranges.end());
  return out;
}

// Computed at the first launch; the variables do not move afterwards.
inline const StaticShared& static_shared() {
  static const StaticShared shared = find_static_shared();
  return shared;
}

// Dynamic shared memory, 64-byte aligned, between two 64-byte guards that are checked after every
// block and, under ASan, poisoned so that any access to them is reported at once.
class DynamicShared {
 public:
  static constexpr size_t kGuard = 64;
  explicit DynamicShared(size_t bytes) : bytes_(bytes), storage_(bytes + 3 * kGuard) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(storage_.data()) + kGuard;
    data_ = reinterpret_cast<unsigned char*>((start + kGuard - 1) & ~uintptr_t(kGuard - 1));
    for (size_t i = 0; i < kGuard; ++i) front()[i] = back()[i] = guard_byte(i);
    asan_poison(front(), kGuard);
    asan_poison(back(), kGuard);
  }
  ~DynamicShared() { asan_unpoison(storage_.data(), storage_.size()); }
  unsigned char* data() const { return data_; }
  size_t size() const { return bytes_; }
  void fill(unsigned char byte) { std::memset(data_, byte, bytes_); }
  // False, with the offset from data() of the first changed guard byte, if a guard was written.
  bool guards_intact(long& damaged_offset) const {
    asan_unpoison(front(), kGuard);
    asan_unpoison(back(), kGuard);
    bool intact = true;
    for (size_t i = 0; i < kGuard && intact; ++i) {
      if (front()[i] != guard_byte(i)) {
        intact = false;
        damaged_offset = long(i) - long(kGuard);
      } else if (back()[i] != guard_byte(i)) {
        intact = false;
        damaged_offset = long(bytes_ + i);
      }
    }
    asan_poison(front(), kGuard);
    asan_poison(back(), kGuard);
    return intact;
  }

 private:
  static unsigned char guard_byte(size_t i) { return (unsigned char)(0xa5 ^ (i * 0x3b)); }
  unsigned char* front() const { return data_ - kGuard; }
  unsigned char* back() const { return data_ + bytes_; }
  size_t bytes_;
  std::vector<unsigned char> storage_;
  unsigned char* data_;
};

}  // namespace cudasim::detail
