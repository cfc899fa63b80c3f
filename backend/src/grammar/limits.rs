//! Bounds on a constraint, checked before the grammar library sees it.
//!
//! llguidance compiles schemas and Lark grammars by recursion: a `$ref` chain a thousand
//! definitions long, or a thousand Lark rules each naming the next, overflowed a 2 MiB thread
//! stack and aborted the process (issue 58). So every constraint's shape is measured here first,
//! by walks that keep their own stacks on the heap (no recursion over client data), and refused
//! with the limit named when it is past one. The compile itself then runs where the stack is sized
//! for these bounds ([`super::compile_thread`]), with llguidance's own work limits tightened to
//! the same end ([`super::parser_limits`]).
//!
//! What is measured, and why it bounds the library's recursion:
//! - a JSON schema's **depth**: the nesting of its objects and arrays, counted through each
//!   `$ref` into its target (a reference cycle counts once: the library compiles a recursive
//!   schema as a rule that names itself); its **size** (values); its widest `anyOf` / `oneOf` /
//!   `allOf` / `enum` / `prefixItems`; the regexes of its `pattern`s and `patternProperties`;
//! - a Lark grammar's **depth**: the longest chain of rules each naming the next (a chain of
//!   regular rules is inlined into one nested regex), plus the nesting of groups inside a rule;
//!   its number of rules; its widest alternation; each `%json` schema inside it as above;
//! - a regex's length and group nesting; a choice's number of strings and bytes.
//!
//! Cost: linear in the constraint's size (each schema value and each grammar byte is visited a
//! bounded number of times); a schema at the size limit is measured in a few milliseconds.

use std::collections::HashMap;

use serde_json::Value;

use super::Constraint;

/// Largest constraint text (a schema's JSON, a grammar, a regex, a choice's strings together).
pub const MAX_BYTES: usize = 512 * 1024;
/// Most values in one JSON schema (objects, arrays and scalars).
pub const MAX_SCHEMA_VALUES: usize = 100_000;
/// Deepest nesting: a schema's objects and arrays through its `$ref`s (a level of
/// `properties` is two); a Lark grammar's rule chain plus the groups of each rule on it; a
/// regex's groups. llguidance takes about 4 KiB of stack a level.
pub const MAX_DEPTH: usize = 512;
/// Most alternatives in one place: an `anyOf` / `oneOf` / `allOf`, an `enum`, a `prefixItems`,
/// one Lark rule's `|`s, a choice's strings. llguidance's parser holds at most 2,000 items in
/// one row of its chart; a wider alternation fails there after seconds of work.
pub const MAX_ALTERNATIVES: usize = 1_000;
/// Most rules and terminals in one Lark grammar.
pub const MAX_RULES: usize = 5_000;
/// Longest regex (a `guided_regex`, a schema's `pattern`).
pub const MAX_REGEX_BYTES: usize = 16 * 1024;

/// A constraint past one of the bounds above.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} is {got}, over the limit of {limit}{hint}")]
pub struct LimitError {
    /// What was measured, e.g. "the schema's nesting depth (through `$ref`s)".
    pub what: &'static str,
    pub got: usize,
    pub limit: usize,
    /// What to change, when more than "less".
    pub hint: &'static str,
}

fn over(what: &'static str, got: usize, limit: usize) -> Result<(), LimitError> {
    if got > limit {
        Err(LimitError {
            what,
            got,
            limit,
            hint: "",
        })
    } else {
        Ok(())
    }
}

/// Checks `c` against the bounds, before any compile work.
pub fn check(c: &Constraint) -> Result<(), LimitError> {
    match c {
        Constraint::JsonSchema(s) => check_schema(s),
        Constraint::JsonObject => Ok(()),
        Constraint::Regex(r) => check_regex(r, "the regex"),
        Constraint::Lark(g) => check_lark(g),
        Constraint::Choice(c) => {
            over("the number of choices", c.len(), MAX_ALTERNATIVES)?;
            over(
                "the choices' total bytes",
                c.iter().map(String::len).sum(),
                MAX_BYTES,
            )
        }
    }
}

/// The keys whose value is a list of alternatives (or of parts every instance must match).
const LISTS: [&str; 5] = ["anyOf", "oneOf", "allOf", "enum", "prefixItems"];

/// A JSON schema's size, widths, regexes and depth through its `$ref`s.
pub fn check_schema(root: &Value) -> Result<(), LimitError> {
    // One pass over every value: count, widths, regexes.
    let mut values = 0usize;
    let mut bytes = 0usize;
    let mut todo: Vec<&Value> = vec![root];
    while let Some(v) = todo.pop() {
        values += 1;
        if values > MAX_SCHEMA_VALUES {
            return over("the schema's number of values", values, MAX_SCHEMA_VALUES);
        }
        match v {
            Value::Object(o) => {
                for (k, x) in o {
                    bytes += k.len() + 4;
                    if LISTS.contains(&k.as_str()) {
                        if let Value::Array(a) = x {
                            over(
                                "the number of alternatives in one anyOf/oneOf/allOf/enum/prefixItems",
                                a.len(),
                                MAX_ALTERNATIVES,
                            )?;
                        }
                    }
                    match (k.as_str(), x) {
                        ("pattern", Value::String(p)) => check_regex(p, "a schema's `pattern`")?,
                        ("patternProperties", Value::Object(pp)) => {
                            for p in pp.keys() {
                                check_regex(p, "a schema's `patternProperties` key")?;
                            }
                        }
                        _ => {}
                    }
                    todo.push(x);
                }
            }
            Value::Array(a) => todo.extend(a),
            Value::String(s) => bytes += s.len() + 2,
            _ => bytes += 8,
        }
        over("the schema's size in bytes", bytes, MAX_BYTES)?;
    }
    over(
        "the schema's nesting depth (objects and arrays, counted through each `$ref`)",
        schema_depth(root),
        MAX_DEPTH,
    )
}

/// The value a local `$ref` (`#`, `#/a/b`, with RFC 6901's `~0` / `~1` escapes) points at.
fn resolve<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    let p = r.strip_prefix('#')?;
    if p.is_empty() {
        return Some(root);
    }
    root.pointer(p).or_else(|| {
        // Percent-encoded pointers (`#/$defs/a%20b`) are rare; try them decoded.
        let decoded = percent_decode(p)?;
        root.pointer(&decoded)
    })
}

fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return None;
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let h = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The depth of `root`: the longest path of nested objects and arrays, where a `$ref` adds its
/// target's depth (its target's own value, walked once and remembered). A reference back into
/// a value still being measured (a cycle) adds nothing more. Iterative: the walk's stack is on
/// the heap.
pub fn schema_depth(root: &Value) -> usize {
    #[derive(Clone, Copy)]
    enum Step<'a> {
        Enter(&'a Value),
        Leave(&'a Value),
    }
    let key = |v: &Value| v as *const Value as usize;
    let mut depth: HashMap<usize, usize> = HashMap::new();
    let mut open: std::collections::HashSet<usize> = Default::default();
    let mut todo = vec![Step::Enter(root)];
    let target = |v: &Value| match v {
        Value::Object(o) => o
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| resolve(root, r)),
        _ => None,
    };
    fn children(v: &Value) -> Vec<&Value> {
        match v {
            Value::Object(o) => o
                .values()
                .filter(|x| x.is_object() || x.is_array())
                .collect(),
            Value::Array(a) => a.iter().filter(|x| x.is_object() || x.is_array()).collect(),
            _ => Vec::new(),
        }
    }
    while let Some(s) = todo.pop() {
        match s {
            Step::Enter(v) => {
                let k = key(v);
                if depth.contains_key(&k) || !open.insert(k) {
                    continue;
                }
                todo.push(Step::Leave(v));
                todo.extend(children(v).into_iter().map(Step::Enter));
                if let Some(t) = target(v) {
                    todo.push(Step::Enter(t));
                }
            }
            Step::Leave(v) => {
                let k = key(v);
                open.remove(&k);
                let of = |x: &Value| depth.get(&key(x)).copied().unwrap_or(0);
                let mut d = children(v).into_iter().map(of).max().unwrap_or(0);
                if let Some(t) = target(v) {
                    d = d.max(of(t));
                }
                depth.insert(k, d + 1);
            }
        }
    }
    depth.get(&key(root)).copied().unwrap_or(1)
}

/// A regex's length and the nesting of its groups (escapes and classes skipped).
pub fn check_regex(r: &str, what: &'static str) -> Result<(), LimitError> {
    if r.len() > MAX_REGEX_BYTES {
        return Err(LimitError {
            what,
            got: r.len(),
            limit: MAX_REGEX_BYTES,
            hint: " bytes",
        });
    }
    let (mut d, mut most, mut class) = (0usize, 0usize, false);
    let mut it = r.bytes();
    while let Some(b) = it.next() {
        match b {
            b'\\' => {
                it.next();
            }
            b'[' if !class => class = true,
            b']' if class => class = false,
            b'(' if !class => {
                d += 1;
                most = most.max(d);
            }
            b')' if !class => d = d.saturating_sub(1),
            _ => {}
        }
    }
    if most > MAX_DEPTH {
        return Err(LimitError {
            what: "a regex's group nesting",
            got: most,
            limit: MAX_DEPTH,
            hint: "",
        });
    }
    Ok(())
}

/// One Lark rule or terminal as the scan found it.
#[derive(Default)]
struct Rule {
    /// The names its body mentions.
    refs: Vec<String>,
    /// The deepest group nesting in its body.
    nesting: usize,
}

/// A Lark grammar's size, rules, widest alternation, nesting, `%json` schemas and the longest
/// chain of rules naming each other.
pub fn check_lark(g: &str) -> Result<(), LimitError> {
    over("the grammar's size in bytes", g.len(), MAX_BYTES)?;
    let rules = scan_lark(g)?;
    over("the grammar's number of rules", rules.len(), MAX_RULES)?;
    over(
        "the grammar's depth (its longest chain of rules each naming the next, plus the groups nested in them)",
        lark_depth(&rules),
        MAX_DEPTH,
    )
}

/// The rules of `g`, by a scan that knows Lark's lexical structure (comments, strings, regexes,
/// `%json { … }` blocks); it does not parse the grammar — llguidance does, once it is bounded.
fn scan_lark(g: &str) -> Result<HashMap<String, Rule>, LimitError> {
    let b = g.as_bytes();
    let mut rules: HashMap<String, Rule> = HashMap::new();
    let mut current: Option<String> = None;
    let (mut i, mut nesting, mut alts) = (0usize, 0usize, 0usize);
    let mut line_start = true;
    let ident = |i: usize| {
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        j
    };
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line_start = true;
            i += 1;
            continue;
        }
        if c == b' ' || c == b'\t' || c == b'\r' {
            i += 1;
            continue;
        }
        // A definition: at the start of a line, `[?!]name[.prio]:` (not `::`).
        if line_start {
            line_start = false;
            let mut j = i;
            if j < b.len() && (b[j] == b'?' || b[j] == b'!') {
                j += 1;
            }
            if j < b.len() && (b[j].is_ascii_alphabetic() || b[j] == b'_') {
                let end = ident(j);
                let mut k = end;
                if k < b.len() && b[k] == b'.' {
                    k += 1;
                    while k < b.len() && (b[k].is_ascii_digit() || b[k] == b'-') {
                        k += 1;
                    }
                }
                while k < b.len() && (b[k] == b' ' || b[k] == b'\t') {
                    k += 1;
                }
                if k < b.len() && b[k] == b':' && b.get(k + 1) != Some(&b':') {
                    let name = g[j..end].to_string();
                    rules.entry(name.clone()).or_default();
                    current = Some(name);
                    nesting = 0;
                    alts = 0;
                    i = k + 1;
                    continue;
                }
            }
        }
        match c {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'"' | b'/' => {
                // A string or a regex literal, to its unescaped closing quote or slash.
                i += 1;
                while i < b.len() && b[i] != c && b[i] != b'\n' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            b'%' => {
                let end = ident(i + 1);
                let word = &g[i + 1..end];
                i = end;
                if matches!(word, "json" | "regex" | "llguidance" | "lark") {
                    let (text, next) = braced(g, i);
                    i = next;
                    if word == "json" {
                        let v: Value = serde_json::from_str(text).map_err(|_| LimitError {
                            what: "a `%json` block's nesting (or it is not JSON)",
                            got: 0,
                            limit: MAX_DEPTH,
                            hint: "",
                        })?;
                        check_schema(&v)?;
                    }
                } else {
                    // `%import`, `%ignore`, `%declare`: the rest of the line.
                    while i < b.len() && b[i] != b'\n' {
                        i += 1;
                    }
                }
            }
            b'(' | b'[' | b'{' => {
                nesting += 1;
                if let Some(r) = current.as_ref().and_then(|n| rules.get_mut(n)) {
                    r.nesting = r.nesting.max(nesting);
                }
                i += 1;
            }
            b')' | b']' | b'}' => {
                nesting = nesting.saturating_sub(1);
                i += 1;
            }
            b'|' => {
                alts += 1;
                over(
                    "the number of alternatives of one Lark rule",
                    alts + 1,
                    MAX_ALTERNATIVES,
                )?;
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let end = ident(i);
                if let Some(r) = current.as_ref().and_then(|n| rules.get_mut(n)) {
                    r.refs.push(g[i..end].to_string());
                }
                i = end;
            }
            _ => i += 1,
        }
        if rules.len() > MAX_RULES {
            over("the grammar's number of rules", rules.len(), MAX_RULES)?;
        }
    }
    Ok(rules)
}

/// The text of the balanced `{ … }` after `at` (strings respected), and where it ends.
fn braced(g: &str, at: usize) -> (&str, usize) {
    let b = g.as_bytes();
    let mut i = at;
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    let start = i;
    let mut d = 0usize;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'{' => d += 1,
            b'}' => {
                d = d.saturating_sub(1);
                if d == 0 {
                    return (&g[start..i + 1], i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    (&g[start..], b.len())
}

/// The longest chain of rules naming each other, each rule on it counted with its own group
/// nesting; a name back into the chain (recursion) adds nothing. Iterative.
fn lark_depth(rules: &HashMap<String, Rule>) -> usize {
    enum Step<'a> {
        Enter(&'a str),
        Leave(&'a str),
    }
    let mut depth: HashMap<&str, usize> = HashMap::new();
    let mut open: std::collections::HashSet<&str> = Default::default();
    let mut most = 0;
    for start in rules.keys() {
        let mut todo = vec![Step::Enter(start.as_str())];
        while let Some(s) = todo.pop() {
            match s {
                Step::Enter(n) => {
                    if depth.contains_key(n) || !open.insert(n) {
                        continue;
                    }
                    todo.push(Step::Leave(n));
                    for r in &rules[n].refs {
                        if let Some((k, _)) = rules.get_key_value(r.as_str()) {
                            todo.push(Step::Enter(k.as_str()));
                        }
                    }
                }
                Step::Leave(n) => {
                    open.remove(n);
                    let r = &rules[n];
                    let below = r
                        .refs
                        .iter()
                        .filter_map(|x| depth.get(x.as_str()))
                        .max()
                        .copied()
                        .unwrap_or(0);
                    let d = 1 + r.nesting + below;
                    most = most.max(d);
                    depth.insert(n, d);
                }
            }
        }
    }
    most
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A `$ref` chain of `n` definitions (`d0` → `d1` → …), each `anyOf [$ref, array of $ref]`
    /// when `wide`.
    pub fn ref_chain(n: usize, wide: bool) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let next = json!({"$ref": format!("#/$defs/d{}", i + 1)});
            let body = if i + 1 == n {
                json!({"type": "string"})
            } else if wide {
                json!({"anyOf": [next.clone(), {"type": "array", "items": next}]})
            } else {
                next
            };
            defs.insert(format!("d{i}"), body);
        }
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    /// `r_i: "x" r_{i+1} | "y"`, `n` rules.
    pub fn rule_chain(n: usize) -> String {
        let mut g = String::from("start: r0\n");
        for i in 0..n {
            g += &format!("r{i}: \"x\" r{} | \"y\"\n", i + 1);
        }
        g + &format!("r{n}: \"z\"\n")
    }

    #[test]
    fn depth_counts_through_refs_and_cuts_cycles() {
        assert_eq!(schema_depth(&json!({"type": "string"})), 1);
        assert_eq!(
            schema_depth(&json!({"properties": {"a": {"type": "string"}}})),
            3
        );
        let d = schema_depth(&ref_chain(300, false));
        assert_eq!(d, 302);
        // A schema that refers to itself (a tree of nodes) is shallow.
        let tree = json!({"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}});
        assert!(schema_depth(&tree) <= 6);
        assert!(check(&Constraint::JsonSchema(tree)).is_ok());
    }

    #[test]
    fn the_issues_schemas_and_grammars_are_refused_with_the_limit_named() {
        for s in [ref_chain(300, true), ref_chain(1000, false)] {
            let e = check(&Constraint::JsonSchema(s)).unwrap_err();
            assert!(e.to_string().contains("nesting depth"), "{e}");
            assert_eq!(e.limit, MAX_DEPTH);
        }
        let e = check(&Constraint::Lark(rule_chain(1000))).unwrap_err();
        assert!(e.to_string().contains("chain of rules"), "{e}");
        let wide = json!({"anyOf": (0..3000).map(|i| json!({"const": i})).collect::<Vec<_>>()});
        let e = check(&Constraint::JsonSchema(wide)).unwrap_err();
        assert!(
            e.to_string().contains("3000") && e.to_string().contains("1000"),
            "{e}"
        );
        let e = check(&Constraint::Choice(
            (0..50_000).map(|i| i.to_string()).collect(),
        ))
        .unwrap_err();
        assert!(e.to_string().contains("number of choices"), "{e}");
        let deep_regex = "(".repeat(600) + &")".repeat(600);
        assert!(check(&Constraint::Regex(deep_regex)).is_err());
        let deep_group = format!("start: {}\"a\"{}", "(".repeat(600), ")".repeat(600));
        assert!(check(&Constraint::Lark(deep_group)).is_err());
        let wide_rule = format!(
            "start: {}",
            (0..2000)
                .map(|i| format!("\"{i}\""))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        assert!(check(&Constraint::Lark(wide_rule)).is_err());
        // A `%json` block is measured as a schema.
        let g = format!(
            "start: obj\nobj: %json {}\n",
            serde_json::to_string(&ref_chain(600, false)).unwrap()
        );
        assert!(check(&Constraint::Lark(g)).is_err());
    }

    #[test]
    fn ordinary_grammars_pass() {
        let g = r#"
// a comment with | bars ( and parens
start: expr
?expr: term (("+" | "-") term)*
?term: factor (("*" | "/") factor)*
?factor: NUMBER | "(" expr ")" | /[a-z]+/
NUMBER: /[0-9]+/
%ignore " "
"#;
        assert!(check(&Constraint::Lark(g.into())).is_ok());
        assert!(check(&Constraint::Lark(rule_chain(100))).is_ok());
        assert!(check(&Constraint::JsonSchema(ref_chain(100, false))).is_ok());
        assert!(check(&Constraint::Regex(r"\d{3}-[()]{2}(ab|cd)+".into())).is_ok());
    }
}
