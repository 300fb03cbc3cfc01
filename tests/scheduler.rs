//! The runtime's [`Scheduler`]: requests of different lengths run together (joining when a slot
//! frees, leaving when done, long prompts prefilled in chunks beside the others' decode tokens)
//! each get the tokens they get alone; a slot's sequence is reused by the next request sharing
//! its prefix; cancellation ends one request without touching the others.

mod common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use common::{fixtures, gpu};
use moestream::ops::WeightFormat;
use moestream::runtime::drafts::PromptLookup;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions, SamplingParams, Scheduler};

fn engine(fixture: &str, max_batch: usize, budget: ExpertBudget) -> (Engine, Vec<u32>) {
    let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with(fixture)).unwrap();
    let mut o = EngineOptions::new(&dir).with_format(WeightFormat::F32);
    o.max_batch = max_batch;
    o.budget = budget;
    let prompt = golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens.clone();
    (Engine::load_on(gpu(), &o).unwrap(), prompt)
}

/// Four requests cut from `prompt`: different lengths and token limits, one sampled with a seed.
fn requests(prompt: &[u32]) -> Vec<(Vec<u32>, GenerateOptions)> {
    let greedy = |max_tokens| GenerateOptions { max_tokens, ignore_eos: true, ..Default::default() };
    let sampled = GenerateOptions {
        sampling: SamplingParams { temperature: 0.8, top_p: 0.95, seed: 7, ..SamplingParams::default() },
        ..greedy(6)
    };
    let mut long = prompt.to_vec();
    long.extend_from_slice(prompt);
    long.extend_from_slice(&prompt[..3]);
    vec![
        (prompt.to_vec(), greedy(8)),
        (prompt[..prompt.len() - 2].to_vec(), greedy(3)),
        (long, greedy(6)),
        (prompt[1..].to_vec(), sampled),
    ]
}

/// Each request alone through `generate`.
fn solo(e: &Engine, reqs: &[(Vec<u32>, GenerateOptions)]) -> Vec<Vec<u32>> {
    reqs.iter().map(|(p, o)| e.generate(p, o, |_, _| true).unwrap().tokens).collect()
}

/// The requests through a scheduler of `parallel` slots, all submitted at once; each one's
/// tokens, and the tokens its callback saw.
fn scheduled(e: &Engine, parallel: usize, reqs: &[(Vec<u32>, GenerateOptions)]) -> Vec<Vec<u32>> {
    let mut s = Scheduler::new(e, parallel).unwrap();
    let seen: Rc<RefCell<HashMap<u64, Vec<u32>>>> = Rc::default();
    let ids: Vec<u64> = reqs
        .iter()
        .map(|(p, o)| {
            let seen = seen.clone();
            let id = Rc::new(RefCell::new(0u64));
            let own = id.clone();
            let submitted = s
                .submit(
                    p.clone(),
                    o.clone(),
                    Box::new(move |t, _, _| {
                        seen.borrow_mut().entry(*own.borrow()).or_default().push(t);
                        true
                    }),
                )
                .unwrap();
            *id.borrow_mut() = submitted;
            submitted
        })
        .collect();
    let finished = s.run().unwrap();
    assert_eq!(finished.len(), reqs.len());
    let mut by_id: HashMap<u64, Vec<u32>> = finished.into_iter().map(|f| (f.id, f.result.unwrap().tokens)).collect();
    ids.iter()
        .map(|id| {
            let tokens = by_id.remove(id).unwrap();
            assert_eq!(seen.borrow().get(id).cloned().unwrap_or_default(), tokens, "callback saw every token");
            tokens
        })
        .collect()
}

#[test]
fn scheduled_requests_get_their_solo_tokens() {
    // A grouped-attention MoE, a hybrid (linear attention states), MLA, attention sinks and
    // windows; max_batch 8 puts the long prompt in chunks beside the other requests' decodes.
    for fixture in ["qwen3_moe", "qwen3_next", "deepseek_v3", "gpt_oss"] {
        let (e, prompt) = engine(fixture, 8, ExpertBudget::Auto);
        let reqs = requests(&prompt);
        let want = solo(&e, &reqs);
        for parallel in [4, 2, 1] {
            // With 2 slots, requests wait and join as others leave.
            assert_eq!(scheduled(&e, parallel, &reqs), want, "{fixture}: {parallel} parallel");
        }
    }
}

#[test]
fn scheduled_requests_with_drafts_get_their_plain_tokens() {
    // Each sequence drafts on its own by prompt lookup in what is left of the step (max_batch 8:
    // drafts compete with the long prompt's chunks) and gets the tokens one token a step gives
    // (greedy: sampling with drafts follows the same distribution, not the same draws), on a
    // grouped-attention MoE, a hybrid (states cut back after rejected drafts), MLA.
    let lookup = Some(PromptLookup { ngram: 3, max_draft: 4 });
    for fixture in ["qwen3_moe", "qwen3_next", "deepseek_v3"] {
        let (e, prompt) = engine(fixture, 8, ExpertBudget::Auto);
        // Repeating prompts, so that lookups find drafts.
        let reqs: Vec<_> = requests(&[&prompt[..], &prompt[..]].concat())
            .into_iter()
            .filter(|(_, o)| o.sampling.temperature == 0.0)
            .map(|(p, o)| (p, GenerateOptions { max_tokens: o.max_tokens + 8, ..o }))
            .collect();
        let want = solo(&e, &reqs);
        let drafted: Vec<_> =
            reqs.iter().map(|(p, o)| (p.clone(), GenerateOptions { drafts: lookup, ..o.clone() })).collect();
        for parallel in [4, 2] {
            assert_eq!(scheduled(&e, parallel, &drafted), want, "{fixture}: {parallel} parallel with drafts");
        }
        let mut s = Scheduler::new(&e, 2).unwrap();
        for (p, o) in &drafted {
            s.submit(p.clone(), o.clone(), Box::new(|_, _, _| true)).unwrap();
        }
        let stats: Vec<_> = s.run().unwrap().into_iter().map(|f| f.result.unwrap().stats).collect();
        let (proposed, accepted) =
            stats.iter().fold((0, 0), |(d, a), s| (d + s.draft_tokens, a + s.accepted_draft_tokens));
        assert!(proposed > 0 && accepted <= proposed, "{fixture}: {proposed} drafted, {accepted} accepted");
    }
}

#[test]
fn scheduled_streaming_at_the_smallest_budget_equals_resident() {
    let (resident, prompt) = engine("mixtral", 64, ExpertBudget::Auto);
    let reqs = requests(&prompt);
    let want = solo(&resident, &reqs);
    drop(resident);
    let top_k = 2;
    let (streamed, _) = engine("mixtral", 64, ExpertBudget::Slots(top_k));
    assert_eq!(scheduled(&streamed, 4, &reqs), want);
    assert!(streamed.expert_stats().expert_misses > 0);
}

#[test]
fn each_scheduled_request_files_its_own_activation_matrix() {
    // Streaming with EAMC: requests run together each get an activation matrix of their own
    // (their rows of every batched step, prompt chunks as prefill, decode tokens as decode),
    // filed when they end, equal to the one each files when it runs alone.
    let filed = |e: &Engine| -> Vec<(Vec<f32>, Vec<f32>)> {
        let r = e.model().residency().unwrap();
        let c = r.cache().unwrap().tracker().collection();
        (0..c.len())
            .map(|i| c.get(i).unwrap())
            .map(|m| (m.prefill.counts().to_vec(), m.decode.counts().to_vec()))
            .collect()
    };
    let (alone, prompt) = engine("mixtral", 64, ExpertBudget::Slots(4));
    let reqs: Vec<_> = requests(&prompt).into_iter().take(3).collect();
    solo(&alone, &reqs);
    let want = filed(&alone);
    assert_eq!(want.len(), 3);
    drop(alone);
    let (together, _) = engine("mixtral", 64, ExpertBudget::Slots(4));
    scheduled(&together, 3, &reqs);
    let got = filed(&together);
    assert_eq!(got.len(), 3, "one matrix per request, not one for the spell");
    for m in &want {
        assert!(got.contains(m), "a request's matrix as alone: {m:?} among {got:?}");
    }
}

#[test]
fn a_slot_keeps_its_sequence_for_the_next_turn() {
    let (e, prompt) = engine("qwen3_moe", 64, ExpertBudget::Auto);
    let mut s = Scheduler::new(&e, 2).unwrap();
    let opts = GenerateOptions { max_tokens: 4, ignore_eos: true, ..Default::default() };
    s.submit(prompt.clone(), opts.clone(), Box::new(|_, _, _| true)).unwrap();
    let first = s.run().unwrap().pop().unwrap().result.unwrap();
    // The next turn: the conversation so far plus new tokens.
    let mut turn = prompt.clone();
    turn.extend_from_slice(&first.tokens);
    turn.extend_from_slice(&[3, 4, 5]);
    s.submit(turn.clone(), opts.clone(), Box::new(|_, _, _| true)).unwrap();
    let second = s.run().unwrap().pop().unwrap().result.unwrap();
    assert_eq!(second.stats.reused_tokens, prompt.len() + first.tokens.len() - 1);
    assert_eq!(second.stats.prefilled_tokens, 4);
    assert_eq!(second.tokens, e.generate(&turn, &opts, |_, _| true).unwrap().tokens);
}

#[test]
fn cancelling_one_request_leaves_the_others_alone() {
    let (e, prompt) = engine("qwen3_moe", 64, ExpertBudget::Auto);
    let opts = GenerateOptions { max_tokens: 10, ignore_eos: true, ..Default::default() };
    let want = e.generate(&prompt, &opts, |_, _| true).unwrap().tokens;
    let mut s = Scheduler::new(&e, 3).unwrap();
    let a = s.submit(prompt.clone(), opts.clone(), Box::new(|_, _, _| true)).unwrap();
    let b = s.submit(prompt[1..].to_vec(), opts.clone(), Box::new(|_, _, _| true)).unwrap();
    // A callback that stops its request after two tokens, and a queued request cancelled.
    let mut count = 0;
    let c = s
        .submit(
            prompt.clone(),
            opts.clone(),
            Box::new(move |_, _, _| {
                count += 1;
                count < 2
            }),
        )
        .unwrap();
    let d = s.submit(prompt.clone(), opts, Box::new(|_, _, _| true)).unwrap();
    assert!(s.cancel(d));
    let mut results: HashMap<u64, Vec<u32>> = HashMap::new();
    for _ in 0..3 {
        for f in s.step().unwrap() {
            results.insert(f.id, f.result.unwrap().tokens);
        }
    }
    assert!(s.cancel(b), "b is running");
    for f in s.run().unwrap() {
        results.insert(f.id, f.result.unwrap().tokens);
    }
    assert_eq!(results[&a], want);
    assert!(results[&b].len() < 10);
    assert_eq!(results[&c].len(), 2);
    assert!(results[&d].is_empty());
    assert!(!s.cancel(a), "a has ended");
}

#[test]
fn bad_requests_are_refused_at_submit() {
    let (e, prompt) = engine("qwen3_moe", 64, ExpertBudget::Auto);
    assert!(Scheduler::new(&e, 0).is_err());
    let mut s = Scheduler::new(&e, 2).unwrap();
    let opts = GenerateOptions::default();
    assert!(s.submit(Vec::new(), opts.clone(), Box::new(|_, _, _| true)).is_err());
    assert!(s.submit(vec![u32::MAX], opts.clone(), Box::new(|_, _, _| true)).is_err());
    assert!(s.submit(vec![1; e.context() + 1], opts.clone(), Box::new(|_, _, _| true)).is_err());
    let bad_drafts = GenerateOptions { drafts: Some(PromptLookup { ngram: 0, max_draft: 4 }), ..opts.clone() };
    assert!(s.submit(prompt.clone(), bad_drafts, Box::new(|_, _, _| true)).is_err());
    let nan = GenerateOptions { sampling: SamplingParams { temperature: f32::NAN, ..Default::default() }, ..opts };
    assert!(s.submit(prompt, nan, Box::new(|_, _, _| true)).is_err());
    assert!(s.is_idle());
}

#[test]
fn n_choices_prefill_once_and_sample_as_alone() {
    for fixture in ["qwen3_moe", "qwen3_next", "deepseek_v3"] {
        let (e, prompt) = engine(fixture, 64, ExpertBudget::Auto);
        let sampled = |seed| GenerateOptions {
            max_tokens: 6,
            ignore_eos: true,
            sampling: SamplingParams { temperature: 1.0, seed, ..SamplingParams::default() },
            ..Default::default()
        };
        // Choice i samples with seed 11 + i, as a request of its own would.
        let want: Vec<Vec<u32>> =
            (0..3).map(|i| e.generate(&prompt, &sampled(11 + i), |_, _| true).unwrap().tokens).collect();
        let mut s = Scheduler::new(&e, 4).unwrap();
        let ids = s.submit_n(prompt.clone(), sampled(11), 3, |_| Box::new(|_, _, _| true)).unwrap();
        let mut got: HashMap<u64, moestream::runtime::Generation> =
            s.run().unwrap().into_iter().map(|f| (f.id, f.result.unwrap())).collect();
        let runs: Vec<_> = ids.iter().map(|id| got.remove(id).unwrap()).collect();
        for (i, g) in runs.iter().enumerate() {
            assert_eq!(g.tokens, want[i], "{fixture}: choice {i}");
            assert_eq!(g.prompt_tokens, prompt);
        }
        // One prefill: the other choices reused the first one's caches.
        assert_eq!(runs[0].stats.prefilled_tokens, prompt.len());
        assert!(runs[1..].iter().all(|g| g.stats.prefilled_tokens == 0 && g.stats.reused_tokens == prompt.len()));
        assert!(
            s.submit_n(prompt.clone(), sampled(1), 5, |_| Box::new(|_, _, _| true)).is_err(),
            "more choices than slots"
        );
    }
}

#[test]
fn batched_steps_build_no_gpu_objects_after_the_first() {
    // Serve's path: once a scheduler's batched steps have run, later ones (other sequence
    // counts, prompt chunks beside decodes, forked choices) create no pipeline, shader, bind
    // group or buffer.
    // A context of its own: the binary's other tests create objects on the shared one.
    let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with("qwen3_moe")).unwrap();
    let mut o = EngineOptions::new(&dir).with_format(WeightFormat::F32);
    o.max_batch = 8;
    let own = moestream::gpu::Gpu::new(&Default::default()).unwrap();
    let e = Engine::load_on(own, &o).unwrap();
    let prompt = golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens.clone();
    let mut s = Scheduler::new(&e, 4).unwrap();
    let run = |s: &mut Scheduler| {
        for (p, o) in requests(&prompt) {
            s.submit(p, o, Box::new(|_, _, _| true)).unwrap();
        }
        s.run().unwrap();
        s.submit_n(prompt.clone(), GenerateOptions { max_tokens: 4, ..Default::default() }, 3, |_| {
            Box::new(|_, _, _| true)
        })
        .unwrap();
        s.run().unwrap();
    };
    run(&mut s);
    let before = e.gpu().objects_created();
    assert!(before.pipelines > 0 && before.buffers > 0, "not counted: {before:?}");
    run(&mut s);
    assert_eq!(e.gpu().objects_created(), before, "GPU objects created after the first batched steps");
}
