//! The import directions ARCHITECTURE.md claims, checked on the sources: which top-level module
//! of a crate names which (`crate::x` in code, not in comments or test modules), no cycle among
//! them, and the layers of the request path and of the engine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src` without comments and without `#[cfg(test)]` items (test code may build fixtures from
/// any layer).
fn code_of(src: &str) -> String {
    let mut out = String::new();
    let mut lines = src.lines();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if t.starts_with("#[cfg(test)]") {
            // Skip the item: to the end of its line if it closes there (`mod tests;`), else
            // to the line where its braces balance.
            let mut depth = 0i64;
            let mut opened = false;
            for l in lines.by_ref() {
                depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
                opened |= l.contains('{');
                if (opened && depth <= 0) || (!opened && l.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        out.push_str(line.split("//").next().unwrap_or(""));
        out.push('\n');
    }
    out
}

/// The top-level modules `code` names through `crate::`.
fn named(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::X, b, c::{..}}`: the first name of each top-level entry.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        names.insert(ident(&group[j..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

/// Each top-level module of the crate at `src` and the modules it names (itself left out).
/// Test files (`tests.rs`, `tests/`) are left out; `lib.rs` and `main.rs` compose, so they are
/// left out too.
fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g = Graph::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let parts: Vec<_> = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts.iter().any(|p| p == "tests" || p == "tests.rs") {
            continue;
        }
        let top = parts[0].trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&f).unwrap());
        let entry = g.entry(top.clone()).or_default();
        entry.extend(named(&code).into_iter().filter(|n| *n != top));
    }
    g
}

/// A cycle of `g`, if it has one.
fn cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        n: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(g, m, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(g, n, &mut Vec::new(), &mut done))
}

/// `module` names only modules in `allowed`.
fn sees_only(g: &Graph, module: &str, allowed: &[&str]) {
    let seen = g
        .get(module)
        .unwrap_or_else(|| panic!("no module `{module}`"));
    let extra: Vec<_> = seen
        .iter()
        .filter(|m| !allowed.contains(&m.as_str()))
        .collect();
    assert!(
        extra.is_empty(),
        "`{module}` imports {extra:?}, above it (it may see {allowed:?})"
    );
}

/// Nothing but `above` names `module`.
fn seen_only_by(g: &Graph, module: &str, above: &[&str]) {
    let users: Vec<_> = g
        .iter()
        .filter(|(m, seen)| seen.contains(module) && !above.contains(&m.as_str()))
        .map(|(m, _)| m)
        .collect();
    assert!(
        users.is_empty(),
        "{users:?} import `{module}`, which sits above them"
    );
}

#[test]
fn the_parser_reads_grouped_imports_and_skips_comments_and_tests() {
    let code = code_of(
        "use crate::{a::X, b, c::{d, e::F}};\n// crate::g\nlet x = crate::h::y(); // crate::i\n\
         #[cfg(test)]\nmod tests {\n    use crate::j;\n}\n#[cfg(test)]\nmod more;\nuse crate::k;\n",
    );
    let got: Vec<_> = named(&code).into_iter().collect();
    assert_eq!(got, ["a", "b", "c", "h", "k"]);
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(cycle(&g), None);
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(cycle(&g).unwrap(), ["a", "b", "c", "a"]);
}

#[test]
fn no_module_of_either_crate_imports_in_a_cycle() {
    for krate in ["backend/src", "gateway/src"] {
        let g = graph(&root().join(krate));
        assert!(g.len() > 10, "{krate}: {} modules read", g.len());
        assert_eq!(
            cycle(&g),
            None,
            "{krate}: modules import each other in a cycle"
        );
    }
}

#[test]
fn no_gateway_module_imports_up_the_request_path() {
    let g = graph(&root().join("gateway/src"));
    sees_only(&g, "error", &[]);
    sees_only(&g, "http", &["error"]);
    sees_only(&g, "protocol", &["error"]);
    sees_only(&g, "route", &["error", "protocol"]);
    sees_only(&g, "upstream", &["error", "http", "protocol", "route"]);
    seen_only_by(&g, "server", &[]);
    // Each subsystem owns its config type; only `config` composes them.
    seen_only_by(&g, "config", &[]);
}

#[test]
fn no_engine_module_imports_up_the_engine() {
    let g = graph(&root().join("backend/src"));
    let leaves = [
        "config",
        "error",
        "tensor",
        "shard",
        "sampler",
        "rng",
        "tokenizer",
    ];
    for leaf in ["error", "tensor", "rng"] {
        sees_only(&g, leaf, &[]);
    }
    sees_only(&g, "shard", &["config", "error"]);
    sees_only(&g, "device", &leaves);
    let mut loader = leaves.to_vec();
    loader.push("device");
    sees_only(&g, "loader", &loader);
    seen_only_by(&g, "model", &["engine", "generate"]);
    seen_only_by(&g, "engine", &[]);
}

#[test]
fn nothing_that_serves_imports_the_benchmarks() {
    let src = root().join("gateway/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        if rel.starts_with("cli/bench") || rel == "cli/mod.rs" {
            continue; // the benchmarks, and the command that dispatches to them
        }
        let code = code_of(&std::fs::read_to_string(&f).unwrap());
        assert!(
            !code.contains("cachet_bench") && !code.contains("bench::"),
            "{rel} imports the benchmarks"
        );
    }
}
