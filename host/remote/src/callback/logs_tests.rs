use std::time::Duration;

use futures::StreamExt;

use super::*;

fn record(line: &str, stream: LogStream) -> LogRecord {
    LogRecord {
        ts: Utc::now(),
        stream,
        line: line.to_string(),
        run: 0,
    }
}

fn of_run(line: &str, run: u32) -> LogRecord {
    LogRecord {
        run,
        ..record(line, LogStream::Stdout)
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
    let chunks: Vec<Bytes> = log.read(options).expect("a run").collect().await;
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
    let mut stream = Box::pin(log.read(options).expect("a run"));
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

/// `body` as one chunk.
fn one_chunk(body: Vec<u8>) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Unpin {
    futures::stream::iter([Ok(Bytes::from(body))])
}

#[tokio::test]
async fn a_chunk_of_a_million_newlines_is_ingested_in_linear_work() {
    let mut body = vec![b'\n'; 1_000_000];
    body.extend_from_slice(br#"{"ts":"2026-01-01T00:00:00Z","stream":"stdout","line":"last"}"#);
    let mut got = Vec::new();
    let ingesting = ingest(one_chunk(body), MAX_LOG_RECORD, |record| {
        got.push(record.line);
        Ok(())
    });
    // Linear work takes well under a second, even unoptimised on a loaded machine; removing
    // lines from the front of the buffer one at a time moves about 5e11 bytes (half a minute
    // or more). The loop never yields, so the time is measured rather than raced.
    let started = std::time::Instant::now();
    let accepted = ingesting.await.expect("ingested");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "a million blank lines took {took:?}"
    );
    assert_eq!((accepted, got), (1, vec!["last".to_owned()]));
}

#[tokio::test]
async fn an_over_long_line_is_refused_after_reading_no_more_than_the_limit_and_a_chunk() {
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    let pulled = std::sync::atomic::AtomicUsize::new(0);
    let endless = futures::stream::repeat_with(|| {
        pulled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok::<_, std::io::Error>(chunk.clone())
    });
    let first =
        Bytes::from("{\"ts\":\"2026-01-01T00:00:00Z\",\"stream\":\"stderr\",\"line\":\"ok\"}\n");
    let body = futures::stream::iter([Ok(first)]).chain(endless);
    let mut appended = 0;
    let err = ingest(Box::pin(body), 100_000, |_| {
        appended += 1;
        Ok(())
    })
    .await
    .expect_err("an endless line");
    assert_eq!(err.to_string(), "log record 2 is longer than 100000 bytes");
    assert_eq!(appended, 1, "the record before it is kept");
    let pulled = pulled.load(std::sync::atomic::Ordering::SeqCst);
    assert!(pulled <= 100_000 / (64 * 1024) + 2, "read {pulled} chunks");
}

#[tokio::test]
async fn records_that_are_not_json_or_utf8_are_refused_by_number() {
    let ok = r#"{"ts":"2026-01-01T00:00:00Z","stream":"stdout","line":"a"}"#;
    let body = format!("{ok}\n\n{ok}\nnot json\n").into_bytes();
    let err = ingest(one_chunk(body), 1024, |_| Ok(()))
        .await
        .expect_err("bad");
    assert!(
        err.to_string().starts_with("log record 3 is not valid:"),
        "{err}"
    );
    let err =
        (ingest(one_chunk(b"\xff\xfe\n".to_vec()), 1024, |_| Ok(())).await).expect_err("not utf-8");
    assert!(
        err.to_string()
            .starts_with("log record 1 is not valid: it is not UTF-8"),
        "{err}"
    );
    let err = (ingest(one_chunk(format!("{ok}\n").into_bytes()), 1024, |_| {
        Err("binding uid-a is not registered".into())
    })
    .await)
        .expect_err("refused");
    assert_eq!(err.to_string(), "binding uid-a is not registered");
}

const PREVIOUS: LogOptions = LogOptions {
    follow: false,
    tail_lines: None,
    limit_bytes: None,
    since_seconds: None,
    timestamps: false,
    previous: true,
};

#[tokio::test]
async fn a_log_without_a_restart_has_no_previous_run() {
    let log = filled(&["a"]);
    assert!(log.read(PREVIOUS).is_none());
}

#[tokio::test]
async fn the_previous_run_is_the_one_that_ended_and_the_current_one_the_restart() {
    let log = Arc::new(LogBuffer::new(LogLimits::default()));
    log.append(of_run("first", 0));
    log.end_run(0);
    // Backing off: like a kubelet, both the current and the previous log are the ended run.
    assert_eq!(text(&log, PREVIOUS).await, "first\n");
    assert_eq!(text(&log, LogOptions::default()).await, "first\n");
    log.start_run(1);
    assert_eq!(text(&log, LogOptions::default()).await, "");
    log.append(of_run("second", 1));
    // A late line of the ended run still goes to that run.
    log.append(of_run("first, late", 0));
    assert_eq!(text(&log, PREVIOUS).await, "first\nfirst, late\n");
    assert_eq!(text(&log, LogOptions::default()).await, "second\n");
    // A record of a later run moves the log on without a report.
    log.append(of_run("third", 2));
    assert_eq!(text(&log, PREVIOUS).await, "second\n");
    assert_eq!(text(&log, LogOptions::default()).await, "third\n");
}

#[tokio::test]
async fn following_a_run_ends_when_it_ends() {
    let log = Arc::new(LogBuffer::new(LogLimits::default()));
    log.append(of_run("one", 0));
    let options = LogOptions {
        follow: true,
        ..LogOptions::default()
    };
    let mut stream = Box::pin(log.read(options).expect("a run"));
    assert_eq!(stream.next().await, Some(Bytes::from("one\n")));
    let writer = log.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        writer.append(of_run("two", 0));
        writer.end_run(0);
        writer.append(of_run("next run", 1));
    });
    assert_eq!(stream.next().await, Some(Bytes::from("two\n")));
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
    assert_eq!(end.expect("the follow ends"), None);
}
