//! Fuzzes the configuration loader: the input is split at NUL bytes into a transport-config
//! JSON, a pool file, a merge-policy file and extra command-line words. Parsing the flags and
//! loading must give a config or a ConfigError naming a field — never a panic.
#![no_main]

use clap::Parser;
use inferq::config::{load_with_env, RunArgs};
use libfuzzer_sys::fuzz_target;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    run: RunArgs,
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let transport = parts.next().unwrap_or_default();
    let pools = parts.next();
    let merge = parts.next();
    let extra = parts.next().unwrap_or_default();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut argv = vec![
        "inferq".to_owned(),
        "--transport=redis-sortedset".to_owned(),
        format!("--transport-config={transport}"),
    ];
    if let Some(pools) = pools {
        let p = dir.path().join("pools.json");
        std::fs::write(&p, pools).expect("write");
        argv.push(format!("--pool-config-file={}", p.display()));
    }
    if let Some(merge) = merge {
        let p = dir.path().join("merge.json");
        std::fs::write(&p, merge).expect("write");
        argv.push(format!(
            "--request-merge-policy-config-file={}",
            p.display()
        ));
    }
    argv.extend(extra.split_whitespace().map(str::to_owned));
    let Ok(cli) = Cli::try_parse_from(&argv) else {
        return;
    };
    if let Err(e) = load_with_env(&cli.run, |_| None) {
        assert!(!e.field().is_empty(), "a config error names a field: {e}");
    }
});
