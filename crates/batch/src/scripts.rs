//! The Batch API's Lua moves, loaded from `lua/*.lua` at compile time (each file's opening
//! comment states its KEYS, ARGV, answer and the move it makes), run by `EVALSHA` with a load
//! and retry on `NOSCRIPT`, as the queue's scripts are.

use std::sync::LazyLock;

use inferq_client::scripts::Script;

macro_rules! lua {
    ($name:literal) => {
        include_str!(concat!("lua/", $name, ".lua"))
    };
}

const MOVE: &str = lua!("includes/move");
const ENDED: &str = lua!("includes/ended");

/// Every script of the Batch API.
pub struct Scripts {
    pub create: Script,
    pub begin: Script,
    pub advance: Script,
    pub collect: Script,
    pub cancel: Script,
    pub seal: Script,
    pub finish: Script,
    pub lease: Script,
    pub ingest: Script,
    pub sweep: Script,
}

pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    create: Script::new("batchCreate", &[], lua!("create")),
    begin: Script::new("batchBegin", &[MOVE, ENDED], lua!("begin")),
    advance: Script::new("batchAdvance", &[], lua!("advance")),
    collect: Script::new("batchCollect", &[MOVE], lua!("collect")),
    cancel: Script::new("batchCancel", &[MOVE], lua!("cancel")),
    seal: Script::new("batchSeal", &[], lua!("seal")),
    finish: Script::new("batchFinish", &[MOVE, ENDED], lua!("finish")),
    lease: Script::new("batchLease", &[], lua!("lease")),
    ingest: Script::new("batchIngest", &[], lua!("ingest")),
    sweep: Script::new("batchSweep", &[], lua!("sweep")),
});
