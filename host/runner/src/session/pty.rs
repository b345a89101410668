//! A pseudo-terminal for `kubectl exec -t`: the runner keeps its controlling end (non-blocking,
//! read and written through tokio), the command gets the other as its stdio and controlling
//! terminal. The only `unsafe` code of the runner is here: giving a child its controlling
//! terminal between fork and exec, setting the window size, and (since tokio 1.54) watching a
//! descriptor have no safe API.
//!
//! Not the session's frames: see [`super::exec`].

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use tokio::io::unix::AsyncFd;

use neocloud_protocol::session::TerminalSize;

/// The runner's end of a pseudo-terminal.
#[derive(Debug)]
pub(super) struct Pty {
    master: AsyncFd<OwnedFd>,
}

impl Pty {
    /// A new pseudo-terminal: the runner's end, and the end for the command.
    pub(super) fn open() -> io::Result<(Self, OwnedFd)> {
        let pair = nix::pty::openpty(None, None)?;
        let flags = OFlag::from_bits_truncate(fcntl(&pair.master, FcntlArg::F_GETFL)?);
        fcntl(&pair.master, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
        let master = register(pair.master)?;
        Ok((Self { master }, pair.slave))
    }

    /// Reads what the command wrote; 0 once every copy of its end is closed (Linux says EIO).
    pub(super) async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.master.readable().await?;
            let read =
                ready.try_io(|fd| nix::unistd::read(fd.get_ref(), buf).map_err(io::Error::from));
            match read {
                Ok(Err(e)) if e.raw_os_error() == Some(nix::libc::EIO) => return Ok(0),
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes all of `bytes` as typed input.
    pub(super) async fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let mut ready = self.master.writable().await?;
            let written =
                ready.try_io(|fd| nix::unistd::write(fd.get_ref(), bytes).map_err(io::Error::from));
            match written {
                Ok(Ok(n)) => bytes = &bytes[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Sets the window size (the command gets `SIGWINCH`).
    #[allow(unsafe_code)]
    pub(super) fn resize(&self, size: TerminalSize) -> io::Result<()> {
        let winsize = nix::libc::winsize {
            ws_row: size.height,
            ws_col: size.width,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let fd = self.master.get_ref().as_raw_fd();
        // SAFETY: `fd` is open for as long as `self`, and TIOCSWINSZ only reads the `winsize`
        // it is given, which lives across the call.
        let done = unsafe { nix::libc::ioctl(fd, nix::libc::TIOCSWINSZ, &winsize) };
        if done == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Watches `fd` with tokio's reactor.
#[allow(unsafe_code)]
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is open until it is dropped, which the `AsyncFd` owning it does last,
    // and its `as_raw_fd` is always the same descriptor.
    let registered = unsafe { AsyncFd::register(fd) };
    registered.map_err(io::Error::from)
}

/// Makes the command a session leader whose controlling terminal is its stdin (the terminal's
/// end it is given), as a login shell has.
#[allow(unsafe_code)]
pub(super) fn make_controlling_terminal(command: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it makes two system calls (setsid, ioctl) and
    // allocates nothing (errors are raw OS errors).
    unsafe {
        command.pre_exec(|| {
            if nix::libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
