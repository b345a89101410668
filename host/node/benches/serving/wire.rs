//! The backend server and the load client of the serving benchmark, one tiny protocol for all
//! three paths. A connection's first byte says what it wants:
//!
//! - `E`: echo. Then every 1 KiB the client writes is written back (a request/response round
//!   trip on a persistent connection).
//! - `S` and a little-endian `u64`: a stream of that many bytes from the server, then its end.
//! - `V` and a count: that many SSE-like events (`data: event N\n\n`), written 1 s apart, the
//!   first at once.
//!
//! Not a general load tool: no TLS, no HTTP; just enough to compare the same bytes on three
//! paths.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The size of one request and of its response.
pub const MESSAGE: usize = 1024;

/// How long a connection may take to answer its first round trip (a relayed connection opens a
/// session to the runner first).
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves the protocol on `address` until killed.
pub async fn serve(address: SocketAddr) {
    let listener = TcpListener::bind(address).await.unwrap();
    eprintln!("serving on {address}");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let _ = answer(stream).await;
        });
    }
}

async fn answer(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    match stream.read_u8().await? {
        b'E' => {
            let mut buf = [0u8; MESSAGE];
            loop {
                stream.read_exact(&mut buf).await?;
                stream.write_all(&buf).await?;
            }
        }
        b'S' => {
            let mut left = stream.read_u64_le().await?;
            let chunk = vec![0x5au8; 256 * 1024];
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                stream.write_all(&chunk[..n]).await?;
                left -= n as u64;
            }
            stream.shutdown().await
        }
        b'V' => {
            let count = stream.read_u8().await?;
            for i in 0..count {
                if i > 0 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                stream
                    .write_all(format!("data: event {i}\n\n").as_bytes())
                    .await?;
            }
            stream.shutdown().await
        }
        _ => Ok(()),
    }
}

/// One persistent echo connection, after its first round trip.
async fn open_echo(address: SocketAddr) -> Option<TcpStream> {
    let open = async {
        let mut stream = TcpStream::connect(address).await.ok()?;
        stream.set_nodelay(true).ok()?;
        stream.write_u8(b'E').await.ok()?;
        round_trip(&mut stream).await.ok()?;
        Some(stream)
    };
    tokio::time::timeout(OPEN_TIMEOUT, open)
        .await
        .ok()
        .flatten()
}

async fn round_trip(stream: &mut TcpStream) -> std::io::Result<Duration> {
    let mut buf = [0x61u8; MESSAGE];
    let start = Instant::now();
    stream.write_all(&buf).await?;
    stream.read_exact(&mut buf).await?;
    Ok(start.elapsed())
}

/// Waits up to `seconds` for the server to answer one round trip at `address`.
pub async fn wait_until_served(address: SocketAddr, seconds: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        if open_echo(address).await.is_some() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    false
}

/// `connections` persistent connections, each doing round trips back to back for `seconds`
/// after a second of warm-up. Prints `latency c=.. open=.. n=.. p50_us=.. p99_us=.. errors=..`:
/// `open` is how many of the connections could be opened, `errors` how many broke meanwhile.
pub async fn latency(address: SocketAddr, connections: usize, seconds: f64) {
    let opened = futures::future::join_all((0..connections).map(|_| open_echo(address))).await;
    let streams: Vec<TcpStream> = opened.into_iter().flatten().collect();
    let open = streams.len();
    let warm = Instant::now() + Duration::from_secs(1);
    let end = warm + Duration::from_secs_f64(seconds);
    let errors = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks = streams.into_iter().map(|mut stream| {
        let errors = Arc::clone(&errors);
        tokio::spawn(async move {
            let mut samples = Vec::with_capacity(4096);
            while Instant::now() < end {
                match round_trip(&mut stream).await {
                    Ok(took) if Instant::now() > warm => samples.push(took),
                    Ok(_) => {}
                    Err(_) => {
                        errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        break;
                    }
                }
            }
            samples
        })
    });
    let mut all: Vec<Duration> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .flat_map(Result::unwrap)
        .collect();
    all.sort();
    let us = |p: f64| percentile(&all, p).as_micros();
    println!(
        "latency c={connections} open={open} n={} p50_us={} p99_us={} errors={}",
        all.len(),
        us(50.0),
        us(99.0),
        errors.load(std::sync::atomic::Ordering::Relaxed)
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One stream of `bytes` from the server. Prints `stream bytes=.. seconds=..`.
pub async fn stream(address: SocketAddr, bytes: u64) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let start = Instant::now();
    stream.write_u8(b'S').await.unwrap();
    stream.write_u64_le(bytes).await.unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let seconds = start.elapsed().as_secs_f64();
    println!("stream bytes={got} seconds={seconds:.3}");
}

/// Three events written 1 s apart. Prints `events first_ms=.. last_ms=.. count=..`: when the
/// first event's bytes and the last's arrived, counted from the request.
pub async fn events(address: SocketAddr) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let start = Instant::now();
    stream.write_all(&[b'V', 3]).await.unwrap();
    let mut buf = [0u8; 1024];
    let mut text = String::new();
    let mut first = None;
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        first.get_or_insert_with(|| start.elapsed());
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let last = start.elapsed();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "events first_ms={:.1} last_ms={:.1} count={}",
        ms(first.unwrap_or(last)),
        ms(last),
        text.matches("data: ").count()
    );
}
