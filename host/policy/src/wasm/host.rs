//! The state of one decision's `Store`: the memory limiter, the bounded log, and the optional
//! deny-all WASI context.
//!
//! Not for running guests (see [`super::call`]) or for deciding what a guest may import (see
//! [`super::link`]).

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::LogLevel;
use super::bindings::neocloud::policy::log;
use super::config::output_limits::{MAX_LOG_MESSAGE_BYTES, MAX_LOG_MESSAGES, MAX_STDIO_BYTES};
use super::error::Role;

/// The `tracing` target of the lines guests log (`RUST_LOG=neocloud_policy::guest=debug`
/// shows their debug lines too).
pub const GUEST_LOG_TARGET: &str = "neocloud_policy::guest";

/// One line a guest logged during a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub level: LogLevel,
    pub message: String,
}

/// The bounded log of one decision: at most [`MAX_LOG_MESSAGES`] lines of at most
/// [`MAX_LOG_MESSAGE_BYTES`] bytes; further lines are counted in `dropped`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecisionLog {
    pub lines: Vec<LogLine>,
    pub dropped: u32,
}

impl DecisionLog {
    pub(crate) fn push(&mut self, level: LogLevel, message: &str) {
        if self.lines.len() >= MAX_LOG_MESSAGES {
            self.dropped = self.dropped.saturating_add(1);
            return;
        }
        let message = truncate_utf8(message, MAX_LOG_MESSAGE_BYTES).to_owned();
        self.lines.push(LogLine { level, message });
    }

    /// Writes every line to the host's log (target [`GUEST_LOG_TARGET`]) at the level the
    /// guest gave it, with the policy's name and role as fields, and warns of lines dropped
    /// past the limit.
    pub fn emit(&self, policy: &str, role: Role) {
        const T: &str = GUEST_LOG_TARGET;
        for line in &self.lines {
            let m = line.message.as_str();
            match line.level {
                LogLevel::Debug => tracing::debug!(target: T, policy = %policy, %role, "{m}"),
                LogLevel::Info => tracing::info!(target: T, policy = %policy, %role, "{m}"),
                LogLevel::Warn => tracing::warn!(target: T, policy = %policy, %role, "{m}"),
            }
        }
        if self.dropped > 0 {
            tracing::warn!(
                target: T,
                policy = %policy,
                %role,
                dropped = self.dropped,
                "policy log: lines past the limit of {MAX_LOG_MESSAGES} per decision were dropped"
            );
        }
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary.
pub(crate) fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Deny-all WASI: the context plus the pipes its stdout and stderr write into.
pub(crate) struct Wasi {
    ctx: WasiCtx,
    table: ResourceTable,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
}

impl Wasi {
    /// No preopens, no environment, no arguments, no sockets, closed stdin, bounded stdio.
    pub(crate) fn deny_all() -> Self {
        let stdout = MemoryOutputPipe::new(MAX_STDIO_BYTES);
        let stderr = MemoryOutputPipe::new(MAX_STDIO_BYTES);
        let ctx = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let table = ResourceTable::new();
        Self {
            ctx,
            table,
            stdout,
            stderr,
        }
    }
}

/// Everything one decision's store holds.
pub(crate) struct HostState {
    pub(crate) limiter: Limiter,
    pub(crate) log: DecisionLog,
    pub(crate) wasi: Option<Wasi>,
}

impl HostState {
    pub(crate) fn new(memory_bytes: usize, deny_all_wasi: bool) -> Self {
        Self {
            limiter: Limiter::new(memory_bytes),
            log: DecisionLog::default(),
            wasi: deny_all_wasi.then(Wasi::deny_all),
        }
    }

    /// Moves captured stdout and stderr into the bounded log, as `info` and `warn` lines.
    pub(crate) fn drain_stdio(&mut self) {
        let Some(wasi) = &self.wasi else { return };
        let out = wasi.stdout.contents();
        let err = wasi.stderr.contents();
        for (level, bytes) in [(LogLevel::Info, out), (LogLevel::Warn, err)] {
            if !bytes.is_empty() {
                self.log.push(level, &String::from_utf8_lossy(&bytes));
            }
        }
    }
}

impl log::Host for HostState {
    fn log(&mut self, level: LogLevel, message: String) {
        self.log.push(level, &message);
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let wasi = self
            .wasi
            .as_mut()
            .expect("wasi is linked only for policies granted deny-all wasi");
        WasiCtxView {
            ctx: &mut wasi.ctx,
            table: &mut wasi.table,
        }
    }
}

/// Caps each linear memory and table, and remembers whether it refused a growth so the
/// resulting trap is classified as out of memory.
pub(crate) struct Limiter {
    memory_bytes: usize,
    refused: bool,
}

impl Limiter {
    fn new(memory_bytes: usize) -> Self {
        Self {
            memory_bytes,
            refused: false,
        }
    }

    pub(crate) fn refused_growth(&self) -> bool {
        self.refused
    }

    fn refuse(&mut self, what: &str, desired: usize) -> wasmtime::Result<bool> {
        self.refused = true;
        Err(wasmtime::format_err!(
            "{what} growth to {desired} refused by the policy budget"
        ))
    }
}

const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            return self.refuse("memory", desired);
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.refused = true;
        Err(error)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return self.refuse("table", desired);
        }
        Ok(true)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.refused = true;
        Err(error)
    }

    fn instances(&self) -> usize {
        64
    }

    fn tables(&self) -> usize {
        64
    }

    fn memories(&self) -> usize {
        16
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What a `fmt` subscriber writes, shared with the test.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn emitted(log: &DecisionLog) -> Vec<String> {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || log.emit("cheap-first", Role::Pricing));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn guest_log_lines_reach_the_host_log_at_their_own_level_with_the_policy_name() {
        let mut log = DecisionLog::default();
        log.push(LogLevel::Debug, "looked at 3 offers");
        log.push(LogLevel::Info, "accept spot bid 0.30");
        log.push(LogLevel::Warn, "no on-demand reference price");
        let lines = emitted(&log);
        let expected = [
            ("DEBUG", "looked at 3 offers"),
            ("INFO", "accept spot bid 0.30"),
            ("WARN", "no on-demand reference price"),
        ];
        assert_eq!(lines.len(), 3, "{lines:?}");
        for (line, (level, message)) in lines.iter().zip(expected) {
            assert!(line.trim_start().starts_with(level), "{line}");
            assert!(line.contains(GUEST_LOG_TARGET), "{line}");
            assert!(line.contains(message), "{line}");
            assert!(line.contains("policy=cheap-first"), "{line}");
            assert!(line.contains("role=pricing"), "{line}");
        }
    }

    #[test]
    fn dropped_guest_log_lines_are_counted_in_a_warning() {
        let mut log = DecisionLog::default();
        for i in 0..MAX_LOG_MESSAGES + 2 {
            log.push(LogLevel::Debug, &format!("line {i}"));
        }
        let lines = emitted(&log);
        let last = lines.last().unwrap();
        assert!(last.trim_start().starts_with("WARN"), "{last}");
        assert!(last.contains("dropped=2"), "{last}");
    }
}
