//! Opening Redis connections: a self-healing multiplexed connection for the moves, and a
//! separate connection without a response timeout for blocking pops (`BRPOP`, `BLMOVE`).

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, RedisResult};

/// How long one command may take before it counts as failed (the caller retries).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);

/// A multiplexed connection that reconnects by itself after Redis restarts or blips.
pub async fn manager(client: &Client) -> RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(1));
    client.get_connection_manager_with_config(config).await
}

/// A connection for blocking commands: no response timeout (the command's own timeout rules).
pub async fn blocking(client: &Client) -> RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(2)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}
