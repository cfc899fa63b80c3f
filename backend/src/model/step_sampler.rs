//! [`StepSampler`]: the tokens of a step, from what the runner returned — logits for the host
//! sampler (already edited by the processors), or tokens the device already chose — including
//! the verification of speculative drafts and the log-probabilities asked for.
//!
//! Every draw is the counter-based `sampler::uniform(seed, output index)`, as on the GPU, so a
//! seeded request reproduces whatever batches it shared, and a draft is verified by sampling
//! its position as plain decoding would and keeping the draft when they agree: with n-gram
//! drafts (a point mass) that is exact speculative sampling, accepting with p(draft), and the
//! output does not depend on whether speculation ran.

use super::runner::StepOutput;
use crate::sampler;
use crate::scheduler::{SampledSeq, SchedulerOutput};

#[derive(Debug, Default)]
pub struct StepSampler;

impl StepSampler {
    pub fn new() -> Self {
        StepSampler
    }

    /// One [`SampledSeq`] per scheduled entry of `out`: empty for chunks that sample nothing;
    /// for a verification entry the drafts the model agrees with, then one token of its own.
    pub fn sample(&mut self, out: &SchedulerOutput, step: &StepOutput) -> Vec<SampledSeq> {
        let mut row = 0;
        let mut sampled = Vec::with_capacity(out.scheduled.len());
        for sc in &out.scheduled {
            if !sc.sample {
                sampled.push(SampledSeq::default());
                continue;
            }
            let mut got = SampledSeq::default();
            for j in 0..=sc.drafts.len() {
                let r = row + j;
                let (tok, lp) = match step {
                    StepOutput::Logits(logits) => {
                        let x = logits.row(r);
                        let t =
                            sampler::sample(x, &sc.sampling, sc.seed, (sc.num_output + j) as u64);
                        (t, sc.sampling.logprobs.map(|n| sampler::logprobs(x, t, n)))
                    }
                    StepOutput::Tokens(s) => (s.ids[r], s.logprobs.get(r).cloned().flatten()),
                };
                got.tokens.push(tok);
                got.logprobs.extend(lp);
                if j == sc.drafts.len() || tok != sc.drafts[j] {
                    break;
                }
                got.accepted_drafts += 1;
            }
            row += sc.num_logit_rows();
            sampled.push(got);
        }
        sampled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Logits;
    use crate::sampler::SamplingParams;
    use crate::scheduler::ScheduledSeq;

    fn entry(id: u64, sample: bool, drafts: &[u32]) -> ScheduledSeq {
        ScheduledSeq {
            id,
            num_computed: 4,
            tokens: std::iter::once(1).chain(drafts.iter().copied()).collect(),
            block_table: vec![0],
            sample,
            drafts: drafts.to_vec(),
            sampling: SamplingParams::greedy(),
            seed: 0,
            num_output: 0,
            edits: Vec::new(),
        }
    }

    /// One-hot rows over a vocabulary of 8.
    fn logits(tops: &[u32]) -> StepOutput {
        let mut data = vec![0.0; tops.len() * 8];
        for (r, &t) in tops.iter().enumerate() {
            data[r * 8 + t as usize] = 5.0;
        }
        StepOutput::Logits(Logits {
            rows: tops.len(),
            vocab: 8,
            data,
        })
    }

    #[test]
    fn drafts_are_kept_up_to_the_first_disagreement() {
        let out = SchedulerOutput {
            scheduled: vec![
                entry(1, false, &[]),
                entry(2, true, &[]),
                entry(3, true, &[4, 5, 6]),
                entry(4, true, &[2, 2]),
            ],
            ..Default::default()
        };
        // Rows: request 2's one, request 3's four (agrees on 4 and 5, not 6), request 4's three
        // (all agree: the bonus token follows).
        let step = logits(&[7, 4, 5, 1, 3, 2, 2, 6]);
        let mut s = StepSampler::new();
        let got = s.sample(&out, &step);
        assert_eq!(got[0], SampledSeq::default());
        assert_eq!(got[1].tokens, vec![7]);
        assert_eq!(
            (got[2].tokens.clone(), got[2].accepted_drafts),
            (vec![4, 5, 1], 2)
        );
        assert_eq!(
            (got[3].tokens.clone(), got[3].accepted_drafts),
            (vec![2, 2, 6], 2)
        );
        // Tokens chosen on the device are verified the same way.
        let got = s.sample(
            &out,
            &StepOutput::Tokens(crate::device::DeviceSample {
                ids: vec![7, 4, 0, 0, 0, 2, 3, 3],
                logprobs: vec![None; 8],
            }),
        );
        assert_eq!(
            (got[2].tokens.clone(), got[2].accepted_drafts),
            (vec![4, 0], 1)
        );
        assert_eq!(
            (got[3].tokens.clone(), got[3].accepted_drafts),
            (vec![2, 3], 1)
        );
    }
}
