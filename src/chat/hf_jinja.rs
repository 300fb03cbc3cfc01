//! The Jinja environment of Hugging Face chat templates: transformers renders them with
//! `trim_blocks`, `lstrip_blocks`, loop controls, and adds `raise_exception`, `strftime_now` and
//! its own `tojson` (no HTML escaping, `indent`/`separators`/`sort_keys`); templates also call
//! Python string and dict methods, which `minijinja_contrib::pycompat` provides.
//!
//! A template comes from a model's files, so its rendering is bounded: [`TEMPLATE_FUEL`]
//! instructions per render (a loop that never ends is an error, not a hang) and minijinja's
//! recursion limit (a macro that calls itself is an error, not a stack overflow); the
//! builtins that pad to a width the template gives (`indent`, the `format` filter, Python's
//! `str.format`, `tojson`'s indent) refuse widths that would allocate gigabytes.

use minijinja::value::{Kwargs, Rest, StringInput, Value};
use minijinja::{Environment, Error, ErrorKind, State};

/// Instructions one render may run. The largest real template measured (gpt-oss with tools)
/// spends about 1,000 per message, so this allows conversations of thousands of turns while a
/// runaway loop ends within a few seconds.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// An environment configured like transformers' `_compile_jinja_template`, with its renders
/// bounded by [`TEMPLATE_FUEL`].
pub fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(python_method);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_filter("indent", indent);
    env.add_filter("format", format);
    env
}

/// Largest padding width (`indent`, `format` specs) a template may ask for.
const MAX_WIDTH: usize = 4096;

fn width_error(what: &str, width: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{what}: width {width} is over {MAX_WIDTH}"))
}

/// Refuses a printf-style (`%10s`) or `str.format`-style (`{:>10}`) format string whose
/// widths or precisions exceed [`MAX_WIDTH`].
fn check_format_widths(format: &str) -> Result<(), Error> {
    let (mut in_spec, mut number) = (false, 0u64);
    for c in format.chars() {
        match c {
            '%' | '{' => (in_spec, number) = (true, 0),
            '}' => in_spec = false,
            '0'..='9' if in_spec => {
                number = number.saturating_mul(10).saturating_add(c as u64 - '0' as u64);
                if number > MAX_WIDTH as u64 {
                    return Err(width_error("format", number));
                }
            }
            c if in_spec && c.is_ascii_alphabetic() => in_spec = false,
            _ => number = 0,
        }
    }
    Ok(())
}

/// Python's string and dict methods (`minijinja_contrib::pycompat`), `str.format`'s widths
/// bounded.
fn python_method(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    if let (Some(s), "format") = (value.as_str(), method) {
        check_format_widths(s)?;
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// The builtin `format` filter, its widths bounded.
fn format(state: &State, format: &Value, args: Rest<Value>) -> Result<Value, Error> {
    if let Some(s) = format.as_str() {
        check_format_widths(s)?;
    }
    minijinja::filters::format(state, format, args)
}

/// The builtin `indent` filter, its width bounded.
fn indent(
    value: StringInput<'_>,
    width: Option<usize>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let width = match width {
        Some(w) => Some(w),
        None => kwargs.get("width")?,
    };
    if let Some(w) = width.filter(|&w| w > MAX_WIDTH) {
        return Err(width_error("indent", w));
    }
    minijinja::filters::indent(value, width, first, blank, kwargs)
}

/// `raise_exception(message)`: the template refuses the conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the local time in strftime syntax (Llama 3.x's "Today Date").
fn strftime_now(format: String) -> Result<String, Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format))
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, format!("bad strftime format {format:?}")))?;
    Ok(out)
}

/// Largest `tojson` indent accepted (real templates use 2 or 4; a huge one would allocate
/// its spaces per line).
const MAX_TOJSON_INDENT: usize = 64;

/// `x | tojson(indent=None, separators=None, sort_keys=False)` as Python's `json.dumps(x,
/// ensure_ascii=False, ...)`: `", "` and `": "` separators by default, non-ASCII kept.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    if let Some(n) = indent.filter(|&n| n > MAX_TOJSON_INDENT) {
        let message = format!("tojson: indent {n} is over {MAX_TOJSON_INDENT}");
        return Err(Error::new(ErrorKind::InvalidOperation, message));
    }
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let json =
        serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([a, b]) => (a.clone(), b.clone()),
        Some(_) => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair")),
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let mut out = String::new();
    let style = JsonStyle { indent, item_sep, key_sep, sort_keys: sort_keys.unwrap_or(false) };
    style.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// Python `json.dumps` layout options.
struct JsonStyle {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonStyle {
    fn write(&self, v: &serde_json::Value, depth: usize, out: &mut String) {
        use serde_json::Value as J;
        match v {
            J::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separator(i, depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.newline(depth, out);
                out.push(']');
            }
            J::Object(map) if !map.is_empty() => {
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    self.separator(i, depth + 1, out);
                    out.push_str(&python_json_string(k));
                    out.push_str(&self.key_sep);
                    self.write(item, depth + 1, out);
                }
                self.newline(depth, out);
                out.push('}');
            }
            J::String(s) => out.push_str(&python_json_string(s)),
            J::Number(n) if n.is_f64() => out.push_str(&python_float(n.as_f64().unwrap_or(f64::NAN))),
            other => out.push_str(&other.to_string()),
        }
    }

    /// What goes before item `i` of a container whose items sit at `depth`.
    fn separator(&self, i: usize, depth: usize, out: &mut String) {
        if i > 0 {
            out.push_str(&self.item_sep);
        }
        self.newline(depth, out);
    }

    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    }
}

/// A JSON string as `json.dumps(ensure_ascii=False)` writes it: only `"`, `\` and control
/// characters escaped.
fn python_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A float as Python's `repr` writes it (`1.0`, not `1`).
fn python_float(f: f64) -> String {
    if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
        format!("{f:.1}")
    } else {
        f.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: Value) -> Result<String, Error> {
        let env = environment();
        env.render_str(src, ctx)
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let ctx = Value::from_serialize(serde_json::json!({"x": {"b": [1, 2.0, "é<"], "a": null, "t": true}}));
        assert_eq!(render("{{ x | tojson }}", ctx.clone()).unwrap(), r#"{"b": [1, 2.0, "é<"], "a": null, "t": true}"#);
        assert_eq!(
            render("{{ x | tojson(indent=2, sort_keys=true) }}", ctx).unwrap(),
            "{\n  \"a\": null,\n  \"b\": [\n    1,\n    2.0,\n    \"é<\"\n  ],\n  \"t\": true\n}"
        );
    }

    #[test]
    fn raise_exception_fails_the_render_with_its_message() {
        let err = render("{{ raise_exception('roles must alternate') }}", Value::UNDEFINED).unwrap_err();
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }

    #[test]
    fn strftime_now_formats_today() {
        let today = chrono::Local::now().format("%Y-%m-%d").to_string();
        assert_eq!(render("{{ strftime_now('%Y-%m-%d') }}", Value::UNDEFINED).unwrap(), today);
    }

    #[test]
    fn padding_widths_are_bounded() {
        for src in [
            "{{ 'x' | indent(5000) }}",
            "{{ 'x' | indent(width=5000) }}",
            "{{ '%5000s' | format(1) }}",
            "{{ '{:>5000}'.format(1) }}",
            "{{ '{:.99999999999}'.format(1.5) }}",
        ] {
            let err = render(src, Value::UNDEFINED).unwrap_err();
            assert!(err.to_string().contains("is over 4096"), "{src}: {err}");
        }
        let ok = render(
            "{{ 'a\nb' | indent(2) }}|{{ '%5.1f' | format(1.25) }}|{{ '{:>4}{}'.format(7, 12345) }}",
            Value::UNDEFINED,
        );
        assert_eq!(ok.unwrap(), "a\n  b|  1.2|   712345");
    }

    #[test]
    fn python_methods_work() {
        let out =
            render("{{ ' a</think>b '.strip().split('</think>')[-1] }}{{ 'xy'.startswith('x') }}", Value::UNDEFINED);
        assert_eq!(out.unwrap(), "bTrue", "booleans print as Python's");
    }
}
