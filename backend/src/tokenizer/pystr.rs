//! Python's `str()` of template values, as jinja2 writes `{{ x }}` and `x | string` in the
//! templates transformers renders: `True`/`False`, `None`, floats as Python's `repr`
//! (`1e-05`, `1.0`), and lists and dicts as their `repr` (`{'type': 'function'}`), strings in
//! them quoted as Python quotes them.

use minijinja::value::{Value, ValueKind};

/// `str(v)`: a string as it is, anything else as Python writes it.
pub fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => {
            let mut out = String::new();
            repr(&mut out, v);
            out
        }
    }
}

/// `repr(v)` onto `out`.
fn repr(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => match f64_of(v) {
            Some(f) => out.push_str(&py_float(f)),
            None => out.push_str(&v.to_string()),
        },
        ValueKind::String => quote(out, v.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(items) = v.try_iter() {
                for (i, x) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    repr(out, &x);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = v.try_iter() {
                for (i, k) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    repr(out, &k);
                    out.push_str(": ");
                    repr(out, &v.get_item(&k).unwrap_or_default());
                }
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
}

/// The value as an f64 when it is a float (integers print as integers).
fn f64_of(v: &Value) -> Option<f64> {
    if v.is_integer() {
        return None;
    }
    f64::try_from(v.clone()).ok()
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional from 1e-4 to below
/// 1e16, else `d.ddde±XX`; a whole number keeps `.0`.
pub fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "d.ddde<exp>".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp >= n - 1 {
            format!("{digits}{}.0", "0".repeat((exp - (n - 1)) as usize))
        } else if exp >= 0 {
            let (int, frac) = digits.split_at(exp as usize + 1);
            format!("{int}.{frac}")
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let m = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let es = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{es}{:02}", exp.abs())
    }
}

/// A string as Python's `repr` quotes it: single quotes unless it holds a single quote and no
/// double one; backslashes, the quote, `\n`, `\r`, `\t` escaped, other control characters as
/// `\xNN` (`\uNNNN` past Latin-1).
fn quote(out: &mut String, s: &str) {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                let n = c as u32;
                if n < 0x100 {
                    out.push_str(&format!("\\x{n:02x}"));
                } else {
                    out.push_str(&format!("\\u{n:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(q);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_print_as_python_prints_them() {
        // Each `want` is what python3 prints for str() of the same value.
        let v = Value::from_serialize(serde_json::json!({
            "type": "function", "ok": true, "no": null, "n": 2, "x": 1.5,
            "q": "it's", "both": "a'b\"c", "nl": "a\nb\\", "list": [1, "b", false]
        }));
        assert_eq!(
            py_str(&v),
            r#"{'type': 'function', 'ok': True, 'no': None, 'n': 2, 'x': 1.5, 'q': "it's", 'both': 'a\'b"c', 'nl': 'a\nb\\', 'list': [1, 'b', False]}"#
        );
        assert_eq!(py_str(&Value::from(true)), "True");
        assert_eq!(py_str(&Value::from(())), "None");
        assert_eq!(py_str(&Value::from("plain")), "plain");
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (123456.789, "123456.789"),
            (1e16, "1e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (-2.5e-7, "-2.5e-07"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ] {
            assert_eq!(py_float(f), want, "{f}");
        }
    }
}
