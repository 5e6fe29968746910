//! Pusher channel names: which names are valid, and what kind of channel a name is (its
//! prefix decides whether subscribing needs a signature, carries a member, relays ciphertext
//! or replays the last event).

/// Longest channel name, in bytes, as Pusher allows.
pub const MAX_CHANNEL_LEN: usize = 164;

/// What a channel's prefix makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No prefix: anyone may subscribe.
    Public,
    /// `private-`: subscribing needs the application's signature over socket and channel.
    Private,
    /// `private-encrypted-`: private, and the payloads are end-to-end encrypted (the server
    /// relays them and never triggers client events on it).
    PrivateEncrypted,
    /// `presence-`: private, with a member (`channel_data`) signed in the signature.
    Presence,
}

/// A valid channel name, classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// Who may subscribe and what the subscription carries.
    pub access: Access,
    /// A `cache-` channel (`cache-`, `private-cache-`, `private-encrypted-cache-`,
    /// `presence-cache-`): a new subscriber gets the last event, or `pusher:cache_miss`.
    pub cache: bool,
}

impl Kind {
    /// Whether subscribing needs an `auth` signature.
    pub fn needs_auth(self) -> bool {
        match self.access {
            Access::Public => false,
            Access::Private | Access::PrivateEncrypted | Access::Presence => true,
        }
    }

    /// Whether clients may send `client-` events on it (when the application allows them):
    /// private and presence channels, not public ones nor encrypted ones (the server could not
    /// check what it cannot read).
    pub fn allows_client_events(self) -> bool {
        match self.access {
            Access::Private | Access::Presence => true,
            Access::Public | Access::PrivateEncrypted => false,
        }
    }
}

/// Why a channel name was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// Empty.
    #[error("channel name is empty")]
    Empty,
    /// Longer than [`MAX_CHANNEL_LEN`].
    #[error("channel name longer than 164 characters")]
    TooLong,
    /// A byte outside `[A-Za-z0-9_-=@,.;]`.
    #[error("channel names may only contain A-Z a-z 0-9 _ - = @ , . ;")]
    BadChar,
    /// A prefix that names a kind without a name after it (`private-`, `presence-cache-`).
    #[error("channel name is only a prefix")]
    OnlyPrefix,
}

fn channel_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'=' | b'@' | b',' | b'.' | b';')
}

/// Checks a channel name and says what kind of channel it is.
pub fn classify(name: &str) -> Result<Kind, ChannelError> {
    if name.is_empty() {
        return Err(ChannelError::Empty);
    }
    if name.len() > MAX_CHANNEL_LEN {
        return Err(ChannelError::TooLong);
    }
    if !name.bytes().all(channel_byte) {
        return Err(ChannelError::BadChar);
    }
    // Longest prefixes first: `private-encrypted-` before `private-`.
    let (access, rest) = if let Some(r) = name.strip_prefix("private-encrypted-") {
        (Access::PrivateEncrypted, r)
    } else if let Some(r) = name.strip_prefix("private-") {
        (Access::Private, r)
    } else if let Some(r) = name.strip_prefix("presence-") {
        (Access::Presence, r)
    } else {
        (Access::Public, name)
    };
    let (cache, rest) = match rest.strip_prefix("cache-") {
        Some(r) => (true, r),
        None => (false, rest),
    };
    if rest.is_empty() {
        return Err(ChannelError::OnlyPrefix);
    }
    Ok(Kind { access, cache })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(access: Access, cache: bool) -> Result<Kind, ChannelError> {
        Ok(Kind { access, cache })
    }

    #[test]
    fn prefixes_and_their_combinations_name_the_kind() {
        assert_eq!(classify("my-channel"), kind(Access::Public, false));
        assert_eq!(classify("private-foobar"), kind(Access::Private, false));
        assert_eq!(
            classify("private-encrypted-x"),
            kind(Access::PrivateEncrypted, false)
        );
        assert_eq!(classify("presence-room"), kind(Access::Presence, false));
        assert_eq!(classify("cache-ticker"), kind(Access::Public, true));
        assert_eq!(classify("private-cache-a"), kind(Access::Private, true));
        assert_eq!(
            classify("private-encrypted-cache-a"),
            kind(Access::PrivateEncrypted, true)
        );
        assert_eq!(classify("presence-cache-a"), kind(Access::Presence, true));
        // A prefix in the middle is only a name.
        assert_eq!(classify("my-private-x"), kind(Access::Public, false));
    }

    #[test]
    fn names_outside_the_rules_are_refused_with_the_reason() {
        assert_eq!(classify(""), Err(ChannelError::Empty));
        assert_eq!(classify(&"a".repeat(165)), Err(ChannelError::TooLong));
        assert!(classify(&"a".repeat(164)).is_ok());
        assert_eq!(classify("a b"), Err(ChannelError::BadChar));
        assert_eq!(classify("a/b"), Err(ChannelError::BadChar));
        assert_eq!(classify("é"), Err(ChannelError::BadChar));
        assert_eq!(classify("private-"), Err(ChannelError::OnlyPrefix));
        assert_eq!(classify("presence-cache-"), Err(ChannelError::OnlyPrefix));
        assert!(classify("a=b,c;d@e.f_g-h").is_ok());
    }

    #[test]
    fn only_private_and_presence_channels_take_client_events() {
        let k = |n| classify(n).map(Kind::allows_client_events);
        assert_eq!(k("public"), Ok(false));
        assert_eq!(k("private-a"), Ok(true));
        assert_eq!(k("presence-a"), Ok(true));
        assert_eq!(k("private-encrypted-a"), Ok(false));
        assert_eq!(classify("cache-a").map(Kind::needs_auth), Ok(false));
        assert_eq!(classify("private-cache-a").map(Kind::needs_auth), Ok(true));
    }
}
