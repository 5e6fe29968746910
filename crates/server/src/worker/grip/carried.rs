//! A GRIP hold as it moves between processes in a hand-over (`crate::worker::handover_grip`
//! takes it out of the engine's `grip` table and puts it back): a held stream's keep-alive or a
//! held long-poll's deadline, timeout answer and backend headers, owned, with its conversions
//! to and from the record's GRIP part ([`clarion_proto::handover_grip`]).

use clarion_proto::handover::GripRecord;

use crate::worker::state::{PollMode, State};

/// What the `grip` table keeps for a held connection as it moves (either way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarriedGrip {
    /// A held stream's keep-alive.
    KeepAlive {
        /// Bytes sent when due, framed as the stream is.
        data: Vec<u8>,
        /// Seconds between keep-alives.
        every: u32,
        /// Sent on a fixed period rather than after quiet seconds.
        interval: bool,
        /// Seconds since the last one was sent.
        since: u32,
    },
    /// A held long-poll.
    Response {
        /// Seconds left before the timeout answer.
        left: u32,
        /// The timeout answer.
        timeout: Vec<u8>,
        /// The backend's headers for a published answer.
        headers: Vec<(String, String)>,
    },
}

impl CarriedGrip {
    /// The record's part, borrowing from `self`.
    pub fn wire(&self) -> GripRecord<'_> {
        match self {
            CarriedGrip::KeepAlive {
                data,
                every,
                interval,
                since,
            } => GripRecord::KeepAlive {
                data,
                every: *every,
                interval: *interval,
                since: *since,
            },
            CarriedGrip::Response {
                left,
                timeout,
                headers,
            } => GripRecord::Response {
                left: *left,
                timeout,
                headers: headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect(),
            },
        }
    }

    /// The part as read from the old process.
    pub fn from_wire(g: &GripRecord<'_>) -> CarriedGrip {
        match g {
            GripRecord::KeepAlive {
                data,
                every,
                interval,
                since,
            } => CarriedGrip::KeepAlive {
                data: data.to_vec(),
                every: *every,
                interval: *interval,
                since: *since,
            },
            GripRecord::Response {
                left,
                timeout,
                headers,
            } => CarriedGrip::Response {
                left: *left,
                timeout: timeout.to_vec(),
                headers: headers
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                    .collect(),
            },
        }
    }

    /// Bytes of the part in a record, for sizing a batch's buffer.
    pub fn size(&self) -> usize {
        16 + match self {
            CarriedGrip::KeepAlive { data, .. } => 16 + data.len(),
            CarriedGrip::Response {
                timeout, headers, ..
            } => {
                16 + timeout.len()
                    + headers
                        .iter()
                        .map(|(n, v)| 4 + n.len() + v.len())
                        .sum::<usize>()
            }
        }
    }

    /// The state a record arrives in: a poll with a hold is a GRIP long-poll (the record's
    /// transport byte does not say so; its part does).
    pub fn arriving_state(state: State, part: Option<&CarriedGrip>) -> State {
        match (state, part) {
            (State::Poll(PollMode { keep, .. }), Some(CarriedGrip::Response { .. })) => {
                State::Poll(PollMode { keep, grip: true })
            }
            (s, Some(CarriedGrip::Response { .. } | CarriedGrip::KeepAlive { .. }) | None) => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_carried_grip_part_round_trips_through_its_wire_form() {
        let parts = [
            CarriedGrip::KeepAlive {
                data: b"1\r\n\n\r\n".to_vec(),
                every: 15,
                interval: true,
                since: 4,
            },
            CarriedGrip::Response {
                left: 30,
                timeout: b"HTTP/1.1 304 Not Modified\r\n\r\n".to_vec(),
                headers: vec![("ETag".into(), "\"v1\"".into())],
            },
        ];
        for p in parts {
            assert_eq!(CarriedGrip::from_wire(&p.wire()), p);
            let mut out = Vec::new();
            clarion_proto::handover_grip::encode(Some(&p.wire()), &mut out);
            assert!(out.len() <= p.size(), "{} > {}", out.len(), p.size());
        }
    }

    #[test]
    fn a_poll_with_a_hold_arrives_as_a_grip_long_poll() {
        let hold = CarriedGrip::Response {
            left: 1,
            timeout: Vec::new(),
            headers: Vec::new(),
        };
        let poll = State::Poll(PollMode {
            keep: true,
            grip: false,
        });
        assert_eq!(
            CarriedGrip::arriving_state(poll, Some(&hold)),
            State::Poll(PollMode {
                keep: true,
                grip: true
            })
        );
        assert_eq!(CarriedGrip::arriving_state(poll, None), poll);
    }
}
