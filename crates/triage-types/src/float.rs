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

/// NaN: the value of a field missing from a record written before the field existed.
pub(crate) fn nan_f32() -> f32 {
    f32::NAN
}

/// Whether a field is NaN, to leave it out of the JSON: a record without the newer signals
/// writes what it wrote before they existed.
pub(crate) fn is_nan_f32(x: &f32) -> bool {
    x.is_nan()
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
