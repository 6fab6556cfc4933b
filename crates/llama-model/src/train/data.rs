//! Training data as JSON lines, as TRL's SFT trainer reads it: one example per line, either
//! `{"text": "..."}` (every token trained) or `{"messages": [{"role": ..., "content": ...}, ...]}`
//! rendered with the model's chat template, the loss on the assistant turns only (labels
//! [`IGNORE`] elsewhere).
//!
//! An assistant turn's tokens are found by rendering the conversation up to it with the
//! generation prompt and up to its end: the tokens between the two renderings are the turn's
//! (its text and the template's end-of-turn marker, which the model must learn to emit). Each
//! rendering's tokens must be a prefix of the whole conversation's; a template for which they
//! are not is an error rather than a silently misplaced mask.

use std::path::Path;

use serde_json::Value;

use super::batch::{Example, IGNORE};
use crate::error::{Error, Result};
use crate::formats::files::read_bounded_text;
use crate::text::{ChatTemplate, Message, Tokenizer};

/// Largest training file read, in bytes.
pub const MAX_DATA_BYTES: u64 = 1 << 30;

/// How examples become tokens.
#[derive(Clone, Copy, Debug)]
pub struct Encoder<'a> {
    /// The model's tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// The model's chat template (needed for `messages` lines).
    pub template: Option<&'a ChatTemplate>,
    /// Appended to `text` examples (TRL's SFT trainer ends each text with EOS).
    pub eos: Option<u32>,
    /// Longest example, in tokens (the model's context, or the step's token budget).
    pub max_len: usize,
}

impl Encoder<'_> {
    /// The example of one JSON line's value.
    pub fn example(&self, value: &Value) -> std::result::Result<Example, String> {
        let ex = if let Some(text) = value.get("text") {
            let text = text.as_str().ok_or("`text` is not a string")?;
            let mut ids = self.tokenizer.encode(text, true).map_err(|e| e.to_string())?;
            ids.extend(self.eos);
            Example::text(ids)
        } else if let Some(messages) = value.get("messages") {
            self.chat(messages)?
        } else {
            return Err("neither a `text` nor a `messages` field".into());
        };
        if ex.ids.is_empty() {
            return Err("no tokens".into());
        }
        if ex.ids.len() > self.max_len {
            return Err(format!("{} tokens, longer than the {} allowed", ex.ids.len(), self.max_len));
        }
        if ex.labels.iter().all(|&l| l == IGNORE) {
            return Err("no trained token (no assistant turn)".into());
        }
        Ok(ex)
    }

    fn chat(&self, messages: &Value) -> std::result::Result<Example, String> {
        let template = self.template.ok_or("a `messages` example, and the model has no chat template")?;
        let list = messages.as_array().ok_or("`messages` is not a list")?;
        let mut turns = Vec::with_capacity(list.len());
        for m in list {
            let field = |k: &str| m.get(k).and_then(Value::as_str).ok_or(format!("a message without a string `{k}`"));
            turns.push(Message::new(field("role")?, field("content")?));
        }
        let encode = |msgs: &[Message], generation_prompt: bool| -> std::result::Result<Vec<u32>, String> {
            let text = template.render(msgs, generation_prompt).map_err(|e| e.to_string())?;
            self.tokenizer.encode(&text, false).map_err(|e| e.to_string())
        };
        let ids = encode(&turns, false)?;
        let mut labels = vec![IGNORE; ids.len()];
        for (k, turn) in turns.iter().enumerate().filter(|(_, t)| t.role == "assistant") {
            let (start, end) = (encode(&turns[..k], true)?, encode(&turns[..=k], false)?);
            let is_prefix = |p: &[u32]| p.len() <= ids.len() && ids[..p.len()] == *p;
            if !is_prefix(&start) || !is_prefix(&end) || end.len() < start.len() {
                return Err(format!(
                    "the chat template's rendering up to assistant turn {k} ({:?}...) does not tokenize to a prefix of the whole conversation",
                    turn.content.chars().take(20).collect::<String>()
                ));
            }
            for t in start.len()..end.len() {
                labels[t] = ids[t] as i32;
            }
        }
        Ok(Example { ids, labels })
    }

    /// Every example of the JSON-lines file `path` (blank lines skipped); a line that is not a
    /// JSON object of one of the two forms, or too long, is an error naming the file and line.
    pub fn read_jsonl(&self, path: &Path) -> Result<Vec<Example>> {
        let text = read_bounded_text(path, MAX_DATA_BYTES)?;
        let mut out = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad =
                |why: String| Error::Io { path: path.display().to_string(), why: format!("line {}: {why}", n + 1) };
            let value: Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON ({e})")))?;
            if !value.is_object() {
                return Err(bad("not a JSON object".into()));
            }
            out.push(self.example(&value).map_err(bad)?);
        }
        if out.is_empty() {
            return Err(Error::Io { path: path.display().to_string(), why: "no examples".into() });
        }
        Ok(out)
    }
}

/// Groups `examples` (in order) into micro-batches of at most `max_tokens` tokens and
/// `max_seqs` examples each.
pub fn micro_batches(examples: &[Example], max_tokens: usize, max_seqs: usize) -> Vec<Vec<Example>> {
    let mut out: Vec<Vec<Example>> = Vec::new();
    let mut tokens = 0;
    for ex in examples {
        match out.last_mut() {
            Some(b) if tokens + ex.ids.len() <= max_tokens && b.len() < max_seqs => {
                tokens += ex.ids.len();
                b.push(ex.clone());
            }
            _ => {
                tokens = ex.ids.len();
                out.push(vec![ex.clone()]);
            }
        }
    }
    out
}
