//! Chat templates: the Jinja template a checkpoint ships (`tokenizer_config.json`'s
//! `chat_template`, a `chat_template.jinja` file, or GGUF `tokenizer.chat_template`), rendered
//! with `minijinja` the way Hugging Face's `apply_chat_template` renders it with Python's
//! `jinja2`: `trim_blocks` and `lstrip_blocks` on, the context `messages` (a list of
//! `{role, content}`), `add_generation_prompt`, `bos_token` and `eos_token`, the functions
//! `raise_exception(message)` (fails the render with that message) and `strftime_now(format)`
//! (the current time, UTC, formatted as Python's `strftime` does for `%Y %m %d %e %H %M %S %I %p
//! %y %b %B %a %A %j %%`), and Python's string, list and dict methods (`.strip()`,
//! `.startswith()`, `.items()`, ...) through `minijinja-contrib`'s `pycompat`, and `tojson` as
//! transformers redefines it (`json.dumps(x, ensure_ascii=False)`, see [`super::jinja`]). Maps
//! keep their insertion order, as Python's dicts do.
//!
//! A template is untrusted input: it is at most [`MAX_TEMPLATE_BYTES`], and a render runs on a
//! fuel budget ([`RENDER_FUEL`]) that pays for every instruction and for every 64 bytes the
//! render creates (output, strings, list slots), so a template that loops without end fails by
//! name instead of hanging, and one render creates at most 64 × [`RENDER_FUEL`] bytes (256 MiB)
//! in all. Sizes known before an allocation are checked before it: minijinja's for `*`
//! repetition, `range` (100,000 items) and its filters, [`super::jinja::method`]'s for
//! `str.format` widths.

use std::collections::BTreeMap;
use std::path::Path;

use minijinja::{Environment, ErrorKind};
use serde::Serialize;

use super::tokenizer::{MAX_CONFIG_BYTES, read_bounded, token_text};
use crate::error::{Error, Result};
use crate::formats::gguf::{GgufFile, GgufValue};

/// Longest chat template accepted, in bytes (real ones are a few KB).
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;
/// Fuel of one render: one unit per instruction and per 64 bytes created.
pub const RENDER_FUEL: u64 = 4_000_000;

const NAME: &str = "chat_template";

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant` (any string the template knows).
    pub role: String,
    /// The turn's text.
    pub content: String,
}

impl Message {
    /// A message of `role` with `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message { role: role.into(), content: content.into() }
    }
    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }
    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }
    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

/// A compiled chat template with the BOS and EOS token texts it may use.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bytes", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

fn template_error(e: minijinja::Error) -> Error {
    Error::Config { field: NAME.into(), why: e.to_string() }
}

impl ChatTemplate {
    /// Compiles `source`, with the texts of the BOS and EOS tokens (`bos_token` and
    /// `eos_token` in the template; undefined when `None`).
    pub fn new(
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<ChatTemplate> {
        let source = source.into();
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(Error::Config {
                field: NAME.into(),
                why: format!("{} bytes exceed the {MAX_TEMPLATE_BYTES} accepted", source.len()),
            });
        }
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(template_error)?,
        );
        env.set_unknown_method_callback(super::jinja::method);
        env.add_filter("tojson", super::jinja::tojson);
        env.set_fuel(Some(RENDER_FUEL));
        env.add_function("raise_exception", |message: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_function("strftime_now", |format: String| -> std::result::Result<String, minijinja::Error> {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            strftime(&format, now).map_err(|why| minijinja::Error::new(ErrorKind::InvalidOperation, why))
        });
        env.add_template_owned(NAME, source.clone()).map_err(template_error)?;
        Ok(ChatTemplate { env, source, bos_token, eos_token })
    }

    /// GGUF metadata's `tokenizer.chat_template`, with the texts of `tokenizer.ggml.bos_token_id`
    /// and `eos_token_id` from `tokenizer.ggml.tokens`.
    pub fn from_gguf_metadata(meta: &BTreeMap<String, GgufValue>) -> Result<ChatTemplate> {
        const KEY: &str = "tokenizer.chat_template";
        let source = match meta.get(KEY) {
            Some(GgufValue::Str(s)) => s.clone(),
            Some(_) => return Err(Error::Config { field: KEY.into(), why: "expected a string".into() }),
            None => return Err(Error::Config { field: KEY.into(), why: "missing".into() }),
        };
        let token = |key: &str| -> Result<Option<String>> {
            let Some(id) = meta.get(key) else { return Ok(None) };
            let text = id.as_u64().and_then(|id| match meta.get("tokenizer.ggml.tokens") {
                Some(GgufValue::Array(tokens)) => usize::try_from(id).ok().and_then(|i| tokens.get(i)),
                _ => None,
            });
            match text.and_then(GgufValue::as_str) {
                Some(t) => Ok(Some(t.to_string())),
                None => Err(Error::Config {
                    field: key.into(),
                    why: "not the id of a string in tokenizer.ggml.tokens".into(),
                }),
            }
        };
        let bos = token("tokenizer.ggml.bos_token_id")?;
        let eos = token("tokenizer.ggml.eos_token_id")?;
        ChatTemplate::new(source, bos, eos)
    }

    /// The chat template of a GGUF file.
    pub fn from_gguf(file: &GgufFile) -> Result<ChatTemplate> {
        Self::from_gguf_metadata(file.metadata())
    }

    /// The chat template of a Hugging Face checkpoint directory: `chat_template.jinja` if it
    /// exists (newer transformers save it there), else `chat_template` in
    /// `tokenizer_config.json` (a string, or a list of `{name, template}` of which `default` is
    /// taken); `bos_token` and `eos_token` from `tokenizer_config.json`.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<ChatTemplate> {
        let dir = dir.as_ref();
        let config_path = dir.join("tokenizer_config.json");
        let config: Option<serde_json::Value> = if config_path.exists() {
            let bytes = read_bounded(&config_path, MAX_CONFIG_BYTES)?;
            Some(
                serde_json::from_slice(&bytes)
                    .map_err(|e| Error::Io { path: config_path.display().to_string(), why: e.to_string() })?,
            )
        } else {
            None
        };
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.exists() {
            let bytes = read_bounded(&jinja, MAX_TEMPLATE_BYTES as u64)?;
            String::from_utf8(bytes)
                .map_err(|_| Error::Io { path: jinja.display().to_string(), why: "not UTF-8".into() })?
        } else {
            let field = |why: &str| Error::Config { field: format!("tokenizer_config.json {NAME}"), why: why.into() };
            match config.as_ref().and_then(|c| c.get(NAME)) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(serde_json::Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template"))
                    .and_then(serde_json::Value::as_str)
                    .ok_or_else(|| field("a list of named templates without a `default` one"))?
                    .to_string(),
                Some(_) => return Err(field("expected a string or a list of {name, template}")),
                None => return Err(field("missing (and no chat_template.jinja)")),
            }
        };
        let (bos, eos) = match &config {
            Some(c) => (token_text(c, "bos_token")?, token_text(c, "eos_token")?),
            None => (None, None),
        };
        ChatTemplate::new(source, bos, eos)
    }

    /// Renders `messages`; with `add_generation_prompt`, the template's opening of the
    /// assistant's turn follows. A `raise_exception` in the template, or a render past its
    /// fuel, is an [`Error::Kernel`] holding a
    /// [`llama_kernels::Error::InvalidArgument`] carrying the template's message.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let template = self.env.get_template(NAME).map_err(template_error)?;
        let ctx = minijinja::context! {
            messages => minijinja::Value::from(minijinja::value::Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_deref(),
            eos_token => self.eos_token.as_deref(),
        };
        template.render(ctx).map_err(|e| {
            Error::from(llama_kernels::Error::InvalidArgument {
                op: "ChatTemplate::render",
                name: "messages",
                value: format!("{} messages", messages.len()),
                why: match e.kind() {
                    ErrorKind::InvalidOperation => e.detail().unwrap_or("invalid operation").to_string(),
                    _ => e.to_string(),
                },
            })
        })
    }

    /// One user turn followed by the generation prompt: what to encode (without adding
    /// special tokens) to ask the model for its answer to `user`.
    pub fn render_user_turn(&self, user: &str) -> Result<String> {
        self.render(&[Message::user(user)], true)
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The BOS token text the template sees.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The EOS token text the template sees.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }
}

/// Days since 1970-01-01 to (year, month 1..=12, day 1..=31), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Python's `strftime` (C locale) of `secs` since the Unix epoch, UTC, for the directives
/// templates use; any other directive is an error naming it.
pub fn strftime(format: &str, secs: i64) -> std::result::Result<String, String> {
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
    const DAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (tod / 3600, tod / 60 % 60, tod % 60);
    let weekday = (days + 4).rem_euclid(7) as usize;
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[(month - 1) as usize % 12];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else { return Err("a format that ends in `%`".into()) };
        match d {
            'Y' => out.push_str(&year.to_string()),
            'y' => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            'm' => out.push_str(&format!("{month:02}")),
            'd' => out.push_str(&format!("{day:02}")),
            'e' => out.push_str(&format!("{day:2}")),
            'H' => out.push_str(&format!("{hour:02}")),
            'I' => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            'M' => out.push_str(&format!("{minute:02}")),
            'S' => out.push_str(&format!("{second:02}")),
            'j' => out.push_str(&format!("{day_of_year:03}")),
            'b' => out.push_str(&month_name[..3]),
            'B' => out.push_str(month_name),
            'a' => out.push_str(&DAYS[weekday][..3]),
            'A' => out.push_str(DAYS[weekday]),
            '%' => out.push('%'),
            other => return Err(format!("strftime_now: unsupported directive `%{other}`")),
        }
    }
    Ok(out)
}

/// (year, month, day) to days since 1970-01-01.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
