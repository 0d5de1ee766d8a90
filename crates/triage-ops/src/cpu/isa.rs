//! The x86 instruction-set extensions the CPU kernels use, detected once per process.
//!
//! Every kernel choice reads this one record, so a host is asked once (the AMX permission
//! request included) and every op agrees about what it runs. The record holds what the CPU runs
//! now, not what the binary was compiled for: the same binary runs on AVX2-only and on
//! AVX-512/AMX hosts and picks its kernels at run time.

use std::sync::OnceLock;

/// The extensions this CPU runs (all `false` off x86-64).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Isa {
    pub(crate) avx2: bool,
    pub(crate) fma: bool,
    pub(crate) f16c: bool,
    /// AVX-VNNI (`vpdpbusd`, VEX-encoded).
    pub(crate) avx_vnni: bool,
    pub(crate) avx512f: bool,
    pub(crate) avx512bw: bool,
    pub(crate) avx512vl: bool,
    pub(crate) avx512vnni: bool,
    /// AMX-TILE and AMX-INT8 in the CPU (`amx_int8` says whether this process may use them).
    amx_tile_int8: bool,
}

impl Isa {
    /// This CPU's, detected on the first call.
    pub(crate) fn get() -> &'static Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        ISA.get_or_init(detect)
    }

    /// AVX2 with FMA, the base of every x86 kernel.
    pub(crate) fn avx2_fma(&self) -> bool {
        self.avx2 && self.fma
    }

    /// Whether the CPU has AMX-TILE and AMX-INT8 and the kernel lets this process use tile data
    /// (Linux asks for it once per process: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`).
    /// The request is made on the first call, not at detection: it enlarges every signal frame
    /// of the process, so only a process that lists the AMX kernels makes it.
    pub(crate) fn amx_int8(&self) -> bool {
        static PERMITTED: OnceLock<bool> = OnceLock::new();
        self.amx_tile_int8 && *PERMITTED.get_or_init(tile_data_permitted)
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    use std::arch::is_x86_feature_detected as has;
    let avx512f = has!("avx512f");
    Isa {
        avx2: has!("avx2"),
        fma: has!("fma"),
        f16c: has!("f16c"),
        avx_vnni: has!("avxvnni"),
        avx512f,
        avx512bw: has!("avx512bw"),
        avx512vl: has!("avx512vl"),
        avx512vnni: has!("avx512vnni"),
        amx_tile_int8: avx512f && amx_tile_int8(),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Isa {
    Isa::default()
}

/// Whether this CPU has AMX-TILE and AMX-INT8 (`cpuid` leaf 7; std's detection of them is not
/// stable). `detect` asks only where AVX-512 F is: the AMX kernels scale with it, and leaf 7
/// exists on every CPU that has it.
#[cfg(target_arch = "x86_64")]
fn amx_tile_int8() -> bool {
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    leaf7.edx >> 24 & 1 == 1 && leaf7.edx >> 25 & 1 == 1
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
fn tile_data_permitted() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a request about this process's own register state; it changes nothing else, and a
    // kernel without AMX support refuses it.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn tile_data_permitted() -> bool {
    false
}
