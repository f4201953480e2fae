//! Redis Cluster key slots. Every Lua move touches several keys of one queue; on a cluster they
//! must all hash to one slot, which only a `{hash tag}` in the queue name can guarantee. The queue
//! layer passes in the key names it derives for a queue; [`check_same_slot`] refuses, at
//! start-up, a configuration whose keys would land in different slots.

use super::ConfigError;

pub use inferq_client::{hash_slot, SLOTS};

/// The slot all `keys` share, or `None` when they do not share one (or there are none).
pub fn shared_slot<S: AsRef<str>>(keys: &[S]) -> Option<u16> {
    let mut slots = keys.iter().map(|k| hash_slot(k.as_ref()));
    let first = slots.next()?;
    slots.all(|s| s == first).then_some(first)
}

/// Checks that every key a queue's scripts touch is in one slot.
///
/// `field` names the setting to fix (e.g. `queues[0].queue_name`); `keys` are the key names the
/// queue layer derives for that queue. The error names two keys in different slots and says how
/// to fix it.
pub fn check_same_slot<S: AsRef<str>>(field: &str, keys: &[S]) -> Result<u16, ConfigError> {
    let Some(first) = keys.first() else {
        return Err(ConfigError::invalid(field, "no keys to check"));
    };
    let first = first.as_ref();
    let first_slot = hash_slot(first);
    for key in keys.iter().map(AsRef::as_ref) {
        let slot = hash_slot(key);
        if slot != first_slot {
            return Err(ConfigError::invalid(
                field,
                format!(
                    "keys {first:?} (slot {first_slot}) and {key:?} (slot {slot}) are in different \
                     Redis Cluster slots; give the queue name a hash tag such as \"{{name}}\" and use \
                     the same tag in the names of the other keys it uses"
                ),
            ));
        }
    }
    Ok(first_slot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_checks() {
        let tagged = [
            "{q1}",
            "{q1}:claimed",
            "{q1}:claim-owners",
            "{q1}:claims-idx",
        ];
        assert_eq!(shared_slot(&tagged), Some(hash_slot("q1")));
        assert!(check_same_slot("queues[0].queue_name", &tagged).is_ok());

        let untagged = ["q1", "q1:claimed"];
        assert_eq!(shared_slot(&untagged), None);
        assert_eq!(shared_slot::<&str>(&[]), None);
        let text = check_same_slot("queues[0].queue_name", &untagged)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            text.starts_with("invalid config: queues[0].queue_name: keys \"q1\" (slot"),
            "{text}"
        );
        assert!(text.contains("different Redis Cluster slots"), "{text}");
    }
}
