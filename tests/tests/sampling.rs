//! Token selection against the host sampler's distribution: on the CPU (host sampler) and, in
//! the `::cuda` variant (`--ignored` on a GPU), the GPU sampling kernel (greedy, temperature,
//! top-k, top-p, seeded).

use cachet_backend::device::cpu::CpuDevice;
use cachet_backend::device::cuda::CudaDevice;
use cachet_backend::device::{Device, RowSampling};
use cachet_backend::loader::HostTensor;
use cachet_backend::rng::Rng;
use cachet_backend::sampler::{self, SamplingParams};
use cachet_tests::DeviceKind;

const LOGITS: [f32; 8] = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 2.5];
const ROWS: usize = 8192;

fn draw<D: Device>(dev: &D, p: &SamplingParams, seed: u64) -> Vec<u32> {
    let data: Vec<f32> = (0..ROWS).flat_map(|_| LOGITS).collect();
    let t = dev
        .upload_table(&HostTensor::new(vec![ROWS, LOGITS.len()], data))
        .unwrap();
    let rows: Vec<RowSampling> = (0..ROWS as u64)
        .map(|step| RowSampling {
            temperature: p.temperature,
            top_k: p.top_k as i32,
            top_p: p.top_p,
            pad: 0,
            seed,
            step,
        })
        .collect();
    match dev.sample(&t, &rows).unwrap() {
        Some(ids) => ids,
        None => (0..ROWS as u64)
            .map(|step| {
                sampler::sample(&LOGITS, p, &mut Rng::new(seed ^ step.wrapping_mul(0x9E37)))
            })
            .collect(),
    }
}

fn check<D: Device>(dev: &D) {
    let cases = [
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
        },
        SamplingParams {
            temperature: 0.7,
            top_k: 0,
            top_p: 1.0,
            seed: None,
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
            seed: None,
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.8,
            seed: None,
        },
        SamplingParams {
            temperature: 1.3,
            top_k: 5,
            top_p: 0.9,
            seed: None,
        },
    ];
    for p in &cases {
        let ids = draw(dev, p, 42);
        assert_eq!(ids, draw(dev, p, 42), "{p:?}: same seed, same draws");
        let want = if p.is_greedy() {
            vec![(7u32, 1.0f32)]
        } else {
            sampler::distribution(&LOGITS, p)
        };
        for (id, prob) in &want {
            let f = ids.iter().filter(|&&x| x == *id).count() as f32 / ROWS as f32;
            assert!(
                (f - prob).abs() < 0.025,
                "{p:?}: token {id} drawn {f:.3}, expected {prob:.3}"
            );
        }
        assert!(
            ids.iter().all(|x| want.iter().any(|w| w.0 == *x)),
            "{p:?}: a token outside the kept set"
        );
    }
}

cachet_tests::device_test! {
    fn sampling_follows_the_distribution_and_reproduces(dev) {
        match dev {
            DeviceKind::Cuda => check(&CudaDevice::new(0, 16, Default::default()).unwrap()),
            _ => check(&CpuDevice::new()),
        }
    }
}
