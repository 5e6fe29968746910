//! The error codes of `pusher:error` and of the close frames that end a Pusher connection, and
//! what each range tells a client to do (protocol version 7). pusher-js decides from the code
//! alone whether to give up, back off or reconnect, so a code is part of the contract: the
//! server must pick the one whose class matches what it wants the client to do.

/// What a client does after a connection ends with a code, by its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// 4000–4099: the connection cannot work as configured; the client stops.
    Never,
    /// 4100–4199: the server is over capacity; the client reconnects after a while.
    BackOff,
    /// 4200–4299: the client reconnects at once.
    Now,
    /// 4300–4399 and codes sent without a close: an error about one request (a subscription,
    /// a client event); the connection stays up.
    NoClose,
}

/// The codes Clarion sends. Each is the one Pusher documents for the situation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// 4000: the application accepts TLS connections only.
    TlsOnly,
    /// 4001: no application has the key in the path (`/app/{key}`).
    AppUnknown,
    /// 4003: the application is disabled.
    AppDisabled,
    /// 4004: the application is at its connection limit.
    OverConnectionQuota,
    /// 4005: the path is not `/app/{key}`.
    PathNotFound,
    /// 4006: the `protocol` query parameter is not a number.
    InvalidVersion,
    /// 4007: the `protocol` version is not one this server speaks.
    UnsupportedVersion,
    /// 4008: no `protocol` query parameter.
    NoVersion,
    /// 4009: the connection is not authorized (a user was terminated, signin required).
    Unauthorized,
    /// 4100: the server is over capacity.
    OverCapacity,
    /// 4200: a generic "reconnect now" (the server is going away).
    ReconnectNow,
    /// 4201: the client did not answer a ping in time.
    PongNotReceived,
    /// 4202: the connection was idle past the activity timeout.
    Inactive,
    /// 4301: a client event over the per-connection rate limit.
    ClientEventRateLimit,
}

impl ErrorCode {
    /// The number on the wire.
    pub fn code(self) -> u16 {
        match self {
            ErrorCode::TlsOnly => 4000,
            ErrorCode::AppUnknown => 4001,
            ErrorCode::AppDisabled => 4003,
            ErrorCode::OverConnectionQuota => 4004,
            ErrorCode::PathNotFound => 4005,
            ErrorCode::InvalidVersion => 4006,
            ErrorCode::UnsupportedVersion => 4007,
            ErrorCode::NoVersion => 4008,
            ErrorCode::Unauthorized => 4009,
            ErrorCode::OverCapacity => 4100,
            ErrorCode::ReconnectNow => 4200,
            ErrorCode::PongNotReceived => 4201,
            ErrorCode::Inactive => 4202,
            ErrorCode::ClientEventRateLimit => 4301,
        }
    }

    /// What a client does after it, from the code's range.
    pub fn retry(self) -> Retry {
        retry_of(self.code())
    }

    /// The message sent with it (no input of the peer is echoed).
    pub fn message(self) -> &'static str {
        match self {
            ErrorCode::TlsOnly => "Application only accepts TLS connections",
            ErrorCode::AppUnknown => "Application does not exist",
            ErrorCode::AppDisabled => "Application disabled",
            ErrorCode::OverConnectionQuota => "Application is over its connection quota",
            ErrorCode::PathNotFound => "Path not found",
            ErrorCode::InvalidVersion => "Invalid version string format",
            ErrorCode::UnsupportedVersion => "Unsupported protocol version",
            ErrorCode::NoVersion => "No protocol version supplied",
            ErrorCode::Unauthorized => "Connection is unauthorized",
            ErrorCode::OverCapacity => "Over capacity",
            ErrorCode::ReconnectNow => "Reconnect now",
            ErrorCode::PongNotReceived => "Pong reply not received",
            ErrorCode::Inactive => "Closed after inactivity",
            ErrorCode::ClientEventRateLimit => "Client event rejected due to rate limit",
        }
    }

    /// Whether the connection is closed with this code (4000–4299) rather than only told.
    pub fn closes(self) -> bool {
        !matches!(self.retry(), Retry::NoClose)
    }
}

/// The class of any code a client may receive.
pub fn retry_of(code: u16) -> Retry {
    match code {
        4000..=4099 => Retry::Never,
        4100..=4199 => Retry::BackOff,
        4200..=4299 => Retry::Now,
        _ => Retry::NoClose,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [ErrorCode; 14] = [
        ErrorCode::TlsOnly,
        ErrorCode::AppUnknown,
        ErrorCode::AppDisabled,
        ErrorCode::OverConnectionQuota,
        ErrorCode::PathNotFound,
        ErrorCode::InvalidVersion,
        ErrorCode::UnsupportedVersion,
        ErrorCode::NoVersion,
        ErrorCode::Unauthorized,
        ErrorCode::OverCapacity,
        ErrorCode::ReconnectNow,
        ErrorCode::PongNotReceived,
        ErrorCode::Inactive,
        ErrorCode::ClientEventRateLimit,
    ];

    #[test]
    fn the_codes_pusher_js_acts_on_have_their_documented_numbers() {
        assert_eq!(ErrorCode::AppUnknown.code(), 4001);
        assert_eq!(ErrorCode::OverConnectionQuota.code(), 4004);
        assert_eq!(ErrorCode::Unauthorized.code(), 4009);
        assert_eq!(ErrorCode::OverCapacity.code(), 4100);
        assert_eq!(ErrorCode::PongNotReceived.code(), 4201);
        assert_eq!(ErrorCode::ClientEventRateLimit.code(), 4301);
    }

    #[test]
    fn each_code_is_in_the_range_of_what_the_client_should_do() {
        assert_eq!(ErrorCode::AppUnknown.retry(), Retry::Never);
        assert_eq!(ErrorCode::OverConnectionQuota.retry(), Retry::Never);
        assert_eq!(ErrorCode::Unauthorized.retry(), Retry::Never);
        assert_eq!(ErrorCode::OverCapacity.retry(), Retry::BackOff);
        assert_eq!(ErrorCode::ReconnectNow.retry(), Retry::Now);
        assert_eq!(ErrorCode::Inactive.retry(), Retry::Now);
        assert_eq!(ErrorCode::ClientEventRateLimit.retry(), Retry::NoClose);
        assert!(!ErrorCode::ClientEventRateLimit.closes());
        let mut seen = std::collections::HashSet::new();
        for c in ALL {
            assert!(seen.insert(c.code()), "{c:?} repeats a number");
            assert!((4000..4400).contains(&c.code()));
            assert!(!c.message().is_empty());
        }
    }
}
