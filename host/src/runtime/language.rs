//! The source language of a component, when the component says it: for
//! people reading the dashboard and the module list, never for a decision.
//!
//! Toolchains record themselves in `producers` custom sections, one per
//! core module and one for the component. A component holds more than its
//! author's code (the WASI adapter is Rust; componentize-js bundles a
//! C++ engine; componentize-py a Rust runtime), so the answer is read from
//! the tool that made the component first, then from the languages:
//!
//! | language | what marks it |
//! |---|---|
//! | JavaScript | `processed-by` ComponentizeJS, or `language` JavaScript |
//! | Python | `processed-by` componentize-py, or its runtime, `libcomponentize_py_runtime` |
//! | Go | `language` Go, or `processed-by` TinyGo |
//! | Rust | `processed-by` wit-bindgen-rust |
//! | C / C++ | `processed-by` wit-bindgen-c, or `language` C99, C11, ... / C_plus_plus_* |

use wasmparser::{KnownCustom, Parser, Payload};

/// The language `bytes` (a component) was written in, if its producers
/// sections say; `None` when they do not, or the bytes do not parse.
pub fn source_language(bytes: &[u8]) -> Option<&'static str> {
    let mut languages = Vec::new();
    let mut tools = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else { return None };
        let Payload::CustomSection(section) = payload else { continue };
        let KnownCustom::Producers(reader) = section.as_known() else { continue };
        for field in reader.into_iter().flatten() {
            let list = match field.name {
                "language" => &mut languages,
                "processed-by" => &mut tools,
                _ => continue,
            };
            list.extend(field.values.into_iter().flatten().map(|value| value.name.to_owned()));
        }
    }
    decide(&languages, &tools, || contains(bytes, b"libcomponentize_py_runtime"))
}

fn decide(languages: &[String], tools: &[String], has_python_runtime: impl FnOnce() -> bool) -> Option<&'static str> {
    let any = |list: &[String], name: &str| list.iter().any(|n| n.eq_ignore_ascii_case(name));
    if any(tools, "ComponentizeJS") || any(languages, "JavaScript") {
        Some("JavaScript")
    } else if any(tools, "componentize-py") || has_python_runtime() {
        Some("Python")
    } else if any(languages, "Go") || any(tools, "TinyGo") {
        Some("Go")
    } else if any(tools, "wit-bindgen-rust") {
        Some("Rust")
    } else if any(tools, "wit-bindgen-c") || languages.iter().any(|l| l.starts_with("C9") || l.starts_with("C1")) {
        Some("C")
    } else if languages.iter().any(|l| l.starts_with("C_plus_plus")) {
        Some("C++")
    } else {
        None
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    type Case = (&'static [&'static str], &'static [&'static str], bool, Option<&'static str>);

    /// The producers each SDK's running-count carries (as built here).
    #[test]
    fn the_author_s_language_wins_over_what_the_toolchain_bundles() {
        const ADAPTER: &[&str] = &["Rust"];
        // (languages, processed-by, holds componentize-py's runtime, expected)
        let cases: [Case; 7] = [
            (&["C99", "C11", "Rust"], &["clang", "wit-component", "wit-bindgen-c", "rustc"], false, Some("C")),
            (&["Go", "Rust"], &["Go cmd/compile", "wit-component", "rustc"], false, Some("Go")),
            (
                &["C11", "Rust", "C_plus_plus_14", "JavaScript"],
                &["clang", "rustc", "ComponentizeJS"],
                false,
                Some("JavaScript"),
            ),
            (ADAPTER, &["rustc", "wit-component", "component-init-transform"], true, Some("Python")),
            (&[], &["wit-component", "wit-bindgen-rust", "wit-bindgen-c"], false, Some("Rust")),
            (ADAPTER, &["rustc", "wit-component"], false, None),
            (&[], &[], false, None),
        ];
        for (languages, tools, python, expected) in cases {
            assert_eq!(decide(&names(languages), &names(tools), || python), expected, "{languages:?} {tools:?}");
        }
    }

    #[test]
    fn bytes_that_are_not_wasm_have_no_language() {
        assert_eq!(source_language(b"not wasm at all"), None);
    }
}
