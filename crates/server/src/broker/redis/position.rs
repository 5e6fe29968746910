//! How a subscription's resume position is written: one topic's id, or one `topic:id` per topic.

use std::sync::Arc;

/// The position of a subscription: its topic's id, or for several topics one `topic:id` per
/// topic, comma-separated (topic names hold no commas). A resume from it is exact per topic.
pub(super) fn joined_position(names: &[Arc<str>], positions: &[(Option<Arc<str>>, u64)]) -> String {
    let id = |(e, last): &(Option<Arc<str>>, u64)| match e {
        Some(e) => format!("{e}-{last}"),
        None => "0-0".to_owned(),
    };
    if let [one] = positions {
        return id(one);
    }
    let ids: Vec<String> = names
        .iter()
        .zip(positions)
        .map(|(n, p)| format!("{n}:{}", id(p)))
        .collect();
    ids.join(",")
}
