//! Constrained decoding: a JSON schema, a regular expression or a Lark grammar decides which
//! tokens may come next, through llguidance. Each token's logits are masked (what the grammar
//! forbids gets -inf) before the sampler draws; a grammar that is complete allows only the
//! request's stop tokens.

use std::sync::Arc;

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use super::tokenizer::Tokenizer;
use crate::error::{Error, Result};

/// What the generated text must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this schema (`json_schema`).
    JsonSchema(Value),
    /// Text matching this regular expression, whole.
    Regex(String),
    /// Text of this Lark grammar (llguidance's dialect, which embeds `%json {...}` schemas).
    Lark(String),
    /// Text that opens with `prefix` (Lark items: text literals, `<[ID]>` tokens), then follows
    /// `then`: an answer shaped by `then` after the reply closes its reasoning.
    Prefixed {
        /// What the text opens with.
        prefix: String,
        /// What follows it.
        then: Box<Constraint>,
    },
}

impl Constraint {
    /// The grammar llguidance compiles.
    fn grammar(&self) -> TopLevelGrammar {
        match self {
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(bounded_whitespace(json!({"type": "object"}))),
            Constraint::JsonSchema(schema) => TopLevelGrammar::from_json_schema(bounded_whitespace(schema.clone())),
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
            Constraint::Prefixed { prefix, then } => {
                // `then`'s grammars follow a start grammar that refers to the first of them by
                // a name no other of them has (their count tells nestings apart).
                let mut grammar = then.grammar();
                let name = format!("then_{}", grammar.grammars.len());
                grammar.grammars[0].name = Some(name.clone());
                let mut start = GrammarWithLexer::from_lark(format!("start: {prefix} @{name}"));
                start.name = Some("prefixed".into());
                grammar.grammars.insert(0, start);
                grammar
            }
        }
    }

    /// What the constraint is, for error messages.
    fn what(&self) -> &'static str {
        match self {
            Constraint::JsonObject | Constraint::JsonSchema(_) => "JSON schema",
            Constraint::Regex(_) => "regex",
            Constraint::Lark(_) => "grammar",
            Constraint::Prefixed { then, .. } => then.what(),
        }
    }
}

/// Whitespace JSON may hold between its tokens unless the schema's own `x-guidance` options
/// say otherwise: one space or tab, or a newline and up to 20 spaces or tabs of indent (as
/// llama.cpp's JSON-schema grammars allow). llguidance's default, any run of whitespace, lets a
/// small model write newlines for ever.
const JSON_WHITESPACE: &str = r"[\x20\x09]|\x0A[\x20\x09]{0,20}";

/// `schema` with [`JSON_WHITESPACE`] where it sets no `x-guidance` options of its own (also
/// for schemas embedded in a Lark grammar's `%json`).
pub fn bounded_whitespace(mut schema: Value) -> Value {
    if let Value::Object(o) = &mut schema {
        o.entry("x-guidance").or_insert_with(|| json!({"whitespace_pattern": JSON_WHITESPACE}));
    }
    schema
}

/// A model's vocabulary as llguidance sees it: each token's bytes in a trie, and the model's
/// tokenizer for the text a grammar forces.
struct GrammarTokens {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for GrammarTokens {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s).ok().and_then(|text| self.tokenizer.encode(text, false).ok()) {
            Some(enc) => enc.get_ids().to_vec(),
            None => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles constraints for one model (built once, at its first constrained request).
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// The grammar compiler for a model of `vocab` logits whose tokens `tokenizer` spells,
    /// `eos` the token llguidance treats as the end (a constrained request's stop tokens all
    /// count as it).
    pub fn new(tokenizer: &Tokenizer, vocab: usize, eos: u32) -> Result<Grammars> {
        let json = serde_json::to_value(tokenizer.hf())
            .map_err(|e| Error::Tokenizer(format!("tokenizer JSON for constrained decoding: {e}")))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| Error::Tokenizer(format!("token bytes for constrained decoding: {e}")))?;
        if words.len() > vocab {
            return Err(Error::Tokenizer(format!(
                "the tokenizer has {} tokens, more than the model's {vocab} logits",
                words.len()
            )));
        }
        words.resize(vocab, Vec::new());
        let trie = TokTrie::from(&TokRxInfo::new(vocab as u32, eos), &words);
        // Text a grammar forces is text: a special token's spelling in it must not become the
        // special token (which the trie marks apart, so the grammar would refuse it).
        let mut text_tokenizer = tokenizer.hf().clone();
        text_tokenizer.set_encode_special_tokens(true);
        let env: TokEnv = Arc::new(GrammarTokens { trie, tokenizer: text_tokenizer });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::Tokenizer(format!("constrained decoding's token tables: {e}")))?;
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// A fresh matcher of `constraint`; a schema, regex or grammar that does not compile is an
    /// error naming the problem. `stops` are the request's stop tokens (allowed where the
    /// grammar may end).
    pub fn start(&self, constraint: &Constraint, stops: &[u32]) -> Result<ConstraintState> {
        let parser = self
            .factory
            .create_parser(constraint.grammar())
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", constraint.what())))?;
        let eos = self.factory.tok_env().tok_trie().eos_token();
        Ok(ConstraintState { matcher: Matcher::new(Ok(parser)), stops: stops.to_vec(), eos, next: None })
    }
}

/// One request's place in its grammar.
pub struct ConstraintState {
    matcher: Matcher,
    stops: Vec<u32>,
    eos: TokenId,
    /// The next token's mask, when computed ahead ([`ConstraintState::prepare`]).
    next: Option<SimpleVob>,
}

impl ConstraintState {
    /// Computes the next token's mask now (on another thread while the GPU runs the step whose
    /// logits it will mask).
    pub fn prepare(&mut self) -> Result<()> {
        self.next = Some(self.matcher.compute_mask_or_eos().map_err(grammar_error)?);
        Ok(())
    }

    /// Sets the logits of every token the grammar does not allow next to -inf; where it may end
    /// there, the stop tokens stay allowed.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let allowed = match self.next.take() {
            Some(prepared) => prepared,
            None => self.matcher.compute_mask_or_eos().map_err(grammar_error)?,
        };
        let may_end = allowed.is_allowed(self.eos);
        for (id, l) in logits.iter_mut().enumerate() {
            let id = id as u32;
            if !(allowed.is_allowed(id) || may_end && self.stops.contains(&id)) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Moves past `token` (a stop token ends the text and is not fed to the grammar).
    pub fn accept(&mut self, token: u32) -> Result<()> {
        match self.stops.contains(&token) {
            true => Ok(()),
            false => self.matcher.consume_token(token).map_err(grammar_error),
        }
    }
}

fn grammar_error(e: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("constrained decoding: {e}"))
}
