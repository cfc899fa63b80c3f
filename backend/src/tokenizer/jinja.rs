//! The chat-template environment as transformers' `apply_chat_template` builds it for jinja2:
//! blocks trimmed and left-stripped, loop controls, `raise_exception(msg)`, `tojson` as Python's
//! `json.dumps` ([`super::pyjson`]), `strftime_now(format)` (the local clock, as
//! `datetime.now().strftime`), and Python's methods on strings, lists and dicts
//! (`.startswith`, `.split`, `.strip`, `.items()`…, minijinja-contrib's pycompat), which real
//! templates call (Qwen3, DeepSeek, Llama 3.x). Values are written as Python's `str()` writes
//! them ([`super::pystr`]) and `none is iterable` is false, as in jinja2.

use minijinja::{Environment, Error, ErrorKind};

/// What `raise_exception` raised: the template refusing the conversation it was given (a
/// client's error), unlike any other failure of the template (the template's).
pub const RAISED: &str = "the chat template refused the conversation";

/// An environment holding `source` as the template `chat`.
pub fn environment(source: &str) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, RAISED).with_source(Raised(msg)))
    });
    env.add_function("strftime_now", |format: String| -> String {
        strftime(&format, now_utc())
    });
    env.add_filter("tojson", super::pyjson::tojson);
    // jinja2 writes Python objects with str(): `True`, `None`, `{'k': 'v'}`.
    env.set_formatter(|out, _state, value| {
        out.write_str(&super::pystr::py_str(value))
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "writing the rendering"))
    });
    env.add_filter("string", |v: minijinja::Value| super::pystr::py_str(&v));
    // In jinja2 `none is iterable` is false (a for loop over it fails); an undefined value
    // iterates as empty.
    env.add_test("iterable", |v: minijinja::Value| {
        !v.is_none() && v.try_iter().is_ok()
    });
    env.add_template_owned("chat", generation_blocks(source))?;
    Ok(env)
}

/// transformers' `{% generation %}…{% endgeneration %}` (its AssistantTracker extension, which
/// marks the assistant's tokens and renders the body unchanged) as the `{% if true %}…{% endif
/// %}` block it renders like, whitespace control kept.
fn generation_blocks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open, body) = inner.strip_prefix('-').map_or(("", inner), |b| ("-", b));
        let (body, close) = body.strip_suffix('-').map_or((body, ""), |b| (b, "-"));
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{open} if true {close}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{open} endif {close}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The message a template passed to `raise_exception`.
#[derive(Debug)]
pub struct Raised(pub String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// The message of a `raise_exception` anywhere in `e`'s chain, if one.
pub fn raised(e: &Error) -> Option<&str> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(r) = c.downcast_ref::<Raised>() {
            return Some(&r.0);
        }
        cause = c.source();
    }
    None
}

/// A civil time: (year, month 1–12, day 1–31, hour, minute, second, weekday 0 = Monday, day of
/// the year 1–366).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub weekday: u32,
    pub yday: u32,
}

fn now_utc() -> Civil {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    civil(secs)
}

/// The UTC civil time of `secs` since the epoch (days to a date: Howard Hinnant's algorithm).
pub fn civil(secs: i64) -> Civil {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = BEFORE[month as usize - 1] + day + u32::from(leap && month > 2);
    Civil {
        year,
        month,
        day,
        hour: (rem / 3600) as u32,
        minute: (rem / 60 % 60) as u32,
        second: (rem % 60) as u32,
        // 1970-01-01 was a Thursday (3).
        weekday: (days + 3).rem_euclid(7) as u32,
        yday,
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `format` as Python's `strftime` writes `t` (the C locale): `%Y %y %m %d %e %B %b %A %a %H %I
/// %M %S %p %j %%`; another specifier stays as written, as glibc leaves an unknown one.
pub fn strftime(format: &str, t: Civil) -> String {
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        let hour12 = if t.hour.is_multiple_of(12) {
            12
        } else {
            t.hour % 12
        };
        match spec {
            'Y' => out.push_str(&t.year.to_string()),
            'y' => out.push_str(&format!("{:02}", t.year.rem_euclid(100))),
            'm' => out.push_str(&format!("{:02}", t.month)),
            'd' => out.push_str(&format!("{:02}", t.day)),
            'e' => out.push_str(&format!("{:2}", t.day)),
            'B' => out.push_str(MONTHS[t.month as usize - 1]),
            'b' | 'h' => out.push_str(&MONTHS[t.month as usize - 1][..3]),
            'A' => out.push_str(DAYS[t.weekday as usize]),
            'a' => out.push_str(&DAYS[t.weekday as usize][..3]),
            'H' => out.push_str(&format!("{:02}", t.hour)),
            'I' => out.push_str(&format!("{hour12:02}")),
            'M' => out.push_str(&format!("{:02}", t.minute)),
            'S' => out.push_str(&format!("{:02}", t.second)),
            'p' => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            'j' => out.push_str(&format!("{:03}", t.yday)),
            '%' => out.push('%'),
            other => {
                out.push('%');
                out.push(other);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_and_strftime_match_pythons() {
        // date -u -d @1767225600 → Thu 2026-01-01; @951782400 → Tue 2000-02-29.
        let t = civil(1_767_225_600 + 13 * 3600 + 5 * 60 + 9);
        assert_eq!(
            strftime("%d %b %Y|%A %a|%B %m %e|%H:%M:%S %I %p|%j %y %%|%Q", t),
            "01 Jan 2026|Thursday Thu|January 01  1|13:05:09 01 PM|001 26 %|%Q"
        );
        let leap = civil(951_782_400);
        assert_eq!(strftime("%Y-%m-%d %a %j", leap), "2000-02-29 Tue 060");
        assert_eq!(strftime("%d %B %Y", civil(0)), "01 January 1970");
        assert_eq!(strftime("%Y-%m-%d", civil(-86_400)), "1969-12-31");
    }

    #[test]
    fn generation_blocks_render_their_body() {
        assert_eq!(
            generation_blocks("a {%- generation -%} b {% endgeneration %}{%- if x %}c{% endif -%}"),
            "a {%- if true -%} b {% endif %}{%- if x %}c{% endif -%}"
        );
        let env = environment("<{%- generation -%} x {%- endgeneration -%}>").unwrap();
        assert_eq!(env.get_template("chat").unwrap().render(()).unwrap(), "<x>");
    }

    #[test]
    fn python_methods_work_and_raise_exception_is_told_apart() {
        let env = environment(
            "{% if s.startswith('<th') %}yes{% endif %}|{{ s.split('>')[1].lstrip() }}|{{ s.upper() }}|\
             {% for k, v in d.items() %}{{ k }}={{ v }}{% endfor %}|{{ s.replace('<', '[') }}",
        )
        .unwrap();
        let got = env
            .get_template("chat")
            .unwrap()
            .render(
                minijinja::context! { s => "<think>  a b", d => minijinja::context! { x => 1 } },
            )
            .unwrap();
        assert_eq!(got, "yes|a b|<THINK>  A B|x=1|[think>  a b");
        let env = environment("{{ raise_exception('roles must alternate') }}").unwrap();
        let e = env.get_template("chat").unwrap().render(()).unwrap_err();
        assert_eq!(raised(&e), Some("roles must alternate"));
        let env = environment("{{ x.nope() }}").unwrap();
        let e = env
            .get_template("chat")
            .unwrap()
            .render(minijinja::context! { x => "s" })
            .unwrap_err();
        assert_eq!(raised(&e), None);
    }
}
