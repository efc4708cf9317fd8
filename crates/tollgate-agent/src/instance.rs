//! The agent's instance id: who it is to the server, for every tenant it
//! serves, without anyone handing out numbers.
//!
//! The server keeps one instance row per (bucket, instance id), and a pod
//! that restarts must come back under the same id with a greater lease so
//! that a late copy of a request sent before the restart is refused, not
//! counted again (`tollgate-client` makes a new, greater lease at every
//! start). An agent per node (a DaemonSet) therefore needs an id that is
//! the same after every restart on that node and different on every other
//! node, with no coordination. It is derived from the node's name:
//!
//! `id = 2^31 + (xxh3_64("tollgate-agent/" + node name) mod (2^31 − 1))`
//!
//! - Stable: the same name gives the same id on every restart and release
//!   (xxh3 is a fixed function, not a per-process hash).
//! - Above 2^31: never one of the small ids pods numbered by hand use.
//! - Collisions: two of a tenant's n agents share an id with probability
//!   about n²/2³² (one in 430 000 for 100 agents, one in 4 300 for 1 000). Two
//!   agents sharing an id would take each other's place at the server (the
//!   later lease wins), so a fleet that large, or one that cannot accept
//!   the odds, sets `--instance-id` per node instead.
//!
//! The node name is `--node-name`, else `TOLLGATE_NODE_NAME` (a DaemonSet
//! sets it from `spec.nodeName`), else the host name.

use tollgate_core::{InstanceId, InvalidInput};
use xxhash_rust::xxh3::xxh3_64;

/// The lowest derived id: 2^31.
pub const DERIVED_BASE: u32 = 1 << 31;

/// Where the host name is read when no node name is given.
pub const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

/// The instance id of the agent on node `node_name` (see the module docs).
pub fn derived_instance_id(node_name: &str) -> InstanceId {
    let hash = xxh3_64(format!("tollgate-agent/{node_name}").as_bytes());
    let modulus = u64::from(u32::MAX >> 1); // 2^31 − 1
    // `hash % modulus` < 2^31 − 1, so the sum stays below u32::MAX.
    let offset = u32::try_from(hash % modulus).unwrap_or(0);
    DERIVED_BASE + offset
}

/// The node name: `given` (the flag, or its variable), else
/// `TOLLGATE_NODE_NAME` as `env` reads it, else the host name read from
/// `hostname_file`. Surrounding white space is dropped; an empty name is
/// refused, naming `node_name`.
pub fn node_name(
    given: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    hostname_file: &std::path::Path,
) -> Result<String, InvalidInput> {
    let name = match given {
        Some(name) => name.trim().to_owned(),
        None => match env("TOLLGATE_NODE_NAME") {
            Some(name) => name.trim().to_owned(),
            None => std::fs::read_to_string(hostname_file)
                .map_err(|e| {
                    InvalidInput::new(
                        "node_name",
                        format!(
                            "not given (--node-name, TOLLGATE_NODE_NAME) and the host name \
                             could not be read from {}: {e}",
                            hostname_file.display()
                        ),
                    )
                })?
                .trim()
                .to_owned(),
        },
    };
    if name.is_empty() {
        return Err(InvalidInput::new("node_name", "must not be empty"));
    }
    Ok(name)
}

/// Checks an id given by hand (`--instance-id`): 1 to 2^32 − 1 (0 is the
/// server's sentinel for the tenant itself).
pub fn given_instance_id(id: u64) -> Result<InstanceId, InvalidInput> {
    match InstanceId::try_from(id) {
        Ok(id) if id >= 1 => Ok(id),
        _ => Err(InvalidInput::new(
            "instance_id",
            format!("must be 1 to {}, got {id}", u32::MAX),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_above_two_to_the_31_and_differ_by_node() {
        // Fixed values: a change of the rule would renumber every agent in
        // a fleet, making each a new instance at the server.
        let a = derived_instance_id("node-a");
        assert_eq!(a, derived_instance_id("node-a"));
        let expected =
            DERIVED_BASE + (xxh3_64(b"tollgate-agent/node-a") % u64::from(u32::MAX >> 1)) as u32;
        assert_eq!(a, expected);
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000 {
            let id = derived_instance_id(&format!("ip-10-0-{}-{}.ec2.internal", i / 256, i % 256));
            assert!(id >= DERIVED_BASE, "{id}");
            assert!(id < u32::MAX, "{id}");
            seen.insert(id);
        }
        // 10 000 names: about 0.02 collisions expected.
        assert!(seen.len() >= 9_998, "{} distinct", seen.len());
    }

    #[test]
    fn the_node_name_comes_from_the_flag_then_the_variable_then_the_host() {
        let dir = tempfile::tempdir().expect("temp dir");
        let hostname = dir.path().join("hostname");
        std::fs::write(&hostname, "host-7\n").expect("write");
        let none = |_: &str| None;
        let set = |name: &str| (name == "TOLLGATE_NODE_NAME").then(|| "node-3".to_owned());
        assert_eq!(
            node_name(Some(" node-1 "), &set, &hostname).expect("valid"),
            "node-1"
        );
        assert_eq!(node_name(None, &set, &hostname).expect("valid"), "node-3");
        assert_eq!(node_name(None, &none, &hostname).expect("valid"), "host-7");
        let missing = dir.path().join("missing");
        let error = node_name(None, &none, &missing).expect_err("no name");
        assert_eq!(error.field, "node_name");
        assert!(error.reason.contains("missing"), "{error}");
        assert_eq!(
            node_name(Some("  "), &none, &hostname)
                .expect_err("empty")
                .field,
            "node_name"
        );
    }

    #[test]
    fn ids_given_by_hand_are_one_to_u32_max() {
        assert_eq!(given_instance_id(1).expect("valid"), 1);
        assert_eq!(
            given_instance_id(u64::from(u32::MAX)).expect("valid"),
            u32::MAX
        );
        for bad in [0, u64::from(u32::MAX) + 1] {
            assert_eq!(
                given_instance_id(bad).expect_err("refused").field,
                "instance_id"
            );
        }
    }
}
