//! Where the health and metrics servers listen. A port on the unspecified IPv6 address (`[::]`)
//! is opened for IPv6 and IPv4 alike, as Go's `:8081` is, so probes and scrapes reach it on
//! IPv6-only clusters too; on a host without IPv6 it falls back to every IPv4 address. Any other
//! address is bound as given.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;

/// Listens on `addr` (see the module comment for `[::]`).
pub async fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    if !(addr.is_ipv6() && addr.ip().is_unspecified()) {
        return TcpListener::bind(addr).await;
    }
    let any_v4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()));
    // A kernel without IPv6 refuses the socket itself: every IPv4 address instead.
    let Ok(socket) = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP)) else {
        return TcpListener::bind(any_v4).await;
    };
    socket.set_only_v6(false)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    match socket.bind(&addr.into()) {
        Ok(()) => {}
        // IPv6 present but without an address to listen on (disabled on every interface).
        Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
            return TcpListener::bind(any_v4).await
        }
        Err(e) => return Err(e),
    }
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv6Addr, TcpStream};

    use super::*;

    /// `[::]` answers on IPv4 and IPv6 loopback alike (this machine has both); a given address
    /// is bound as it is.
    #[tokio::test]
    async fn the_unspecified_v6_address_takes_both_families() {
        let listener = listen(SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let accept = tokio::spawn(async move {
            for _ in 0..2 {
                listener.accept().await.unwrap();
            }
        });
        for host in ["127.0.0.1", "[::1]"] {
            let addr: SocketAddr = format!("{host}:{port}").parse().unwrap();
            tokio::task::spawn_blocking(move || TcpStream::connect(addr))
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("{addr}: {e}"));
        }
        accept.await.unwrap();

        let v4 = listen(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .unwrap();
        assert_eq!(v4.local_addr().unwrap().ip(), Ipv4Addr::LOCALHOST);
    }
}
