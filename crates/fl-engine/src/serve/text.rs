//! Text out of a token stream: incremental detokenization and stop strings.
//!
//! ```text
//!  token ──► Detokenizer ──delta──► StopStrings ──text to send──► client
//!            (a window of a few       (holds back a possible
//!             tokens, holds back a     partial stop string; a
//!             partial UTF-8 char)      full one ends the request)
//! ```
//!
//! [`Detokenizer`] decodes only a short window of ids per token (vLLM's and TGI's
//! prefix/read offsets): `prefix..read` is text already sent, kept as left context so that
//! spaces and merged characters come out as in a full decode; `read..` is new. The cost per
//! token does not grow with the output.
//!
//! ```
//! use fl_engine::serve::text::{Decode, OutputText};
//! // A decoder where each id is one byte of UTF-8 ("€" is three ids).
//! struct Bytes;
//! impl Decode for Bytes {
//!     fn decode(&self, ids: &[u32]) -> Result<String, String> {
//!         let b: Vec<u8> = ids.iter().map(|&i| i as u8).collect();
//!         Ok(String::from_utf8_lossy(&b).into_owned())
//!     }
//! }
//! let mut out = OutputText::new(Box::new(Bytes), &[], vec!["END".into()], vec![]);
//! let mut sent = String::new();
//! for &b in "5€ then END and more".as_bytes() {
//!     let piece = out.push(b as u32)?;
//!     sent += &piece.text;
//!     if piece.stopped {
//!         break;
//!     }
//! }
//! assert_eq!(sent, "5€ then ");
//! # Ok::<(), String>(())
//! ```

/// Token ids to text, special tokens skipped.
pub trait Decode: Send + Sync {
    /// The text of `ids`; an incomplete UTF-8 sequence at the end decodes to U+FFFD.
    ///
    /// Errors: the decoder's message.
    fn decode(&self, ids: &[u32]) -> Result<String, String>;

    /// The bytes token `id` stands for on its own (a word's leading space kept), when the
    /// decoder knows them ([`Tokenizer::token_bytes`](crate::tokenizer::Tokenizer::token_bytes));
    /// `None`: decode it instead.
    fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let _ = id;
        None
    }
}

impl Decode for crate::tokenizer::Tokenizer {
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        crate::tokenizer::Tokenizer::decode(self, ids).map_err(|e| e.to_string())
    }

    fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        crate::tokenizer::Tokenizer::token_bytes(self, id)
    }
}

impl<D: Decode + ?Sized> Decode for std::sync::Arc<D> {
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        (**self).decode(ids)
    }

    fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        (**self).token_bytes(id)
    }
}

/// The text of a model without a tokenizer: each id as a space and its decimal digits
/// (`" 15043"`), so clients still get one piece of text per token.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdText;

impl Decode for IdText {
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        Ok(ids.iter().map(|t| format!(" {t}")).collect())
    }
}

/// Prompt tokens kept as left context for the first output tokens (a SentencePiece decoder
/// drops the leading space of the first token it decodes).
const CONTEXT_TOKENS: usize = 5;
/// Ids before the window are dropped once there are this many (memory stays bounded).
const TRIM_AT: usize = 256;
/// Tokens held back at most while the text ends in an incomplete character (a UTF-8
/// character is at most 4 byte tokens; special tokens in between decode to nothing).
const MAX_HELD: usize = 8;

/// Incremental detokenization over a window of ids. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct Detokenizer {
    ids: Vec<u32>,
    /// Start of the context window: `ids[prefix..read]` was sent.
    prefix: usize,
    /// Start of the text not sent yet.
    read: usize,
}

impl Detokenizer {
    /// A detokenizer whose left context is the end of `prompt`.
    pub fn new(prompt: &[u32]) -> Self {
        let ids = prompt[prompt.len().saturating_sub(CONTEXT_TOKENS)..].to_vec();
        let read = ids.len();
        Detokenizer {
            ids,
            prefix: 0,
            read,
        }
    }

    /// Adds `id`; returns the text it completes: empty while a character is incomplete.
    ///
    /// Errors: the decoder's.
    pub fn push(&mut self, dec: &dyn Decode, id: u32) -> Result<String, String> {
        self.ids.push(id);
        let (prefix, new) = self.decode_window(dec)?;
        // A character still incomplete; past a few tokens it is an invalid sequence that no
        // later token completes, and it goes out as U+FFFD.
        if new.ends_with('\u{FFFD}') && self.ids.len() - self.read < MAX_HELD {
            return Ok(String::new());
        }
        self.delta(dec, &prefix, &new)
    }

    /// The text still held back (an incomplete character comes out as U+FFFD); call once
    /// after the last token.
    ///
    /// Errors: the decoder's.
    pub fn finish(&mut self, dec: &dyn Decode) -> Result<String, String> {
        let (prefix, new) = self.decode_window(dec)?;
        self.delta(dec, &prefix, &new)
    }

    /// The text after `prefix` (the window's text already sent) in `new` (the window's text
    /// now), and the window moved past it.
    fn delta(&mut self, dec: &dyn Decode, prefix: &str, new: &str) -> Result<String, String> {
        let delta = match new.strip_prefix(prefix) {
            // Nothing new yet (e.g. a special token, skipped): wait for more.
            Some("") => return Ok(String::new()),
            Some(d) => d.to_string(),
            // The text sent decodes differently now: byte tokens joined an invalid sequence
            // (byte-fallback decoders then replace the whole run). What was sent stays sent;
            // the new tokens go out as their own text.
            None => dec.decode(&self.ids[self.read..])?,
        };
        self.advance();
        Ok(delta)
    }

    fn decode_window(&self, dec: &dyn Decode) -> Result<(String, String), String> {
        let prefix = dec.decode(&self.ids[self.prefix..self.read])?;
        let new = dec.decode(&self.ids[self.prefix..])?;
        Ok((prefix, new))
    }

    fn advance(&mut self) {
        self.prefix = self.read;
        self.read = self.ids.len();
        if self.prefix >= TRIM_AT {
            self.ids.drain(..self.prefix);
            self.read -= self.prefix;
            self.prefix = 0;
        }
    }
}

/// What [`StopStrings::push`] and [`OutputText::push`] let out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Piece {
    /// Text safe to send (possibly empty).
    pub text: String,
    /// A stop string was found: `text` ends just before it and nothing follows.
    pub stopped: bool,
}

/// Stop strings over streamed text: the text up to the first stop string goes out, a
/// possible partial one is held back, the stop string itself never goes out.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received and not let out yet: at most a stop string's length once `push` returns.
    held: String,
    stopped: bool,
}

impl StopStrings {
    /// Watches for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has been found.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Adds `delta`; returns what can go out.
    pub fn push(&mut self, delta: &str) -> Piece {
        if self.stopped {
            return Piece {
                text: String::new(),
                stopped: true,
            };
        }
        if self.stops.is_empty() {
            return Piece {
                text: delta.to_string(),
                stopped: false,
            };
        }
        self.held.push_str(delta);
        // The earliest match wins (a stop string cannot start in text already let out:
        // every possible start was held back).
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s)).min() {
            self.held.truncate(at);
            self.stopped = true;
            return Piece {
                text: std::mem::take(&mut self.held),
                stopped: true,
            };
        }
        let keep = self.partial_start();
        let rest = self.held.split_off(keep);
        Piece {
            text: std::mem::replace(&mut self.held, rest),
            stopped: false,
        }
    }

    /// The text held back, once no more text comes (it cannot complete a stop string now).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Start of the longest suffix of `held` that begins some stop string (`held.len()`
    /// when none does).
    fn partial_start(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let from = self.held.len().saturating_sub(longest);
        self.held
            .char_indices()
            .map(|(i, _)| i)
            .filter(|&i| i >= from)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops
                    .iter()
                    .any(|s| s.len() > tail.len() && s.starts_with(tail))
            })
            .unwrap_or(self.held.len())
    }
}

/// A request's output text: [`Detokenizer`] then [`StopStrings`], with the ids that end
/// the request (stop ids, EOS) kept out of the text.
pub struct OutputText {
    dec: Box<dyn Decode>,
    detok: Detokenizer,
    stops: StopStrings,
    end_ids: Vec<u32>,
}

impl OutputText {
    /// Output text for a request with prompt `prompt`, stop strings `stops`, and `end_ids`:
    /// the ids that finish it when sampled (their text is not sent).
    pub fn new(
        dec: Box<dyn Decode>,
        prompt: &[u32],
        stops: Vec<String>,
        end_ids: Vec<u32>,
    ) -> Self {
        OutputText {
            dec,
            detok: Detokenizer::new(prompt),
            stops: StopStrings::new(stops),
            end_ids,
        }
    }

    /// Adds a generated token; returns the text that can go out now.
    ///
    /// Errors: the decoder's.
    pub fn push(&mut self, token: u32) -> Result<Piece, String> {
        if self.stops.is_stopped() || self.end_ids.contains(&token) {
            return Ok(Piece {
                text: String::new(),
                stopped: self.stops.is_stopped(),
            });
        }
        let delta = self.detok.push(&*self.dec, token)?;
        Ok(self.stops.push(&delta))
    }

    /// After the last token: the text held back (a stop string may still be found in it).
    ///
    /// Errors: the decoder's.
    pub fn finish(&mut self) -> Result<Piece, String> {
        if self.stops.is_stopped() {
            return Ok(Piece {
                text: String::new(),
                stopped: true,
            });
        }
        let delta = self.detok.finish(&*self.dec)?;
        let mut piece = self.stops.push(&delta);
        if !piece.stopped {
            piece.text.push_str(&self.stops.finish());
        }
        Ok(piece)
    }
}

impl std::fmt::Debug for OutputText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputText")
            .field("detok", &self.detok)
            .field("stops", &self.stops)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Each id is one UTF-8 byte; counts the ids it decodes.
    #[derive(Default)]
    struct Bytes {
        decoded: AtomicUsize,
    }

    impl Decode for Bytes {
        fn decode(&self, ids: &[u32]) -> Result<String, String> {
            self.decoded.fetch_add(ids.len(), Ordering::Relaxed);
            let b: Vec<u8> = ids.iter().map(|&i| i as u8).collect();
            Ok(String::from_utf8_lossy(&b).into_owned())
        }
    }

    /// A SentencePiece-like decoder: id 1 is BOS (skipped), ids >= 10 are words whose text is
    /// "▁w{id}"; the first piece of a decode loses its leading space.
    struct Words;

    impl Decode for Words {
        fn decode(&self, ids: &[u32]) -> Result<String, String> {
            let s: String = ids
                .iter()
                .filter(|&&i| i >= 10)
                .map(|i| format!(" w{i}"))
                .collect();
            Ok(s.strip_prefix(' ').unwrap_or(&s).to_string())
        }
    }

    /// Like a byte-fallback decoder (Llama-2's): ids < 256 are bytes, a run of them decodes
    /// to its text if valid UTF-8 and to one U+FFFD per byte if not; ids >= 256 are the ASCII
    /// characters `id - 256`.
    struct Grouped;

    impl Decode for Grouped {
        fn decode(&self, ids: &[u32]) -> Result<String, String> {
            let mut out = String::new();
            let mut run: Vec<u8> = vec![];
            let flush = |run: &mut Vec<u8>, out: &mut String| {
                match std::str::from_utf8(run) {
                    Ok(s) => out.push_str(s),
                    Err(_) => out.extend(std::iter::repeat_n('\u{FFFD}', run.len())),
                }
                run.clear();
            };
            for &i in ids {
                if i < 256 {
                    run.push(i as u8);
                } else {
                    flush(&mut run, &mut out);
                    out.push((i - 256) as u8 as char);
                }
            }
            flush(&mut run, &mut out);
            Ok(out)
        }
    }

    #[test]
    fn invalid_byte_runs_neither_stall_nor_lose_text() {
        // "F@" as byte tokens in the prompt's context, then bytes that make the run invalid:
        // the context decodes differently from then on.
        let prompt = [256 + u32::from(b'x'), u32::from(b'F'), u32::from(b'@')];
        let out_ids = [
            0x99,
            0xDD,
            256 + u32::from(b'3'),
            0xE2,
            0x82,
            0xAC,
            256 + 66,
        ];
        let mut out = OutputText::new(Box::new(Grouped), &prompt, vec![], vec![]);
        let (pieces, _) = run(&mut out, &out_ids);
        assert_eq!(pieces.concat(), "\u{FFFD}\u{FFFD}3€B");
        // A long run of bytes that never forms a character goes out, bounded.
        let mut out = OutputText::new(Box::new(Grouped), &[], vec![], vec![]);
        let ids = vec![0xFF; 100];
        let (pieces, _) = run(&mut out, &ids);
        assert_eq!(pieces.concat().chars().count(), 100);
        assert!(pieces.iter().filter(|p| !p.is_empty()).count() >= 100 / MAX_HELD);
    }

    fn bytes(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    fn run(out: &mut OutputText, ids: &[u32]) -> (Vec<String>, bool) {
        let mut pieces = vec![];
        for &id in ids {
            let p = out.push(id).expect("push");
            pieces.push(p.text);
            if p.stopped {
                return (pieces, true);
            }
        }
        let p = out.finish().expect("finish");
        pieces.push(p.text);
        (pieces, p.stopped)
    }

    #[test]
    fn multi_byte_characters_are_held_until_complete() {
        let text = "a€b😀c";
        let mut out = OutputText::new(Box::new(Bytes::default()), &[], vec![], vec![]);
        let (pieces, stopped) = run(&mut out, &bytes(text));
        assert!(!stopped);
        for p in &pieces {
            assert!(!p.contains('\u{FFFD}'), "{pieces:?}");
        }
        assert_eq!(pieces.concat(), text);
        // "€" is 3 bytes: the first two tokens give nothing, the third the whole character.
        assert_eq!(&pieces[1..4], ["", "", "€"]);
    }

    #[test]
    fn a_partial_character_at_the_end_is_flushed_as_replacement() {
        let mut ids = bytes("ok");
        ids.push(0xE2);
        let mut out = OutputText::new(Box::new(Bytes::default()), &[], vec![], vec![]);
        let (pieces, _) = run(&mut out, &ids);
        assert_eq!(pieces.concat(), "ok\u{FFFD}");
    }

    #[test]
    fn the_prompt_gives_left_context() {
        // Without context the first word would lose its space.
        let mut out = OutputText::new(Box::new(Words), &[1, 11, 12], vec![], vec![]);
        let (pieces, _) = run(&mut out, &[13, 14]);
        assert_eq!(pieces.concat(), " w13 w14");
        let mut out = OutputText::new(Box::new(Words), &[], vec![], vec![]);
        let (pieces, _) = run(&mut out, &[13, 14]);
        assert_eq!(pieces.concat(), "w13 w14");
    }

    #[test]
    fn decoding_cost_per_token_is_bounded() {
        let dec = Arc::new(Bytes::default());
        let n = 20_000;
        let ids: Vec<u32> = "hello wörld "
            .bytes()
            .cycle()
            .take(n)
            .map(u32::from)
            .collect();
        let mut out = OutputText::new(Box::new(Arc::clone(&dec)), &[], vec![], vec![]);
        let (pieces, _) = run(&mut out, &ids);
        assert_eq!(pieces.concat().len(), n);
        // A full decode per token would be ~n^2/2 = 2e8 ids.
        let per_token = dec.decoded.load(Ordering::Relaxed) as f64 / n as f64;
        assert!(per_token < 8.0, "{per_token} ids decoded per token");
    }

    #[test]
    fn a_stop_string_split_across_tokens_is_not_emitted() {
        let mut out = OutputText::new(
            Box::new(Bytes::default()),
            &[],
            vec!["STOP".into(), "xyz".into()],
            vec![],
        );
        let (pieces, stopped) = run(&mut out, &bytes("abc ST and STO then STOP more"));
        assert!(stopped);
        assert_eq!(pieces.concat(), "abc ST and STO then ");
        // "S" of "ST" was held back until " " showed it was not a stop.
        assert_eq!(pieces[4], "");
        assert!(pieces.iter().all(|p| !p.contains("STOP")));
    }

    #[test]
    fn the_earliest_stop_string_wins_and_multi_byte_stops_work() {
        let mut s = StopStrings::new(vec!["cd".into(), "bc".into(), "€!".into()]);
        assert_eq!(
            s.push("abcd"),
            Piece {
                text: "a".into(),
                stopped: true
            }
        );
        assert_eq!(s.push("more").text, "");
        let mut s = StopStrings::new(vec!["€!".into()]);
        let a = s.push("x€");
        assert_eq!((a.text.as_str(), a.stopped), ("x", false));
        let b = s.push("!y");
        assert_eq!((b.text.as_str(), b.stopped), ("", true));
    }

    #[test]
    fn held_text_is_flushed_at_the_end_and_end_ids_are_silent() {
        let mut out = OutputText::new(
            Box::new(Bytes::default()),
            &[],
            vec!["STOP".into()],
            vec![0],
        );
        let mut ids = bytes("a ST");
        ids.push(0);
        let (pieces, stopped) = run(&mut out, &ids);
        assert!(!stopped);
        assert_eq!(pieces.concat(), "a ST");
        // A stop string completed by the flushed text still stops.
        let mut out = OutputText::new(
            Box::new(Bytes::default()),
            &[],
            vec!["b\u{FFFD}".into()],
            vec![],
        );
        let mut ids = bytes("ab");
        ids.push(0xE2);
        let (pieces, stopped) = run(&mut out, &ids);
        assert!(stopped);
        assert_eq!(pieces.concat(), "a");
    }

    #[test]
    fn id_text_without_a_tokenizer() {
        let mut out = OutputText::new(Box::new(IdText), &[5, 6], vec![" 9".into()], vec![]);
        let (pieces, stopped) = run(&mut out, &[7, 8, 9, 10]);
        assert!(stopped);
        assert_eq!(pieces.concat(), " 7 8");
    }
}
