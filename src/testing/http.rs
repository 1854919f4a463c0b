//! `GET /health` and `GET /metrics` on a member's plain-HTTP metrics listener.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

/// Connect, read and write timeout of one request: short, because a paused member never
/// answers and callers poll again anyway.
const IO_TIMEOUT: Duration = Duration::from_millis(500);

/// A response: its status code and its body (invalid UTF-8 replaced).
pub(super) struct Response {
    pub(super) status: u16,
    pub(super) body: String,
}

/// One `GET http://{addr}{path}`; any status is a response, not an error.
pub(super) fn get(addr: SocketAddr, path: &str) -> io::Result<Response> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        // The listener is on loopback: a proxy from the environment could not reach it.
        .proxy(None)
        .http_status_as_error(false)
        // A restarted member reuses its port: a pooled connection would be to the old process.
        .max_idle_connections(0)
        .timeout_connect(Some(IO_TIMEOUT))
        .timeout_per_read(Some(IO_TIMEOUT))
        .timeout_per_write(Some(IO_TIMEOUT))
        .build()
        .into();
    let mut response = agent
        .get(format!("http://{addr}{path}"))
        .call()
        .map_err(ureq::Error::into_io)?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .read_to_vec()
        .map_err(ureq::Error::into_io)?;
    Ok(Response {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}
