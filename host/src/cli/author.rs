//! `sluice init` and `sluice build`: a transform author's project, in any of
//! the five guest languages.
//!
//! `init` writes a working running-count project (the language's example,
//! with its test data) that `build` turns into a component. `build` finds
//! the language from the project's files and runs the language's build:
//! cargo for Rust, the SDK's `build.sh` for the others (which installs the
//! toolchain it needs first). Both need the sluice source tree (the SDKs,
//! the WIT and the toolchain scripts): the one this binary was built from,
//! or `$SLUICE_HOME`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// A guest language.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub(crate) enum Lang {
    Rust,
    Python,
    Javascript,
    Go,
    C,
}

impl Lang {
    /// Its directory under sdks/ (and examples/).
    fn dir_name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Javascript => "javascript",
            Lang::Go => "go",
            Lang::C => "c",
        }
    }
}

/// Arguments of `sluice init`.
#[derive(clap::Args)]
pub(crate) struct InitArgs {
    /// The project's language.
    #[arg(long)]
    lang: Lang,
    /// The project's name; also its directory.
    name: String,
}

/// Arguments of `sluice build`.
#[derive(clap::Args)]
pub(crate) struct BuildArgs {
    /// The project directory.
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Where to write the component (default: DIR/NAME.wasm).
    #[arg(long, short)]
    out: Option<PathBuf>,
}

macro_rules! example {
    ($lang:literal, $file:literal) => {
        ($file, include_str!(concat!("../../../examples/", $lang, "/running-count/", $file)))
    };
}

/// The files of a new project, by language (the running-count examples).
fn template(lang: Lang, name: &str, home: &Path) -> Vec<(String, String)> {
    let files: Vec<(&str, &str)> = match lang {
        Lang::Rust => vec![("src/lib.rs", include_str!("../../../examples/rust/running-count/src/lib.rs"))],
        Lang::Python => vec![example!("python", "app.py")],
        Lang::Javascript => vec![example!("javascript", "app.js")],
        Lang::Go => vec![example!("go", "main.go")],
        Lang::C => vec![example!("c", "running_count.c")],
    };
    let mut files: Vec<(String, String)> = files.into_iter().map(|(p, t)| (p.to_owned(), t.to_owned())).collect();
    match lang {
        Lang::Rust => files.push((
            "Cargo.toml".into(),
            format!(
                "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[lib]\ncrate-type = [\"cdylib\"]\n\n\
                 [dependencies]\nsluice-guest = {{ path = {:?} }}\n\n\
                 # A workspace of its own, so it builds wherever it lives.\n[workspace]\n\n\
                 [profile.release]\nlto = true\nopt-level = 3\nstrip = true\n",
                home.join("guest-sdk")
            ),
        )),
        // The SDK by module path and version; `sluice build` (sdks/go/build.sh)
        // resolves that version to the tree's SDK through a go.work `replace`,
        // so nothing is downloaded.
        Lang::Go => files.push((
            "go.mod".into(),
            format!("module {name}\n\ngo 1.25\n\nrequire sluice.dev/sdk/go v0.1.0 // sdks/go in the sluice tree\n"),
        )),
        // The SDK by name and version, from the sluice tree (as the Rust
        // project's path dependency): `sluice build` stages it itself, and
        // an editor or a type checker finds it through these files.
        Lang::Python => files.push((
            "pyproject.toml".into(),
            format!(
                "[project]\nname = \"{name}\"\nversion = \"0.1.0\"\nrequires-python = \">=3.9\"\n\
                 dependencies = [\"sluice-guest @ file://{}\"]  # sluice-guest {}\n",
                home.join("sdks").join("python").display(),
                env!("CARGO_PKG_VERSION")
            ),
        )),
        Lang::Javascript => files.push((
            "package.json".into(),
            format!(
                "{{\n  \"name\": \"{name}\",\n  \"version\": \"0.1.0\",\n  \"private\": true,\n  \"type\": \"module\",\n  \
                 \"main\": \"app.js\",\n  \"dependencies\": {{\n    \"sluice-guest\": \"file:{}\"\n  }}\n}}\n",
                home.join("sdks").join("javascript").display()
            ),
        )),
        // The SDK by name and version through pkg-config, as C projects
        // depend on libraries: `make` builds against the install that
        // `sluice build` (sdks/c/build.sh) or `make -C sdks/c install` made.
        Lang::C => files.push((
            "Makefile".into(),
            format!(
                "# Builds {name}.wasm against the sluice C SDK {version}, found by name and version with pkg-config.\n\
                 # Install it first: `sluice build` does (or `make -C {sdk} install`); then\n\
                 # `eval \"$({tools} --env)\"` for clang-19, wasm-tools and WASI_ADAPTER_REACTOR.\n\
                 SLUICE_C_SDK ?= $(or $(SLUICE_TOOLCHAINS),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/sluice/toolchains)/c-sdk-{version}\n\
                 PKG_CONFIG = PKG_CONFIG_PATH=$(SLUICE_C_SDK)/lib/pkgconfig pkg-config\n\
                 CC = clang-19\n\
                 CFLAGS = --target=wasm32-wasi -O2 -Wall -Wextra $(shell $(PKG_CONFIG) --cflags 'sluice = {version}')\n\
                 LDLIBS = $(shell $(PKG_CONFIG) --libs 'sluice = {version}')\n\n\
                 {name}.wasm: core.wasm\n\
                 \twasm-tools component new $< --adapt wasi_snapshot_preview1=$(WASI_ADAPTER_REACTOR) -o $@\n\n\
                 core.wasm: $(wildcard *.c)\n\
                 \t$(CC) $(CFLAGS) -fuse-ld=lld $^ $(LDLIBS) -Wl,--strip-debug -o $@\n",
                version = "0.1.0",
                sdk = home.join("sdks").join("c").display(),
                tools = home.join("scripts").join("toolchains").join("c.sh").display(),
            ),
        )),
    }
    let testdata = [
        ("testdata/input.jsonl", include_str!("../../../examples/rust/running-count/testdata/input.jsonl")),
        ("testdata/expected.jsonl", include_str!("../../../examples/rust/running-count/testdata/expected.jsonl")),
    ];
    files.extend(testdata.iter().map(|(p, t)| ((*p).to_owned(), (*t).to_owned())));
    files.push((
        "README.md".into(),
        format!(
            "# {name}\n\nA sluice transform in {lang:?}: for each record, its key and how many records with that key \
             came so far.\n\n```sh\nsluice build                      # writes {name}.wasm\n\
             sluice exec {name}.wasm --input testdata/input.jsonl   # compare with testdata/expected.jsonl\n```\n\n\
             The SDK guide: {}.\n",
            home.join("sdks").join(lang.dir_name()).join("README.md").display()
        ),
    ));
    files
}

/// The sluice source tree: `$SLUICE_HOME`, else the one this binary was
/// built from.
fn sluice_home() -> Result<PathBuf> {
    let home = match std::env::var_os("SLUICE_HOME") {
        Some(home) => PathBuf::from(home),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    };
    let home =
        home.canonicalize().with_context(|| format!("the sluice source tree {} is not there", home.display()))?;
    if !home.join("wit").join("sluice.wit").is_file() {
        bail!("{} is not the sluice source tree (no wit/sluice.wit); set SLUICE_HOME", home.display());
    }
    Ok(home)
}

pub(crate) fn init(args: InitArgs) -> Result<()> {
    let valid = !args.name.is_empty()
        && args.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && args.name.starts_with(|c: char| c.is_ascii_alphabetic());
    if !valid {
        bail!("project name {:?}: use letters, digits, `-` and `_`, starting with a letter", args.name);
    }
    let dir = PathBuf::from(&args.name);
    if dir.exists() {
        bail!("{} exists already", dir.display());
    }
    let home = sluice_home()?;
    for (path, text) in template(args.lang, &args.name, &home) {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("created {} ({:?}); next: cd {} && sluice build", dir.display(), args.lang, dir.display());
    Ok(())
}

/// The project's language, from its files.
fn detect(dir: &Path) -> Result<Lang> {
    let has = |name: &str| dir.join(name).is_file();
    let has_ext = |ext: &str| {
        std::fs::read_dir(dir)
            .map(|entries| entries.flatten().any(|e| e.path().extension().is_some_and(|x| x == ext)))
            .unwrap_or(false)
    };
    Ok(if has("Cargo.toml") {
        Lang::Rust
    } else if has("app.py") {
        Lang::Python
    } else if has("app.js") {
        Lang::Javascript
    } else if has("go.mod") {
        Lang::Go
    } else if has_ext("c") {
        Lang::C
    } else {
        bail!(
            "{}: no Cargo.toml, app.py, app.js, go.mod or .c file, so no sluice project (`sluice init` makes one)",
            dir.display()
        )
    })
}

pub(crate) fn build(args: BuildArgs) -> Result<()> {
    let dir = args.dir.canonicalize().with_context(|| format!("no project at {}", args.dir.display()))?;
    let lang = detect(&dir)?;
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "transform".into());
    let out = args.out.unwrap_or_else(|| dir.join(format!("{name}.wasm")));
    let home = sluice_home()?;
    let status = match lang {
        Lang::Rust => {
            let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args(["build", "--release", "--target", "wasm32-wasip2", "--manifest-path"])
                .arg(dir.join("Cargo.toml"))
                .arg("--target-dir")
                .arg(dir.join("target"))
                .status()
                .context("running cargo")?;
            if status.success() {
                let built = dir
                    .join("target/wasm32-wasip2/release")
                    .join(format!("{}.wasm", crate_name(&dir.join("Cargo.toml"))?.replace('-', "_")));
                std::fs::copy(&built, &out).with_context(|| format!("copying {}", built.display()))?;
            }
            status
        }
        _ => {
            install_toolchain(&home, lang)?;
            let script = home.join("sdks").join(lang.dir_name()).join("build.sh");
            Command::new(&script)
                .arg(&dir)
                .arg(&out)
                .status()
                .with_context(|| format!("running {}", script.display()))?
        }
    };
    if !status.success() {
        bail!("building the {lang:?} project {} failed ({status})", dir.display());
    }
    let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    println!("built {} ({size} bytes)", out.display());
    Ok(())
}

/// Installs `lang`'s toolchain if it is missing (the first build of a
/// language downloads it: minutes), behind a spinner on a terminal; its
/// output is shown only if it fails. A no-op when installed.
fn install_toolchain(home: &Path, lang: Lang) -> Result<()> {
    let script = home.join("scripts").join("toolchains").join(format!("{}.sh", lang.dir_name()));
    let spinner = super::progress::spinner(format!(
        "checking the {lang:?} toolchain (the first build installs it into ~/.cache/sluice/toolchains)"
    ));
    let output = Command::new(&script).output().with_context(|| format!("running {}", script.display()))?;
    spinner.finish_and_clear();
    if !output.status.success() {
        bail!(
            "installing the {lang:?} toolchain failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// The `name` of a Cargo.toml's `[package]`.
fn crate_name(manifest: &Path) -> Result<String> {
    let text = std::fs::read_to_string(manifest).with_context(|| format!("reading {}", manifest.display()))?;
    let value: toml::Value = toml::from_str(&text).with_context(|| format!("parsing {}", manifest.display()))?;
    value
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
        .map(str::to_owned)
        .with_context(|| format!("{} has no package name", manifest.display()))
}
