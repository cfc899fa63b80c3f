//! From tokens to the text a client sees: incremental detokenization and stop strings. Text that
//! could still grow into a stop string is held back; a stop string found ends the request with
//! the text before it; a stop token's own text is never shown.
//!
//! The hand-out runs on a thread of its own (`Handout`): the engine thread passes each step's
//! tokens and each request's end over one channel, in order, and goes on scheduling and queuing
//! the next step while this thread detokenizes and sends (on the H200 the hand-out was 74% of the
//! host's time between steps, 5.7 µs a token). Every event of a stream goes through here, so a
//! stream's tokens always come before its `Finished`. A stop string found here ends the stream at
//! once and tells the engine (a notice it takes before its next step), so the request may run
//! one more step whose tokens are not sent nor counted.

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc as tmpsc;

use crate::request::{EngineEvent, FinishReason, RequestTimings, Usage};
use crate::scheduler::{RequestId, StepToken};
use crate::tokenizer::{IncrementalDecoder, TextTokenizer};

/// The text state of one request's stream.
#[derive(Debug, Default)]
pub struct TextOutput {
    decoder: IncrementalDecoder,
    /// All generated text so far and how much of it was sent.
    text: String,
    sent: usize,
    /// The stop string found, if one ended the text.
    matched: Option<String>,
}

/// What one token adds to a stream.
#[derive(Debug, PartialEq, Eq)]
pub struct Delta {
    /// Text to send now.
    pub text: String,
    /// Set when this token ends the request (its own finish, or a stop string).
    pub finish: Option<FinishReason>,
}

impl TextOutput {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a generated token: `finish` is the scheduler's verdict on it (a stop token, a length
    /// limit), `stops` the request's stop strings.
    pub fn push(
        &mut self,
        tok: &TextTokenizer,
        id: u32,
        finish: Option<FinishReason>,
        stops: &[String],
    ) -> Delta {
        // Skip the text of a stop token; keep everything else.
        if finish != Some(FinishReason::Stop) {
            if let Ok(Some(piece)) = self.decoder.push(tok, id) {
                self.text.push_str(&piece);
            }
        }
        let unsent = &self.text[self.sent..];
        if let Some((pos, _)) = stops
            .iter()
            .filter_map(|s| unsent.find(s.as_str()).map(|p| (p, s)))
            .min_by_key(|x| x.0)
        {
            let text = unsent[..pos].to_string();
            self.matched = Some(
                stops
                    .iter()
                    .find(|s| unsent[pos..].starts_with(s.as_str()))
                    .cloned()
                    .unwrap_or_default(),
            );
            self.sent = self.text.len();
            return Delta {
                text,
                finish: Some(FinishReason::Stop),
            };
        }
        let hold = if finish.is_some() {
            0
        } else {
            held_back(unsent, stops)
        };
        let upto = self.text.len() - hold;
        let text = self.text[self.sent..upto].to_string();
        self.sent = upto;
        Delta { text, finish }
    }

    /// The stop string that ended the text, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Text held back when the request ends for `reason` (none after a stop string).
    pub fn rest(&self, reason: FinishReason) -> String {
        if reason == FinishReason::Stop && self.sent == self.text.len() {
            String::new()
        } else {
            self.text[self.sent..].to_string()
        }
    }
}

/// Bytes at the end of `unsent` that could still grow into a stop string.
pub fn held_back(unsent: &str, stops: &[String]) -> usize {
    let mut hold = 0;
    for s in stops {
        for k in (1..s.len().min(unsent.len() + 1)).rev() {
            if unsent.is_char_boundary(unsent.len() - k)
                && s.is_char_boundary(k)
                && unsent.ends_with(&s[..k])
            {
                hold = hold.max(k);
                break;
            }
        }
    }
    hold
}

/// What the engine thread hands to the hand-out thread, in the order the stream must see it.
pub(super) enum HandoutMsg {
    /// A request's stream opens.
    Open {
        id: RequestId,
        tx: tmpsc::UnboundedSender<EngineEvent>,
        stops: Vec<String>,
        /// Stop strings count only once this many tokens are out (vLLM's rule).
        min_tokens: usize,
    },
    /// One step's tokens, in the order the scheduler produced them.
    Tokens(Vec<StepToken>),
    /// A request ended on the engine's side (its blocks are already free).
    Close { id: RequestId, end: Ending },
}

/// How a request ended, as the engine saw it; the hand-out thread adds what only it knows (the
/// tokens sent, the text held back, a stop string found).
pub(super) struct Ending {
    pub reason: FinishReason,
    pub error: Option<String>,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// Every timing but `mean_itl`.
    pub timings: RequestTimings,
    /// First token → last token, for `mean_itl`.
    pub itl_span: Option<Duration>,
}

struct Stream {
    tx: tmpsc::UnboundedSender<EngineEvent>,
    text: TextOutput,
    stops: Vec<String>,
    min_tokens: usize,
    /// Tokens sent (tokens after a stop string are not).
    emitted: usize,
    /// A stop string ended the text: nothing more is sent but the `Finished`.
    stopped: bool,
}

/// The hand-out thread's handle: dropping the sender side (through [`Handout::close`]) lets it
/// drain what is queued and end.
pub(super) struct Handout {
    tx: Option<mpsc::Sender<HandoutMsg>>,
    thread: Option<JoinHandle<()>>,
    /// The requests the thread found a stop string in, for the engine to end.
    stopped: mpsc::Receiver<RequestId>,
    /// A message could not be queued: the thread has ended (it panicked), taking its streams'
    /// senders with it.
    lost: std::cell::Cell<bool>,
}

impl Handout {
    /// Starts the thread.
    pub fn start(tokenizer: Option<TextTokenizer>) -> Handout {
        let (tx, rx) = mpsc::channel();
        let (stopped_tx, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("cachet-handout".into())
            .spawn(move || handout_loop(tokenizer, rx, stopped_tx))
            .expect("spawning the token hand-out thread");
        Handout {
            tx: Some(tx),
            thread: Some(thread),
            stopped,
            lost: Default::default(),
        }
    }

    /// The requests a stop string ended since the last call.
    pub fn take_stopped(&self) -> Vec<RequestId> {
        self.stopped.try_iter().collect()
    }

    pub fn send(&self, msg: HandoutMsg) {
        let queued = self.tx.as_ref().is_some_and(|tx| tx.send(msg).is_ok());
        if !queued && !self.lost.replace(true) {
            tracing::error!("the token hand-out thread has ended; its streams' events are lost");
        }
    }

    /// Whether the thread has ended while messages were still being sent: the engine must stop
    /// (its own stream handles dropped, so every client sees its stream end) rather than run
    /// requests whose tokens no one hands out.
    pub fn lost(&self) -> bool {
        self.lost.get()
    }

    /// Waits until everything queued has been handed out.
    fn close(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the token hand-out thread panicked");
            }
        }
    }
}

impl Drop for Handout {
    fn drop(&mut self) {
        self.close();
    }
}

fn handout_loop(
    tokenizer: Option<TextTokenizer>,
    rx: mpsc::Receiver<HandoutMsg>,
    stopped: mpsc::Sender<RequestId>,
) {
    let mut streams: HashMap<RequestId, Stream> = HashMap::new();
    for msg in rx {
        match msg {
            HandoutMsg::Open {
                id,
                tx,
                stops,
                min_tokens,
            } => {
                streams.insert(
                    id,
                    Stream {
                        tx,
                        text: TextOutput::new(),
                        stops,
                        min_tokens,
                        emitted: 0,
                        stopped: false,
                    },
                );
            }
            HandoutMsg::Tokens(tokens) => {
                for t in tokens {
                    let Some(st) = streams.get_mut(&t.id) else {
                        continue;
                    };
                    if st.stopped {
                        continue;
                    }
                    let at = Instant::now();
                    let delta = match &tokenizer {
                        Some(tok) if st.emitted < st.min_tokens.saturating_sub(1) => {
                            st.text.push(tok, t.token, t.finish, &[])
                        }
                        Some(tok) => st.text.push(tok, t.token, t.finish, &st.stops),
                        None => Delta {
                            text: String::new(),
                            finish: t.finish,
                        },
                    };
                    st.emitted += 1;
                    let _ = st.tx.send(EngineEvent::Token {
                        id: t.token,
                        text: delta.text,
                        at,
                        logprobs: t.logprobs,
                    });
                    // The scheduler's own finishes come as a `Close` right after this step's
                    // tokens; only a stop string is news to the engine.
                    if st.text.matched().is_some() {
                        st.stopped = true;
                        let _ = stopped.send(t.id);
                    }
                }
            }
            HandoutMsg::Close { id, end } => {
                let Some(st) = streams.remove(&id) else {
                    continue;
                };
                // A stop string found ends the request as a stop, whatever the engine saw after
                // it (the step it ran past it, a length limit, the client leaving).
                let (reason, error) = if st.stopped {
                    (FinishReason::Stop, None)
                } else {
                    (end.reason, end.error)
                };
                let n_out = st.emitted;
                let mut timings = end.timings;
                timings.mean_itl = match end.itl_span {
                    Some(span) if n_out > 1 => span / (n_out as u32 - 1),
                    _ => Duration::ZERO,
                };
                let _ = st.tx.send(EngineEvent::Finished {
                    reason,
                    usage: Usage {
                        prompt_tokens: end.prompt_tokens,
                        cached_tokens: end.cached_tokens,
                        completion_tokens: n_out,
                    },
                    timings,
                    error,
                    text: st.text.rest(reason),
                    stop_sequence: st.text.matched().map(str::to_owned),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(rx: &mut tmpsc::UnboundedReceiver<EngineEvent>) -> Vec<EngineEvent> {
        let mut v = Vec::new();
        while let Ok(e) = rx.try_recv() {
            v.push(e);
        }
        v
    }

    #[test]
    fn the_hand_out_keeps_each_streams_order_and_counts_what_it_sent() {
        let mut h = Handout::start(None);
        let (tx, mut rx) = tmpsc::unbounded_channel();
        h.send(HandoutMsg::Open {
            id: 7,
            tx,
            stops: Vec::new(),
            min_tokens: 0,
        });
        let tok = |token| StepToken {
            id: 7,
            token,
            finish: None,
            logprobs: None,
        };
        h.send(HandoutMsg::Tokens(vec![tok(11), tok(12)]));
        h.send(HandoutMsg::Tokens(vec![tok(13)]));
        h.send(HandoutMsg::Close {
            id: 7,
            end: Ending {
                reason: FinishReason::Length,
                error: None,
                prompt_tokens: 5,
                cached_tokens: 2,
                timings: RequestTimings::default(),
                itl_span: Some(Duration::from_millis(10)),
            },
        });
        // Tokens of a stream already closed are dropped, not sent.
        h.send(HandoutMsg::Tokens(vec![tok(14)]));
        h.close();
        assert!(!h.lost());
        let events = collect(&mut rx);
        let ids: Vec<u32> = events
            .iter()
            .filter_map(|e| match e {
                EngineEvent::Token { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        assert_eq!(ids, [11, 12, 13]);
        match events.last() {
            Some(EngineEvent::Finished {
                reason,
                usage,
                timings,
                ..
            }) => {
                assert_eq!(*reason, FinishReason::Length);
                assert_eq!(
                    (
                        usage.prompt_tokens,
                        usage.cached_tokens,
                        usage.completion_tokens
                    ),
                    (5, 2, 3)
                );
                assert_eq!(timings.mean_itl, Duration::from_millis(5));
            }
            other => panic!("the last event is not Finished: {other:?}"),
        }
    }

    #[test]
    fn a_hand_out_thread_that_ended_is_reported_lost() {
        let (tx, rx) = mpsc::channel();
        drop(rx);
        let h = Handout {
            tx: Some(tx),
            thread: None,
            stopped: mpsc::channel().1,
            lost: Default::default(),
        };
        assert!(!h.lost());
        h.send(HandoutMsg::Tokens(Vec::new()));
        assert!(h.lost());
    }

    #[test]
    fn text_that_may_start_a_stop_string_is_held_back() {
        let stops = vec!["</answer>".to_string(), "END".to_string()];
        assert_eq!(held_back("the answer</ans", &stops), 5);
        assert_eq!(held_back("the answer E", &stops), 1);
        assert_eq!(held_back("the answer", &stops), 0);
        // Never inside a multi-byte character.
        assert_eq!(held_back("café", &["é!".to_string()]), 2);
        assert_eq!(held_back("caf\u{e9}", &["\u{301}x".to_string()]), 0);
    }
}
