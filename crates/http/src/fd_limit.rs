//! The open-file limit (`RLIMIT_NOFILE`, `ulimit -n`): every open connection holds a
//! descriptor, so the default bound of a listener's connections derives from it. At start-up a
//! server raises its soft limit to the hard one (as the Go runtime does since Go 1.19) with
//! [`raise`], and sizes its bounds on what [`FdLimit::soft`] then says.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// The open-file limit before and after start-up raised it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit found at start (`None`: unlimited).
    pub before: Option<u64>,
    /// The soft limit now in force.
    pub soft: Option<u64>,
    /// The hard limit (the most an unprivileged process may raise the soft one to).
    pub hard: Option<u64>,
}

/// Raises the soft open-file limit to the hard one, and reports both.
pub fn raise() -> FdLimit {
    let found = getrlimit(Resource::Nofile);
    let mut limit = FdLimit {
        before: found.current,
        soft: found.current,
        hard: found.maximum,
    };
    if let (Some(soft), Some(hard)) = (found.current, found.maximum) {
        if soft < hard {
            let raised = Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            };
            if setrlimit(Resource::Nofile, raised).is_ok() {
                limit.soft = Some(hard);
            }
        }
    }
    limit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_leaves_the_soft_limit_at_the_hard_one() {
        let after = raise();
        assert_eq!(after.soft, after.hard);
        assert_eq!(getrlimit(Resource::Nofile).current, after.soft);
    }
}
