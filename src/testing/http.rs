//! `GET /health` and `GET /metrics` on a member's plain-HTTP metrics listener.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Connect, read and write timeout of one request: short, because a paused member never
/// answers and callers poll again anyway.
const IO_TIMEOUT: Duration = Duration::from_millis(500);

/// A response: its status code and its body (invalid UTF-8 replaced).
pub(super) struct Response {
    pub(super) status: u16,
    pub(super) body: String,
}

/// A raw HTTP/1.1 `GET` with short timeouts, read until the server closes the connection.
/// Returns the status code and the (de-chunked) body.
pub(super) fn get(addr: SocketAddr, path: &str) -> io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;

    let invalid = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("invalid HTTP response to GET http://{addr}{path}: {what}"),
        )
    };
    let header_end = find(&response, b"\r\n\r\n").ok_or_else(|| invalid("no end of headers"))?;
    let (head, body) = response.split_at(header_end);
    let body = body.get(4..).unwrap_or_default();
    let head = std::str::from_utf8(head).map_err(|_| invalid("headers are not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|status_line| status_line.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| invalid("bad status line"))?;
    let chunked = lines.any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        decode_chunked(body).ok_or_else(|| invalid("bad chunked body"))?
    } else {
        body.to_vec()
    };
    Ok(Response {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Decodes a `Transfer-Encoding: chunked` body (trailers are ignored).
fn decode_chunked(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = find(rest, b"\r\n")?;
        let (size_line, after) = rest.split_at(line_end);
        let size_line = std::str::from_utf8(size_line).ok()?;
        let size_hex = size_line.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        rest = after.get(2..)?;
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size..)?.strip_prefix(b"\r\n")?;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}
