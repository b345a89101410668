//! A TCP forwarder on the host's end of a worker node's veth pair to a server on loopback: how
//! the node's kubelet and Pods reach the API server (which listens on loopback only), and any
//! server a test exposes to them.
//!
//! Not the node's network itself (the veth pair, the bridge: the parent module).

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::Error;

/// A TCP forwarder from the host's end of the veth pair to a server on loopback (the API
/// server, or one a test exposes to the node's Pods).
#[derive(Debug)]
pub(super) struct Forwarder {
    pub(super) port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Forwarder {
    pub(super) fn start(listen: Ipv4Addr, target: u16) -> Result<Forwarder, Error> {
        let listener = TcpListener::bind((listen, 0))
            .map_err(|e| Error::io(format!("listen on {listen} for the worker node"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("make the forwarder's listener non-blocking", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::io("read the forwarder's port", e))?
            .port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("worker-forwarder".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((inbound, _)) => {
                            let _ = inbound.set_nonblocking(false);
                            if let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) {
                                pipe(inbound, outbound);
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
            })
            .map_err(|e| Error::io("start the forwarder", e))?;
        Ok(Forwarder {
            port,
            stop,
            thread: Some(thread),
        })
    }
}

/// Copies both ways until either side closes.
fn pipe(a: TcpStream, b: TcpStream) {
    let copy = |mut from: TcpStream, mut to: TcpStream| {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Write);
        });
    };
    if let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) {
        copy(a, b2);
        copy(b, a2);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
