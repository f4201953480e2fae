//! The durable queue: Redis keys, the Lua scripts of every move, and the producer side.

pub mod settings;

pub use settings::ClaimSettings;
