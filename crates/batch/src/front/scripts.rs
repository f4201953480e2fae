//! The front door's Lua moves, `lua/front/<move>-<KEYS>.lua`, loaded at compile time with the
//! Batch API's conventions and fragments (see [`crate::scripts`]).

use std::sync::LazyLock;

use inferq_client::scripts::Script;

crate::scripts::scripts!("lua/front/", "Every script of the front door.", Scripts, SCRIPTS, FILES {
    create: "frontCreate" => "create-2",
    forget: "frontForget" => "forget-2",
    collect: "frontCollect" => "collect-1",
    cancel: "frontCancel" => "cancel-2",
});
