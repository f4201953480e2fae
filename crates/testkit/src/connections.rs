//! Raw TCP clients of an HTTP listener, for the tests of its bounds: [`slot_taken`] opens a
//! connection known to hold one of the listener's slots (its request was answered), so a test
//! that fills the bound asserts on the next connection without racing the listener's accepts
//! or the release of slots freed a moment before.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A connection to `addr` whose request for a path nobody serves was answered `404`, kept open
/// (HTTP/1.1 keep-alive). A connection answered otherwise (a `503` refusal while a slot is still
/// being freed) is retried for up to 10 s, then this fails with what came back.
pub async fn slot_taken(addr: &str) -> std::io::Result<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut conn = TcpStream::connect(addr).await?;
        conn.write_all(b"GET /no-such-path HTTP/1.1\r\nHost: x\r\n\r\n")
            .await?;
        let mut status = [0u8; 12];
        let read = tokio::time::timeout(Duration::from_secs(3), conn.read_exact(&mut status)).await;
        if matches!(read, Ok(Ok(_))) && &status == b"HTTP/1.1 404" {
            return Ok(conn);
        }
        if Instant::now() >= deadline {
            return Err(std::io::Error::other(format!(
                "{addr}: no slot for 10 s (last answer began {:?})",
                String::from_utf8_lossy(&status)
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
