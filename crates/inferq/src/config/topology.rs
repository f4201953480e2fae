//! Go's Redis deployment fields, `mode`, `addrs` and `master_name`, validated into a
//! [`Topology`]. The transport config and the operator commands' `--redis-mode`,
//! `--redis-addrs` and `--redis-master-name` flags both come through here, so both refuse the
//! same combinations with the same words, naming the field (or flag) at fault.

use super::ConfigError;
use inferq_client::target::Topology;

/// What the user wrote, and how to name each field in an error.
#[derive(Debug)]
pub struct TopologyFields<'a> {
    pub mode: Option<&'a str>,
    pub addrs: &'a [String],
    pub master_name: Option<&'a str>,
    /// The checked URL (`config::check_redis_url`), and its field name.
    pub url: &'a str,
    pub names: FieldNames,
}

/// The names of the four fields in errors: the transport config's or the flags'.
#[derive(Debug, Clone, Copy)]
pub struct FieldNames {
    pub mode: &'static str,
    pub addrs: &'static str,
    pub master_name: &'static str,
    pub url: &'static str,
}

/// The transport config's field names.
pub const CONFIG_FIELDS: FieldNames = FieldNames {
    mode: "mode",
    addrs: "addrs",
    master_name: "master_name",
    url: "url",
};

/// The operator commands' flag names.
pub const FLAG_FIELDS: FieldNames = FieldNames {
    mode: "--redis-mode",
    addrs: "--redis-addrs",
    master_name: "--redis-master-name",
    url: "--redis-url",
};

/// Go's rules: `mode` is `standalone` (also when empty), `cluster` or `sentinel`; `addrs` only
/// with cluster or sentinel, each `host:port`; `master_name` required for sentinel and refused
/// otherwise; a cluster has only database 0; a unix socket is one server.
pub fn resolve_topology(f: &TopologyFields<'_>) -> Result<Topology, ConfigError> {
    let n = f.names;
    let mode = f.mode.filter(|m| !m.is_empty()).unwrap_or("standalone");
    let master_name = f.master_name.filter(|m| !m.is_empty());
    for (i, addr) in f.addrs.iter().enumerate() {
        check_addr(addr).map_err(|why| ConfigError::invalid(format!("{}[{i}]", n.addrs), why))?;
    }
    let unix = f
        .url
        .get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("unix://"));
    match mode {
        "standalone" => {
            if !f.addrs.is_empty() {
                return Err(ConfigError::invalid(
                    n.addrs,
                    format!("only with {} cluster or sentinel", n.mode),
                ));
            }
            if master_name.is_some() {
                return Err(ConfigError::invalid(
                    n.master_name,
                    format!("only with {} sentinel", n.mode),
                ));
            }
            Ok(Topology::Standalone)
        }
        "cluster" | "sentinel" if unix => Err(ConfigError::invalid(
            n.url,
            format!(
                "a unix socket is one server; {} {mode} needs host:port nodes",
                n.mode
            ),
        )),
        "cluster" => {
            if master_name.is_some() {
                return Err(ConfigError::invalid(
                    n.master_name,
                    format!("only with {} sentinel", n.mode),
                ));
            }
            if let Some(db) = url_db(f.url).filter(|&db| db != 0) {
                return Err(ConfigError::invalid(
                    n.url,
                    format!("a Redis Cluster has only database 0, the URL selects {db}"),
                ));
            }
            Ok(Topology::Cluster {
                addrs: f.addrs.to_vec(),
            })
        }
        "sentinel" => match master_name {
            Some(name) => Ok(Topology::Sentinel {
                addrs: f.addrs.to_vec(),
                master_name: name.to_owned(),
            }),
            None => Err(ConfigError::invalid(
                n.master_name,
                format!("required with {} sentinel", n.mode),
            )),
        },
        other => Err(ConfigError::invalid(
            n.mode,
            format!("must be standalone, cluster or sentinel, got {other:?}"),
        )),
    }
}

/// `host:port` with a host and a port from 1 to 65535 (`[v6]:port` for IPv6).
fn check_addr(addr: &str) -> Result<(), String> {
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(format!("{addr:?} is not host:port"));
    };
    if host.is_empty() || host.contains('/') {
        return Err(format!("{addr:?} names no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("{addr:?}: the port must be 1 to 65535")),
    }
}

/// The database a checked `redis://` URL selects (its path), if any.
fn url_db(url: &str) -> Option<u32> {
    let parsed = url::Url::parse(url).ok()?;
    parsed.path().trim_matches('/').parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(mode: &str, addrs: &[&str], master: &str, url: &str) -> Result<Topology, String> {
        let addrs: Vec<String> = addrs.iter().map(|s| (*s).to_owned()).collect();
        resolve_topology(&TopologyFields {
            mode: Some(mode),
            addrs: &addrs,
            master_name: Some(master),
            url,
            names: CONFIG_FIELDS,
        })
        .map_err(|e| e.to_string())
    }

    #[test]
    fn gos_modes_and_their_fields() {
        assert_eq!(
            resolve("", &[], "", "redis://h:1"),
            Ok(Topology::Standalone)
        );
        assert_eq!(
            resolve("standalone", &[], "", "redis://h:1/3"),
            Ok(Topology::Standalone)
        );
        assert_eq!(
            resolve("cluster", &["h2:7001"], "", "redis://h:7000"),
            Ok(Topology::Cluster {
                addrs: vec!["h2:7001".into()]
            })
        );
        assert_eq!(
            resolve("sentinel", &["s2:26380"], "mymaster", "redis://s1:26379/2"),
            Ok(Topology::Sentinel {
                addrs: vec!["s2:26380".into()],
                master_name: "mymaster".into()
            })
        );
    }

    #[test]
    fn bad_combinations_name_the_field() {
        let e = |m, a: &[&str], n, u| resolve(m, a, n, u).unwrap_err();
        assert_eq!(
            e("Cluster", &[], "", "redis://h:1"),
            "invalid config: mode: must be standalone, cluster or sentinel, got \"Cluster\""
        );
        assert_eq!(
            e("", &["h:1"], "", "redis://h:1"),
            "invalid config: addrs: only with mode cluster or sentinel"
        );
        assert_eq!(
            e("cluster", &[], "m", "redis://h:1"),
            "invalid config: master_name: only with mode sentinel"
        );
        assert_eq!(
            e("standalone", &[], "m", "redis://h:1"),
            "invalid config: master_name: only with mode sentinel"
        );
        assert_eq!(
            e("sentinel", &[], "", "redis://h:1"),
            "invalid config: master_name: required with mode sentinel"
        );
        assert_eq!(
            e("cluster", &[], "", "redis://h:1/2"),
            "invalid config: url: a Redis Cluster has only database 0, the URL selects 2"
        );
        assert!(resolve("cluster", &[], "", "redis://h:1/0").is_ok());
        assert_eq!(
            e("cluster", &["h2"], "", "redis://h:1"),
            "invalid config: addrs[0]: \"h2\" is not host:port"
        );
        assert_eq!(
            e("sentinel", &["h2:0"], "m", "redis://h:1"),
            "invalid config: addrs[0]: \"h2:0\": the port must be 1 to 65535"
        );
        assert!(e("cluster", &[], "", "unix:///tmp/r.sock").starts_with("invalid config: url: "));
    }
}
