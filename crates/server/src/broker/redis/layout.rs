//! Where a topic lives in Redis: its keys and channel, and the partition (hash tag) that keeps
//! them in one slot. Part of the data layout: changing a name or the hash strands the data of
//! nodes running the old version.

/// Hash-tag partitions topics are spread over (a Redis Cluster spreads them over its shards).
pub const PARTITIONS: u32 = 64;

/// The keys and channel of a topic: `clarion:{pN}:m:TOPIC`, `clarion:{pN}:s:TOPIC` and
/// `clarion:{pN}:TOPIC`, `N` from a stable hash of the name.
pub fn keys(topic: &str) -> [String; 3] {
    let p = partition(topic);
    [
        format!("clarion:{{p{p}}}:m:{topic}"),
        format!("clarion:{{p{p}}}:s:{topic}"),
        format!("clarion:{{p{p}}}:{topic}"),
    ]
}

/// The offsets of `topic` whose folded appendable-message entries moved on, removed from its
/// stream (`clarion:{pN}:f:TOPIC`, a sorted set kept by `stream.lua`): holes a resume reads
/// across without a gap, as nothing was trimmed there.
pub fn holes_key(topic: &str) -> String {
    format!("clarion:{{p{}}}:f:{topic}", partition(topic))
}

/// The record of an `Idempotency-Key` published to `topic`, in the topic's slot (so the
/// publish script claims it with the message): `clarion:{pN}:i:LEN:TOPIC:KEY`, the topic's
/// length making the split between topic and key unambiguous.
pub fn idempotency_key(topic: &str, key: &str) -> String {
    let p = partition(topic);
    format!("clarion:{{p{p}}}:i:{}:{topic}:{key}", topic.len())
}

/// FNV-1a: the same partition on every node and every version.
pub fn partition(topic: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in topic.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % PARTITIONS
}

/// The topic a channel name is for.
pub(super) fn topic_of(channel: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(channel).ok()?;
    let rest = s.strip_prefix("clarion:{p")?;
    let (_, topic) = rest.split_once("}:")?;
    Some(topic)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn keys_share_a_partition_tag_and_channels_name_their_topic() {
        let [m, s, c] = keys("news.eu");
        let tag = &m[..m.find("}:").unwrap() + 1];
        assert!(s.starts_with(tag) && c.starts_with(tag));
        assert_eq!(topic_of(c.as_bytes()), Some("news.eu"));
        assert_eq!(topic_of(b"other:{p1}:x"), None);
        let i = idempotency_key("news.eu", "k:1");
        assert!(i.starts_with(tag), "{i}");
        assert_eq!(i, "clarion:{p22}:i:7:news.eu:k:1");
        assert_ne!(idempotency_key("a:b", "c"), idempotency_key("a", "b:c"));
        // stream.lua and offset.lua spell it from the stream's key.
        assert_eq!(holes_key("news.eu"), s.replacen("}:s:", "}:f:", 1));
    }

    #[test]
    fn partitions_are_pinned_because_they_are_the_data_layout() {
        // FNV-1a 32-bit of each name, mod 64. A change here strands every topic that nodes of
        // an older version wrote to Redis: these values must never change.
        for (topic, fnv1a, expected) in [
            ("", 0x811c_9dc5_u32, 5),
            ("a", 0xe40c_292c, 44),
            ("news.eu", 0x7b0c_15d6, 22),
            ("chat.lobby", 0x9f4f_7a9d, 29),
        ] {
            assert_eq!(fnv1a % PARTITIONS, expected, "{topic}");
            assert_eq!(partition(topic), expected, "{topic}");
        }
        assert_eq!(keys("a")[0], "clarion:{p44}:m:a");
        assert!((0..1000).map(|i| partition(&format!("t{i}"))).max() < Some(PARTITIONS));
    }
}
