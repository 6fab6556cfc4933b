//! Streaming decode: text one token at a time, whole characters only.

use crate::error::Result;

use super::tokenizer::Tokenizer;

/// Streaming decode: [`StreamDecoder::push`] takes one token id and returns the text it
/// completes. Byte-level tokens can end inside a UTF-8 character (an emoji's four bytes are
/// often two or three tokens); those bytes are held back until the character is complete, so
/// every returned string is whole characters. Bytes that can never form a character are
/// replaced by U+FFFD as soon as that is certain, so that the concatenation of everything
/// returned, plus [`StreamDecoder::finish`], equals [`Tokenizer::decode`] of the same ids. For
/// a SentencePiece vocabulary that drops the leading space of a decode (the dummy prefix), the
/// first bytes the stream takes lose their leading space too: a reply streamed on its own
/// starts like its decode, `"Paris"` rather than `" Paris"`.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    pending: Vec<u8>,
    skip_special_tokens: bool,
    /// No bytes taken yet, and the tokenizer drops one leading space.
    strip_next_space: bool,
}

impl Tokenizer {
    /// A decoder that takes one id at a time (see [`StreamDecoder`]).
    pub fn stream(&self, skip_special_tokens: bool) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            pending: Vec::new(),
            skip_special_tokens,
            strip_next_space: self.strips_leading_space(),
        }
    }
}

impl StreamDecoder<'_> {
    /// Adds token `id`; returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        if let Some(mut piece) = self.tokenizer.piece(id, self.skip_special_tokens, "StreamDecoder::push")? {
            if self.strip_next_space && !piece.is_empty() {
                self.strip_next_space = false;
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
            }
            self.pending.extend_from_slice(piece);
        }
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The first `valid` bytes are UTF-8 by the error's contract.
                    out.push_str(std::str::from_utf8(&self.pending[start..start + valid]).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete character at the end: hold it back.
                        None => {
                            start += valid;
                            break;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start += valid + bad;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        Ok(out)
    }

    /// The bytes held back, waiting for the rest of their character (at most 3).
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: whatever is held back, as U+FFFD (an incomplete character).
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}
