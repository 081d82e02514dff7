//! The gateway's HTTP request counter and in-flight gauge follow real requests to its OpenAI
//! endpoint (a binary of its own: the worker's process-wide counters of
//! `tests/metrics.rs` must see only that test's requests).

mod common;

use common::{http_get, http_post, model_path, sample, start, start_http};

/// How much `series` grew from `before` to `after`. A series missing after is a failure;
/// before, a counter not yet touched is not rendered and counts 0.
fn increase(who: &str, before: &str, after: &str, series: &str) -> f64 {
    let now = sample(after, series).unwrap_or_else(|| panic!("{who} /metrics has no series {series}:\n{after}"));
    now - sample(before, series).unwrap_or(0.0)
}

/// Each answered HTTP request increments `gateway_http_requests_total{route, status}`; the
/// in-flight gauge counts a server-sent event stream until its body ends, then returns to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_are_counted_by_route_and_status() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut servers = start(model_path()).await;
    let http = start_http(&mut servers).await;
    let chat = r#"gateway_http_requests_total{route="/v1/chat/completions",status="200"}"#;
    let other = r#"gateway_http_requests_total{route="other",status="404"}"#;
    let in_flight = r#"gateway_http_requests_in_flight{route="/v1/chat/completions"}"#;
    let (_, before) = http_get(&http, "/metrics").await;

    let body = r#"{"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}"#;
    let (status, text) = http_post(&http, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(http_get(&http, "/no-such-path").await.0, 404);
    let (_, after) = http_get(&http, "/metrics").await;
    assert_eq!(increase("gateway", &before, &after, chat), 1.0, "{after}");
    assert_eq!(increase("gateway", &before, &after, other), 1.0, "{after}");
    assert_eq!(sample(&after, in_flight), Some(0.0), "{after}");
    // The scrape itself is in flight while /metrics renders.
    assert!(sample(&after, r#"gateway_http_requests_in_flight{route="/metrics"}"#).unwrap_or_else(|| panic!("no /metrics in-flight series:\n{after}")) >= 1.0);

    // A stream: in flight from its head to its last event.
    let body = r#"{"messages": [{"role": "user", "content": "Count to twenty."}], "max_tokens": 24, "stream": true}"#;
    let mut s = tokio::net::TcpStream::connect(&http).await.unwrap();
    let head = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("data: ") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "the stream ended before its first event");
        got.extend_from_slice(&buf[..n]);
    }
    let (_, during) = http_get(&http, "/metrics").await;
    let done = String::from_utf8_lossy(&got).contains("[DONE]");
    if !done {
        assert_eq!(sample(&during, in_flight), Some(1.0), "{during}");
    }
    s.read_to_end(&mut got).await.unwrap();
    assert!(String::from_utf8_lossy(&got).contains("[DONE]"));
    // The server drops the body (and the guard) as it finishes writing; wait for it.
    let mut last = None;
    for _ in 0..50 {
        let (_, now) = http_get(&http, "/metrics").await;
        last = sample(&now, in_flight);
        if last == Some(0.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(last, Some(0.0), "the in-flight gauge returns to 0 after the stream");
    let (_, end) = http_get(&http, "/metrics").await;
    assert_eq!(increase("gateway", &before, &end, chat), 2.0, "{end}");
}
