//! The library's folders form one stack, and no module imports from a layer above its own.
//!
//! Reads every `src/**/*.rs` of the library, takes each `crate::NAME` outside comments and
//! outside the file's `#[cfg(test)]` tail (unit tests may use the CPU reference as their
//! oracle), and checks NAME's layer is at or below the file's. `error` is outside the stack: the
//! crate's error type names every layer's error, and every layer returns it.

use std::path::{Path, PathBuf};

/// The layers from the ground up; a module may import its own layer and those before it.
const LAYERS: &[&[&str]] = &[
    &["util", "env_choice"],
    &["quant"],
    &["store"],
    &["model"],
    &["prerouter"],
    &["gpu"],
    &["ops"],
    &["experts"],
    &["sim"],
    &["decoder"],
    &["reference"],
    &["convert"],
    &["runtime"],
    &["chat"],
    &["bench"],
    &["serve"],
];

/// Items the crate root re-exports, by the module they come from.
const ROOT_ITEMS: &[(&str, &str)] = &[
    ("Engine", "runtime"),
    ("EngineOptions", "runtime"),
    ("Session", "runtime"),
    ("Error", "error"),
    ("Result", "error"),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `crate::NAME` references in `code` with their line numbers (comments and the `#[cfg(test)]`
/// tail left out); `crate::{a::x, b}` gives `a` and `b`.
fn crate_references(code: &str) -> Vec<(usize, String)> {
    let mut text = String::new();
    let mut line_of = Vec::new();
    for (n, line) in code.lines().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let code = line.find("//").map_or(line, |i| &line[..i]);
        text.push_str(code);
        text.push('\n');
        line_of.resize(text.len(), n + 1);
    }
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut refs = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("crate::").map(|i| from + i) {
        from = i + "crate::".len();
        // `$crate::x` (macros) and `other_crate::x` are not this crate's paths.
        if text[..i].chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let after = &text[from..];
        if let Some(group) = after.strip_prefix('{') {
            // The first segment of each item at the group's top level.
            let (mut depth, mut item_start) = (0usize, true);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphanumeric() || c == '_') => {
                        refs.push((line_of[from + 1 + j], ident(&group[j..])));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(after);
            if !name.is_empty() {
                refs.push((line_of[from], name));
            }
        }
    }
    refs
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut unplaced = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel.iter().next().unwrap().to_str().unwrap().trim_end_matches(".rs");
        // The binary (main.rs, cli/) and the root are above every layer.
        if matches!(top, "lib" | "main" | "cli" | "error") {
            continue;
        }
        let Some(own) = layer_of(top) else {
            unplaced.push(top.to_string());
            continue;
        };
        let code = std::fs::read_to_string(file).unwrap();
        for (line, name) in crate_references(&code) {
            let module = ROOT_ITEMS.iter().find(|(item, _)| *item == name).map_or(name.as_str(), |(_, m)| m);
            if module == "error" || module == top {
                continue;
            }
            match layer_of(module) {
                Some(l) if l <= own => {}
                Some(_) => violations.push(format!("{}:{line}: {top} imports {module}", rel.display())),
                None if module.chars().next().is_some_and(char::is_uppercase) => {
                    unplaced.push(format!("crate::{module} (a root item this test does not know)"))
                }
                None => unplaced.push(module.to_string()),
            }
        }
    }
    unplaced.sort();
    unplaced.dedup();
    assert!(unplaced.is_empty(), "modules not in LAYERS: {unplaced:?}");
    assert!(violations.is_empty(), "imports pointing up the stack:\n{}", violations.join("\n"));
}

#[test]
fn the_checker_sees_imports() {
    let code = "use crate::gpu::Gpu;\nuse crate::{ops, model::{X, Y}, \n  quant::Z};\n// crate::runtime in a comment\nlet x = $crate::y;\n#[cfg(test)]\nuse crate::reference;";
    let refs = crate_references(code);
    let names: Vec<&str> = refs.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["gpu", "ops", "model", "quant"]);
    assert_eq!(refs[3].0, 3, "{refs:?}");
}
