//! Penalties through the engine: greedy generation with presence and frequency penalties picks,
//! at every step, the argmax of the next-token log-probs (which differ from the logits by a
//! constant, so additive penalties rank them alike) minus the penalties over the last
//! `last_n` tokens; a repetition penalty takes the logits path and ends the bundled model's
//! greedy loop; bad values are refused before anything runs.

use std::path::PathBuf;

use moestream::runtime::penalties::Penalties;
use moestream::runtime::{Engine, EngineOptions, GenerateOptions, SamplingParams};

fn bundled() -> Engine {
    Engine::load(&EngineOptions::new(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/moestream-tiny-moe")))
        .unwrap()
}

fn generate(e: &Engine, prompt: &[u32], penalties: Penalties, n: usize) -> Vec<u32> {
    let sampling = SamplingParams { penalties, ..Default::default() };
    let options = GenerateOptions { max_tokens: n, sampling, ignore_eos: true, ..Default::default() };
    e.generate(prompt, &options, |_, _| true).unwrap().tokens
}

#[test]
fn additive_penalties_pick_the_penalised_argmax_at_every_step() {
    let e = bundled();
    let prompt = e.encode("The history of").unwrap();
    let penalties = Penalties { repeat: 1.0, last_n: 8, presence: 0.7, frequency: 0.4 };
    let got = generate(&e, &prompt, penalties, 12);
    let mut context = prompt.clone();
    for (i, &token) in got.iter().enumerate() {
        let mut lp = e.next_logprobs(&context).unwrap();
        penalties.apply(&mut lp, &context, &mut Vec::new());
        let best = (0..lp.len()).max_by(|&a, &b| lp[a].total_cmp(&lp[b]).then(b.cmp(&a))).unwrap() as u32;
        assert_eq!(token, best, "step {i}: {got:?}");
        context.push(token);
    }
    // The penalties changed the reply.
    assert_ne!(got, generate(&e, &prompt, Penalties::default(), 12));
}

#[test]
fn a_repetition_penalty_ends_the_greedy_loop() {
    let e = bundled();
    let prompt = e.encode("The history of").unwrap();
    let distinct = |t: &[u32]| t.iter().collect::<std::collections::HashSet<_>>().len();
    let plain = generate(&e, &prompt, Penalties::default(), 64);
    let penalised = generate(&e, &prompt, Penalties { repeat: 1.3, ..Default::default() }, 64);
    assert!(
        distinct(&penalised) > distinct(&plain),
        "{} vs {} distinct tokens",
        distinct(&penalised),
        distinct(&plain)
    );
}

#[test]
fn bad_penalties_are_refused_before_anything_runs() {
    let e = bundled();
    for penalties in
        [Penalties { repeat: 0.0, ..Default::default() }, Penalties { presence: 2.5, ..Default::default() }]
    {
        let options = GenerateOptions {
            max_tokens: 4,
            sampling: SamplingParams { penalties, ..Default::default() },
            ignore_eos: true,
            ..Default::default()
        };
        let err = e.generate(&[1, 2, 3], &options, |_, _| panic!("no token before the check")).unwrap_err();
        assert!(err.to_string().contains("penalty"), "{err}");
    }
}
