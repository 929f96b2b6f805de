//! A small HTTP/1.1 client for the server tests (`mod http_client;`): one request per
//! connection (`Connection: close`), chunked bodies decoded, to servers on 127.0.0.1 only.
// Each test binary uses part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

/// A response: status, headers in order, body (de-chunked).
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{e}: status {} body {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The JSON body of a 200 (panics with the body otherwise).
    pub fn ok(&self) -> Value {
        assert_eq!(
            self.status,
            200,
            "{:?}",
            String::from_utf8_lossy(&self.body)
        );
        self.json()
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("UTF-8 body")
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn events(&self) -> Vec<String> {
        let text = self.text();
        assert!(text.ends_with("\n\n"), "{text:?}");
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not a data event: {e:?}"))
                    .to_string()
            })
            .collect()
    }
}

/// The bytes of a request with `Content-Length` and `Connection: close`.
pub fn raw_request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// A connection to `addr` whose reads give up after `wait`.
pub fn connect(addr: SocketAddr, wait: Duration) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(wait)).expect("timeout");
    s
}

/// Parses a whole response as read until the server closed the connection.
pub fn parse_response(raw: &[u8]) -> Resp {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = std::str::from_utf8(&raw[..split]).expect("ASCII head");
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        let mut body = vec![];
        loop {
            let eol = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("chunk size line");
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..eol]).expect("hex").trim(), 16)
                    .expect("chunk size");
            rest = &rest[eol + 2..];
            if size == 0 {
                break;
            }
            body.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
        body
    } else {
        rest.to_vec()
    };
    Resp {
        status,
        headers,
        body,
    }
}

/// One request on its own connection; reads the whole response (reads give up after `wait`).
pub fn call(
    addr: SocketAddr,
    wait: Duration,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = connect(addr, wait);
    s.write_all(&raw_request(method, path, headers, body))
        .expect("send");
    let mut raw = vec![];
    s.read_to_end(&mut raw).expect("read the response");
    parse_response(&raw)
}
