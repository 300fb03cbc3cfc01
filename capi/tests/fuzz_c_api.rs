//! Hostile calls through the C API never panic or abort: seeded proptest mutants of every
//! entry point's arguments (NULL for each handle, string and out-pointer; invalid UTF-8, empty
//! and long strings; out-of-range option constants, contexts and budgets; NaN, infinite and
//! negative sampling parameters; malformed and mutated `messages_json`; token ids outside the
//! vocabulary). The property: a success, or the documented error return with a message from
//! `moestream_last_error()`, never a panic (the boundary's `internal error:` message or a
//! panic seen by the hook). Handles that were freed cannot be detected without undefined
//! behaviour, so they are not tried; a NULL one always is. `MOESTREAM_FUZZ_LONG=1` runs 50×
//! the CI count, `MOESTREAM_FUZZ_CASES=N` exactly N.

use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};

use moestream_c::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use serde_json::{json, Value};

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

fn model_dir() -> CString {
    CString::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/moestream-tiny-moe")).unwrap()
}

/// Mutants per run: `ci`, 50 × `ci` with `MOESTREAM_FUZZ_LONG=1`, or `MOESTREAM_FUZZ_CASES`.
fn runner(name: &str, ci: u32) -> TestRunner {
    let cases = match std::env::var("MOESTREAM_FUZZ_CASES").ok().and_then(|v| v.parse().ok()) {
        Some(n) => n,
        None if std::env::var("MOESTREAM_FUZZ_LONG").as_deref() == Ok("1") => ci * 50,
        None => ci,
    };
    let seed = name.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 50,
        ..Config::default()
    })
}

/// Runs one call: `Ok(true)` when it succeeded, `Ok(false)` when it failed with a message,
/// a failure when it panicked (or failed without saying why). Before the call the last error is
/// set to `options is NULL`, so a failure that leaves it there is caught unless
/// `null_options` (the call passes NULL load options and that is its message).
fn checked(null_options: bool, call: impl FnOnce() -> bool) -> Result<bool, TestCaseError> {
    count_panics();
    let before = PANICS.load(Ordering::SeqCst);
    // A message from an earlier call must not pass for this one's.
    let _ = unsafe { moestream_engine_load(null()) };
    let stale = unsafe { CStr::from_ptr(moestream_last_error()) }.to_owned();
    let ok = call();
    if PANICS.load(Ordering::SeqCst) != before {
        return Err(TestCaseError::fail("panicked"));
    }
    if ok {
        return Ok(true);
    }
    let message = moestream_last_error();
    if message.is_null() {
        return Err(TestCaseError::fail("an error return without moestream_last_error()"));
    }
    let message = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
    if message.starts_with("internal error") {
        return Err(TestCaseError::fail(message));
    }
    if message.is_empty() || (message == stale.to_string_lossy() && !null_options) {
        return Err(TestCaseError::fail(format!("an error return with a stale or empty message: {message:?}")));
    }
    Ok(false)
}

/// A string argument: NULL, valid, empty, invalid UTF-8 or long.
#[derive(Clone, Debug)]
enum Text {
    Null,
    Valid,
    Empty,
    NotUtf8,
    Long,
}

fn texts() -> impl Strategy<Value = Text> {
    prop::sample::select(vec![Text::Null, Text::Valid, Text::Valid, Text::Empty, Text::NotUtf8, Text::Long])
}

/// `valid` as `t` says (owned; NULL is `None`).
fn text(t: &Text, valid: &str) -> Option<CString> {
    match t {
        Text::Null => None,
        Text::Valid => Some(CString::new(valid).unwrap()),
        Text::Empty => Some(CString::default()),
        Text::NotUtf8 => Some(CString::new([valid.as_bytes(), b"\xff\xfe"].concat()).unwrap()),
        Text::Long => Some(CString::new(valid.repeat(2000)).unwrap()),
    }
}

fn ptr(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(null(), |s| s.as_ptr())
}

/// Hostile `u32` option values: valid constants, the next ones, extremes.
fn u32s() -> impl Strategy<Value = u32> {
    prop::sample::select(vec![0u32, 0, 1, 2, 3, 4, 7, 64, 1 << 16, i32::MAX as u32, u32::MAX])
}

#[derive(Clone, Debug)]
struct LoadMutant {
    options_null: bool,
    model_dir: Text,
    context: u32,
    expert_slots: u32,
    expert_memory_bytes: u64,
    policy: u32,
    prefetch: u32,
    weights: u32,
    adapter: Text,
    kv_cache_type: u32,
}

fn load_mutants() -> impl Strategy<Value = LoadMutant> {
    let bytes = prop::sample::select(vec![0u64, 1, 4096, 1 << 40, u64::MAX]);
    (prop::bool::weighted(0.1), texts(), u32s(), u32s(), bytes, u32s(), u32s(), u32s(), texts(), u32s()).prop_map(
        |(
            options_null,
            model_dir,
            context,
            expert_slots,
            expert_memory_bytes,
            policy,
            prefetch,
            weights,
            adapter,
            kv_cache_type,
        )| {
            LoadMutant {
                options_null,
                model_dir,
                context,
                expert_slots,
                expert_memory_bytes,
                policy,
                prefetch,
                weights,
                adapter,
                kv_cache_type,
            }
        },
    )
}

#[test]
fn hostile_load_options() {
    let dir = model_dir();
    let result = runner("capi/load", 32).run(&load_mutants(), |m| {
        let model = text(&m.model_dir, dir.to_str().unwrap());
        // The adapter names a GPU adapter by substring: anything valid matches nothing or lavapipe.
        let adapter = text(&m.adapter, "llvmpipe");
        let mut o = std::mem::MaybeUninit::<MoestreamLoadOptions>::uninit();
        let o = unsafe {
            moestream_load_options_default(o.as_mut_ptr());
            let mut o = o.assume_init();
            o.model_dir = ptr(&model);
            o.context = m.context;
            o.expert_slots = m.expert_slots;
            o.expert_memory_bytes = m.expert_memory_bytes;
            o.policy = m.policy;
            o.prefetch = m.prefetch;
            o.weights = m.weights;
            o.adapter = ptr(&adapter);
            o.kv_cache_type = m.kv_cache_type;
            o
        };
        let options: *const MoestreamLoadOptions = if m.options_null { null() } else { &o };
        checked(m.options_null, || unsafe {
            let e = moestream_engine_load(options);
            moestream_engine_free(e);
            !e.is_null()
        })
        .map(drop)
    });
    if let Err(e) = result {
        panic!("fuzz capi/load: {e}");
    }
}

/// The bundled model, context 64 (so any generation is short).
fn engine() -> *mut MoestreamEngine {
    let dir = model_dir();
    unsafe {
        let mut o = std::mem::MaybeUninit::<MoestreamLoadOptions>::uninit();
        moestream_load_options_default(o.as_mut_ptr());
        let mut o = o.assume_init();
        o.model_dir = dir.as_ptr();
        o.context = 64;
        let e = moestream_engine_load(&o);
        assert!(!e.is_null(), "{:?}", CStr::from_ptr(moestream_last_error()));
        e
    }
}

/// A call on a loaded engine with hostile arguments.
#[derive(Clone, Debug)]
enum Call {
    Generate { engine_null: bool, session: bool, prompt: Text, options: Option<Sampling>, stats: bool },
    Chat { engine_null: bool, session: bool, messages: Messages, options: Option<Sampling> },
    Tokenize { engine_null: bool, text: Text, out_null: bool, capacity: usize },
    Score { engine_null: bool, tokens_null: bool, tokens: Vec<u32>, logprobs: bool },
    Session { engine_null: bool, truncate_to: usize, handle_null: bool },
}

#[derive(Clone, Debug)]
struct Sampling {
    max_tokens: u32,
    temperature: f32,
    top_p: f32,
    top_k: u32,
    seed: u64,
}

#[derive(Clone, Debug)]
enum Messages {
    Text(Text),
    /// A valid conversation with a hostile value at one node.
    Mutated(usize, Value),
    /// Not JSON, or not an array of messages.
    Raw(&'static str),
}

fn samplings() -> impl Strategy<Value = Sampling> {
    let floats =
        || prop::sample::select(vec![0.0f32, 0.5, 1.0, 2.0, -1.0, f32::NAN, f32::INFINITY, f32::MIN_POSITIVE, 1e30]);
    (prop::sample::select(vec![0u32, 1, 3, u32::MAX]), floats(), floats(), u32s(), any::<u64>()).prop_map(
        |(max_tokens, temperature, top_p, top_k, seed)| Sampling { max_tokens, temperature, top_p, top_k, seed },
    )
}

fn messages() -> impl Strategy<Value = Messages> {
    let hostile = prop::sample::select(vec![
        Value::Null,
        json!(0),
        json!(-1),
        json!(u64::MAX),
        json!(1e300),
        json!(""),
        json!("tool"),
        json!(true),
        json!([]),
        json!({}),
        json!([{"role": "user", "content": null}]),
        json!({"role": "user"}),
    ]);
    prop_oneof![
        1 => texts().prop_map(Messages::Text),
        3 => (any::<usize>(), hostile).prop_map(|(at, v)| Messages::Mutated(at, v)),
        1 => prop::sample::select(vec!["", "[", "{}", "null", "[1,2]", "[{\"role\":\"user\",\"content\":\"hi\"}", "[[[[[[[[[[[[]]]]]]]]]]]]", "\"x\""])
            .prop_map(Messages::Raw),
    ]
}

fn calls() -> impl Strategy<Value = Call> {
    let b = || prop::bool::weighted(0.15);
    let tokens = prop::collection::vec(prop::sample::select(vec![0u32, 1, 2, 100, 383, 384, 1 << 20, u32::MAX]), 0..80);
    prop_oneof![
        (b(), any::<bool>(), texts(), prop::option::of(samplings()), any::<bool>()).prop_map(
            |(engine_null, session, prompt, options, stats)| Call::Generate {
                engine_null,
                session,
                prompt,
                options,
                stats
            }
        ),
        (b(), any::<bool>(), messages(), prop::option::of(samplings())).prop_map(
            |(engine_null, session, messages, options)| Call::Chat { engine_null, session, messages, options }
        ),
        (b(), texts(), b(), prop::sample::select(vec![0usize, 1, 4, 1 << 20])).prop_map(
            |(engine_null, text, out_null, capacity)| Call::Tokenize { engine_null, text, out_null, capacity }
        ),
        (b(), b(), tokens, any::<bool>()).prop_map(|(engine_null, tokens_null, tokens, logprobs)| Call::Score {
            engine_null,
            tokens_null,
            tokens,
            logprobs
        }),
        (b(), prop::sample::select(vec![0usize, 1, 5, usize::MAX]), b()).prop_map(
            |(engine_null, truncate_to, handle_null)| Call::Session { engine_null, truncate_to, handle_null }
        ),
    ]
}

/// The library's defaults for the generation options.
unsafe fn default_options() -> MoestreamGenerateOptions {
    let mut o = std::mem::MaybeUninit::<MoestreamGenerateOptions>::uninit();
    moestream_generate_options_default(o.as_mut_ptr());
    o.assume_init()
}

fn options(s: &Option<Sampling>) -> Option<MoestreamGenerateOptions> {
    s.as_ref().map(|s| MoestreamGenerateOptions {
        struct_size: std::mem::size_of::<MoestreamGenerateOptions>() as u32,
        max_tokens: s.max_tokens,
        temperature: s.temperature,
        top_p: s.top_p,
        top_k: s.top_k,
        seed: s.seed,
        ..unsafe { default_options() }
    })
}

fn messages_json(m: &Messages) -> Option<CString> {
    let valid = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who won?"}]);
    match m {
        Messages::Text(t) => text(t, &valid.to_string()),
        Messages::Raw(r) => Some(CString::new(*r).unwrap()),
        Messages::Mutated(at, v) => {
            let mut doc = valid;
            let paths = ["/0", "/0/role", "/0/content", "/1", "/1/role", "/1/content"];
            *doc.pointer_mut(paths[at % paths.len()]).unwrap() = v.clone();
            Some(CString::new(doc.to_string()).unwrap())
        }
    }
}

/// Runs `call` on `engine` (NULL where the mutant says), with a fresh session when asked.
unsafe fn run_call(engine: *mut MoestreamEngine, call: &Call) -> bool {
    let pick = |null: bool| if null { null_mut() } else { engine };
    match call {
        Call::Generate { engine_null, session, prompt, options: o, stats } => {
            let prompt = text(prompt, "The jury said");
            let o = options(o);
            let s = if *session { moestream_session_new(engine) } else { null_mut() };
            let mut st = std::mem::zeroed::<MoestreamStats>();
            st.struct_size = std::mem::size_of::<MoestreamStats>() as u32;
            let stats = if *stats { &mut st as *mut _ } else { null_mut() };
            let out = moestream_generate(
                pick(*engine_null),
                s,
                ptr(&prompt),
                o.as_ref().map_or(null(), |o| o),
                None,
                null_mut(),
                stats,
            );
            moestream_session_free(s);
            moestream_string_free(out);
            !out.is_null()
        }
        Call::Chat { engine_null, session, messages, options: o } => {
            let m = messages_json(messages);
            let o = options(o);
            let s = if *session { moestream_session_new(engine) } else { null_mut() };
            let out = moestream_chat(
                pick(*engine_null),
                s,
                ptr(&m),
                o.as_ref().map_or(null(), |o| o),
                None,
                null_mut(),
                null_mut(),
            );
            moestream_session_free(s);
            moestream_string_free(out);
            !out.is_null()
        }
        Call::Tokenize { engine_null, text: t, out_null, capacity } => {
            let t = text(t, "The jury said");
            let mut out = vec![0u32; *capacity];
            let out = if *out_null { null_mut() } else { out.as_mut_ptr() };
            moestream_tokenize(pick(*engine_null), ptr(&t), out, *capacity) >= 0
        }
        Call::Score { engine_null, tokens_null, tokens, logprobs } => {
            let mut lp = vec![0f32; tokens.len()];
            let lp = if *logprobs { lp.as_mut_ptr() } else { null_mut() };
            let mut perplexity = 0f64;
            let t = if *tokens_null { null() } else { tokens.as_ptr() };
            moestream_score(pick(*engine_null), t, tokens.len(), lp, &mut perplexity) == 0
        }
        Call::Session { engine_null, truncate_to, handle_null } => {
            let s = moestream_session_new(pick(*engine_null));
            if s.is_null() {
                return false;
            }
            let h = if *handle_null { null_mut() } else { s };
            let ok = moestream_session_truncate(h, *truncate_to) == 0;
            let _ = moestream_session_len(h);
            moestream_session_free(s);
            ok
        }
    }
}

#[test]
fn hostile_calls_on_a_loaded_engine() {
    let engine = engine();
    let (ok, refused) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let result = runner("capi/calls", 96).run(&calls(), |call| {
        match checked(false, || unsafe { run_call(engine, &call) })? {
            true => ok.set(ok.get() + 1),
            false => refused.set(refused.get() + 1),
        }
        Ok(())
    });
    eprintln!("fuzz capi/calls: {} ran, {} refused with a message", ok.get(), refused.get());
    unsafe { moestream_engine_free(engine) };
    if let Err(e) = result {
        panic!("fuzz capi/calls: {e}");
    }
}

#[test]
fn null_everywhere_is_an_error_or_a_no_op() {
    // Every handle, string and options pointer NULL at once: errors, and frees that do nothing.
    unsafe {
        moestream_load_options_default(null_mut());
        moestream_generate_options_default(null_mut());
        moestream_engine_free(null_mut());
        moestream_session_free(null_mut());
        moestream_string_free(null_mut());
        assert_eq!(moestream_session_len(null()), 0);
        for call in [
            checked(true, || !moestream_engine_load(null()).is_null()),
            checked(false, || !moestream_session_new(null_mut()).is_null()),
            checked(false, || moestream_session_truncate(null_mut(), 0) == 0),
            checked(false, || moestream_generate_options_for_model(null(), null_mut()) == 0),
            checked(false, || {
                !moestream_generate(null_mut(), null_mut(), null(), null(), None, null_mut(), null_mut()).is_null()
            }),
            checked(false, || {
                !moestream_chat(null_mut(), null_mut(), null(), null(), None, null_mut(), null_mut()).is_null()
            }),
            checked(false, || moestream_tokenize(null_mut(), null(), null_mut(), 4) >= 0),
            checked(false, || moestream_score(null_mut(), null(), 4, null_mut(), null_mut()) == 0),
        ] {
            assert!(matches!(call, Ok(false)), "{call:?}");
        }
    }
}
