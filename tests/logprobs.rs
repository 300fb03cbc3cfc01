//! Log-probabilities of generated tokens: each one the model's (the teacher-forced score of the
//! same sequence agrees within 1e-4), the greedy token the most likely one, the same through the
//! scheduler and with prompt-lookup drafts.

mod common;

use common::{fixtures, gpu};
use moestream::ops::WeightFormat;
use moestream::runtime::drafts::PromptLookup;
use moestream::runtime::{Engine, EngineOptions, GenerateOptions, Scheduler};

#[test]
fn generated_logprobs_are_the_models() {
    for fixture in ["qwen3_moe", "qwen3_next", "deepseek_v3"] {
        let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with(fixture)).unwrap();
        let e = Engine::load_on(gpu(), &EngineOptions::new(&dir).with_format(WeightFormat::F32)).unwrap();
        let prompt = golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens.clone();
        let options = GenerateOptions { max_tokens: 8, ignore_eos: true, logprobs: Some(3), ..Default::default() };
        let g = e.generate(&prompt, &options, |_, _| true).unwrap();
        assert_eq!(g.logprobs.len(), g.tokens.len());
        let sequence = [prompt.clone(), g.tokens.clone()].concat();
        let scored = e.score(&sequence).unwrap().logprobs;
        for (i, lp) in g.logprobs.iter().enumerate() {
            assert_eq!(lp.id, g.tokens[i]);
            assert_eq!(lp.top.len(), 3);
            assert_eq!(lp.top[0].0, lp.id, "{fixture}: greedy takes the most likely token");
            assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
            let want = scored[prompt.len() - 1 + i];
            assert!((lp.logprob - want).abs() < 1e-4, "{fixture} token {i}: {} vs scored {want}", lp.logprob);
        }
        // Without the option, none; with drafts and through the scheduler, the same figures.
        assert!(e
            .generate(&prompt, &GenerateOptions { logprobs: None, ..options.clone() }, |_, _| true)
            .unwrap()
            .logprobs
            .is_empty());
        let drafted = GenerateOptions { drafts: Some(PromptLookup::default()), ..options.clone() };
        let d = e.generate(&[prompt.clone(), prompt.clone()].concat(), &drafted, |_, _| true).unwrap();
        let plain = e.generate(&[prompt.clone(), prompt.clone()].concat(), &options, |_, _| true).unwrap();
        assert_eq!(d.tokens, plain.tokens);
        for (a, b) in d.logprobs.iter().zip(&plain.logprobs) {
            assert!(a.id == b.id && (a.logprob - b.logprob).abs() < 1e-4, "{fixture}: drafted {a:?} vs {b:?}");
        }
        let mut seen = Vec::new();
        let mut s = Scheduler::new(&e, 2).unwrap();
        s.submit(
            prompt.clone(),
            options.clone(),
            Box::new(|_, _, lp| {
                seen.push(lp.cloned());
                true
            }),
        )
        .unwrap();
        let f = s.run().unwrap().pop().unwrap().result.unwrap();
        drop(s);
        assert_eq!(f.tokens, g.tokens);
        for ((a, b), s) in f.logprobs.iter().zip(&g.logprobs).zip(&seen) {
            assert!(a.id == b.id && (a.logprob - b.logprob).abs() < 1e-4);
            assert_eq!(s.as_ref(), Some(a), "the callback saw each token's log-probabilities");
        }
        // The prompt's log-probabilities (echo), through the scheduler: the teacher-forced score.
        let echo = GenerateOptions { max_tokens: 0, prompt_logprobs: true, ..options.clone() };
        let mut s = Scheduler::new(&e, 2).unwrap();
        s.submit(prompt.clone(), echo.clone(), Box::new(|_, _, _| true)).unwrap();
        let f = s.run().unwrap().pop().unwrap().result.unwrap();
        drop(s);
        let scored = e.score(&prompt).unwrap().logprobs;
        assert_eq!(f.prompt_logprobs.len(), prompt.len() - 1);
        assert!(f.tokens.is_empty());
        for (i, lp) in f.prompt_logprobs.iter().enumerate() {
            assert_eq!(lp.id, prompt[i + 1]);
            assert!(
                (lp.logprob - scored[i]).abs() < 1e-4,
                "{fixture}: prompt token {i}: {} vs {}",
                lp.logprob,
                scored[i]
            );
        }
        assert!(e.generate(&prompt, &echo, |_, _| true).is_err(), "generate refuses prompt log-probabilities by name");
        let too_many = GenerateOptions { logprobs: Some(21), ..options.clone() };
        assert!(e.generate(&prompt, &too_many, |_, _| true).is_err());
    }
}
