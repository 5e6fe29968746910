//! What authentication and presence keep per connection, moved from one engine to another as a
//! hand-over moves it (the old engine releases it, the record's section is encoded and decoded,
//! the new engine resumes it), under simulated time with the two engines' clocks started at
//! different wall-clock seconds: the token still ends at its own deadline, a warning is not
//! sent twice, and the room's listeners see no leave or join from the move.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use clarion_proto::handover_state;
use clarion_proto::ws::OpCode;

use super::handover_state::CarriedMode;
use super::testkit::{hs256, server_frames, upgrade, Client, Harness, UNIX_BASE};
use crate::config::Config;

const SECRET: &str = "test-secret-of-some-length-000000";

fn config() -> Config {
    Config {
        auth_secret: Some(SECRET.into()),
        auth_expiry_warning: 10,
        allow_client_publish: true,
        presence_topics: vec!["room.*".into()],
        ping_interval: 0,
        idle_timeout: 0,
        ..Config::default()
    }
}

fn token(sub: &str, exp: u64) -> String {
    let claims = serde_json::json!({
        "sub": sub,
        "exp": exp,
        "clarion": { "subscribe": ["room.*"], "publish": ["room.a"] },
    });
    hs256(SECRET, &claims)
}

fn open(h: &mut Harness, target: &str) -> Client {
    let c = h.connect();
    let mut req = String::from_utf8(upgrade(target)).unwrap();
    req.insert_str(req.len() - 2, "Sec-WebSocket-Protocol: clarion.v1\r\n");
    h.send(&c, req.as_bytes());
    let head = c.take_text();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    c
}

/// Every frame the client got since the last call.
fn frames(c: &Client) -> Vec<(OpCode, String)> {
    server_frames(&c.take())
        .into_iter()
        .map(|(op, p)| (op, String::from_utf8_lossy(&p).into_owned()))
        .collect()
}

/// Moves connection `from` of `old` to a fresh connection of `new` as a hand-over does (the
/// record's section through its encoding); returns the new connection.
fn move_conn(old: &mut Harness, from: &Client, new: &mut Harness) -> Client {
    let topics: Vec<String> = {
        let conn = old.engine.conns.get(from.key as usize).unwrap();
        conn.subs
            .ids()
            .into_iter()
            .filter_map(|t| old.engine.index.name_of(t))
            .map(|n| n.to_string())
            .collect()
    };
    let listening = old
        .engine
        .presence_listening_all()
        .remove(&from.key)
        .unwrap_or_default();
    let mode = old
        .engine
        .release(from.key, listening)
        .expect("auth and presence keep state");
    old.engine
        .presence_drop_listeners(&[from.key].into_iter().collect());
    let mut bytes = Vec::new();
    handover_state::encode(&mode.wire(), &mut bytes);
    let mode = CarriedMode::from_wire(&handover_state::decode(&bytes).unwrap());
    // A WebSocket with no topic and no token stands for the arriving socket.
    let to = open(new, "/ws");
    new.engine.resume(to.key, &topics, None, Some(&mode));
    to
}

#[test]
fn rights_deadline_rooms_and_listeners_move_without_a_blip() {
    let mut old = Harness::new(config());
    let exp = UNIX_BASE + 130;
    let lis = open(
        &mut old,
        &format!(
            "/ws?topic=room.a&presence=1&token={}",
            token("lis", exp + 1000)
        ),
    );
    let mem = open(
        &mut old,
        &format!("/ws?topic=room.a&token={}", token("mem", exp)),
    );
    let list = frames(&lis);
    assert!(
        list.iter()
            .any(|(_, t)| t.contains(r#""type":"join""#) && t.contains("mem")),
        "{list:?}"
    );
    // Past the warning: `mem` is told its token expires soon.
    old.advance(125);
    assert!(frames(&mem)
        .iter()
        .any(|(_, t)| t.contains(r#""type":"expiring""#)));
    let p = old.shared.presence.clone().unwrap();
    let before = p.list(&old.shared.broker, "room.a", None, 10).unwrap();
    assert_eq!(before.count, 2);

    // The new engine's clock starts 125 s later in wall-clock time.
    let mut new = Harness::new(config());
    new.engine.set_unix_base(UNIX_BASE + 125);
    let lis2 = move_conn(&mut old, &lis, &mut new);
    let mem2 = move_conn(&mut old, &mem, &mut new);
    frames(&lis2);
    frames(&mem2);
    // Nobody in the old process was told anyone left.
    assert!(frames(&lis).is_empty());
    let p2 = new.shared.presence.clone().unwrap();
    let after = p2.list(&new.shared.broker, "room.a", None, 10).unwrap();
    assert_eq!(after, before, "same members, same version");
    assert_eq!(
        new.shared
            .metrics
            .presence_joins
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );

    // Rights moved: `mem` may publish to room.a (and `lis` gets it), not to room.b.
    new.send_frame(
        &mem2,
        OpCode::Text,
        br#"{"type":"publish","topic":"room.b","data":"x"}"#,
    );
    let r = frames(&mem2);
    assert!(
        r.iter()
            .any(|(_, t)| t.contains("does not allow publishing")),
        "{r:?}"
    );
    new.send_frame(
        &mem2,
        OpCode::Text,
        br#"{"type":"publish","topic":"room.a","data":"hi"}"#,
    );
    assert!(frames(&lis2)
        .iter()
        .any(|(_, t)| t.contains(r#""data":"hi""#)));

    // The deadline is the same wall-clock second (UNIX_BASE + 130 = new second 5), with no
    // second warning.
    new.advance(4);
    assert!(new.is_open(&mem2));
    assert!(frames(&mem2).iter().all(|(_, t)| !t.contains("expiring")));
    new.advance(1);
    let closed = frames(&mem2);
    let close = closed
        .iter()
        .find(|(op, _)| *op == OpCode::Close)
        .expect("closed at exp");
    assert!(close.1.contains("token expired"), "{closed:?}");
    // ... and once it is gone, the room's listener sees `mem` leave, at the next version.
    new.hang_up(&mem2);
    new.advance(1);
    let ev = frames(&lis2);
    assert!(
        ev.iter()
            .any(|(_, t)| t.contains(r#""type":"leave""#) && t.contains("mem")),
        "{ev:?}"
    );
    assert!(
        ev.iter().all(|(_, t)| !t.contains(r#""type":"join""#)),
        "{ev:?}"
    );
    let last = p2.list(&new.shared.broker, "room.a", None, 10).unwrap();
    assert_eq!((last.count, last.version), (1, before.version + 1));
}

#[test]
fn a_connection_still_to_authenticate_keeps_its_deadline() {
    let mut old = Harness::new(Config {
        auth_anonymous: false,
        handshake_timeout: 10,
        ..config()
    });
    let c = open(&mut old, "/ws");
    old.advance(4);
    let mode = old.engine.release(c.key, Vec::new()).unwrap();
    let auth = mode.auth.as_ref().unwrap();
    assert!(auth.pending && auth.deadline == UNIX_BASE + 10);
    let mut new = Harness::new(Config {
        auth_anonymous: false,
        handshake_timeout: 10,
        ..config()
    });
    new.engine.set_unix_base(UNIX_BASE + 4);
    let c2 = new.connect();
    new.send(&c2, &upgrade("/ws"));
    c2.take();
    new.engine.side.grants_mut().clear(c2.key);
    new.engine.resume(c2.key, &[], None, Some(&mode));
    new.advance(5);
    assert!(new.is_open(&c2));
    new.advance(1);
    let f = frames(&c2);
    assert!(
        f.iter()
            .any(|(op, t)| *op == OpCode::Close && t.contains("authentication required")),
        "{f:?}"
    );
}
