//! Builds every `kernels/*.cu` into one static library with nvcc (through `cc`) and
//! generates the raw FFI for `kernels/include/fl_kernels.h` with bindgen.
//!
//! Environment:
//! - `NVCC`: the nvcc to use; else `CUDA_HOME`/`CUDA_PATH` + `/bin/nvcc`; else `nvcc` on PATH.
//! - `FL_CUDA_ARCHS`: comma-separated targets, e.g. `80,90a` (SASS for each) plus
//!   `compute_80` style entries for PTX. Default: `80,86,89,90a,compute_80`.
//! - `FL_NVCC_FLAGS`: extra flags, whitespace separated.
//! - `FL_KERNELS_CACHE`: where built libraries are kept for reuse, keyed by a hash of every
//!   input (default `fl-kernels-cache/` beside the profile directories of the target dir;
//!   empty: no cache).
//!
//! No GPU is needed to build.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_ARCHS: &str = "80,86,89,90a,compute_80";
/// Sources compiled without relocatable device code (see where they are built).
const WHOLE_PROGRAM: &[&str] = &["attention_prefill_wgmma.cu"];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernels = manifest
        .join("../../kernels")
        .canonicalize()
        .unwrap_or_else(|_| {
            fail("the kernels/ directory was not found next to crates/ (expected ../../kernels)")
        });
    let header = kernels.join("include/fl_kernels.h");

    for var in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "FL_CUDA_ARCHS",
        "FL_NVCC_FLAGS",
        "PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let sources = collect(&kernels, "cu");
    let mut watched = sources.clone();
    watched.extend(collect(&kernels.join("common"), "cuh"));
    watched.extend(collect(&kernels.join("include"), "h"));
    watched.extend(collect(&kernels, "cuh"));
    // Watched paths are given relative to this package (`../../kernels/...`): cargo resolves a
    // relative path against the package root of the checkout being built. Absolute paths would
    // tie the build script's output to the checkout that last ran it, and cargo shares that
    // output between checkouts using one CARGO_TARGET_DIR (the unit's hash has no path in it):
    // another clone's unchanged kernels then stood for this one's (stale bindings, seen when a
    // CI clone and the working tree shared ~/.cache/fasterllama/target).
    let rel = |f: &Path| -> PathBuf {
        match f.strip_prefix(&kernels) {
            Ok(tail) => Path::new("../../kernels").join(tail),
            Err(_) => f.to_path_buf(),
        }
    };
    for f in &watched {
        println!("cargo:rerun-if-changed={}", rel(f).display());
    }
    println!("cargo:rerun-if-changed=../../kernels");

    let nvcc = find_nvcc().unwrap_or_else(|| {
        fail(
            "nvcc was not found. Set NVCC=/path/to/nvcc or CUDA_HOME, or put nvcc on PATH.\n\
             Get one from a CUDA toolkit (12.x or 13.x), or run `bash scripts/setup-cuda.sh`, \
             which installs the pinned CUDA 13.0 compiler wheels into ~/.cache/fasterllama \
             (this is what `bash scripts/test.sh` and `.ci/run` do).",
        )
    });
    let nvcc_bin = nvcc.parent().unwrap().to_path_buf();
    let cuda_root = nvcc_bin.parent().unwrap().to_path_buf();

    // cc's nvcc support wants `nvcc` on PATH (`.compiler(path)` breaks its flag handling).
    let path = env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![nvcc_bin.clone()];
    paths.extend(env::split_paths(&path));
    env::set_var("PATH", env::join_paths(paths).unwrap());
    env::set_var("NVCC", &nvcc);

    let archs = env::var("FL_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_string());
    let mut build = cc::Build::new();
    build
        .cuda(true)
        .cudart("static")
        .warnings(false)
        // cc would pass -G (device debug, very slow kernels) in debug profiles, and the
        // profile's host opt-level; kernels are always built optimised.
        .debug(false)
        .opt_level(3)
        .flag("-O3")
        .flag("-std=c++17")
        .flag("--expt-relaxed-constexpr")
        // Smallest fatbin (decompressed once at module load). -lineinfo is left to
        // FL_NVCC_FLAGS when profiling: it nearly triples the device code.
        .flag("--compress-mode=size")
        .include(&kernels);
    let mut n_targets = 0;
    for a in archs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let gencode = if let Some(v) = a.strip_prefix("compute_") {
            format!("arch=compute_{v},code=compute_{v}")
        } else {
            let v = a.strip_prefix("sm_").unwrap_or(a);
            if !v.chars().next().is_some_and(|c| c.is_ascii_digit()) {
                fail(&format!(
                    "FL_CUDA_ARCHS: `{a}` is not an architecture like 80, 90a or compute_80"
                ));
            }
            format!("arch=compute_{v},code=sm_{v}")
        };
        build.flag("-gencode").flag(&gencode);
        n_targets += 1;
    }
    if n_targets == 0 {
        fail("FL_CUDA_ARCHS names no architecture");
    }
    if let Ok(extra) = env::var("FL_NVCC_FLAGS") {
        for f in extra.split_whitespace() {
            build.flag(f);
        }
    }
    let whole_program = |s: &Path| {
        WHOLE_PROGRAM
            .iter()
            .any(|w| s.file_name().is_some_and(|n| n == *w))
    };
    let single = build.clone(); // the flags without any file, for the whole-program sources
    for s in sources.iter().filter(|s| !whole_program(s)) {
        build.file(s);
    }
    // The library depends only on the inputs hashed below, never on the cargo profile (the
    // kernels are always built optimised), yet cargo runs this script once per profile and
    // per check/clippy/doc flavour: a library built for identical inputs is reused from a
    // cache next to the profiles (one nvcc pass instead of three in `scripts/test.sh`).
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let lib = out_dir.join("libfl_kernels.a");
    let key = input_hash(&kernels, &watched, &archs, &nvcc);
    let cache = kernel_cache_dir(&out_dir).map(|d| d.join(format!("{key:016x}.a")));
    let hit = cache.as_ref().is_some_and(|c| {
        let ok = c.is_file() && std::fs::copy(c, &lib).is_ok();
        if ok {
            // Most recently used entries are the ones kept.
            let now = std::time::SystemTime::now();
            let _ = std::fs::File::options()
                .append(true)
                .open(c)
                .and_then(|f| f.set_modified(now));
        }
        ok
    });
    if !hit {
        build.cargo_metadata(false);
        // Kernels that hand registers between warpgroups (setmaxnreg) are compiled as whole
        // programs, each on its own: with relocatable device code (what cc uses for more than
        // one CUDA file) ptxas ignores setmaxnreg (warning C7504) and the kernel spills. Their
        // objects join the library beside the others; the device-link step leaves them alone.
        for s in sources.iter().filter(|s| whole_program(s)) {
            let mut one = single.clone();
            one.file(s);
            for o in one.compile_intermediates() {
                build.object(o);
            }
        }
        build.compile("fl_kernels");
        check_no_host_exit(&lib);
        if let Some(c) = &cache {
            store_in_cache(&lib, c);
        }
    }
    // What cc's cargo metadata would print (off, so that a cache hit prints the same).
    println!("cargo:rustc-link-search=native={}", out_dir.display());
    println!("cargo:rustc-link-lib=static=fl_kernels");
    println!("cargo:rustc-link-lib=cudart_static");
    println!("cargo:rustc-link-lib=stdc++");

    // cudart_static lives in lib/ (wheels) or lib64/ / targets/<arch>-linux/lib (toolkits).
    for dir in [
        "lib",
        "lib64",
        "targets/x86_64-linux/lib",
        "targets/sbsa-linux/lib",
    ] {
        let d = cuda_root.join(dir);
        if d.join("libcudart_static.a").exists() {
            println!("cargo:rustc-link-search=native={}", d.display());
        }
    }
    println!("cargo:rustc-link-lib=dylib=dl");
    println!("cargo:rustc-link-lib=dylib=rt");
    println!("cargo:rustc-link-lib=dylib=pthread");
    println!("cargo:rustc-link-lib=dylib=stdc++");

    // Raw FFI, launchers and fl_ types only.
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_function("fl_.*")
        .allowlist_type("fl_.*")
        .allowlist_var("FL_.*")
        .rustified_non_exhaustive_enum("fl_dtype")
        .default_enum_style(bindgen::EnumVariation::Rust {
            non_exhaustive: true,
        })
        .layout_tests(false)
        .derive_debug(true)
        .derive_copy(true)
        .generate_comments(true)
        .generate()
        .unwrap_or_else(|e| {
            fail(&format!(
                "bindgen failed on {}: {e}. bindgen needs libclang \
                 (Debian/Ubuntu: apt-get install libclang-dev; or set LIBCLANG_PATH).",
                header.display()
            ))
        });
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings.write_to_file(&out).expect("write bindings.rs");
}

fn collect(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == ext))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn find_nvcc() -> Option<PathBuf> {
    let works = |p: &Path| {
        Command::new(p)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if let Some(p) = env::var_os("NVCC").map(PathBuf::from) {
        if works(&p) {
            return Some(p);
        }
        fail(&format!(
            "NVCC={} does not run (`nvcc --version` failed)",
            p.display()
        ));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = env::var_os(var) {
            let p = PathBuf::from(root).join("bin/nvcc");
            if works(&p) {
                return Some(p);
            }
        }
    }
    for dir in env::split_paths(&env::var_os("PATH").unwrap_or_default()) {
        let p = dir.join("nvcc");
        if p.is_file() && works(&p) {
            return Some(p);
        }
    }
    None
}

/// Fails the build when host code of the kernel library references `exit`. None of our host
/// code calls it; cudafe gives the host copy of every `__device__`-only function the body
/// `exit(1)`, and nvcc accepts a call to such a function from host code inside a template
/// without a diagnostic, so a reference to `exit` means a launcher calls a `__device__`
/// helper (make it `__host__ __device__`): the process would end silently, with status 1,
/// when the call is reached. Skipped (with a warning) when `nm` is not available.
fn check_no_host_exit(lib: &Path) {
    let out = match Command::new(env::var_os("NM").unwrap_or_else(|| "nm".into()))
        .arg("--undefined-only")
        .arg("-A")
        .arg(lib)
        .output()
    {
        Ok(o) if o.status.success() => o,
        _ => {
            println!(
                "cargo:warning=fl-kernels-sys: `nm` did not run; the check that no host code \
                 calls exit() (a __device__ function called from host code) was skipped"
            );
            return;
        }
    };
    // Lines like `.../libfl_kernels.a:<hash>-quant.o:                 U exit`.
    let bad: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut t = l.split_whitespace().rev();
            match (t.next(), t.next(), t.next()) {
                (Some("exit" | "_exit" | "_Exit"), Some("U"), Some(file)) => Some(
                    file.trim_end_matches(':')
                        .rsplit(':')
                        .next()
                        .unwrap_or(file)
                        .to_string(),
                ),
                _ => None,
            }
        })
        .collect();
    if !bad.is_empty() {
        fail(&format!(
            "host code in {} references exit(): a launcher calls a __device__-only function, \
             whose host copy nvcc compiles to `exit(1)` (the process would end silently when \
             it is reached). Mark the helper __host__ __device__.",
            bad.join(", ")
        ));
    }
}

/// FNV-1a (64-bit) of everything the kernel library is built from: this script, the
/// workspace's Cargo.lock, every watched file (name relative to `kernels/` and contents),
/// the target list, the extra nvcc flags and the environment that picks the host compiler,
/// and the versions of nvcc and g++.
fn input_hash(kernels: &Path, watched: &[PathBuf], archs: &str, nvcc: &Path) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes.iter().chain(&[0xffu8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(include_bytes!("build.rs"));
    // The cc crate's version (its nvcc flags) is pinned there.
    eat(&std::fs::read(kernels.join("../Cargo.lock")).unwrap_or_default());
    for f in watched {
        eat(f
            .strip_prefix(kernels)
            .unwrap_or(f)
            .to_string_lossy()
            .as_bytes());
        eat(&std::fs::read(f).unwrap_or_default());
    }
    eat(archs.as_bytes());
    for var in [
        "FL_NVCC_FLAGS",
        "NVCC_CCBIN",
        "NVCC_PREPEND_FLAGS",
        "NVCC_APPEND_FLAGS",
        "TARGET",
    ] {
        eat(env::var(var).unwrap_or_default().as_bytes());
    }
    for (prog, arg) in [
        (nvcc.as_os_str(), "--version"),
        ("g++".as_ref(), "--version"),
    ] {
        let out = Command::new(prog).arg(arg).output();
        eat(&out.map(|o| o.stdout).unwrap_or_default());
    }
    h
}

/// `FL_KERNELS_CACHE` if set (empty: no cache), else `fl-kernels-cache/` in the directory
/// that holds the profile directories (`target/` for a host build), found from OUT_DIR
/// (`target/<profile>/build/<unit>/out`).
fn kernel_cache_dir(out_dir: &Path) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=FL_KERNELS_CACHE");
    if let Some(d) = env::var_os("FL_KERNELS_CACHE") {
        return (!d.is_empty()).then(|| PathBuf::from(d));
    }
    let build = out_dir
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "build"))?;
    Some(build.parent()?.parent()?.join("fl-kernels-cache"))
}

/// Copies the library into the cache (through a temporary name, so that a concurrent build
/// never sees half a file) and keeps the 4 newest entries. Failures only cost the cache.
fn store_in_cache(lib: &Path, entry: &Path) {
    let Some(dir) = entry.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = entry.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::copy(lib, &tmp).is_err() || std::fs::rename(&tmp, entry).is_err() {
        let _ = std::fs::remove_file(&tmp);
        return;
    }
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|x| x == "a"))
                .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
                .collect()
        })
        .unwrap_or_default();
    entries.sort();
    for (_, old) in entries.iter().rev().skip(4) {
        let _ = std::fs::remove_file(old);
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("\nfl-kernels-sys: {msg}\n");
    println!(
        "cargo:warning=fl-kernels-sys: {}",
        msg.lines().next().unwrap_or(msg)
    );
    std::process::exit(1);
}
