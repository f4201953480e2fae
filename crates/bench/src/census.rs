//! A command census: which Redis commands the processor sends itself (top level, one each a
//! client round trip or pipeline slot) and which run inside its Lua scripts. INFO commandstats
//! counts both alike, so a small extra drain runs with `MONITOR` attached, whose lines mark
//! commands run by a script with `[0 lua]`. MONITOR slows Redis, so this drain's time is not
//! reported. In: the gateway and N; out: a [`Census`] of commands per request, both kinds.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::load::{preload, wait_for_results};
use super::procs::{Gateway, Processor};
use super::{BenchError, Ctx};
use inferq_client::producer::Producer;

/// Commands per request, split by who ran them.
#[derive(Debug, Clone, Serialize)]
pub struct Census {
    pub requests: u64,
    /// Sent by the processor (scripts' EVALSHA included, their insides not).
    pub top_level_per_request: f64,
    /// Run inside Lua scripts.
    pub inside_scripts_per_request: f64,
    pub top_level_by_command: BTreeMap<String, u64>,
}

/// One MONITOR line: whether a script ran it, and the command name (lower case).
fn parse_monitor_line(line: &str) -> Option<(bool, String)> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let source = &line[open + 1..close];
    let rest = line[close + 1..].trim_start();
    let name = rest
        .strip_prefix('"')?
        .split('"')
        .next()?
        .to_ascii_lowercase();
    Some((source.ends_with(" lua"), name))
}

/// The `addr=` of a connection, from `CLIENT INFO`.
async fn client_addr(con: &mut redis::aio::MultiplexedConnection) -> Result<String, BenchError> {
    let info: String = redis::cmd("CLIENT").arg("INFO").query_async(con).await?;
    info.split_whitespace()
        .find_map(|f| f.strip_prefix("addr="))
        .map(str::to_owned)
        .ok_or_else(|| BenchError::Phase("CLIENT INFO has no addr".into()))
}

/// The lines of a `MONITOR` of the Redis on `port` (on a connection of its own).
pub(crate) async fn monitor(
    port: u16,
) -> Result<tokio::io::Lines<BufReader<TcpStream>>, BenchError> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| BenchError::setup("cannot connect for MONITOR", e))?;
    stream
        .write_all(b"MONITOR\r\n")
        .await
        .map_err(|e| BenchError::setup("cannot send MONITOR", e))?;
    Ok(BufReader::new(stream).lines())
}

pub(crate) async fn run(ctx: &mut Ctx, gateway: &Gateway, n: u64) -> Result<Census, BenchError> {
    ctx.flush().await?;
    let tag = "census";
    let spec = ctx.spec(&gateway.base_url(), tag);
    let producer = Producer::connect(&ctx.redis_url, &spec.queue, &spec.results).await?;
    preload(&producer, tag, n).await?;
    drop(producer);

    // The census's own LLEN polls come from this connection; its address is left out.
    let mut poller = redis::Client::open(ctx.redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let own_addr = client_addr(&mut poller).await?;

    let mut lines = monitor(ctx.redis_port).await?;
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::spawn(async move {
        let mut top = BTreeMap::<String, u64>::new();
        let mut inside = 0u64;
        loop {
            tokio::select! {
                biased;
                line = lines.next_line() => match line {
                    Ok(Some(line)) => {
                        if line.contains(&own_addr) {
                            continue;
                        }
                        if let Some((by_script, name)) = parse_monitor_line(&line) {
                            if by_script {
                                inside += 1;
                            } else {
                                *top.entry(name).or_default() += 1;
                            }
                        }
                    }
                    _ => break,
                },
                _ = &mut stop_rx => break,
            }
        }
        (top, inside)
    });

    let (mut processor, _) = Processor::spawn(&spec, &ctx.dir)?;
    let watched = wait_for_results(
        &mut poller,
        &spec.results,
        n,
        Duration::from_secs(120),
        || processor.check_alive(),
    )
    .await;
    processor.kill9();
    watched?;
    // Let MONITOR's last lines arrive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = stop_tx.send(());
    let (top, inside) = reader
        .await
        .map_err(|e| BenchError::Phase(format!("the MONITOR reader failed: {e}")))?;
    let total_top: u64 = top.values().sum();
    Ok(Census {
        requests: n,
        top_level_per_request: total_top as f64 / n as f64,
        inside_scripts_per_request: inside as f64 / n as f64,
        top_level_by_command: top,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_lines_tell_scripts_from_clients() {
        assert_eq!(
            parse_monitor_line(r#"1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "abc" "1""#),
            Some((false, "evalsha".to_owned()))
        );
        assert_eq!(
            parse_monitor_line(r#"1700000000.123457 [0 lua] "hset" "k" "f" "v""#),
            Some((true, "hset".to_owned()))
        );
        assert_eq!(parse_monitor_line("OK"), None);
    }
}
