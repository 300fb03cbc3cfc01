//! The committed `include/moestream.h` is what cbindgen generates from this crate now, given
//! the crate once (it follows the modules itself), and it declares each function once.
//! `MOESTREAM_WRITE_HEADER=1 cargo test -p moestream-capi --test header` rewrites it.

use std::path::Path;

#[test]
fn committed_header_matches_cbindgen() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_crate(crate_dir)
        .generate()
        .expect("cbindgen parses the C ABI")
        .write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    let header = crate_dir.join("../include/moestream.h");
    if std::env::var_os("MOESTREAM_WRITE_HEADER").is_some() {
        std::fs::write(&header, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&header).unwrap_or_default();
    assert!(
        committed == generated,
        "include/moestream.h is stale: run MOESTREAM_WRITE_HEADER=1 cargo test --release -p moestream-capi --test header"
    );
}

#[test]
fn header_declares_each_function_once() {
    let header = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../include/moestream.h")).unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for line in header.lines().filter(|l| !l.trim_start().starts_with("//") && l.contains('(')) {
        let before = &line[..line.find('(').unwrap()];
        if let Some(name) =
            before.split(|c: char| !c.is_alphanumeric() && c != '_').rfind(|w| w.starts_with("moestream_"))
        {
            *seen.entry(name.to_string()).or_insert(0) += 1;
        }
    }
    assert!(seen.len() >= 10, "{seen:?}");
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "declared more than once: {twice:?}");
}

#[test]
fn header_states_which_thread_may_call_what() {
    let header = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../include/moestream.h")).unwrap();
    let text = header.replace("\n * ", " ");
    for rule in [
        "used by one thread at a time",
        "moestream_last_error is per thread",
        "Callbacks run on the calling thread",
        "must not call the library with the same engine or its sessions",
    ] {
        assert!(text.contains(rule), "the header's opening comment says {rule:?}");
    }
}
