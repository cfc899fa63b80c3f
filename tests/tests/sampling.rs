//! Token selection, logits processors and log-probabilities against the host sampler: on the
//! CPU (the host sampler itself) and, in the `::cuda` variants (`--ignored` on a GPU), the GPU
//! kernels — the same draws for the same (seed, step), the same edits, the same log-softmax.

use cachet_backend::device::cpu::CpuDevice;
use cachet_backend::device::cuda::CudaDevice;
use cachet_backend::device::{Device, LogitEdits, RowSampling};
use cachet_backend::loader::HostTensor;
use cachet_backend::rng::Rng;
use cachet_backend::sampler::{self, SamplingParams, TokenHistory};
use cachet_tests::DeviceKind;

const LOGITS: [f32; 8] = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 2.5];
const ROWS: usize = 8192;

/// Output tokens `0..ROWS` of a request seeded `seed`, one per row: on the device when it
/// samples, else on the host.
fn draw<D: Device>(dev: &D, p: &SamplingParams, seed: u64) -> Vec<u32> {
    let data: Vec<f32> = (0..ROWS).flat_map(|_| LOGITS).collect();
    let t = dev
        .upload_table(&HostTensor::new(vec![ROWS, LOGITS.len()], data))
        .unwrap();
    let rows: Vec<RowSampling> = (0..ROWS as u64)
        .map(|step| RowSampling::new(p, seed, step))
        .collect();
    match dev.sample(&t, &rows, &vec![-1; ROWS]).unwrap() {
        Some(s) => s.ids,
        None => host_draw(p, seed),
    }
}

fn host_draw(p: &SamplingParams, seed: u64) -> Vec<u32> {
    (0..ROWS as u64)
        .map(|step| sampler::sample(&LOGITS, p, seed, step))
        .collect()
}

fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        ..Default::default()
    }
}

fn check_draws<D: Device>(dev: &D) {
    let cases = [
        params(0.0, 0, 1.0, 0.0),
        params(0.7, 0, 1.0, 0.0),
        params(1.0, 3, 1.0, 0.0),
        params(1.0, 0, 0.8, 0.0),
        params(1.3, 5, 0.9, 0.0),
        params(1.0, 0, 1.0, 0.3),
        params(1.2, 6, 0.95, 0.1),
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
        // The device draws what the host sampler draws for the same (seed, step): only a
        // uniform number within float rounding of a boundary may fall the other way.
        let host = host_draw(p, 42);
        let differ = ids.iter().zip(&host).filter(|(a, b)| a != b).count();
        assert!(
            differ <= ROWS / 500,
            "{p:?}: {differ} of {ROWS} draws differ from the host's"
        );
    }
}

/// Sampling over a real vocabulary (SmolLM2's 49152, random logits): the device's fast path
/// (candidates in shared memory) and its full path draw what the host draws for the same
/// (seed, step), for top-k, top-p, both, min-p, and a flat row that overflows the candidates.
fn check_vocab_draws<D: Device>(dev: &D) {
    let vocab = 49_152;
    let rows = 512;
    for (scale, p) in [
        (3.0, params(1.0, 50, 1.0, 0.0)),
        (3.0, params(0.8, 0, 0.9, 0.0)),
        (3.0, params(1.2, 40, 0.95, 0.0)),
        (3.0, params(1.0, 0, 0.95, 0.05)),
        // Nearly flat: thousands of tokens within a hair of the max.
        (0.01, params(1.0, 0, 0.5, 0.0)),
    ] {
        let row: Vec<f32> = vocab_logits(1, vocab)
            .iter()
            .map(|x| x * scale / 3.0)
            .collect();
        let data: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
        let t = dev
            .upload_table(&HostTensor::new(vec![rows, vocab], data))
            .unwrap();
        let plan: Vec<RowSampling> = (0..rows as u64)
            .map(|step| RowSampling::new(&p, 7, step))
            .collect();
        let s = dev
            .sample(&t, &plan, &vec![-1; rows])
            .unwrap()
            .expect("a device that samples");
        let kept: std::collections::HashSet<u32> = sampler::distribution(&row, &p)
            .iter()
            .map(|x| x.0)
            .collect();
        let mut differ = 0;
        for (step, &id) in s.ids.iter().enumerate() {
            assert!(
                kept.contains(&id),
                "{p:?}: token {id} is outside the kept set"
            );
            differ += (id != sampler::sample(&row, &p, 7, step as u64)) as usize;
        }
        assert!(
            differ <= rows / 100,
            "{p:?} (scale {scale}): {differ} of {rows} draws differ from the host's"
        );
    }
}

/// Random logits over a real vocabulary size, with a few ties.
fn vocab_logits(rows: usize, vocab: usize) -> Vec<f32> {
    let mut rng = Rng::new(5);
    let mut v: Vec<f32> = (0..rows * vocab)
        .map(|_| 3.0 * rng.normal() as f32)
        .collect();
    for r in 0..rows {
        v[r * vocab + 17] = 9.0;
        v[r * vocab + 4001] = 9.0;
    }
    v
}

fn check_edits_and_logprobs<D: Device>(dev: &D) {
    let (rows, vocab) = (6, 49_152);
    let host = vocab_logits(rows, vocab);
    let mut t = dev
        .upload_table(&HostTensor::new(vec![rows, vocab], host.clone()))
        .unwrap();
    // Every processor on row 1, a ban on row 4, nothing elsewhere.
    let p = SamplingParams {
        presence_penalty: 0.5,
        frequency_penalty: 0.3,
        repetition_penalty: 1.3,
        logit_bias: vec![(17, -100.0), (30, 7.5)],
        min_tokens: 9,
        ..Default::default()
    };
    let mut h = TokenHistory::new(&p, &[3, 4, 5, 17]);
    for tok in [5, 5, 6, 40_000] {
        h.push(tok);
    }
    let row1 = sampler::row_edits(&p, &h, &[7], &[2]);
    let row4 = sampler::row_edits(
        &SamplingParams {
            min_tokens: 1,
            ..Default::default()
        },
        &TokenHistory::default(),
        &[],
        &[4001, 17],
    );
    let mut edits = LogitEdits::default();
    edits.push_row(1, &row1);
    edits.push_row(4, &row4);
    dev.edit_logits(&mut t, &edits).unwrap();
    let mut want = host.clone();
    sampler::apply_edits(&mut want[vocab..2 * vocab], &row1);
    sampler::apply_edits(&mut want[4 * vocab..5 * vocab], &row4);
    assert_eq!(
        dev.to_host(&t).unwrap(),
        want,
        "edits on the device = on the host"
    );
    // Greedy rows with log-probabilities: the chosen token and the top 20 against the host's
    // log-softmax; row 4's banned maxima are passed over.
    let greedy = vec![RowSampling::greedy(); rows];
    let want_lp = [20, 0, -1, 5, 20, 3];
    if let Some(s) = dev.sample(&t, &greedy, &want_lp).unwrap() {
        for r in 0..rows {
            let x = &want[r * vocab..(r + 1) * vocab];
            assert_eq!(s.ids[r], sampler::argmax(x), "row {r}");
            let Some(got) = &s.logprobs[r] else {
                assert_eq!(want_lp[r], -1, "row {r} asked for logprobs");
                continue;
            };
            let exp = sampler::logprobs(x, s.ids[r], want_lp[r] as usize);
            assert_eq!(got.token, exp.token);
            assert!(
                (got.logprob - exp.logprob).abs() < 1e-4,
                "row {r}: {got:?} vs {exp:?}"
            );
            assert_eq!(
                got.top.iter().map(|x| x.0).collect::<Vec<_>>(),
                exp.top.iter().map(|x| x.0).collect::<Vec<_>>(),
                "row {r}: the top alternatives (ties by lowest id)"
            );
            for (a, b) in got.top.iter().zip(&exp.top) {
                assert!((a.1 - b.1).abs() < 1e-4, "row {r}: {a:?} vs {b:?}");
            }
        }
        assert_ne!(s.ids[4], 17);
        assert_ne!(s.ids[4], 4001);
    }
}

cachet_tests::device_test! {
    fn sampling_follows_the_distribution_and_reproduces(dev) {
        match dev {
            DeviceKind::Cuda => check_draws(&CudaDevice::new(0, 16, Default::default()).unwrap()),
            _ => check_draws(&CpuDevice::new()),
        }
    }
}

cachet_tests::device_test! {
    fn processors_and_logprobs_match_the_host(dev) {
        match dev {
            DeviceKind::Cuda => {
                check_edits_and_logprobs(&CudaDevice::new(0, 16, Default::default()).unwrap())
            }
            _ => check_edits_and_logprobs(&CpuDevice::new()),
        }
    }
}

cachet_tests::gpu_test! {
    /// The GPU sampler over a real vocabulary against the host sampler (the CPU device samples
    /// on the host: nothing to compare there).
    fn large_vocabulary_draws_match_the_host() {
        check_vocab_draws(&CudaDevice::new(0, 16, Default::default()).unwrap());
    }
}
