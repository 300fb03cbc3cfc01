//! The committed `include/moestream.h` is what cbindgen generates from this crate now.
//! `MOESTREAM_WRITE_HEADER=1 cargo test -p moestream-capi --test header` rewrites it.

use std::path::Path;

#[test]
fn committed_header_matches_cbindgen() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/lib.rs"))
        .with_src(crate_dir.join("src/boundary.rs"))
        .with_src(crate_dir.join("src/engine.rs"))
        .with_src(crate_dir.join("src/generate.rs"))
        .with_src(crate_dir.join("src/score.rs"))
        .with_src(crate_dir.join("src/session.rs"))
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
