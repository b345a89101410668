use std::time::Duration;

use futures::StreamExt;

use super::*;

fn record(line: &str, stream: LogStream) -> LogRecord {
    LogRecord {
        ts: Utc::now(),
        stream,
        line: line.to_string(),
    }
}

fn filled(lines: &[&str]) -> Arc<LogBuffer> {
    let log = Arc::new(LogBuffer::new(LogLimits::default()));
    for line in lines {
        log.append(record(line, LogStream::Stdout));
    }
    log
}

async fn text(log: &Arc<LogBuffer>, options: LogOptions) -> String {
    let chunks: Vec<Bytes> = log.read(options).collect().await;
    String::from_utf8(chunks.concat()).expect("utf-8")
}

#[tokio::test]
async fn read_returns_every_line_in_order() {
    let log = filled(&["a", "b", "c"]);
    assert_eq!(text(&log, LogOptions::default()).await, "a\nb\nc\n");
}

#[tokio::test]
async fn tail_lines_keeps_the_last_lines() {
    let log = filled(&["a", "b", "c"]);
    let options = LogOptions {
        tail_lines: Some(2),
        ..LogOptions::default()
    };
    assert_eq!(text(&log, options).await, "b\nc\n");
}

#[tokio::test]
async fn limit_bytes_cuts_the_output() {
    let log = filled(&["hello", "world"]);
    let options = LogOptions {
        limit_bytes: Some(8),
        ..LogOptions::default()
    };
    assert_eq!(text(&log, options).await, "hello\nwo");
}

#[tokio::test]
async fn since_seconds_drops_older_lines() {
    let log = Arc::new(LogBuffer::new(LogLimits::default()));
    let mut old = record("old", LogStream::Stdout);
    old.ts = Utc::now() - chrono::Duration::seconds(120);
    log.append(old);
    log.append(record("new", LogStream::Stderr));
    let options = LogOptions {
        since_seconds: Some(60),
        ..LogOptions::default()
    };
    assert_eq!(text(&log, options).await, "new\n");
}

#[tokio::test]
async fn a_since_before_any_time_keeps_every_line() {
    for since in [u64::MAX, i64::MAX as u64, 1 << 40] {
        let log = Arc::new(LogBuffer::new(LogLimits::default()));
        log.append(record("kept", LogStream::Stdout));
        let options = LogOptions {
            since_seconds: Some(since),
            ..LogOptions::default()
        };
        assert_eq!(text(&log, options).await, "kept\n", "{since}");
    }
}

#[tokio::test]
async fn timestamps_prefix_rfc3339_nanos_and_a_space() {
    let log = Arc::new(LogBuffer::new(LogLimits::default()));
    let mut line = record("x", LogStream::Stdout);
    line.ts = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.000000006Z")
        .expect("time")
        .with_timezone(&Utc);
    log.append(line);
    let options = LogOptions {
        timestamps: true,
        ..LogOptions::default()
    };
    assert_eq!(
        text(&log, options).await,
        "2026-01-02T03:04:05.000000006Z x\n"
    );
}

#[tokio::test]
async fn ring_drops_the_oldest_lines_beyond_its_limits() {
    let log = Arc::new(LogBuffer::new(LogLimits {
        max_bytes: 10,
        max_lines: 3,
    }));
    for line in ["1", "2", "3", "4"] {
        log.append(record(line, LogStream::Stdout));
    }
    assert_eq!(text(&log, LogOptions::default()).await, "2\n3\n4\n");
    log.append(record("0123456789", LogStream::Stdout));
    assert_eq!(text(&log, LogOptions::default()).await, "0123456789\n");
}

#[tokio::test]
async fn follow_streams_new_lines_until_closed() {
    let log = filled(&["before"]);
    let options = LogOptions {
        follow: true,
        ..LogOptions::default()
    };
    let mut stream = Box::pin(log.read(options));
    assert_eq!(stream.next().await, Some(Bytes::from("before\n")));
    let writer = log.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        writer.append(record("after", LogStream::Stderr));
        writer.close();
    });
    assert_eq!(stream.next().await, Some(Bytes::from("after\n")));
    assert_eq!(stream.next().await, None);
}

#[tokio::test]
async fn follow_with_tail_starts_from_the_tail() {
    let log = filled(&["a", "b", "c"]);
    log.close();
    let options = LogOptions {
        follow: true,
        tail_lines: Some(1),
        ..LogOptions::default()
    };
    assert_eq!(text(&log, options).await, "c\n");
}
