//! Links the libtorch worker so it runs without LD_LIBRARY_PATH, and records
//! the libtorch version numerical node keys include.
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        println!("cargo:rustc-env=ORCHESTRATE_LIBTORCH_VERSION=none");
        return;
    };
    let lib = Path::new(&lib);
    // An rpath to torch/lib in every binary of the package (the worker, tests, benches).
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-env=ORCHESTRATE_LIBTORCH_LIB={}", lib.display());
    // tch asks to link libtorch_cuda, and --as-needed drops it (no symbol of it is
    // referenced). That is kept so: the worker loads it at run time where a CUDA
    // driver is installed (`load_cuda` in src/lib.rs).
    println!("cargo:rustc-env=ORCHESTRATE_LIBTORCH_VERSION={}", libtorch_version(lib));
}

/// From the pip wheel's torch/version.py, or a libtorch zip's build-version.
fn libtorch_version(lib: &Path) -> String {
    let root = lib.parent().unwrap_or(lib);
    if let Ok(text) = std::fs::read_to_string(root.join("version.py")) {
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("__version__ = ") {
                return v.trim().trim_matches('\'').trim_matches('"').to_string();
            }
        }
    }
    if let Ok(text) = std::fs::read_to_string(root.join("build-version")) {
        return text.trim().to_string();
    }
    "unknown".to_string()
}
