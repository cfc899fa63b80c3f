//! The Cachet guest SDK: what a tenant writes a prompt template with.
//!
//! A template turns a chat request into ordered *segments*, each marked [`Cache::Static`]
//! (identical across requests, so the engine's prefix cache can hold it) or [`Cache::Dynamic`]
//! (per-request). The gateway runs the compiled `wasm32-unknown-unknown` module in a sandbox.
//!
//! This crate is `no_std` + `alloc` so it builds for `wasm32-unknown-unknown` with only `core` and
//! `alloc` in the sysroot.
#![no_std]
#![deny(missing_docs)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

/// Whether a segment may be cached across requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    /// The same for many requests: part of the cacheable prefix.
    Static,
    /// Specific to this request.
    Dynamic,
}

/// One piece of the rendered prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Chat role the text belongs to (`system`, `user`, `assistant`, …).
    pub role: String,
    /// The text itself.
    pub text: String,
    /// Cacheability.
    pub cache: Cache,
}

/// A template's output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// Segments in prompt order.
    pub segments: Vec<Segment>,
    /// Extra stop strings the template asks for.
    pub stop: Vec<String>,
    /// An upper bound on generated tokens the template asks for.
    pub max_tokens: Option<u32>,
}
