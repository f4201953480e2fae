//! Redis Cluster key slots: which of the 16,384 slots a key hashes to. The producer and the
//! processor use it to send each script to the primary that owns its keys, and the processor's
//! config refuses a queue whose keys would land in different slots. Written here because the
//! redis crate keeps its own slot function private; it is CRC16 (XMODEM) of the key or of its
//! `{hash tag}`, modulo 16384, as the Redis Cluster specification gives it.

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
pub fn crc16_xmodem(bytes: &[u8]) -> u16 {
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
}
