//! The Cachet guest SDK: what a tenant writes a prompt template with.
//!
//! A template turns a chat request into ordered *segments*, each marked [`Cache::Static`]
//! (identical across requests, so the engine's prefix cache can hold it) or [`Cache::Dynamic`]
//! (per-request). The gateway runs the compiled `wasm32-unknown-unknown` module in a sandbox, a
//! fresh instance per request, under a time, fuel and memory budget.
//!
//! This crate is `no_std` + `alloc` so it builds for `wasm32-unknown-unknown` with only `core` and
//! `alloc` in the sysroot. On that target it also brings the module's allocator (a bump allocator:
//! each instance lives for one call) and panic handler (a panic traps, and the gateway answers the
//! request with `template_trap`). The wire format and exports are written down in `ABI.md`.
//!
//! # Example
//!
//! ```ignore
//! #![cfg_attr(target_arch = "wasm32", no_std)]
//! extern crate alloc;
//! use alloc::format;
//! use cachet_guest_sdk::{Error, Rendered, Request, Segment, Template};
//!
//! struct Support;
//!
//! impl Template for Support {
//!     fn render(req: &Request) -> Result<Rendered, Error> {
//!         let question = req.last_user().ok_or(Error::new("no user message"))?;
//!         let mut out = Rendered::default();
//!         out.push(Segment::fixed("system", "You are Ada, the support assistant of Example Co."));
//!         out.push(Segment::varying("user", format!("{question}")));
//!         out.stop.push("\nUser:".into());
//!         Ok(out)
//!     }
//! }
//!
//! cachet_guest_sdk::export_template!(Support);
//! ```
//!
//! Build it with `scripts/build-template.sh path/to/crate` (see the README) and upload the
//! `.wasm` with `PUT /v1/templates/{name}`.
#![no_std]
#![deny(missing_docs)]

extern crate alloc;

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

/// The ABI version this SDK speaks; the gateway refuses modules that report another.
pub const ABI_VERSION: u32 = 1;

/// Whether a segment may be cached across requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cache {
    /// The same for many requests: part of the cacheable prefix.
    Static,
    /// Specific to this request.
    Dynamic,
}

/// A function call an assistant message made (OpenAI's `tool_calls`, Anthropic's `tool_use`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id; the `tool` message with its result names it.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments: a JSON object, as text.
    pub arguments: String,
}

/// One piece of the rendered prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Chat role the text belongs to (`system`, `user`, `assistant`, `tool`, …).
    pub role: String,
    /// The text itself.
    pub text: String,
    /// Cacheability.
    pub cache: Cache,
    /// On an `assistant` segment: the calls its message makes (after its text).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a `tool` segment: the call whose result it is. A segment with an id is a message of
    /// its own (never joined with its neighbours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The participant's name of the message it belongs to (OpenAI's `name`): segments join
    /// into one message only where their names are the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// On the first `assistant` segment of a message: its thinking (`reasoning_content`). A
    /// segment with it starts a message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Segment {
    /// A static segment: the same text for many requests.
    pub fn fixed(role: impl Into<String>, text: impl Into<String>) -> Self {
        Segment {
            role: role.into(),
            text: text.into(),
            cache: Cache::Static,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }
    /// A dynamic segment: text of this request only.
    pub fn varying(role: impl Into<String>, text: impl Into<String>) -> Self {
        Segment {
            role: role.into(),
            text: text.into(),
            cache: Cache::Dynamic,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }
}

/// A template's output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rendered {
    /// Segments in prompt order. Consecutive segments of one role form one chat message.
    pub segments: Vec<Segment>,
    /// Extra stop strings the template asks for.
    #[serde(default)]
    pub stop: Vec<String>,
    /// An upper bound on generated tokens the template asks for.
    #[serde(default)]
    pub max_tokens: Option<u32>,
}

impl Rendered {
    /// Appends a segment.
    pub fn push(&mut self, s: Segment) {
        self.segments.push(s);
    }
}

/// One chat message of the request. The same shape carries a message from the gateway's API
/// through the template to the model's chat template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`, …
    pub role: String,
    /// The message text.
    pub content: String,
    /// On an `assistant` message: the function calls it made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a `tool` message: the id of the call whose result it carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The participant's name (OpenAI's `name`), for templates that render it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// On an `assistant` message of the history: its thinking, apart from its answer
    /// (`reasoning_content`), for templates that render it (Qwen3, DeepSeek R1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    /// A message of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }
}

/// The authenticated tenant, as the gateway knows it (never taken from the client).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    /// The tenant's id from the gateway's config.
    pub id: String,
    /// Free-form metadata from the gateway's config.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// What a template renders: the client's chat request plus what the gateway adds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The model the client asked for.
    pub model: String,
    /// The chat messages, in order.
    pub messages: Vec<Message>,
    /// Template variables the client sent (`template_variables` in the request body).
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
    /// The tenant the request belongs to.
    #[serde(default)]
    pub tenant: Tenant,
    /// The end user's id, from the request's `user` field, if sent.
    #[serde(default)]
    pub user: Option<String>,
    /// The gateway's clock when the request arrived, RFC 3339 in UTC (modules have no clock).
    #[serde(default)]
    pub now: String,
}

impl Request {
    /// The text of the last `user` message, if any.
    pub fn last_user(&self) -> Option<&str> {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == "user")
            .map(|m| m.content.as_str())
    }
    /// A template variable, if the client sent it.
    pub fn var(&self, name: &str) -> Option<&str> {
        self.variables.get(name).map(String::as_str)
    }
}

/// A template's refusal: the gateway answers the request with 422 and this message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl Error {
    /// An error with this message.
    pub fn new(msg: impl Into<String>) -> Self {
        Error(msg.into())
    }
}

/// What a tenant implements.
pub trait Template {
    /// Renders one request into segments.
    fn render(req: &Request) -> Result<Rendered, Error>;
}

/// Writes a line to the gateway's log (tagged with the tenant and template; rate-limited there).
pub fn log(msg: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        #[link(wasm_import_module = "cachet")]
        extern "C" {
            #[link_name = "log"]
            fn host_log(ptr: *const u8, len: u32);
        }
        // SAFETY: the host reads `len` bytes at `ptr` from this module's memory, nothing else.
        unsafe { host_log(msg.as_ptr(), msg.len() as u32) };
    }
    #[cfg(not(target_arch = "wasm32"))]
    let _ = msg;
}

/// Runs a template on a JSON request and returns the JSON reply (`Rendered`, or `{"error": …}`).
/// The export glue calls this; it is public so templates can be tested natively.
pub fn render_json<T: Template>(input: &[u8]) -> Vec<u8> {
    #[derive(Serialize)]
    struct Failure<'a> {
        error: &'a str,
    }
    let out = match serde_json::from_slice::<Request>(input) {
        Ok(req) => match T::render(&req) {
            Ok(r) => serde_json::to_vec(&r),
            Err(Error(e)) => serde_json::to_vec(&Failure { error: &e }),
        },
        Err(e) => {
            let msg = alloc::format!("the request is not valid JSON for this ABI: {e}");
            serde_json::to_vec(&Failure { error: &msg })
        }
    };
    out.unwrap_or_else(|_| b"{\"error\":\"could not encode the reply\"}".to_vec())
}

/// Export glue; use [`export_template!`].
#[doc(hidden)]
pub mod abi {
    use alloc::vec::Vec;

    /// Memory for the host to write the request into.
    pub fn alloc(len: u32) -> *mut u8 {
        let mut v: Vec<u8> = Vec::with_capacity(len as usize);
        let p = v.as_mut_ptr();
        core::mem::forget(v);
        p
    }

    /// Renders the request at `ptr..ptr+len`; returns `(out_ptr << 32) | out_len`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be memory from [`alloc`] that the host filled.
    pub unsafe fn render<T: super::Template>(ptr: *mut u8, len: u32) -> u64 {
        // SAFETY: the caller passes back the buffer `alloc` returned, filled with `len` bytes.
        let input = unsafe { core::slice::from_raw_parts(ptr, len as usize) };
        let out = super::render_json::<T>(input);
        let (p, n) = (out.as_ptr() as usize as u64, out.len() as u64);
        core::mem::forget(out);
        (p << 32) | n
    }
}

/// Exports a [`Template`] implementation with the ABI's functions: `cachet_abi_version`,
/// `cachet_alloc` and `cachet_render`.
#[macro_export]
macro_rules! export_template {
    ($t:ty) => {
        /// ABI version (see ABI.md).
        #[no_mangle]
        pub extern "C" fn cachet_abi_version() -> u32 {
            $crate::ABI_VERSION
        }
        /// Memory for the request.
        #[no_mangle]
        pub extern "C" fn cachet_alloc(len: u32) -> *mut u8 {
            $crate::abi::alloc(len)
        }
        /// Renders the request; returns `(ptr << 32) | len` of the JSON reply.
        ///
        /// # Safety
        /// Called by the host with a buffer from `cachet_alloc`.
        #[no_mangle]
        pub unsafe extern "C" fn cachet_render(ptr: *mut u8, len: u32) -> u64 {
            // SAFETY: forwarded from the host, per the ABI.
            unsafe { $crate::abi::render::<$t>(ptr, len) }
        }
    };
}

#[cfg(target_arch = "wasm32")]
mod runtime {
    //! The module's allocator and panic handler on wasm32.
    use core::alloc::{GlobalAlloc, Layout};
    use core::cell::Cell;

    /// Bump allocation from the linker's `__heap_base` to the end of memory, growing memory
    /// when full: an instance lives for one call, so nothing is ever freed. A failed grow (the
    /// gateway's memory cap) fails the allocation, which traps.
    struct Bump {
        next: Cell<usize>,
        end: Cell<usize>,
    }

    // SAFETY: wasm32-unknown-unknown modules are single-threaded.
    unsafe impl Sync for Bump {}

    const PAGE: usize = 65536;

    unsafe impl GlobalAlloc for Bump {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if self.end.get() == 0 {
                extern "C" {
                    static __heap_base: u8;
                }
                // SAFETY: wasm-ld defines `__heap_base`; only its address is taken.
                let base = unsafe { core::ptr::addr_of!(__heap_base) } as usize;
                self.next.set(base);
                self.end.set(core::arch::wasm32::memory_size(0) * PAGE);
            }
            let start = (self.next.get() + layout.align() - 1) & !(layout.align() - 1);
            let Some(stop) = start.checked_add(layout.size()) else {
                return core::ptr::null_mut();
            };
            if stop > self.end.get() {
                let pages = (stop - self.end.get()).div_ceil(PAGE);
                if core::arch::wasm32::memory_grow(0, pages) == usize::MAX {
                    return core::ptr::null_mut();
                }
                self.end.set(self.end.get() + pages * PAGE);
            }
            self.next.set(stop);
            start as *mut u8
        }
        unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}
    }

    #[global_allocator]
    static ALLOC: Bump = Bump {
        next: Cell::new(0),
        end: Cell::new(0),
    };

    #[panic_handler]
    fn panic(_: &core::panic::PanicInfo) -> ! {
        core::arch::wasm32::unreachable()
    }
}
