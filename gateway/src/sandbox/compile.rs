//! Where tenants' template modules are compiled: on a thread of this process, or in a child
//! process of this program (`cachet compile-template`) under an address-space limit, killed at
//! its deadline — what `cachet serve` does, so that a module built to compile slowly costs its
//! deadline and nothing after it. The child's engine has the sandbox's compiler settings
//! ([`wasm_config`]), so its code deserializes into the sandbox's engine.

use std::time::{Duration, Instant};

use wasmtime::{Config, Engine};

use super::TemplateError;

/// Where a template module is compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompileIn {
    /// On a thread of this process: a compile past its deadline is answered with 422 but runs
    /// on to its end (Cranelift cannot be stopped midway). For tools and tests.
    Thread,
    /// In a child process, this program (`cachet compile-template`, [`compile_child`]) under
    /// an address-space limit of [`COMPILE_MEMORY`]: a compile past its deadline is killed,
    /// and one that needs more memory fails alone. What `cachet serve` uses.
    Process(std::path::PathBuf),
}

/// Address space a child compile may use.
pub const COMPILE_MEMORY: u64 = 2 << 30;

/// The engine settings compiled code depends on, shared by the sandbox and its child compiles
/// (the pooling allocator is the sandbox's alone: it changes where instances live, not code).
pub(super) fn wasm_config() -> Config {
    let mut wc = Config::new();
    wc.epoch_interruption(true)
        .consume_fuel(true)
        // One upload compiles on one core (its slot's), never on all of them.
        .parallel_compilation(false);
    wc
}

/// The child's side of [`CompileIn::Process`]: a module's bytes on stdin, its compiled code on
/// stdout (`cachet compile-template`). A failure is the error on stderr and a non-zero exit.
pub fn compile_child() -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let mut bytes = Vec::new();
    std::io::stdin().read_to_end(&mut bytes)?;
    let engine = Engine::new(&wasm_config())?;
    let code = engine.precompile_module(&bytes)?;
    std::io::stdout().write_all(&code)?;
    Ok(())
}

/// Compiles `bytes` in a child process of `exe` (limited to [`COMPILE_MEMORY`] of address
/// space), killed at `deadline`.
pub(super) fn compile_in_child(
    exe: &std::path::Path,
    bytes: &[u8],
    deadline: Duration,
) -> Result<Vec<u8>, TemplateError> {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let t0 = Instant::now();
    let mut cmd = Command::new(exe);
    cmd.arg("compile-template")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: runs in the child between fork and exec, where only async-signal-safe calls are
    // allowed; setrlimit is one, and the closure touches nothing else of this process.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: COMPILE_MEMORY,
                rlim_max: COMPILE_MEMORY,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let storage = |what: &str, e: std::io::Error| {
        TemplateError::Storage(format!("compiling in a child process: {what}: {e}"))
    };
    let mut child = cmd.spawn().map_err(|e| storage("starting it", e))?;
    let mut stdin = child.stdin.take().expect("piped");
    let input = bytes.to_vec();
    let feed = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut stdout = child.stdout.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        stdout.read_to_end(&mut v).map(|_| v)
    });
    let mut stderr = child.stderr.take().expect("piped");
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stderr.read_to_end(&mut v);
        v
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if t0.elapsed() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) => {
                // Stopped, not left running: its CPU and memory are given back now.
                let _ = child.kill();
                let _ = child.wait();
                return Err(TemplateError::CompileTimeout(deadline));
            }
            Err(e) => return Err(storage("waiting for it", e)),
        }
    };
    let _ = feed.join();
    let code = out
        .join()
        .expect("reader thread")
        .map_err(|e| storage("reading its output", e))?;
    let msg = String::from_utf8_lossy(&err.join().expect("reader thread")).into_owned();
    if !status.success() {
        let msg = msg.trim().trim_start_matches("error: ");
        return Err(
            if msg.contains("memory allocation") || msg.contains("out of memory") {
                TemplateError::TooComplex {
                    what: "bytes of memory needed to compile",
                    found: COMPILE_MEMORY + 1,
                    limit: COMPILE_MEMORY,
                }
            } else {
                TemplateError::NotWasm(msg.to_string())
            },
        );
    }
    Ok(code)
}
