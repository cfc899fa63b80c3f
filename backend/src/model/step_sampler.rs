//! [`StepSampler`]: the tokens of a step, from what the runner returned — logits for the host
//! sampler, or tokens the device already chose — including the verification of speculative
//! drafts. It owns each request's random generator (seeded once, advanced by every host draw),
//! so a seeded request reproduces whatever batches it shared.

use std::collections::HashMap;

use super::runner::StepOutput;
use crate::rng::Rng;
use crate::sampler;
use crate::scheduler::{RequestId, SampledSeq, SchedulerOutput};
use crate::spec::verify_draft;

#[derive(Debug, Default)]
pub struct StepSampler {
    rngs: HashMap<RequestId, Rng>,
}

impl StepSampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets a finished request's generator.
    pub fn remove(&mut self, id: RequestId) {
        self.rngs.remove(&id);
    }

    /// One [`SampledSeq`] per scheduled entry of `out`: empty for chunks that sample nothing;
    /// for a verification entry the drafts the model agrees with (greedy: its argmax; sampled,
    /// on the host: accepted with p(draft), else a draw from p without it), then one token of
    /// its own.
    pub fn sample(&mut self, out: &SchedulerOutput, step: &StepOutput) -> Vec<SampledSeq> {
        let mut row = 0;
        let mut sampled = Vec::with_capacity(out.scheduled.len());
        for sc in &out.scheduled {
            if !sc.sample {
                sampled.push(SampledSeq::default());
                continue;
            }
            let rng = self.rngs.entry(sc.id).or_insert_with(|| Rng::new(sc.seed));
            let mut got = SampledSeq::default();
            for j in 0..=sc.drafts.len() {
                let (tok, ok) = match step {
                    StepOutput::Logits(logits) if j < sc.drafts.len() => {
                        verify_draft(logits.row(row + j), &sc.sampling, sc.drafts[j], rng)
                    }
                    StepOutput::Logits(logits) => (
                        sampler::sample(logits.row(row + j), &sc.sampling, rng),
                        false,
                    ),
                    StepOutput::Tokens(ids) => (
                        ids[row + j],
                        j < sc.drafts.len() && ids[row + j] == sc.drafts[j],
                    ),
                };
                got.tokens.push(tok);
                if !ok {
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
        let got = s.sample(&out, &StepOutput::Tokens(vec![7, 4, 0, 0, 0, 2, 3, 3]));
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
