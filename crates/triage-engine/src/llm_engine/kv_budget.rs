//! `KvBudget`: how much memory a model's KV cache may take, as a block count, MiB, or a fraction
//! of the memory available when the engine starts (vLLM's `gpu_memory_utilization`, llama.cpp's
//! context size in blocks).

use std::str::FromStr;

use candle_core::Device;

use crate::{EngineError, Result};

/// A KV-cache size for one model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    /// Exactly this many blocks (one of them the null block).
    Blocks(usize),
    /// At most this many MiB of K and V tensors.
    MiB(f64),
    /// This fraction, in (0, 1], of the device memory available at start.
    Fraction(f64),
}

impl KvBudget {
    /// Number of blocks the budget buys at `bytes_per_block` on `device`; at least 2 (the null
    /// block and one usable block).
    pub fn num_blocks(&self, bytes_per_block: usize, device: &Device) -> Result<usize> {
        let bytes = match *self {
            KvBudget::Blocks(n) => return Ok(n.max(2)),
            KvBudget::MiB(mib) => mib * 1024.0 * 1024.0,
            KvBudget::Fraction(f) => f * available_bytes(device)? as f64,
        };
        let n = (bytes / bytes_per_block.max(1) as f64).floor() as usize;
        if n < 2 {
            return Err(EngineError::Invalid(format!(
                "KV budget {self} holds {n} blocks of {bytes_per_block} bytes; at least 2 are needed"
            )));
        }
        Ok(n)
    }
}

impl std::fmt::Display for KvBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvBudget::Blocks(n) => write!(f, "{n}blocks"),
            KvBudget::MiB(m) => write!(f, "{m}MiB"),
            KvBudget::Fraction(x) => write!(f, "{x}"),
        }
    }
}

impl FromStr for KvBudget {
    type Err = EngineError;

    /// `"512MiB"`, `"4GiB"`, `"0.3"` (a fraction), `"2048blocks"`.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let bad = || {
            EngineError::Invalid(format!(
                "KV budget {s:?}: expected e.g. \"512MiB\", \"4GiB\", \"0.3\" or \"2048blocks\""
            ))
        };
        let number = |t: &str| t.trim().parse::<f64>().map_err(|_| bad());
        let budget = if let Some(n) = s.strip_suffix("blocks") {
            KvBudget::Blocks(n.trim().parse().map_err(|_| bad())?)
        } else if let Some(m) = s.strip_suffix("MiB") {
            KvBudget::MiB(number(m)?)
        } else if let Some(g) = s.strip_suffix("GiB") {
            KvBudget::MiB(number(g)? * 1024.0)
        } else {
            KvBudget::Fraction(number(s)?)
        };
        match budget {
            KvBudget::MiB(m) if !(m.is_finite() && m > 0.0) => Err(bad()),
            KvBudget::Fraction(f) if !(f > 0.0 && f <= 1.0) => Err(bad()),
            b => Ok(b),
        }
    }
}

/// Memory the KV cache could take on `device` now: the free device memory on a GPU (after the
/// weights were loaded, as vLLM measures it), `MemAvailable` on CPU (Linux).
fn available_bytes(device: &Device) -> Result<u64> {
    if !device.is_cpu() {
        let (free, _total) = triage_ops::cuda::memory_info(device)?;
        return Ok(free as u64);
    }
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| EngineError::Invalid(format!("fraction KV budget: /proc/meminfo: {e}")))?;
    parse_mem_available(&text)
        .ok_or_else(|| EngineError::Invalid("fraction KV budget: no MemAvailable".into()))
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms_and_refuses_the_rest() {
        assert_eq!("512MiB".parse::<KvBudget>().unwrap(), KvBudget::MiB(512.0));
        assert_eq!("1.5GiB".parse::<KvBudget>().unwrap(), KvBudget::MiB(1536.0));
        assert_eq!(
            "0.25".parse::<KvBudget>().unwrap(),
            KvBudget::Fraction(0.25)
        );
        assert_eq!(
            "64 blocks".parse::<KvBudget>().unwrap(),
            KvBudget::Blocks(64)
        );
        for bad in ["", "0", "1.5", "-3MiB", "lots", "NaNMiB", "2.5blocks"] {
            assert!(bad.parse::<KvBudget>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn budgets_buy_whole_blocks() {
        let cpu = Device::Cpu;
        assert_eq!(KvBudget::MiB(1.0).num_blocks(1000, &cpu).unwrap(), 1048);
        assert_eq!(KvBudget::Blocks(0).num_blocks(1000, &cpu).unwrap(), 2);
        assert!(KvBudget::MiB(0.001).num_blocks(1 << 20, &cpu).is_err());
        let n = KvBudget::Fraction(0.001).num_blocks(4096, &cpu).unwrap();
        assert!(n >= 2);
    }

    #[test]
    fn reads_mem_available() {
        let text = "MemTotal: 100 kB\nMemFree: 5 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_mem_available(text), Some(2048 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
    }
}
