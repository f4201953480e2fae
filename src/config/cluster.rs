//! Redis Cluster key slots. Every Lua move touches several keys of one queue; on a cluster they
//! must all hash to one slot, which only a `{hash tag}` in the queue name can guarantee. The queue
//! layer passes in the key names it derives for a queue; [`check_same_slot`] refuses, at
//! start-up, a configuration whose keys would land in different slots.

use super::ConfigError;

/// Number of slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The cluster slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag, modulo 16384.
///
/// The hash tag is the text between the first `{` and the first `}` after it, when that text is
/// not empty; otherwise the whole key is hashed.
pub fn hash_slot(key: &str) -> u16 {
    crc16_xmodem(hash_tag(key.as_bytes())) % SLOTS
}

/// The part of `key` that is hashed.
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        let after = &key[open + 1..];
        if let Some(close) = after.iter().position(|&b| b == b'}') {
            if close > 0 {
                return &after[..close];
            }
        }
    }
    key
}

/// CRC-16/XMODEM: polynomial 0x1021, initial value 0, no reflection.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

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
    fn known_slots() {
        assert_eq!(hash_slot("foo"), 12182);
        assert_eq!(hash_slot("123456789"), 12739);
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        // The examples of Redis's CLUSTER KEYSLOT documentation.
        assert_eq!(hash_slot("somekey"), 11058);
        assert_eq!(hash_slot("foo{hash_tag}"), 2515);
        assert_eq!(hash_slot(""), 0);
    }

    #[test]
    fn hash_tags() {
        assert_eq!(
            hash_slot("{user1000}.following"),
            hash_slot("{user1000}.followers")
        );
        assert_eq!(hash_slot("{user1000}.following"), hash_slot("user1000"));
        // Empty tag: the whole key is hashed.
        assert_eq!(hash_slot("foo{}{bar}"), crc16_xmodem(b"foo{}{bar}") % SLOTS);
        // First `{` and the first `}` after it.
        assert_eq!(hash_slot("foo{{bar}}zap"), hash_slot("{bar"));
        assert_eq!(hash_slot("foo{bar}{zap}"), hash_slot("bar"));
        // No closing brace.
        assert_eq!(hash_slot("foo{bar"), crc16_xmodem(b"foo{bar") % SLOTS);
    }

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
