//! Python's `json.dumps`, as transformers' chat templates call it through `tojson`.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};

/// `x | tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
pub fn tojson(x: Value, kwargs: Kwargs) -> Result<String, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (_, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent is a number or a string",
                ))
            }
        },
    };
    let (item, key) = match separators.as_deref() {
        Some([i, k]) => (i.clone(), k.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators is a pair (item, key)",
            ))
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let json = serde_json::to_value(&x)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let f = Format {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    f.write(&mut out, &json, 0);
    Ok(out)
}

pub struct Format {
    pub ensure_ascii: bool,
    pub indent: Option<String>,
    pub item: String,
    pub key: String,
    pub sort_keys: bool,
}

impl Format {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(i) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(i);
            }
        }
    }

    pub fn write(&self, out: &mut String, v: &serde_json::Value, level: usize) {
        use serde_json::Value as J;
        match v {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Number(n) => out.push_str(&n.to_string()),
            J::String(s) => self.string(out, s),
            J::Array(a) if a.is_empty() => out.push_str("[]"),
            J::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(out, level + 1);
                    self.write(out, x, level + 1);
                }
                self.newline(out, level);
                out.push(']');
            }
            J::Object(o) if o.is_empty() => out.push_str("{}"),
            J::Object(o) => {
                let mut entries: Vec<(&String, &serde_json::Value)> = o.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, x)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(out, level + 1);
                    self.string(out, k);
                    out.push_str(&self.key);
                    self.write(out, x, level + 1);
                }
                self.newline(out, level);
                out.push('}');
            }
        }
    }

    fn string(&self, out: &mut String, s: &str) {
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
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for u in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}
