//! The fused layer ops (`silu_mul`, `add_rms_norm`/`rms_norm_to`, `rope_and_cache`) and a
//! captured step (`step_graph`) against their references on random inputs, written once for
//! every device: the CPU and, with the `cuda` feature, GPU 0 (where the step is a real CUDA
//! graph, replayed over new inputs).

use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Tensor};
use rand::{rngs::StdRng, Rng, SeedableRng};
use triage_ops::{add_rms_norm, add_rms_norm_slow, rms_norm_to};
use triage_ops::{rope_and_cache, rope_and_cache_slow, QkvShape, RopeInputs};
use triage_ops::{silu_mul, silu_mul_slow};
use triage_ops::{SlotMapping, PADDING_SLOT};
use triage_ops::{StepBuffer, StepGraph};

/// Written once for every device: the CPU and, with the `cuda` feature, GPU 0.
fn devices() -> Vec<Device> {
    let devices = vec![Device::Cpu];
    #[cfg(feature = "cuda")]
    let devices = {
        let mut devices = devices;
        devices.push(
            triage_ops::cuda::open_device(0).expect("the cuda feature's tests need a CUDA device"),
        );
        devices
    };
    devices
}

fn random(rng: &mut StdRng, shape: &[usize], scale: f32) -> Tensor {
    let n = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
    Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
}

/// Largest |a - b| / (1 + |b|), with NaN equal to NaN (unwritten cache slots), both on the CPU.
fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let flat = |t: &Tensor| {
        let t = t
            .to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    };
    let (a, b) = (flat(a), flat(b));
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| match (x.is_nan(), y.is_nan()) {
            (true, true) => 0.0,
            (false, false) => (x - y).abs() / (1.0 + y.abs()),
            _ => f32::INFINITY,
        })
        .fold(0.0, f32::max)
}

/// Per dtype: f32 sums and exps in another order (a GPU's expf is within 2 ulp); f16/bf16 one
/// rounding of each output, which a last-bit difference before it can move by one unit.
const TOLERANCES: [(DType, f32); 3] = [
    (DType::F32, 1e-5),
    (DType::F16, 2e-3),
    (DType::BF16, 1.6e-2),
];

#[test]
fn silu_mul_matches_the_reference_on_every_device() {
    let mut rng = StdRng::seed_from_u64(3);
    let x = random(&mut rng, &[5, 2 * 37], 6.0);
    for dev in devices() {
        for (dtype, tol) in TOLERANCES {
            let x = x.to_dtype(dtype).unwrap();
            let got = silu_mul(&x.to_device(&dev).unwrap()).unwrap();
            assert_eq!((got.dims(), got.dtype()), (&[5, 37][..], dtype));
            let diff = max_diff(&got, &silu_mul_slow(&x).unwrap());
            assert!(diff <= tol, "{dev:?} {dtype:?}: {diff}");
        }
        let odd = random(&mut rng, &[2, 3], 1.0).to_device(&dev).unwrap();
        assert!(silu_mul(&odd).is_err());
    }
}

#[test]
fn add_rms_norm_adds_in_place_and_normalises_on_every_device() {
    let mut rng = StdRng::seed_from_u64(11);
    let (rows, hidden) = (4, 300);
    let weight = random(&mut rng, &[hidden], 2.0);
    for dev in devices() {
        for (dtype, tol) in TOLERANCES {
            let start = random(&mut rng, &[rows, hidden], 3.0);
            let delta = random(&mut rng, &[rows, hidden], 1.0)
                .to_dtype(dtype)
                .unwrap();
            let (want_x, want_h) =
                add_rms_norm_slow(&start, Some(&delta), &weight, 1e-6, dtype).unwrap();
            let on = |t: &Tensor| t.to_device(&dev).unwrap();
            let residual = on(&start).copy().unwrap(); // updated in place: its own storage
            let h = add_rms_norm(&residual, &on(&delta), &on(&weight), 1e-6).unwrap();
            assert_eq!((h.dims(), h.dtype()), (&[rows, hidden][..], dtype));
            assert!(
                max_diff(&residual, &want_x) <= 1e-6,
                "{dev:?} {dtype:?}: the residual"
            );
            let diff = max_diff(&h, &want_h);
            assert!(diff <= tol, "{dev:?} {dtype:?}: {diff}");
            let plain = rms_norm_to(&on(&start), &on(&weight), 1e-6, dtype).unwrap();
            let (_, want) = add_rms_norm_slow(&start, None, &weight, 1e-6, dtype).unwrap();
            assert!(
                max_diff(&plain, &want) <= tol,
                "{dev:?} {dtype:?}: without a delta"
            );
        }
        let x = random(&mut rng, &[2, 8], 1.0).to_device(&dev).unwrap();
        let w = random(&mut rng, &[8], 1.0).to_device(&dev).unwrap();
        let short = random(&mut rng, &[2, 4], 1.0).to_device(&dev).unwrap();
        assert!(add_rms_norm(&x, &short, &w, 1e-6).is_err());
        assert!(add_rms_norm(&x.to_dtype(DType::BF16).unwrap(), &x, &w, 1e-6).is_err());
        assert!(rms_norm_to(&x, &w.narrow(0, 0, 5).unwrap(), 1e-6, DType::F32).is_err());
        assert!(rms_norm_to(&x, &w, 1e-6, DType::U32).is_err());
    }
}

#[test]
fn rope_and_cache_matches_the_reference_and_writes_only_its_slots_on_every_device() {
    let mut rng = StdRng::seed_from_u64(21);
    let (rows, blocks, block_size) = (5, 6, 4);
    for dev in devices() {
        for (dtype, tol) in TOLERANCES {
            for neox in [true, false] {
                let s = QkvShape {
                    num_heads: 6,
                    kv_heads: 2,
                    head_dim: 16,
                    neox,
                };
                let width = (s.num_heads + 2 * s.kv_heads) * s.head_dim;
                let qkv = random(&mut rng, &[rows, width], 2.0)
                    .to_dtype(dtype)
                    .unwrap();
                let bias = random(&mut rng, &[width], 0.5).to_dtype(dtype).unwrap();
                let angles = random(&mut rng, &[rows, s.head_dim / 2], 3.0);
                let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
                let nan = Tensor::full(
                    f32::NAN,
                    (blocks, block_size, s.kv_heads, s.head_dim),
                    &Device::Cpu,
                )
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
                let slot_ids = vec![3, 17, PADDING_SLOT, 0, 22];
                let x = RopeInputs {
                    qkv: &qkv,
                    bias: Some(&bias),
                    cos: &cos,
                    sin: &sin,
                };
                let (want_q, want_k, want_v) =
                    rope_and_cache_slow(x, &nan, &nan, &slot_ids, s).unwrap();
                let on = |t: &Tensor| t.to_device(&dev).unwrap();
                // Fresh storage each: on the CPU `to_device` shares it.
                let (k_cache, v_cache) = (on(&nan).copy().unwrap(), on(&nan).copy().unwrap());
                let (qkv, bias, cos, sin) = (on(&qkv), on(&bias), on(&cos), on(&sin));
                let x = RopeInputs {
                    qkv: &qkv,
                    bias: Some(&bias),
                    cos: &cos,
                    sin: &sin,
                };
                let slots = SlotMapping::new(slot_ids, &dev).unwrap();
                let q = rope_and_cache(x, &k_cache, &v_cache, &slots, s).unwrap();
                assert_eq!((q.dims(), q.dtype()), (&[rows, 6, 16][..], dtype));
                let context = format!("{dev:?} {dtype:?} neox {neox}");
                assert!(
                    max_diff(&q, &want_q) <= tol,
                    "{context}: q {}",
                    max_diff(&q, &want_q)
                );
                assert!(max_diff(&k_cache, &want_k) <= tol, "{context}: k cache");
                assert!(max_diff(&v_cache, &want_v) <= tol, "{context}: v cache");
                let past =
                    SlotMapping::new(vec![0, 1, 2, 3, (blocks * block_size) as u32], &dev).unwrap();
                assert!(
                    rope_and_cache(x, &k_cache, &v_cache, &past, s).is_err(),
                    "{context}"
                );
            }
        }
    }
}

/// A step captured over a step buffer (an embedding lookup of the buffer's ids, `silu_mul`, the
/// result copied into a tensor made before the capture) replays over whatever the buffer holds
/// when it replays: each replay's output is the eager op's on that replay's ids. On a GPU the
/// capture is a CUDA graph and the buffer is written from pinned memory.
#[test]
fn a_captured_step_replays_over_the_buffers_current_inputs_on_every_device() {
    let mut rng = StdRng::seed_from_u64(31);
    let table = random(&mut rng, &[50, 2 * 24], 4.0);
    for dev in devices() {
        let table_on = table.to_device(&dev).unwrap();
        let mut buffer = StepBuffer::new(3, &dev).unwrap();
        buffer.write(&[4, 9, 33]).unwrap();
        let ids = buffer.view(0, 3).unwrap();
        let out = Tensor::zeros((3, 24), DType::F32, &dev).unwrap();
        let (step_table, step_out) = (table_on.clone(), out.clone());
        let runs = Arc::new(Mutex::new(0));
        let counted = Arc::clone(&runs);
        let graph = StepGraph::capture(&dev, move || {
            *counted.lock().unwrap() += 1;
            let rows = step_table.index_select(&ids, 0)?;
            let y = silu_mul(&rows)?;
            step_out.slice_set(&y, 0, 0)?;
            Ok(())
        })
        .unwrap();
        for ids in [[4u32, 9, 33], [0, 49, 7], [12, 12, 1]] {
            buffer.write(&ids).unwrap();
            graph.replay().unwrap();
            let idx = Tensor::new(&ids, &Device::Cpu).unwrap();
            let want = silu_mul_slow(&table.index_select(&idx, 0).unwrap()).unwrap();
            let diff = max_diff(&out, &want);
            assert!(diff <= 1e-5, "{dev:?} ids {ids:?}: {diff}");
        }
        match dev.is_cuda() {
            // Warm-up and capture ran the closure; replays launch the graph.
            true => {
                assert_eq!(*runs.lock().unwrap(), 2);
                assert!(graph.num_nodes().unwrap().is_some_and(|n| n >= 3));
            }
            false => assert_eq!(*runs.lock().unwrap(), 4),
        }
    }
}
