//! Chat templates rendered once per conversation *layout*.
//!
//! Most chat templates only copy a message's content into the prompt: they test whether it is
//! empty and concatenate it with markup, and never look inside it. For such a template the
//! prompt is a function of the conversation's layout — roles, which contents are empty, tool
//! calls, tools, template variables — with each content spliced in where the template wrote
//! it. [`opacity`] decides from the template's syntax tree whether a template is of that kind;
//! [`Layouts`] then renders each layout once with a placeholder per content, keeps the result,
//! and builds every later prompt of that layout by splicing the real contents in, without
//! running the template engine.
//!
//! The decision is conservative: a template is accepted only when every way a content can be
//! reached (`.content`, `['content']`, a message or the message list taken whole, a variable
//! set from one of them, a macro's output) leads to one of the uses below, and refused (the
//! engine renders every request) at anything else:
//!
//! - written out: `{{ c }}`, or through `+` / `~` concatenations that are written out;
//! - tested for truth (`{% if c %}`, `not c`, `c or ''`) — a placeholder is as empty as the
//!   content it stands for;
//! - type tests that hold for every string (`is defined`, `is string`, `is none`, ...).
//!
//! A filter, a method, a comparison, an `in`, a subscript or slice of a content, a loop over
//! one, or a content stored where the analysis cannot follow it (a namespace attribute, a map
//! literal, a macro argument) refuses the template.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use minijinja::machinery::ast::{self, CallArg, Expr, Stmt};

/// What a value may hold: a message or the message list (`M`: its content is one attribute
/// away), or a content's text, possibly concatenated with markup (`C`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
struct Taint {
    m: bool,
    c: bool,
}

impl Taint {
    const FREE: Taint = Taint { m: false, c: false };
    const M: Taint = Taint { m: true, c: false };
    const C: Taint = Taint { m: false, c: true };
    fn any(self) -> bool {
        self.m || self.c
    }
    fn or(self, o: Taint) -> Taint {
        Taint {
            m: self.m || o.m,
            c: self.c || o.c,
        }
    }
}

/// Tests whose answer is the same for every string (and for every message, list or map).
const TYPE_TESTS: &[&str] = &[
    "defined",
    "undefined",
    "none",
    "string",
    "sequence",
    "iterable",
    "mapping",
    "number",
    "integer",
    "float",
    "boolean",
    "true",
    "false",
];

/// Functions a template may call (with untainted arguments): none reads the context.
const PURE_FUNCTIONS: &[&str] = &["range", "namespace", "dict", "raise_exception"];

struct Analysis<'a> {
    /// Variables and what they may hold, over the whole template (every assignment's taint
    /// joined: flow-insensitive, so a name is as tainted as its worst use anywhere).
    vars: HashMap<&'a str, Taint>,
    /// Macros the template defines: their output may hold contents.
    macros: Vec<&'a str>,
    changed: bool,
    /// The first thing found that the layout cache cannot follow; `None` while checking is off
    /// (the passes that only propagate taint).
    refused: Option<String>,
    checking: bool,
}

impl<'a> Analysis<'a> {
    fn refuse(&mut self, why: impl FnOnce() -> String) {
        if self.checking && self.refused.is_none() {
            self.refused = Some(why());
        }
    }

    fn assign(&mut self, name: &'a str, t: Taint) {
        let e = self.vars.entry(name).or_default();
        let joined = e.or(t);
        if joined != *e {
            *e = joined;
            self.changed = true;
        }
    }

    /// Binds an assignment target (`set`, `with`, a loop's variables) to a value of taint `t`.
    fn bind(&mut self, target: &Expr<'a>, t: Taint, what: &str) {
        match target {
            Expr::Var(v) => self.assign(v.id, t),
            Expr::List(l) => {
                if t.any() {
                    self.refuse(|| format!("{what} unpacks a message or a content"));
                }
                for item in &l.items {
                    self.bind(item, Taint::FREE, what);
                }
            }
            // `ns.attr = ...`: where the value goes cannot be followed.
            other => {
                if t.any() {
                    self.refuse(|| format!("{what} stores a message or a content in an attribute"));
                }
                let _ = self.expr(other);
            }
        }
    }

    fn args(&mut self, args: &[CallArg<'a>], what: &str) {
        for a in args {
            let e = match a {
                CallArg::Pos(e)
                | CallArg::Kwarg(_, e)
                | CallArg::PosSplat(e)
                | CallArg::KwargSplat(e) => e,
            };
            if self.expr(e).any() {
                self.refuse(|| format!("{what} takes a message or a content as an argument"));
            }
        }
    }

    fn expr(&mut self, e: &Expr<'a>) -> Taint {
        match e {
            Expr::Var(v) => match v.id {
                "messages" => Taint::M,
                id => self.vars.get(id).copied().unwrap_or_default(),
            },
            Expr::Const(_) => Taint::FREE,
            Expr::GetAttr(g) => {
                let base = self.expr(&g.expr);
                let mut t = Taint::FREE;
                if base.m {
                    t = t.or(match g.name {
                        "content" => Taint::C,
                        // `loop.previtem` / `loop.nextitem` in a loop over messages.
                        "previtem" | "nextitem" => Taint::M,
                        // A message's other fields are part of the layout.
                        _ => Taint::FREE,
                    });
                }
                // A string's (or a list of strings') attributes are undefined whatever the text.
                t
            }
            Expr::GetItem(g) => self.get_item(g),
            Expr::Slice(s) => {
                let base = self.expr(&s.expr);
                for p in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                    if self.expr(p).any() {
                        self.refuse(|| "a slice bound computed from a message or a content".into());
                    }
                }
                if base.c {
                    self.refuse(|| "a slice of a content".into());
                }
                base
            }
            Expr::UnaryOp(u) => {
                let t = self.expr(&u.expr);
                match u.op {
                    // Truth: a placeholder is as empty as its content.
                    ast::UnaryOpKind::Not => Taint::FREE,
                    ast::UnaryOpKind::Neg => {
                        if t.any() {
                            self.refuse(|| "arithmetic on a message or a content".into());
                        }
                        Taint::FREE
                    }
                }
            }
            Expr::BinOp(b) => self.bin_op(b),
            Expr::Compare(c) => {
                let mut any = self.expr(&c.expr).any();
                for op in &c.ops {
                    any |= self.expr(&op.expr).any();
                }
                if any {
                    self.refuse(|| "a comparison with a message or a content".into());
                }
                Taint::FREE
            }
            Expr::IfExpr(i) => {
                let _ = self.expr(&i.test_expr);
                let t = self.expr(&i.true_expr);
                match &i.false_expr {
                    Some(f) => t.or(self.expr(f)),
                    None => t,
                }
            }
            Expr::Filter(f) => self.filter(f),
            Expr::Test(t) => {
                let input = self.expr(&t.expr);
                self.args(&t.args, "a test");
                if input.any() && !TYPE_TESTS.contains(&t.name) {
                    let name = t.name;
                    self.refuse(|| format!("the `{name}` test on a message or a content"));
                }
                Taint::FREE
            }
            Expr::Call(c) => self.call(c),
            Expr::List(l) => l.items.iter().fold(Taint::FREE, |t, i| t.or(self.expr(i))),
            Expr::Map(m) => {
                let mut any = false;
                for k in &m.keys {
                    any |= self.expr(k).any();
                }
                for v in &m.values {
                    any |= self.expr(v).any();
                }
                if any {
                    self.refuse(|| "a map literal holding a message or a content".into());
                }
                Taint::FREE
            }
        }
    }

    /// `x[k]`: a message's field by name, a message by position; no subscript from a content.
    fn get_item(&mut self, g: &ast::GetItem<'a>) -> Taint {
        let base = self.expr(&g.expr);
        if self.expr(&g.subscript_expr).any() {
            self.refuse(|| "a subscript computed from a message or a content".into());
        }
        if base.c {
            self.refuse(|| "a subscript of a content (a character of its text)".into());
        }
        if !base.m {
            return Taint::FREE;
        }
        match &g.subscript_expr {
            Expr::Const(k) => match k.value.as_str() {
                Some("content") => Taint::C,
                Some("previtem" | "nextitem") => Taint::M,
                Some(_) => Taint::FREE,
                // A position in the message list: a message.
                None => Taint::M,
            },
            // Either a message (a list index) or any field of one, the content too.
            _ => Taint::M.or(Taint::C),
        }
    }

    /// `a op b`: concatenation carries a content along; comparisons and arithmetic are refused.
    fn bin_op(&mut self, b: &ast::BinOp<'a>) -> Taint {
        let (l, r) = (self.expr(&b.left), self.expr(&b.right));
        let both = l.or(r);
        use ast::BinOpKind::*;
        match b.op {
            // Concatenation carries contents along; a list concatenated is refused.
            Add | Concat => {
                if both.m {
                    self.refuse(|| "a message or the message list concatenated".into());
                }
                if both.c {
                    Taint::C
                } else {
                    Taint::FREE
                }
            }
            // `a and b` / `a or b` give one of their operands.
            ScAnd | ScOr => both,
            Eq | Ne | Lt | Lte | Gt | Gte | In | Sub | Mul | Div | FloorDiv | Rem | Pow => {
                if both.any() {
                    self.refuse(|| {
                        "a comparison, `in` or arithmetic with a message or a content".into()
                    });
                }
                Taint::FREE
            }
        }
    }

    /// `x | f(...)`: what a filter on a message, the list or a content gives.
    fn filter(&mut self, f: &ast::Filter<'a>) -> Taint {
        let input = f.expr.as_ref().map_or(Taint::FREE, |e| self.expr(e));
        self.args(&f.args, "a filter");
        if input.c {
            let name = f.name;
            self.refuse(|| format!("the `{name}` filter on a content"));
        }
        if input.m {
            match f.name {
                "length" | "count" => return Taint::FREE,
                "first" | "last" | "reverse" | "list" => return Taint::M,
                name => {
                    self.refuse(|| format!("the `{name}` filter on a message or the message list"))
                }
            }
        }
        Taint::FREE
    }

    /// A call: its arguments may hold no message or content; what it gives back.
    fn call(&mut self, c: &ast::Call<'a>) -> Taint {
        self.args(&c.args, "a call");
        match c.identify_call() {
            // A macro's output may hold what it wrote out.
            ast::CallType::Function(name) if self.macros.contains(&name) || name == "caller" => {
                Taint::C
            }
            ast::CallType::Function(name) if PURE_FUNCTIONS.contains(&name) => Taint::FREE,
            ast::CallType::Function(name) => {
                self.refuse(|| format!("a call of `{name}`, which the analysis does not know"));
                Taint::FREE
            }
            ast::CallType::Method(base, name) => {
                let t = self.expr(base);
                if t.c || (t.m && name != "cycle") {
                    self.refuse(|| format!("the method `{name}` on a message or a content"));
                }
                Taint::FREE
            }
            #[allow(unreachable_patterns)]
            _ => {
                self.refuse(|| "a call of a computed value or a block".into());
                Taint::FREE
            }
        }
    }

    fn stmts(&mut self, body: &[Stmt<'a>]) {
        for s in body {
            self.stmt(s);
        }
    }

    /// Whether `body` writes out anything that may hold a content.
    fn writes_content(&mut self, body: &[Stmt<'a>]) -> bool {
        body.iter().any(|s| match s {
            Stmt::EmitExpr(e) => self.expr(&e.expr).c,
            Stmt::ForLoop(f) => self.writes_content(&f.body) || self.writes_content(&f.else_body),
            Stmt::IfCond(i) => {
                self.writes_content(&i.true_body) || self.writes_content(&i.false_body)
            }
            Stmt::WithBlock(w) => self.writes_content(&w.body),
            Stmt::SetBlock(_)
            | Stmt::EmitRaw(_)
            | Stmt::Set(_)
            | Stmt::Continue(_)
            | Stmt::Break(_) => false,
            Stmt::Macro(_) | Stmt::Do(_) => false,
            // Call blocks write their macro's output: conservatively, contents.
            _ => true,
        })
    }

    fn stmt(&mut self, s: &Stmt<'a>) {
        match s {
            Stmt::Template(t) => self.stmts(&t.children),
            Stmt::EmitRaw(_) | Stmt::Continue(_) | Stmt::Break(_) => {}
            Stmt::EmitExpr(e) => {
                if self.expr(&e.expr).m {
                    self.refuse(|| "a message or the message list written out whole".into());
                }
            }
            Stmt::ForLoop(f) => {
                let it = self.expr(&f.iter);
                if it.c {
                    self.refuse(|| "a loop over a content".into());
                }
                if f.recursive {
                    self.refuse(|| "a recursive loop".into());
                }
                self.bind(&f.target, Taint { m: it.m, c: false }, "a loop");
                self.assign("loop", Taint { m: it.m, c: false });
                if let Some(cond) = &f.filter_expr {
                    let _ = self.expr(cond);
                }
                self.stmts(&f.body);
                self.stmts(&f.else_body);
            }
            Stmt::IfCond(i) => {
                let _ = self.expr(&i.expr);
                self.stmts(&i.true_body);
                self.stmts(&i.false_body);
            }
            Stmt::WithBlock(w) => {
                for (target, value) in &w.assignments {
                    let t = self.expr(value);
                    self.bind(target, t, "a with block");
                }
                self.stmts(&w.body);
            }
            Stmt::Set(set) => {
                let t = self.expr(&set.expr);
                self.bind(&set.target, t, "a set");
            }
            Stmt::SetBlock(b) => {
                let holds = self.writes_content(&b.body);
                if holds && b.filter.is_some() {
                    self.refuse(|| "a filtered set block around a content".into());
                }
                if let Some(f) = &b.filter {
                    let _ = self.expr(f);
                }
                self.bind(
                    &b.target,
                    if holds { Taint::C } else { Taint::FREE },
                    "a set block",
                );
                self.stmts(&b.body);
            }
            Stmt::Macro(m) => {
                if !self.macros.contains(&m.name) {
                    self.macros.push(m.name);
                    self.changed = true;
                }
                for d in &m.defaults {
                    if self.expr(d).any() {
                        self.refuse(|| "a macro default from a message or a content".into());
                    }
                }
                for a in &m.args {
                    self.bind(a, Taint::FREE, "a macro");
                }
                self.stmts(&m.body);
            }
            Stmt::CallBlock(c) => {
                let _ = self.call(&c.call);
                for d in &c.macro_decl.defaults {
                    if self.expr(d).any() {
                        self.refuse(|| "a call block's default from a message or a content".into());
                    }
                }
                self.stmts(&c.macro_decl.body);
            }
            Stmt::Do(d) => {
                let _ = self.call(&d.call);
            }
            Stmt::AutoEscape(_) => self.refuse(|| "an autoescape block".into()),
            Stmt::FilterBlock(_) => self.refuse(|| "a filter block".into()),
            #[allow(unreachable_patterns)]
            _ => self.refuse(|| "blocks, includes or imports".into()),
        }
    }
}

/// Whether the chat template `source` only copies message contents (see the module's
/// documentation): `Ok` when a layout's rendering can be reused with other contents spliced
/// in, or what in the template prevents it.
pub fn opacity(source: &str) -> Result<(), NotReusable> {
    let tree = minijinja::machinery::parse(source, "chat", Default::default(), Default::default())
        .map_err(|e| NotReusable::Parse(std::sync::Arc::new(e)))?;
    let mut a = Analysis {
        vars: HashMap::new(),
        macros: Vec::new(),
        changed: true,
        refused: None,
        checking: false,
    };
    // Taint only grows and is finite: propagate to the fixed point, then check once.
    let mut rounds = 0;
    while a.changed {
        a.changed = false;
        a.stmt(&tree);
        rounds += 1;
        if rounds > 64 {
            return Err(NotReusable::Unsettled);
        }
    }
    a.checking = true;
    a.stmt(&tree);
    match a.refused {
        Some(why) => Err(NotReusable::Uses(why)),
        None => Ok(()),
    }
}

/// Why a chat template's renderings cannot be reused with other contents spliced in.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NotReusable {
    #[error("the template does not parse")]
    Parse(#[source] std::sync::Arc<minijinja::Error>),
    #[error("the template's variables did not settle")]
    Unsettled,
    #[error("the model has no chat template")]
    NoTemplate,
    /// What in the template does more with a content than copy it.
    #[error("{0}")]
    Uses(String),
}

/// One piece of a layout: template text, or where message `i`'s content goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(std::ops::Range<usize>),
    Content(usize),
}

/// A layout's rendering, cut where contents go.
#[derive(Debug)]
pub(crate) struct Layout {
    text: String,
    pieces: Vec<Piece>,
}

impl Layout {
    /// Cuts `rendered` (rendered with [`Layouts::placeholder`]s) at its placeholders; `None`
    /// when one names no message with content (left for the engine to render).
    fn cut(rendered: String, nonce: &str, has_content: &[bool]) -> Option<Layout> {
        let open = format!("{PLACEHOLDER_OPEN}{nonce}:");
        let mut pieces = Vec::new();
        let mut at = 0;
        while let Some(off) = rendered[at..].find(&open) {
            let start = at + off;
            let digits = start + open.len();
            let end = digits + rendered[digits..].find(PLACEHOLDER_CLOSE)?;
            let i: usize = rendered[digits..end].parse().ok()?;
            if !has_content.get(i).copied().unwrap_or(false) {
                return None;
            }
            if start > at {
                pieces.push(Piece::Text(at..start));
            }
            pieces.push(Piece::Content(i));
            at = end + PLACEHOLDER_CLOSE.len_utf8();
        }
        if at < rendered.len() {
            pieces.push(Piece::Text(at..rendered.len()));
        }
        Some(Layout {
            text: rendered,
            pieces,
        })
    }

    /// What it holds in memory, as the cache counts it.
    fn bytes(&self) -> usize {
        self.text.len() + self.pieces.len() * std::mem::size_of::<Piece>() + 64
    }

    /// The prompt with `contents` spliced in.
    pub(crate) fn splice(&self, contents: &[&str]) -> String {
        let len = self
            .pieces
            .iter()
            .map(|p| match p {
                Piece::Text(r) => r.len(),
                Piece::Content(i) => contents[*i].len(),
            })
            .sum();
        let mut out = String::with_capacity(len);
        for p in &self.pieces {
            match p {
                Piece::Text(r) => out.push_str(&self.text[r.clone()]),
                Piece::Content(i) => out.push_str(contents[*i]),
            }
        }
        out
    }
}

const PLACEHOLDER_OPEN: char = '\u{E000}';
const PLACEHOLDER_CLOSE: char = '\u{E001}';

/// Layout renderings of one template, most recently used kept, bounded in bytes.
pub(crate) struct Layouts {
    /// Random per process: a request cannot write a placeholder into the template's markup
    /// (a tool's name, a template variable) without knowing it.
    nonce: String,
    cache: Mutex<Cache>,
}

struct Cache {
    map: lru::LruCache<[u8; 32], Arc<Layout>>,
    bytes: usize,
}

/// What the layouts of one template may hold in memory.
const LAYOUT_BYTES: usize = 8 << 20;

impl Layouts {
    pub(crate) fn new() -> Layouts {
        use std::hash::BuildHasher;
        // Two randomly keyed hashers (the OS's randomness, as HashMap's keys take it).
        let random = || std::collections::hash_map::RandomState::new().hash_one(0u8);
        let (a, b) = (random(), random());
        Layouts {
            nonce: format!("{a:016x}{b:016x}"),
            cache: Mutex::new(Cache {
                map: lru::LruCache::unbounded(),
                bytes: 0,
            }),
        }
    }

    /// The text standing for message `i`'s content in a layout's rendering.
    pub(crate) fn placeholder(&self, i: usize) -> String {
        format!("{PLACEHOLDER_OPEN}{}:{i}{PLACEHOLDER_CLOSE}", self.nonce)
    }

    pub(crate) fn get(&self, key: &[u8; 32]) -> Option<Arc<Layout>> {
        self.cache
            .lock()
            .expect("layout cache")
            .map
            .get(key)
            .cloned()
    }

    /// Cuts and keeps a layout's rendering; `None` when it cannot be cut (see [`Layout::cut`]).
    pub(crate) fn insert(
        &self,
        key: [u8; 32],
        rendered: String,
        has_content: &[bool],
    ) -> Option<Arc<Layout>> {
        let layout = Arc::new(Layout::cut(rendered, &self.nonce, has_content)?);
        if layout.bytes() > LAYOUT_BYTES {
            return Some(layout);
        }
        let mut c = self.cache.lock().expect("layout cache");
        if let Some(old) = c.map.put(key, layout.clone()) {
            c.bytes -= old.bytes();
        }
        c.bytes += layout.bytes();
        while c.bytes > LAYOUT_BYTES {
            match c.map.pop_lru() {
                Some((_, old)) => c.bytes -= old.bytes(),
                None => break,
            }
        }
        Some(layout)
    }

    /// Layouts kept now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.cache.lock().expect("layout cache").map.len()
    }
}

#[cfg(test)]
mod tests;
