//! The parts of a chat template's environment that must behave as Hugging Face's does, and must
//! stay bounded on untrusted templates.
//!
//! * [`tojson`]: transformers replaces Jinja's `tojson` filter with
//!   `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`. Jinja's
//!   own filter (and minijinja's) escapes `<`, `>`, `&` and `'` as `\u003c`...; Llama 3.x
//!   templates put tool definitions and `tool`/`ipython` messages through `tojson`, so the
//!   escaping is part of the prompt the model was trained on. This filter writes what Python's
//!   `json.dumps` writes: separators `", "` and `": "` (`","` and `": "` with an indent), strings
//!   escaped only where JSON requires (`"`, `\`, control characters; every non-ASCII character
//!   too with `ensure_ascii=true`), floats as Python's `repr` (`1.0`, `1e+16`, `NaN`,
//!   `Infinity`), map keys in insertion order (or sorted with `sort_keys=true`).
//! * [`method`]: Python's string, list and dict methods (`minijinja-contrib`'s `pycompat`),
//!   with `str.format` refused when a field asks for a width or precision above
//!   [`MAX_FORMAT_WIDTH`], and charged for the bytes it may create before it creates them
//!   (minijinja charges fuel for a method's result only once it exists).

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, State, Value};

/// Largest width or precision one `str.format` field may ask for.
pub const MAX_FORMAT_WIDTH: u64 = 1 << 16;

/// Deepest nesting of lists and maps [`tojson`] writes.
const MAX_JSON_DEPTH: usize = 128;

fn invalid(why: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, why.into())
}

/// The unknown-method callback: `pycompat`'s methods, with `str.format` bounded (module docs).
pub fn method(state: &mut State, value: &Value, name: &str, args: &[Value]) -> Result<Value, Error> {
    if name == "format" {
        if let Some(s) = value.as_str() {
            let bytes = format_width_budget(s)?;
            state.consume_fuel(bytes / 64)?;
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, name, args)
}

/// The bytes the widths and precisions of `format`'s replacement fields ask for, or an error if
/// one asks for more than [`MAX_FORMAT_WIDTH`] or nests a field inside a format spec.
fn format_width_budget(format: &str) -> Result<u64, Error> {
    let bytes = format.as_bytes();
    let mut total = 0u64;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' if bytes.get(i + 1) == Some(&b'{') => i += 2,
            b'{' => {
                let end = format[i + 1..].find('}').map(|e| i + 1 + e).unwrap_or(bytes.len());
                let field = &format[i + 1..end];
                if let Some((_, spec)) = field.split_once(':') {
                    if spec.contains('{') {
                        return Err(invalid(
                            "str.format: nested replacement fields in a format spec are not supported",
                        ));
                    }
                    for run in spec.split(|c: char| !c.is_ascii_digit()).filter(|r| !r.is_empty()) {
                        let n = run.parse::<u64>().unwrap_or(u64::MAX);
                        if n > MAX_FORMAT_WIDTH {
                            return Err(invalid(format!(
                                "str.format: a width or precision of {run} exceeds {MAX_FORMAT_WIDTH}"
                            )));
                        }
                        total = total.saturating_add(n);
                    }
                }
                i = end + 1;
            }
            _ => i += 1,
        }
    }
    Ok(total)
}

/// How [`tojson`] lays its output out (`json.dumps`' arguments).
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// The `tojson` filter as transformers defines it (module docs). Keyword arguments: `indent`
/// (an integer or a string), `ensure_ascii`, `separators` (two strings), `sort_keys`.
pub fn tojson(state: &State, value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.is_integer() => {
            let n = i64::try_from(v)?;
            if n > 64 {
                return Err(invalid(format!("tojson: indent {n} is larger than 64")));
            }
            Some(" ".repeat(n.max(0) as usize))
        }
        Some(v) => match v.as_str() {
            Some(s) if s.len() <= 64 => Some(s.to_string()),
            _ => return Err(invalid("tojson: indent must be an integer or a short string")),
        },
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(seps) => match <[String; 2]>::try_from(seps) {
            Ok([item, key]) => (item, key),
            Err(_) => return Err(invalid("tojson: separators must be two strings")),
        },
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(state, &style, value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn newline(style: &JsonStyle, depth: usize, out: &mut String) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_json(state: &State, style: &JsonStyle, value: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(invalid(format!("tojson: nested deeper than {MAX_JSON_DEPTH}")));
    }
    // Every value written is paid for, so a long (lazily repeated) list ends with the fuel.
    state.consume_fuel(1)?;
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&python_float_repr(f64::try_from(value.clone())?)),
        ValueKind::String => write_json_string(value.as_str().unwrap_or_default(), style.ensure_ascii, out),
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(style, depth + 1, out);
                write_json_string(key, style.ensure_ascii, out);
                out.push_str(&style.key_sep);
                write_json(state, style, item, depth + 1, out)?;
            }
            newline(style, depth, out);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let mut empty = true;
            out.push('[');
            for item in value.try_iter()? {
                if !empty {
                    out.push_str(&style.item_sep);
                }
                empty = false;
                newline(style, depth + 1, out);
                write_json(state, style, &item, depth + 1, out)?;
            }
            if !empty {
                newline(style, depth, out);
            }
            out.push(']');
        }
        other => return Err(invalid(format!("tojson: a value of kind {other} is not JSON serializable"))),
    }
    state.consume_fuel(out.len() as u64 / 4096)?;
    Ok(())
}

/// A map key as `json.dumps` writes it: strings as they are, numbers, booleans and None as their
/// JSON text.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => python_float_repr(f64::try_from(key.clone())?),
        other => return Err(invalid(format!("tojson: keys must be str, int, float, bool or None, not {other}"))),
    })
}

/// `s` as a JSON string literal, escaped as Python's `json` module does.
fn write_json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    use std::fmt::Write;
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
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `x` as Python's `repr(float)` (what `json.dumps` writes): the shortest digits that read back
/// as `x`, in positional notation for exponents -4..16 (always with a fractional part) and as
/// `d.ddde±XX` otherwise; `NaN`, `Infinity` and `-Infinity` for the non-finite values.
pub fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.25e-7".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    if (-4..16).contains(&exp) {
        if exp < 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                format!("{sign}{digits}{}.0", "0".repeat(int_len - digits.len()))
            } else {
                format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
            }
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_read_as_python_writes_them() {
        for (x, want) in [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (123456789012345.6, "123456789012345.6"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (2.5e300, "2.5e+300"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(python_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn format_widths_are_bounded() {
        assert_eq!(format_width_budget("{:>10}{{:>99999999999}}").ok(), Some(10));
        assert!(format_width_budget("{:>99999999999}").is_err());
        assert!(format_width_budget("{:.70000f}").is_err());
        assert!(format_width_budget("{:{}}").is_err());
    }
}
