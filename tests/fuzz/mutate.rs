//! Mutations: hostile values put into a JSON document, and flips, overwrites and cuts of bytes.

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{json, Value};

/// A hostile value for one JSON node.
#[derive(Clone, Debug)]
pub enum Hostile {
    /// The key (or array element) removed.
    Delete,
    /// `null`.
    Null,
    /// An integer: 0, 1, −1, 2^31, 2^32, 2^63, u64::MAX, or the original plus or minus a bit.
    Int(i128),
    /// A float: 0.5, −1.5, 1e300, −0.0.
    Float(f64),
    /// A string.
    Str(&'static str),
    /// A boolean.
    Bool(bool),
    /// An empty array.
    EmptyArray,
    /// An empty object.
    EmptyObject,
    /// The number doubled, halved or plus one.
    Scale(i8),
}

fn hostile() -> impl Strategy<Value = Hostile> {
    prop_oneof![
        2 => Just(Hostile::Delete),
        2 => Just(Hostile::Null),
        6 => prop::sample::select(vec![
            0i128,
            1,
            -1,
            2,
            3,
            7,
            1 << 31,
            1 << 32,
            1 << 62,
            1 << 63,
            u64::MAX as i128,
            -(1 << 63)
        ])
        .prop_map(Hostile::Int),
        1 => prop::sample::select(vec![0.5, -1.5, 1e300, -0.0, 1e-300]).prop_map(Hostile::Float),
        1 => prop::sample::select(vec!["", "two", "64", "int4-affine-g7", "MixtralForCausalLM"]).prop_map(Hostile::Str),
        1 => any::<bool>().prop_map(Hostile::Bool),
        1 => Just(Hostile::EmptyArray),
        1 => Just(Hostile::EmptyObject),
        3 => prop::sample::select(vec![-1i8, 1, 2, -2]).prop_map(Hostile::Scale),
    ]
}

/// One hostile value at the node of index `at` (modulo the node count) of a document.
#[derive(Clone, Debug)]
pub struct JsonMutation {
    /// Index into [`nodes`] of the document (taken modulo their number).
    pub at: usize,
    /// What to put there.
    pub value: Hostile,
}

/// One to three JSON mutations.
pub fn json_mutations() -> impl Strategy<Value = Vec<JsonMutation>> {
    vec((any::<usize>(), hostile()).prop_map(|(at, value)| JsonMutation { at, value }), 1..=3)
}

/// JSON pointers of every node below the root, in document order.
pub fn nodes(doc: &Value) -> Vec<String> {
    fn walk(v: &Value, path: &str, out: &mut Vec<String>) {
        let children: Vec<(String, &Value)> = match v {
            Value::Object(m) => m.iter().map(|(k, c)| (k.replace('~', "~0").replace('/', "~1"), c)).collect(),
            Value::Array(a) => a.iter().enumerate().map(|(i, c)| (i.to_string(), c)).collect(),
            _ => return,
        };
        for (key, child) in children {
            let p = format!("{path}/{key}");
            out.push(p.clone());
            walk(child, &p, out);
        }
    }
    let mut out = Vec::new();
    walk(doc, "", &mut out);
    out
}

fn replacement(old: &Value, h: &Hostile) -> Value {
    match *h {
        Hostile::Delete => unreachable!("handled by the caller"),
        Hostile::Null => Value::Null,
        Hostile::Int(i) => match (u64::try_from(i), i64::try_from(i)) {
            (Ok(u), _) => json!(u),
            (_, Ok(s)) => json!(s),
            _ => Value::Null,
        },
        Hostile::Float(f) => json!(f),
        Hostile::Str(s) => json!(s),
        Hostile::Bool(b) => json!(b),
        Hostile::EmptyArray => json!([]),
        Hostile::EmptyObject => json!({}),
        Hostile::Scale(s) => match old.as_u64() {
            Some(n) => json!(match s {
                -1 => n.saturating_sub(1),
                1 => n.saturating_add(1),
                2 => n.saturating_mul(2),
                _ => n / 2,
            }),
            None => old.clone(),
        },
    }
}

/// Applies `mutations` to `doc` (mutations whose node a previous one removed are skipped).
pub fn apply_json(doc: &mut Value, mutations: &[JsonMutation]) {
    for m in mutations {
        let paths = nodes(doc);
        if paths.is_empty() {
            return;
        }
        let path = &paths[m.at % paths.len()];
        if let Hostile::Delete = m.value {
            let (parent, key) = path.rsplit_once('/').expect("pointers start with /");
            match doc.pointer_mut(parent) {
                Some(Value::Object(o)) => {
                    o.remove(&key.replace("~1", "/").replace("~0", "~"));
                }
                Some(Value::Array(a)) => {
                    a.remove(key.parse::<usize>().expect("array index"));
                }
                _ => {}
            }
        } else if let Some(node) = doc.pointer_mut(path) {
            *node = replacement(node, &m.value);
        }
    }
}

/// A change to raw bytes, at an offset taken modulo the mutated region's length.
#[derive(Clone, Debug)]
pub enum ByteMutation {
    /// Flip one bit.
    Flip { at: usize, bit: u8 },
    /// Overwrite a byte.
    Set { at: usize, byte: u8 },
    /// Overwrite 8 bytes with a little-endian u64 (0, 1, u32::MAX, u64::MAX, 2^40).
    Word { at: usize, value: u64 },
    /// Cut the file there.
    Truncate { at: usize },
}

/// One to three byte mutations.
pub fn byte_mutations() -> impl Strategy<Value = Vec<ByteMutation>> {
    let one = prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(at, bit)| ByteMutation::Flip { at, bit }),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| ByteMutation::Set { at, byte }),
        2 => (any::<usize>(), prop::sample::select(vec![0u64, 1, u32::MAX as u64, u64::MAX, 1 << 40]))
            .prop_map(|(at, value)| ByteMutation::Word { at, value }),
        1 => any::<usize>().prop_map(|at| ByteMutation::Truncate { at }),
    ];
    vec(one, 1..=3)
}

/// Applies `mutations` to `bytes`, at offsets within the first `region` bytes.
pub fn apply_bytes(bytes: &mut Vec<u8>, region: usize, mutations: &[ByteMutation]) {
    for m in mutations {
        let span = region.min(bytes.len());
        if span == 0 {
            return;
        }
        match *m {
            ByteMutation::Flip { at, bit } => bytes[at % span] ^= 1 << bit,
            ByteMutation::Set { at, byte } => bytes[at % span] = byte,
            ByteMutation::Word { at, value } => {
                let at = at % span;
                let end = (at + 8).min(bytes.len());
                bytes[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
            }
            ByteMutation::Truncate { at } => bytes.truncate(at % span),
        }
    }
}

/// A mutant of a JSON document or of a file's bytes.
#[derive(Clone, Debug)]
pub enum Mutant {
    /// Hostile values in the parsed document.
    Json(Vec<JsonMutation>),
    /// Raw byte changes.
    Bytes(Vec<ByteMutation>),
}

/// JSON mutations three times in four, byte mutations otherwise.
pub fn mutants() -> impl Strategy<Value = Mutant> {
    prop_oneof![3 => json_mutations().prop_map(Mutant::Json), 1 => byte_mutations().prop_map(Mutant::Bytes)]
}

/// `text` (a JSON document) after `mutant`.
pub fn mutate_json_text(text: &[u8], mutant: &Mutant) -> Vec<u8> {
    match mutant {
        Mutant::Json(m) => {
            let mut doc: Value = serde_json::from_slice(text).expect("the original is valid JSON");
            apply_json(&mut doc, m);
            serde_json::to_vec_pretty(&doc).expect("serialisable")
        }
        Mutant::Bytes(m) => {
            let mut bytes = text.to_vec();
            apply_bytes(&mut bytes, text.len(), m);
            bytes
        }
    }
}

/// A safetensors file after `mutant`: JSON mutations go into its header (re-framed with the
/// new length, so the parser gets past the framing), byte mutations into the header's bytes.
pub fn mutate_safetensors(file: &[u8], mutant: &Mutant) -> Vec<u8> {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    match mutant {
        Mutant::Json(m) => {
            let mut header: Value = serde_json::from_slice(&file[8..8 + n]).expect("a valid header");
            apply_json(&mut header, m);
            let mut text = serde_json::to_vec(&header).unwrap();
            // safetensors pads the header with spaces to a multiple of 8.
            text.resize(text.len().next_multiple_of(8), b' ');
            let mut out = (text.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(&text);
            out.extend_from_slice(&file[8 + n..]);
            out
        }
        Mutant::Bytes(m) => {
            let mut bytes = file.to_vec();
            apply_bytes(&mut bytes, 8 + n, m);
            bytes
        }
    }
}
