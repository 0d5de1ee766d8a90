//! Reading back floats that were written as `null`: serde_json writes NaN and ±∞ as `null`, and
//! the records carry NaN on purpose (a signal with no token, a feature with too few hits) and ∞
//! as "no threshold". They read back as NaN, which writes as `null` again.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

/// A float type with a NaN.
pub(crate) trait Float: Copy {
    const NAN: Self;
}

impl Float for f32 {
    const NAN: Self = f32::NAN;
}

impl Float for f64 {
    const NAN: Self = f64::NAN;
}

/// A float, `null` as NaN.
pub(crate) fn or_nan<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Float + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or(T::NAN))
}

/// A list of floats, each `null` as NaN.
pub(crate) fn vec_or_nan<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Float + Deserialize<'de>,
{
    let values = Vec::<Option<T>>::deserialize(d)?;
    Ok(values.into_iter().map(|v| v.unwrap_or(T::NAN)).collect())
}

/// A map to floats, each `null` as NaN.
pub(crate) fn map_or_nan<'de, D, T>(d: D) -> Result<BTreeMap<String, T>, D::Error>
where
    D: Deserializer<'de>,
    T: Float + Deserialize<'de>,
{
    let values = BTreeMap::<String, Option<T>>::deserialize(d)?;
    Ok(values
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or(T::NAN)))
        .collect())
}
