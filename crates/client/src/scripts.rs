//! The Lua scripts of the durability contract, loaded from `lua/*.lua` at compile time with
//! their shared fragments from `lua/includes/`, and the machinery to run them.
//!
//! Scripts run by `EVALSHA`. When Redis answers `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a
//! fail-over) the script is loaded and the call repeated (a call that hit `NOSCRIPT` did not run).

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

/// One script: its name (for errors and metrics), its source and its SHA1.
#[derive(Debug)]
pub struct Script {
    /// Its name, for errors, metrics and traces.
    pub name: &'static str,
    source: String,
    sha: String,
}

impl Script {
    /// A script named `name` (for errors), its `includes` put before its `body`.
    pub fn new(name: &'static str, includes: &[&str], body: &str) -> Script {
        let mut source = String::new();
        for include in includes {
            source.push_str(include);
            source.push('\n');
        }
        source.push_str(body);
        let sha = sha1_smol::Sha1::from(source.as_bytes())
            .digest()
            .to_string();
        Script { name, source, sha }
    }

    /// The SHA1 of the source, which `EVALSHA` names it by.
    pub fn sha(&self) -> &str {
        &self.sha
    }

    /// An `EVALSHA` command for these keys and arguments.
    pub fn cmd<K: redis::ToRedisArgs, A: redis::ToRedisArgs>(&self, keys: &[K], args: &[A]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(keys.len());
        for k in keys {
            cmd.arg(k);
        }
        for a in args {
            cmd.arg(a);
        }
        cmd
    }

    /// `SCRIPT LOAD`s this script.
    pub async fn load<C: ConnectionLike>(&self, con: &mut C) -> RedisResult<()> {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&self.source)
            .query_async(con)
            .await?;
        Ok(())
    }

    /// Runs one call, loading the script first if Redis has lost it.
    pub async fn run<C: ConnectionLike>(&self, con: &mut C, cmd: &Cmd) -> RedisResult<Value> {
        match cmd.query_async::<Value>(con).await {
            Err(e) if is_noscript(&e) => {
                self.load(con).await?;
                cmd.query_async(con).await
            }
            other => other,
        }
    }
}

fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

macro_rules! lua {
    ($name:literal) => {
        include_str!(concat!("lua/", $name, ".lua"))
    };
}

/// The shared fragments a script names with `--- @include <name>` lines (`lua/includes/`).
const INCLUDES: &[(&str, &str)] = &[
    ("nowMs", lua!("includes/nowMs")),
    ("dropClaim", lua!("includes/dropClaim")),
    ("deadlineOf", lua!("includes/deadlineOf")),
    ("writable", lua!("includes/writable")),
    ("deliver", lua!("includes/deliver")),
    ("stampSeq", lua!("includes/stampSeq")),
];

/// The fragments a script's text names, in its order: its `--- @include <name>` lines.
pub fn includes_named(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter_map(|line| line.strip_prefix("--- @include "))
        .map(str::trim)
}

impl Script {
    /// A script from its file's text, `name-<KEYS>` (the name, for errors and metrics, is the
    /// part before the dash): the fragments its `--- @include` lines name go before its body,
    /// after its `#!lua` flags line when it has one, which Redis needs first.
    pub fn from_file(file: &'static str, text: &str) -> Script {
        let name = file.split('-').next().unwrap_or(file);
        Script::from_parts(name, text, INCLUDES)
    }

    /// A script named `name` from a file's text whose `--- @include` lines name fragments of
    /// `includes` (`(name, text)` pairs): what another crate's scripts use with their own
    /// fragments.
    pub fn from_parts(name: &'static str, text: &str, includes: &[(&str, &str)]) -> Script {
        let (flags, body) = match text.split_once('\n') {
            Some((first, rest)) if first.starts_with("#!lua") => (first, rest),
            _ => ("", text),
        };
        let fragments: Vec<&str> = includes_named(text)
            .filter_map(|wanted| {
                includes
                    .iter()
                    .find(|(name, _)| *name == wanted)
                    .map(|(_, fragment)| *fragment)
            })
            .collect();
        let mut script = Script::new(name, &fragments, body);
        if !flags.is_empty() {
            script = Script::new(name, &[flags], &script.source);
        }
        script
    }
}

/// Declares every script once: its field, its file (`lua/<file>.lua`, named `name-<KEYS>`),
/// and whether the processor loads it at its start. The struct, the table and the list of
/// files the contract test reads all come from this one list.
macro_rules! scripts {
    (
        loaded_at_start { $($field:ident => $file:literal,)* }
        on_demand { $($late:ident => $late_file:literal,)* }
    ) => {
        /// Every script inferq runs.
        #[derive(Debug)]
        pub struct Scripts {
            $(#[doc = concat!("`lua/", $file, ".lua`.")] pub $field: Script,)*
            $(#[doc = concat!("`lua/", $late_file, ".lua`.")] pub $late: Script,)*
        }

        /// The scripts, built once.
        pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
            $($field: Script::from_file($file, lua!($file)),)*
            $($late: Script::from_file($late_file, lua!($late_file)),)*
        });

        /// Every script's file and text, for the contract test.
        pub const FILES: &[(&str, &str)] = &[
            $(($file, lua!($file)),)*
            $(($late_file, lua!($late_file)),)*
        ];

        impl Scripts {
            /// The processor's scripts (loaded at its start).
            pub fn all(&self) -> Vec<&Script> {
                vec![$(&self.$field,)*]
            }
        }
    };
}

scripts! {
    loaded_at_start {
        take => "take-5",
        renew => "renew-2",
        finish => "finish-11",
        promote => "promote-3",
        release => "release-5",
        reclaim => "reclaim-7",
        dead_letter => "deadLetter-5",
        cancel => "cancel-2",
        hand_back => "handBack-2",
        requeue => "requeue-5",
        purge_dead => "purgeDead-1",
        hold_name => "holdName-1",
        drop_name => "dropName-1",
        admit => "admit-1",
        adopt_counts => "adoptCounts-3",
        deliver_once => "deliverOnce-2",
        unstage => "unstage-3",
        forget => "forget-1",
        stale_staged => "staleStaged-2",
    }
    // The census only `inferq status` runs (its `#!lua` flags line needs Redis 7); the durable
    // result consumers' scripts (`crate::durable_results`) at their first call.
    on_demand {
        census => "census-7",
        submit => "submit-5",
        enqueue => "enqueue-2",
        result_receive => "resultReceive-5",
        result_renew => "resultRenew-2",
        result_ack => "resultAck-4",
        // `fair-share` discovery (`inferq::dispatch::discovery`); loaded at its first call.
        forget_idle => "forgetIdle-1",
        // The redis-quota concurrency counter's two moves: the processors' gate and the front
        // door's passthrough share them, so a tenant has one account (as with the router's step).
        quota_acquire => "quotaAcquire-1",
        quota_release => "quotaRelease-1",
    }
}

impl Scripts {
    /// Loads every script (at start-up, so the first real call does not pay for it).
    pub async fn load_all<C: ConnectionLike>(&self, con: &mut C) -> RedisResult<()> {
        for script in self.all() {
            script.load(con).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    /// The KEYS a script's header declares: the highest `KEYS[n]` it names (optional ones too:
    /// the name counts every key a call may pass). The header is the opening `--[[ ]]` block,
    /// or the opening run of `--` lines.
    fn required_keys(text: &str) -> usize {
        // A `#!lua` flags line comes first where there is one.
        let text = match text.split_once('\n') {
            Some((first, rest)) if first.starts_with("#!") => rest,
            _ => text,
        };
        let header: String = if text.starts_with("--[[") {
            text.split("]]").next().unwrap_or("").to_owned()
        } else {
            text.lines()
                .take_while(|line| line.starts_with("--"))
                .map(|line| format!("{}\n", line.trim_start_matches('-')))
                .collect()
        };
        header
            .split("KEYS[")
            .skip(1)
            .filter_map(|rest| rest.split(']').next()?.parse::<usize>().ok())
            .max()
            .unwrap_or(0)
    }

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// Every file under `dir` (recursively) whose name ends with `suffix`.
    fn files(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path
                    .file_name()
                    .is_some_and(|n| n != "target" && n != ".git")
                {
                    files(&path, suffix, out);
                }
            } else if path.to_string_lossy().ends_with(suffix) {
                out.push(path);
            }
        }
    }

    /// Each script's name says how many KEYS it takes (`finish-11`), its header declares as many,
    /// and every fragment it includes exists.
    #[test]
    fn every_script_takes_the_keys_its_name_says_and_includes_what_exists() {
        for (file, text) in FILES {
            let suffix: usize = file
                .rsplit('-')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{file}.lua: no `-<KEYS>` suffix"));
            assert_eq!(
                required_keys(text),
                suffix,
                "{file}.lua: its header declares another number of KEYS"
            );
            for wanted in includes_named(text) {
                assert!(
                    INCLUDES.iter().any(|(name, _)| *name == wanted),
                    "{file}.lua includes {wanted:?}, which lua/includes/ does not hold"
                );
            }
        }
    }

    /// The one list is the whole truth: every script file is in it, and every fragment file is
    /// in the table of includes.
    #[test]
    fn every_file_is_listed() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lua");
        let mut found = Vec::new();
        files(&dir, ".lua", &mut found);
        for path in found {
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            if path.parent().is_some_and(|p| p.ends_with("includes")) {
                assert!(
                    INCLUDES.iter().any(|(name, _)| *name == stem),
                    "lua/includes/{stem}.lua is not in INCLUDES"
                );
            } else {
                assert!(
                    FILES.iter().any(|(file, _)| *file == stem),
                    "lua/{stem}.lua is not in the scripts! list"
                );
            }
        }
    }

    /// Every `name-<n>.lua` the workspace's code and docs mention is a file that exists, and
    /// every such file anywhere in the workspace's crates declares the KEYS its name says.
    #[test]
    fn scripts_named_in_code_and_docs_exist_and_keep_their_contract() {
        let root = workspace();
        let mut scripts = Vec::new();
        files(&root.join("crates"), ".lua", &mut scripts);
        let names: Vec<String> = scripts
            .iter()
            .filter_map(|p| Some(p.file_name()?.to_str()?.to_owned()))
            .collect();
        for path in &scripts {
            let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            let Some(suffix) = name
                .rsplit_once('-')
                .and_then(|(_, n)| n.parse::<usize>().ok())
            else {
                continue;
            };
            let text = std::fs::read_to_string(path).unwrap_or_default();
            assert_eq!(
                required_keys(&text),
                suffix,
                "{}: its header declares another number of KEYS",
                path.display()
            );
        }
        let mut texts = Vec::new();
        files(&root.join("crates"), ".rs", &mut texts);
        files(&root.join("docs/src"), ".md", &mut texts);
        texts.push(root.join("README.md"));
        let mut mentions = 0;
        for path in texts {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for (at, _) in text.match_indices(".lua") {
                let before = &text[..at];
                let start = before
                    .char_indices()
                    .rev()
                    .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '-'))
                    .map_or(0, |(i, c)| i + c.len_utf8());
                let mentioned = &text[start..at];
                let numbered = mentioned
                    .rsplit_once('-')
                    .is_some_and(|(head, n)| !head.is_empty() && n.parse::<usize>().is_ok());
                if !numbered {
                    continue;
                }
                mentions += 1;
                let file = format!("{mentioned}.lua");
                assert!(
                    names.contains(&file),
                    "{} mentions {file}, which no crate holds",
                    path.display()
                );
            }
        }
        assert!(mentions > 20, "the scan found only {mentions} mentions");
    }
}
