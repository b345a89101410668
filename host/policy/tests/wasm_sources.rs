//! Policy sources: a file, bytes, or an HTTP URL that must carry a sha256; a digest mismatch
//! refuses to load. The URL is served by a one-file HTTP server on 127.0.0.1.

mod wasm_support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

use neocloud_policy::wasm::{MAX_COMPONENT_BYTES, PolicySource, WasmError, sha256_hex};
use wasm_support::{engine, guest, settings};

/// Serves `body` to every GET on a fresh loopback port; returns the base URL.
fn serve(body: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/placement.wasm", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: application/wasm\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    url
}

fn placement_bytes() -> Vec<u8> {
    std::fs::read(guest("placement-c")).unwrap()
}

#[test]
fn url_with_the_right_sha256_loads() {
    let bytes = placement_bytes();
    let digest = sha256_hex(&bytes);
    let source = PolicySource::Url {
        url: serve(bytes),
        sha256: digest.to_uppercase(),
    };
    let policy = engine().load(&source, settings("url")).unwrap();
    assert_eq!(policy.info().digest, digest);
}

#[test]
fn url_with_a_wrong_sha256_is_refused() {
    let source = PolicySource::Url {
        url: serve(placement_bytes()),
        sha256: "0".repeat(64),
    };
    let error = engine().load(&source, settings("url")).unwrap_err();
    let WasmError::DigestMismatch {
        expected, actual, ..
    } = &error
    else {
        panic!("expected a digest mismatch, got {error}")
    };
    assert_eq!(expected, &"0".repeat(64));
    assert_eq!(actual, &sha256_hex(&placement_bytes()));
    assert!(
        error
            .to_string()
            .starts_with("refused policy from http://127.0.0.1:")
    );
}

#[test]
fn url_without_a_sha256_is_refused_before_fetching() {
    let source = PolicySource::Url {
        url: "http://127.0.0.1:9/never-fetched.wasm".into(),
        sha256: String::new(),
    };
    let error = engine().load(&source, settings("url")).unwrap_err();
    assert!(matches!(error, WasmError::MissingDigest { .. }), "{error}");
}

#[test]
fn file_with_a_pinned_wrong_sha256_is_refused() {
    let source = PolicySource::File {
        path: guest("placement-c"),
        sha256: Some("ab".repeat(32)),
    };
    let error = engine().load(&source, settings("file")).unwrap_err();
    assert!(matches!(error, WasmError::DigestMismatch { .. }), "{error}");
}

#[test]
fn bytes_that_are_not_wasm_are_refused_with_their_digest_and_first_bytes() {
    let bytes = b"not wasm at all".to_vec();
    let digest = sha256_hex(&bytes);
    let error = engine()
        .load(
            &PolicySource::bytes("configmap default/broken", bytes),
            settings("b"),
        )
        .unwrap_err();
    let WasmError::NotWasm {
        digest: got, start, ..
    } = &error
    else {
        panic!("expected a not-Wasm refusal, got {error}")
    };
    assert_eq!(got, &digest);
    // "not " in hex: what the file begins with, so a text file or an HTML error page shows.
    assert_eq!(start, "6e6f7420");
}

#[test]
fn wasm_that_is_not_a_component_fails_to_compile_with_its_digest() {
    // The Wasm magic and a version no engine knows: past the magic check, refused by the
    // compiler.
    let bytes = b"\0asm\x0d\0\x01\0 and then nothing valid".to_vec();
    let digest = sha256_hex(&bytes);
    let error = engine()
        .load(
            &PolicySource::bytes("configmap default/broken", bytes),
            settings("b"),
        )
        .unwrap_err();
    let WasmError::Compile { digest: got, .. } = &error else {
        panic!("expected a compile error, got {error}")
    };
    assert_eq!(got, &digest);
}

#[test]
fn missing_file_is_an_error_naming_the_path() {
    let error = engine()
        .load(
            &PolicySource::file("/nonexistent/policy.wasm"),
            settings("f"),
        )
        .unwrap_err();
    assert!(
        error.to_string().contains("/nonexistent/policy.wasm"),
        "{error}"
    );
}

#[test]
fn bytes_larger_than_the_cap_are_refused_before_compiling() {
    let bytes = vec![0u8; MAX_COMPONENT_BYTES as usize + 1];
    let error = engine()
        .load(
            &PolicySource::bytes("configmap default/huge", bytes),
            settings("b"),
        )
        .unwrap_err();
    assert!(matches!(error, WasmError::TooLarge { .. }), "{error}");
    assert_eq!(error.label(), "too-large");
}

#[test]
fn a_path_to_an_endless_file_is_refused_with_the_limit_not_read_whole() {
    let error = engine()
        .load(&PolicySource::file("/dev/zero"), settings("z"))
        .unwrap_err();
    assert!(matches!(error, WasmError::TooLarge { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("/dev/zero") && message.contains(&MAX_COMPONENT_BYTES.to_string()),
        "{message}"
    );
}
