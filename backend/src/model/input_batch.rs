//! The runner's side of a step: a [`SchedulerOutput`] turned into the device's varlen
//! [`ForwardBatch`] and its [`StepPlan`] — one [`RowSampling`] per logits row, the processors'
//! edits flattened, the log-probabilities wanted (after vLLM v1's input batch). The scheduler
//! plans; this file lays its plan out for the device.

use crate::device::{ForwardBatch, RowSampling, StepPlan};
use crate::scheduler::SchedulerOutput;

/// The forward batch for a step, in `out.scheduled` order, and what each logits row does. A
/// verification entry asks for logits at its last known token and at every draft; other
/// sampling entries at their last token.
pub fn build(out: &SchedulerOutput, block_size: usize) -> (ForwardBatch, StepPlan) {
    let mut b = ForwardBatch::default();
    let mut plan = StepPlan::default();
    for sc in &out.scheduled {
        let start = b.num_tokens() as u32;
        let verify = !sc.drafts.is_empty();
        b.push_seq(
            &sc.tokens,
            sc.num_computed,
            &sc.block_table,
            block_size,
            sc.sample && !verify,
        );
        if verify {
            b.logit_rows.extend(start..start + sc.tokens.len() as u32);
        }
        for j in 0..sc.num_logit_rows() {
            if let Some(e) = sc.edits.get(j) {
                plan.edits.push_row(plan.rows.len(), e);
            }
            plan.rows.push(RowSampling::new(
                &sc.sampling,
                sc.seed,
                (sc.num_output + j) as u64,
            ));
            plan.logprobs
                .push(sc.sampling.logprobs.map_or(-1, |n| n as i32));
        }
    }
    (b, plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SamplingParams;
    use crate::scheduler::ScheduledSeq;

    fn entry(id: u64, num_computed: usize, tokens: &[u32], drafts: &[u32]) -> ScheduledSeq {
        ScheduledSeq {
            id,
            num_computed,
            tokens: tokens.to_vec(),
            block_table: vec![7, 3, 9],
            sample: true,
            drafts: drafts.to_vec(),
            sampling: SamplingParams {
                temperature: 0.5,
                top_k: 4,
                top_p: 0.9,
                seed: Some(11),
                logprobs: Some(3),
                ..Default::default()
            },
            seed: 11,
            num_output: 2,
            edits: Vec::new(),
        }
    }

    #[test]
    fn a_step_lays_out_prefill_decode_and_verification_rows() {
        let mut prefill = entry(1, 0, &[5, 6, 7], &[]);
        prefill.sample = false;
        let mut out = SchedulerOutput {
            scheduled: vec![
                prefill,
                entry(2, 17, &[8], &[]),
                entry(3, 20, &[9, 10, 11], &[10, 11]),
            ],
            preempted: vec![],
            num_batched_tokens: 7,
        };
        let mut verify = entry(3, 20, &[9, 10, 11], &[10, 11]);
        let edit = |token| crate::sampler::TokenEdit {
            token,
            pos: 1.0,
            neg: 1.0,
            add: -1.0,
        };
        verify.edits = vec![vec![], vec![edit(4)], vec![edit(5), edit(6)]];
        out.scheduled[2] = verify;
        let (b, plan) = build(&out, 16);
        let rows = &plan.rows;
        assert_eq!(b.token_ids, vec![5, 6, 7, 8, 9, 10, 11]);
        assert_eq!(b.positions, vec![0, 1, 2, 17, 20, 21, 22]);
        // Position 17 is in the table's second block (3): slot 3·16 + 1.
        assert_eq!(b.slot_mapping, vec![112, 113, 114, 49, 52, 53, 54]);
        // The prefill chunk samples nothing; the decode row its one token; the verification
        // step every position.
        assert_eq!(b.logit_rows, vec![3, 4, 5, 6]);
        assert_eq!(rows.len(), 4);
        assert_eq!(
            rows.iter().map(|r| r.step).collect::<Vec<_>>(),
            vec![2, 2, 3, 4]
        );
        assert!(rows
            .iter()
            .all(|r| r.seed == 11 && r.top_k == 4 && r.temperature == 0.5));
        assert_eq!(plan.logprobs, vec![3; 4]);
        // The verification entry's edits land on its second and third rows (batch rows 2, 3).
        assert_eq!(plan.edits.row, vec![2, 3, 3]);
        assert_eq!(plan.edits.token, vec![4, 5, 6]);
    }
}
