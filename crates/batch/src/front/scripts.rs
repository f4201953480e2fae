//! The front door's Lua moves, `lua/front/<move>-<KEYS>.lua`, loaded at compile time with the
//! Batch API's conventions (see [`crate::scripts`]). Each touches one key, so each runs on a
//! Redis Cluster as it does on one server.

use std::sync::LazyLock;

use inferq_client::scripts::Script;

crate::scripts::scripts!("lua/front/", "Every script of the front door.", Scripts, SCRIPTS, FILES {
    join: "frontJoin" => "join-1",
    unjoin: "frontUnjoin" => "unjoin-1",
});
