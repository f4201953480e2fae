//! The front door's Lua moves, loaded from `lua/front/*.lua` at compile time (each file's
//! opening comment states its KEYS, ARGV, answer and the move it makes), run by `EVALSHA` with
//! a load and retry on `NOSCRIPT`, as the Batch API's are.

use std::sync::LazyLock;

use inferq_client::scripts::Script;

macro_rules! lua {
    ($name:literal) => {
        include_str!(concat!("../lua/front/", $name, ".lua"))
    };
}

/// Every script of the front door.
pub struct Scripts {
    pub create: Script,
    pub forget: Script,
    pub collect: Script,
    pub cancel: Script,
}

pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    create: Script::new("frontCreate", &[], lua!("create")),
    forget: Script::new("frontForget", &[], lua!("forget")),
    collect: Script::new("frontCollect", &[], lua!("collect")),
    cancel: Script::new("frontCancel", &[], lua!("cancel")),
});
