//! What a connection's state becomes on the hand-over's wire and back.
use super::*;

#[test]
fn every_carried_state_round_trips_and_the_others_are_not_carried() {
    let deflate = Ext::from_bits(0b0010_1100);
    let carried = [
        State::Http,
        State::Ws(WsMode::new(WsRole::PubSub)),
        State::Ws(WsMode {
            role: WsRole::Envelope,
            deflate: Some(deflate),
            pinged: true,
        }),
        State::Ws(WsMode::new(WsRole::Echo)),
        State::Ws(WsMode {
            role: WsRole::Pusher,
            deflate: Some(deflate),
            pinged: true,
        }),
        State::Ws(WsMode::new(WsRole::PusherResume)),
        State::Sse(SseMode::Payload),
        State::Sse(SseMode::Json),
        State::Stream(StreamMode::Ndjson),
        State::Stream(StreamMode::Raw),
        State::Poll(PollMode {
            keep: true,
            grip: false,
        }),
        State::Poll(PollMode {
            keep: false,
            grip: false,
        }),
        State::H2,
        State::Stream(StreamMode::Grip {
            chunked: true,
            keep: true,
        }),
        State::Stream(StreamMode::Grip {
            chunked: false,
            keep: false,
        }),
    ];
    for s in carried {
        let (kind, option, deflate, pinged) = state_to_wire(s).expect("carried");
        assert_eq!(state_from_wire(kind, option, deflate, pinged), Some(s));
    }
    // A GRIP long-poll's record is a poll's; its GRIP part says it is GRIP's.
    let grip_poll = State::Poll(PollMode {
        keep: true,
        grip: true,
    });
    assert_eq!(Fallback::of_state(grip_poll), None);
    assert_eq!(state_to_wire(grip_poll), Some((4, 1, None, false)));
    let not_carried = [
        State::Ws(WsMode::new(WsRole::Bridge)),
        State::Proxy,
        State::Closing { write_shut: false },
    ];
    for s in carried {
        assert_eq!(Fallback::of_state(s), None, "{s:?}");
    }
    for s in not_carried {
        assert_eq!(state_to_wire(s), None, "{s:?}");
        assert!(Fallback::of_state(s).is_some(), "{s:?} has a reason");
    }
    assert_eq!(state_from_wire(1, 5, None, false), None);
    assert_eq!(state_from_wire(9, 0, None, false), None);
}

#[test]
fn every_reason_a_connection_stays_names_what_it_is() {
    // An HTTP/2 connection moves; a stream of it that cannot is refused and named.
    assert_eq!(Fallback::of_state(State::H2), None);
    assert_eq!(Fallback::RequestInFlight.label(), "h2_request_in_flight");
    assert_eq!(
        Fallback::of_state(State::Closing { write_shut: true }).map(Fallback::label),
        Some("closing")
    );
    let labels: Vec<&str> = Fallback::ALL.iter().map(|f| f.label()).collect();
    assert!(!labels.contains(&"other"), "{labels:?}");
    let docs = include_str!("../../../../docs/operations.md");
    for l in labels {
        assert!(
            docs.contains(&format!("`{l}`")),
            "docs/operations.md names {l}"
        );
    }
}

#[test]
fn fallbacks_are_counted_by_reason() {
    let f = Fallbacks::default();
    f.add(Fallback::Tls12);
    f.add(Fallback::Tls12);
    f.add(Fallback::DeflateFragmented);
    let counts = f.counts();
    assert_eq!(counts.len(), Fallback::ALL.len());
    assert!(counts.contains(&(Fallback::Tls12, 2)));
    assert!(counts.contains(&(Fallback::DeflateFragmented, 1)));
    assert!(counts.contains(&(Fallback::RequestInFlight, 0)));
    let s = Switch::default();
    s.fallbacks.add(Fallback::GripBackend);
    let mut text = String::new();
    s.render(&mut text);
    assert!(text
        .contains("clarion_handover_connections{outcome=\"fallback\",reason=\"grip_backend\"} 1"));
    assert!(text.contains("clarion_handover_connections{outcome=\"taken\"} 0"));
}
