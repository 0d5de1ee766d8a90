//! HNSW against exact search: recall@10 ≥ 0.98 on 10,000 clustered 384-wide unit vectors (the
//! shape of MiniLM chunk embeddings), and the graph survives a round trip through its bytes.
//! (On real MiniLM embeddings the corpus benchmark reports it too.)

use super::{exact_search, HnswIndex};

/// Unit vectors shaped like sentence embeddings: topic clusters in a 32-dimensional latent
/// space, projected to `dim` dimensions, plus a little isotropic noise.
fn clustered(n: usize, dim: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut s = seed | 1;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    const LATENT: usize = 32;
    // The same projection and centres for every call (fixed seeds), whatever `seed` picks.
    let mut fixed = {
        let mut f = 0x5eed_u64;
        move || {
            f ^= f << 13;
            f ^= f >> 7;
            f ^= f << 17;
            (f >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    };
    let projection: Vec<Vec<f32>> = (0..dim)
        .map(|_| (0..LATENT).map(|_| fixed()).collect())
        .collect();
    let centers: Vec<Vec<f32>> = (0..100)
        .map(|_| (0..LATENT).map(|_| fixed()).collect())
        .collect();
    (0..n)
        .map(|_| {
            let c = &centers[((rnd() + 1.0) * 50.0) as usize % centers.len()];
            let z: Vec<f32> = c.iter().map(|x| x + 0.5 * rnd()).collect();
            let v: Vec<f32> = projection
                .iter()
                .map(|row| row.iter().zip(&z).map(|(a, b)| a * b).sum::<f32>() + 0.3 * rnd())
                .collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter().map(|x| x / norm).collect()
        })
        .collect()
}

#[test]
fn hnsw_recall_at_10_is_at_least_098_of_exact_on_10k() {
    let vectors = clustered(10_000, 384, 42);
    let index = HnswIndex::build(&vectors);
    let index = HnswIndex::from_bytes(&index.to_bytes().unwrap()).unwrap();
    let queries = clustered(200, 384, 7);
    let mut found = 0;
    for q in &queries {
        let exact: Vec<usize> = exact_search(&vectors, q, 10)
            .iter()
            .map(|h| h.index)
            .collect();
        let approx: Vec<usize> = index
            .search(&vectors, q, 10)
            .iter()
            .map(|h| h.index)
            .collect();
        found += exact.iter().filter(|i| approx.contains(i)).count();
    }
    let recall = found as f64 / (10 * queries.len()) as f64;
    eprintln!("hnsw recall@10 over {} queries: {recall:.4}", queries.len());
    assert!(recall >= 0.98, "recall@10 {recall}");
}
