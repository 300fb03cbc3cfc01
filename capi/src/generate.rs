//! Generation: a raw prompt (token callback) or a conversation through the chat template.

use std::ffi::{c_char, c_void};

use moestream::chat::{complete, ChatMessage, Completion, CompletionRequest, FinishReason, RenderOptions};
use moestream::runtime::drafts::PromptLookup;
use moestream::runtime::penalties::Penalties;
use moestream::runtime::{Constraint, GenerateOptions, Generation, SamplingParams, Session};
use moestream::{Error, Result};

use crate::boundary::{c_text, guard, owned_string, str_arg};
use crate::engine::{engine_ref, MoestreamEngine};
use crate::session::MoestreamSession;
use crate::sized::{self, read_sized, write_sized};

/// Called with each new piece of text: `token` is its token id (`UINT32_MAX` from
/// `moestream_chat`, whose text pieces may span tokens), `text` the piece (NUL-terminated,
/// `len` bytes, valid during the call; may be empty). Return false to stop generating.
pub type MoestreamTokenCallback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, token: u32, text: *const c_char, len: usize) -> bool>;

/// How to generate; fill with `moestream_generate_options_default`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MoestreamGenerateOptions {
    /// `sizeof(MoestreamGenerateOptions)` as the app was compiled (set by the default function).
    pub struct_size: u32,
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// Sampling temperature; 0 = greedy.
    pub temperature: f32,
    /// Nucleus threshold in (0, 1]; 1 = off.
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 = all.
    pub top_k: u32,
    /// Random seed.
    pub seed: u64,
    // Appended in the second version (an app built against the first leaves them at their
    // defaults).
    /// Drop tokens below this fraction of the most likely one's probability; 0 = off.
    pub min_p: f32,
    /// llama.cpp's repetition penalty over the last `repeat_last_n` tokens; 1 = off.
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over.
    pub repeat_last_n: u32,
    /// OpenAI's presence penalty, in [-2, 2]; 0 = off.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty, in [-2, 2]; 0 = off.
    pub frequency_penalty: f32,
    // Appended in the third version.
    /// The text must be JSON valid against this JSON schema (NUL-terminated JSON text); NULL =
    /// no schema. At most one of `json_schema`, `regex` and `lark_grammar`.
    pub json_schema: *const c_char,
    /// The text must match this regular expression, whole; NULL = none.
    pub regex: *const c_char,
    /// The text must follow this Lark grammar (llguidance's dialect); NULL = none.
    pub lark_grammar: *const c_char,
    // Appended in the fourth version.
    /// Speculative decoding by prompt lookup: up to this many tokens drafted a step (what
    /// followed the latest earlier occurrence of the last tokens) and verified in one step, the
    /// output what one token a step gives; 0 = off (not with a constraint).
    pub draft_max: u32,
    /// Longest n-gram the prompt lookup matches (1 to 32; 12 by default).
    pub draft_ngram: u32,
    // Appended in the fifth version.
    /// Where the `draft_max` drafts come from: `MOESTREAM_DRAFTS_PROMPT_LOOKUP` (default) or
    /// `MOESTREAM_DRAFTS_MTP` (the model's MTP module, loaded with `MoestreamLoadOptions.mtp`).
    pub draft_source: u32,
}

/// `MoestreamGenerateOptions.draft_source`: prompt lookup (default).
pub const MOESTREAM_DRAFTS_PROMPT_LOOKUP: u32 = 0;
/// `MoestreamGenerateOptions.draft_source`: the model's multi-token-prediction module.
pub const MOESTREAM_DRAFTS_MTP: u32 = 1;

/// Figures of one generation. Set `struct_size` to `sizeof(MoestreamStats)` before passing it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MoestreamStats {
    /// `sizeof(MoestreamStats)` as the app was compiled (the caller sets it).
    pub struct_size: u32,
    /// Prompt length in tokens (for a session: the whole conversation's).
    pub prompt_tokens: u32,
    /// Prompt tokens whose KV cache the session already held (not prefilled again).
    pub reused_tokens: u32,
    /// Tokens generated.
    pub generated_tokens: u32,
    /// Prompt tokens per second.
    pub prefill_tokens_per_s: f64,
    /// Generated tokens per second.
    pub decode_tokens_per_s: f64,
    /// Expert needs found in a GPU slot.
    pub expert_hits: u64,
    /// Expert needs loaded on demand.
    pub expert_misses: u64,
    /// Whether the callback stopped the generation.
    pub cancelled: bool,
    // Appended in the second version.
    /// Draft tokens proposed (`draft_max`).
    pub draft_tokens: u32,
    /// Of those, the tokens the verification accepted.
    pub accepted_draft_tokens: u32,
}

/// Fills `options` with the defaults: 128 tokens, greedy (reproducible whatever the model; the
/// model's recommended sampling: `moestream_generate_options_for_model`).
///
/// # Safety
/// `options` is NULL or points to writable memory for one `MoestreamGenerateOptions`.
#[no_mangle]
pub unsafe extern "C" fn moestream_generate_options_default(options: *mut MoestreamGenerateOptions) {
    if let Some(o) = options.as_mut() {
        *o = default_generate_options();
    }
}

/// Fills `options` with the sampling the engine's model recommends (its
/// `generation_config.json`, or a GGUF's `general.sampling.*` keys) over llama.cpp's defaults
/// (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1.1 over 64 tokens), what
/// the `moestream` command and server sample with; 128 tokens, seed 0. Returns 0, or -1 (see
/// `moestream_last_error`) when `engine` or `options` is NULL.
///
/// # Safety
/// `engine` is NULL or a live handle; `options` NULL or writable memory for one
/// `MoestreamGenerateOptions`.
#[no_mangle]
pub unsafe extern "C" fn moestream_generate_options_for_model(
    engine: *const MoestreamEngine,
    options: *mut MoestreamGenerateOptions,
) -> i32 {
    guard(-1, || {
        let e = engine_ref(engine)?;
        let o = options.as_mut().ok_or_else(|| Error::InvalidArgument("options is NULL".into()))?;
        let d = e.engine.sampling_defaults();
        *o = MoestreamGenerateOptions {
            temperature: d.temperature,
            top_p: d.top_p,
            top_k: d.top_k as u32,
            seed: d.seed,
            min_p: d.min_p,
            repeat_penalty: d.penalties.repeat,
            repeat_last_n: d.penalties.last_n as u32,
            presence_penalty: d.penalties.presence,
            frequency_penalty: d.penalties.frequency,
            ..default_generate_options()
        };
        Ok(0)
    })
}

/// Generates after `prompt`, calling `callback` per token. Without a session (NULL) the prompt
/// starts a new sequence (tokenized with the model's special tokens); with one, it is appended to
/// the session's tokens (as written) and only it is prefilled, and the generated tokens join the
/// session. Returns the generated text (free with `moestream_string_free`), or NULL on failure
/// (see `moestream_last_error`). `options` NULL = defaults; `callback` and `stats` may be NULL.
///
/// # Safety
/// `engine` is a live handle; `session` NULL or a live handle of that engine; `prompt`
/// NUL-terminated; `options`/`stats` NULL or valid; `callback` safe to call with `user_data`.
#[no_mangle]
pub unsafe extern "C" fn moestream_generate(
    engine: *mut MoestreamEngine,
    session: *mut MoestreamSession,
    prompt: *const c_char,
    options: *const MoestreamGenerateOptions,
    callback: MoestreamTokenCallback,
    user_data: *mut c_void,
    stats: *mut MoestreamStats,
) -> *mut c_char {
    guard(std::ptr::null_mut(), || {
        sized::check_output(stats)?;
        let e = engine_ref(engine)?;
        let prompt = str_arg(prompt, "prompt")?;
        let options = generate_options(options)?;
        let mut cancelled = false;
        let on_token = |id, piece: &str| {
            let go_on = call(callback, user_data, id, piece);
            cancelled |= !go_on;
            go_on
        };
        let g = match session.as_mut() {
            None => e.engine.generate(&e.engine.encode(prompt)?, &options, on_token)?,
            Some(s) if s.session.is_empty() => {
                e.engine.generate_in(&mut s.session, &e.engine.encode(prompt)?, &options, on_token)?
            }
            Some(s) => e.engine.generate_in(&mut s.session, &e.engine.encode_raw(prompt)?, &options, on_token)?,
        };
        write_stats(stats, &g, cancelled)?;
        Ok(owned_string(g.text))
    })
}

/// Generates the assistant's reply to `messages_json`, a JSON array of `{"role": "system" |
/// "user" | "assistant" | "tool", "content": "..."}`, rendered with the model's chat template;
/// stops at the template's end-of-turn tokens. With a session, the KV cache of the longest
/// prefix it shares with this conversation (the earlier turns) is reused and only the rest is
/// prefilled; NULL uses a fresh sequence. Returns the reply (free with `moestream_string_free`)
/// or NULL on failure; `callback` gets the text as it is generated (`token` is `UINT32_MAX`).
///
/// # Safety
/// As `moestream_generate`; `messages_json` NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn moestream_chat(
    engine: *mut MoestreamEngine,
    session: *mut MoestreamSession,
    messages_json: *const c_char,
    options: *const MoestreamGenerateOptions,
    callback: MoestreamTokenCallback,
    user_data: *mut c_void,
    stats: *mut MoestreamStats,
) -> *mut c_char {
    guard(std::ptr::null_mut(), || {
        sized::check_output(stats)?;
        let e = engine_ref(engine)?;
        let prompt = chat_prompt(e, messages_json)?;
        let request = chat_request(e, options)?;
        let c = complete_in(e, session, &prompt, &request, (callback, user_data), stats)?;
        Ok(owned_string(c.text))
    })
}

/// Completes `request` after `prompt` in `session` (NULL: a fresh sequence), the text to
/// `callback` as it comes, the figures to `stats`.
pub(crate) unsafe fn complete_in(
    e: &MoestreamEngine,
    session: *mut MoestreamSession,
    prompt: &[u32],
    request: &CompletionRequest,
    (callback, user_data): (MoestreamTokenCallback, *mut c_void),
    stats: *mut MoestreamStats,
) -> Result<Completion> {
    let mut fresh: Option<Session> = None;
    let session = match session.as_mut() {
        Some(s) => &mut s.session,
        None => fresh.insert(e.engine.new_session()?),
    };
    let c = complete(&e.engine, session, prompt, request, |piece| call(callback, user_data, u32::MAX, piece))?;
    write_stats(stats, &c.generation, c.finish_reason == FinishReason::Cancelled)?;
    Ok(c)
}

/// The conversation `messages_json` rendered with `e`'s chat template and tokenized.
pub(crate) unsafe fn chat_prompt(e: &MoestreamEngine, messages_json: *const c_char) -> Result<Vec<u32>> {
    let messages: Vec<ChatMessage> = serde_json::from_str(str_arg(messages_json, "messages_json")?)
        .map_err(|err| Error::InvalidArgument(format!("messages_json: {err}")))?;
    let template = e.template.as_ref().ok_or_else(|| Error::NoChatTemplate(e.engine.model_dir().into()))?;
    let text = template.render(&messages, &RenderOptions { add_generation_prompt: true, ..Default::default() })?;
    e.engine.encode_raw(&text)
}

/// A reply's request: `options`, ending at `e`'s end-of-turn tokens.
pub(crate) unsafe fn chat_request(
    e: &MoestreamEngine,
    options: *const MoestreamGenerateOptions,
) -> Result<CompletionRequest> {
    Ok(CompletionRequest {
        options: generate_options(options)?,
        stop_tokens: e.end_of_turn.clone(),
        stop_strings: Vec::new(),
        tool_format: None,
        markers: Vec::new(),
        reasoning: None,
        harmony: false,
    })
}

fn default_generate_options() -> MoestreamGenerateOptions {
    MoestreamGenerateOptions {
        struct_size: std::mem::size_of::<MoestreamGenerateOptions>() as u32,
        max_tokens: 128,
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: 0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        json_schema: std::ptr::null(),
        regex: std::ptr::null(),
        lark_grammar: std::ptr::null(),
        draft_max: 0,
        draft_ngram: moestream::runtime::drafts::DEFAULT_LOOKUP_NGRAM as u32,
        draft_source: MOESTREAM_DRAFTS_PROMPT_LOOKUP,
    }
}

impl sized::SizedStruct for MoestreamGenerateOptions {
    const NAME: &'static str = "MoestreamGenerateOptions";
    // The first version ended with `seed` (a multiple of 8 bytes, so no padding followed it).
    const FIRST_SIZE: usize = std::mem::offset_of!(Self, min_p);
}

impl sized::SizedStruct for MoestreamStats {
    const NAME: &'static str = "MoestreamStats";
    // The first version ended with `cancelled` (padded to 8 bytes: the draft figures of the
    // second fall into that padding and past it).
    const FIRST_SIZE: usize = std::mem::offset_of!(Self, draft_tokens);
}

pub(crate) unsafe fn generate_options(options: *const MoestreamGenerateOptions) -> Result<GenerateOptions> {
    if options.is_null() {
        return Ok(GenerateOptions::default());
    }
    let o = read_sized(options, default_generate_options())?;
    let sampling = SamplingParams {
        temperature: o.temperature,
        top_k: o.top_k as usize,
        top_p: o.top_p,
        seed: o.seed,
        min_p: o.min_p,
        penalties: Penalties {
            repeat: o.repeat_penalty,
            last_n: o.repeat_last_n as usize,
            presence: o.presence_penalty,
            frequency: o.frequency_penalty,
        },
    };
    sampling.validate()?;
    let constraint = constraint(&o)?;
    let (drafts, mtp_drafts) = match (o.draft_source, o.draft_max) {
        (_, 0) => (None, 0),
        (MOESTREAM_DRAFTS_PROMPT_LOOKUP, n) => {
            (Some(PromptLookup { ngram: o.draft_ngram as usize, max_draft: n as usize }), 0)
        }
        (MOESTREAM_DRAFTS_MTP, n) => (None, n as usize),
        (s, _) => return Err(Error::InvalidArgument(format!("draft_source {s} is not a MOESTREAM_DRAFTS_* value"))),
    };
    // Draft sizes, and drafts with a constraint, are checked where they are used.
    let max_tokens = o.max_tokens as usize;
    Ok(GenerateOptions { max_tokens, sampling, constraint, drafts, mtp_drafts, ..Default::default() })
}

/// The constraint the options' `json_schema`, `regex` or `lark_grammar` asks for.
unsafe fn constraint(o: &MoestreamGenerateOptions) -> Result<Option<Constraint>> {
    let given = [o.json_schema, o.regex, o.lark_grammar].iter().filter(|p| !p.is_null()).count();
    if given > 1 {
        return Err(Error::InvalidArgument("give one of json_schema, regex and lark_grammar".into()));
    }
    if !o.json_schema.is_null() {
        let text = str_arg(o.json_schema, "json_schema")?;
        let schema =
            serde_json::from_str(text).map_err(|e| Error::InvalidArgument(format!("json_schema is not JSON: {e}")))?;
        return Ok(Some(Constraint::JsonSchema(schema)));
    }
    if !o.regex.is_null() {
        return Ok(Some(Constraint::Regex(str_arg(o.regex, "regex")?.to_string())));
    }
    if !o.lark_grammar.is_null() {
        return Ok(Some(Constraint::Lark(str_arg(o.lark_grammar, "lark_grammar")?.to_string())));
    }
    Ok(None)
}

/// Calls the C callback (absent: always go on).
unsafe fn call(callback: MoestreamTokenCallback, user_data: *mut c_void, token: u32, piece: &str) -> bool {
    let Some(f) = callback else { return true };
    let text = c_text(piece);
    f(user_data, token, text.as_ptr(), text.as_bytes().len())
}

pub(crate) unsafe fn write_stats(stats: *mut MoestreamStats, g: &Generation, cancelled: bool) -> Result<()> {
    if stats.is_null() {
        return Ok(());
    }
    write_sized(
        stats,
        MoestreamStats {
            struct_size: std::mem::size_of::<MoestreamStats>() as u32,
            prompt_tokens: g.prompt_tokens.len() as u32,
            reused_tokens: g.stats.reused_tokens as u32,
            generated_tokens: g.tokens.len() as u32,
            prefill_tokens_per_s: g.stats.prefill_tokens_per_s,
            decode_tokens_per_s: g.stats.decode_tokens_per_s,
            expert_hits: g.stats.experts.expert_hits,
            expert_misses: g.stats.experts.expert_misses,
            cancelled,
            draft_tokens: g.stats.draft_tokens as u32,
            accepted_draft_tokens: g.stats.accepted_draft_tokens as u32,
        },
    )
}
