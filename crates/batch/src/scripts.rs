//! The Batch API's Lua moves, loaded from `lua/*.lua` at compile time. Each file is named
//! `<move>-<KEYS>.lua`, opens with a comment that states its KEYS, ARGV, answer and the move it
//! makes, and names the fragments of `lua/includes/` it needs with `--- @include` lines; each is
//! registered once, in the `scripts!` list below. They run by `EVALSHA` with a load and retry
//! on `NOSCRIPT`, as the queue's scripts do.

use std::sync::LazyLock;

use inferq_client::scripts::Script;

/// The fragments the Batch API's scripts (the front door's too) name with `--- @include`.
pub(crate) const INCLUDES: &[(&str, &str)] = &[
    ("move", include_str!("lua/includes/move.lua")),
    ("ended", include_str!("lua/includes/ended.lua")),
];

/// Declares a set of scripts once: each field, its name (for errors and traces) and its file
/// under `dir`; makes the struct, its static and the list of files the contract test reads.
macro_rules! scripts {
    ($dir:literal, $doc:literal, $Scripts:ident, $SCRIPTS:ident, $FILES:ident {
        $($field:ident: $name:literal => $file:literal,)*
    }) => {
        #[doc = $doc]
        #[derive(Debug)]
        pub struct $Scripts {
            $(pub $field: Script,)*
        }

        pub static $SCRIPTS: LazyLock<$Scripts> = LazyLock::new(|| $Scripts {
            $($field: Script::from_parts(
                $name,
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/", $dir, $file, ".lua")),
                crate::scripts::INCLUDES,
            ),)*
        });

        /// Every script's file (under the crate's `src/`) and text, for the contract test.
        #[cfg(test)]
        pub(crate) const $FILES: &[(&str, &str)] = &[
            $((concat!($dir, $file), include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/", $dir, $file, ".lua"))),)*
        ];
    };
}
pub(crate) use scripts;

scripts!("lua/", "Every script of the Batch API.", Scripts, SCRIPTS, FILES {
    create: "batchCreate" => "create-6",
    begin: "batchBegin" => "begin-6",
    advance: "batchAdvance" => "advance-1",
    collect: "batchCollect" => "collect-4",
    cancel: "batchCancel" => "cancel-3",
    seal: "batchSeal" => "seal-1",
    finish: "batchFinish" => "finish-10",
    lease: "batchLease" => "lease-1",
    ingest: "batchIngest" => "ingest-1",
    sweep: "batchSweep" => "sweep-2",
});

#[cfg(test)]
mod tests {
    use std::path::Path;

    use inferq_client::scripts::includes_named;

    use super::*;

    /// Every script file of the crate is listed once, and every fragment it names exists (the
    /// numbers in the names are checked against the headers by inferq-client's contract test,
    /// which reads every crate's scripts).
    #[test]
    fn every_script_is_listed_and_includes_what_exists() {
        let listed: Vec<(&str, &str)> = FILES
            .iter()
            .chain(crate::front::scripts::FILES)
            .copied()
            .collect();
        for (file, text) in &listed {
            for wanted in includes_named(text) {
                assert!(
                    INCLUDES.iter().any(|(name, _)| *name == wanted),
                    "{file}.lua includes {wanted:?}, which lua/includes/ does not hold"
                );
            }
        }
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for dir in ["lua", "lua/front"] {
            for entry in std::fs::read_dir(src.join(dir)).unwrap().flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "lua") {
                    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
                    let file = format!("{dir}/{stem}");
                    assert!(
                        listed.iter().any(|(f, _)| *f == file),
                        "{file}.lua is not in a scripts! list"
                    );
                }
            }
        }
        for entry in std::fs::read_dir(src.join("lua/includes"))
            .unwrap()
            .flatten()
        {
            let path = entry.path();
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            assert!(
                INCLUDES.iter().any(|(name, _)| *name == stem),
                "lua/includes/{stem}.lua is not in INCLUDES"
            );
        }
    }
}
