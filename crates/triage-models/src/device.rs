//! `DeviceSpec`: where a model runs (`cpu`, `cuda`, `cuda:N`), as the command line's `--device`
//! and the configs' `device` key spell it, and how it opens a candle device.

use std::str::FromStr;

use candle_core::{DType, Device};

use crate::{ModelError, Result};

/// A device by name. The default is the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeviceSpec {
    #[default]
    Cpu,
    /// A CUDA GPU by ordinal (`cuda` is `cuda:0`).
    Cuda(usize),
}

impl DeviceSpec {
    /// Open the device. A binary built without the `cuda` feature refuses a CUDA device with
    /// [`ModelError::NotCompiledWithCuda`] rather than failing later inside a kernel.
    pub fn open(self) -> Result<Device> {
        match self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(ordinal) => match triage_ops::cuda::open_device(ordinal) {
                Ok(device) => Ok(device),
                Err(triage_ops::OpsError::NotCompiledWithCuda) => {
                    Err(ModelError::NotCompiledWithCuda(self.to_string()))
                }
                Err(e) => Err(ModelError::Invalid(format!("opening {self}: {e}"))),
            },
        }
    }

    pub fn is_cpu(self) -> bool {
        self == DeviceSpec::Cpu
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = ModelError;

    /// `cpu`, `cuda` or `cuda:N`.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let bad = || {
            ModelError::Invalid(format!(
                "device {s:?}: expected \"cpu\", \"cuda\" or \"cuda:N\""
            ))
        };
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => {
                let n = s.strip_prefix("cuda:").ok_or_else(bad)?;
                n.parse().map(DeviceSpec::Cuda).map_err(|_| bad())
            }
        }
    }
}

impl serde::Serialize for DeviceSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DeviceSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The dtype of a KV cache by name: `bf16`, `f16` or `f32`.
pub fn parse_kv_dtype(s: &str) -> Result<DType> {
    match s.trim() {
        "bf16" => Ok(DType::BF16),
        "f16" => Ok(DType::F16),
        "f32" => Ok(DType::F32),
        other => Err(ModelError::Invalid(format!(
            "KV dtype {other:?}: expected \"bf16\", \"f16\" or \"f32\""
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_spellings_and_refuses_the_rest() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!(
            " cuda:3 ".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Cuda(3)
        );
        for bad in ["", "gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", "metal"] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad:?} accepted");
        }
        assert_eq!(DeviceSpec::Cuda(2).to_string(), "cuda:2");
        assert_eq!(DeviceSpec::default(), DeviceSpec::Cpu);
    }

    #[test]
    fn round_trips_through_serde() {
        let json = serde_json::to_string(&DeviceSpec::Cuda(1)).unwrap();
        assert_eq!(json, "\"cuda:1\"");
        let back: DeviceSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, DeviceSpec::Cuda(1));
        assert!(serde_json::from_str::<DeviceSpec>("\"tpu\"").is_err());
    }

    #[test]
    fn the_cpu_opens_everywhere() {
        assert!(DeviceSpec::Cpu.open().unwrap().is_cpu());
    }

    /// A CPU-only build says so plainly for a GPU, instead of panicking later.
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_cpu_build_refuses_cuda_by_name() {
        let err = DeviceSpec::Cuda(0).open().unwrap_err();
        assert!(matches!(err, ModelError::NotCompiledWithCuda(_)));
        assert!(
            err.to_string().contains("without the `cuda` feature"),
            "{err}"
        );
    }

    #[test]
    fn kv_dtypes_by_name() {
        assert_eq!(parse_kv_dtype("bf16").unwrap(), DType::BF16);
        assert_eq!(parse_kv_dtype("f32").unwrap(), DType::F32);
        assert!(parse_kv_dtype("int8").is_err());
    }
}
