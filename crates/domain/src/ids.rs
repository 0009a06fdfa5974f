//! Slack identifiers as newtypes. Each is parsed once at the edge; afterwards a
//! value of the type is known to be well formed.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{kind} is empty")]
    Empty { kind: &'static str },
    #[error("{kind} is longer than {max} characters")]
    TooLong { kind: &'static str, max: usize },
    #[error("{kind} contains a character outside [A-Za-z0-9_-]")]
    BadChar { kind: &'static str },
    #[error("{kind} is not a Slack timestamp of the form <seconds>.<micros>")]
    BadTs { kind: &'static str },
}

const MAX_ID_LEN: usize = 64;

fn check_id(kind: &'static str, s: &str) -> Result<(), IdError> {
    if s.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if s.len() > MAX_ID_LEN {
        return Err(IdError::TooLong {
            kind,
            max: MAX_ID_LEN,
        });
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(IdError::BadChar { kind });
    }
    Ok(())
}

macro_rules! slack_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub fn parse(s: impl Into<String>) -> Result<Self, IdError> {
                let s = s.into();
                check_id($kind, &s)?;
                Ok(Self(s))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::parse(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }
    };
}

slack_id!(
    /// A Slack app (`api_app_id`, `A…`).
    AppId, "api_app_id"
);
slack_id!(
    /// A workspace (`T…`).
    TeamId, "team_id"
);
slack_id!(
    /// An Enterprise Grid organisation (`E…`).
    EnterpriseId, "enterprise_id"
);
slack_id!(
    /// One Events API event (`Ev…`), shared by every delivery and retry of it.
    EventId, "event_id"
);
slack_id!(
    /// A conversation: channel, private channel, DM or multi-person DM.
    ChannelId, "channel"
);
slack_id!(
    /// A user or bot user (`U…`, `W…`).
    UserId, "user"
);
slack_id!(
    /// A bot (`B…`), distinct from the bot's user id.
    BotId, "bot_id"
);

/// A Slack message timestamp (`"1595926230.009600"`): the message's id within
/// its channel. Kept as the exact string Slack sent; ordering compares the
/// numeric parts so `"9.1" < "10.0"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ts(String);

impl Ts {
    pub fn parse(s: impl Into<String>) -> Result<Self, IdError> {
        let s = s.into();
        let kind = "ts";
        let (secs, micros) = s.split_once('.').ok_or(IdError::BadTs { kind })?;
        let digits =
            |p: &str| !p.is_empty() && p.len() <= 20 && p.bytes().all(|b| b.is_ascii_digit());
        if !digits(secs) || !digits(micros) {
            return Err(IdError::BadTs { kind });
        }
        Ok(Self(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn parts(&self) -> (u64, u64) {
        let (a, b) = self.0.split_once('.').unwrap_or((&self.0, "0"));
        (a.parse().unwrap_or(u64::MAX), b.parse().unwrap_or(u64::MAX))
    }
}

impl PartialOrd for Ts {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ts {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts()
            .cmp(&other.parts())
            .then_with(|| self.0.cmp(&other.0))
    }
}

impl fmt::Display for Ts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether a channel id names a direct message with the app (`D…`): the
/// one place this is decided (the assistant pane lives there, DMs have a
/// policy of their own).
pub fn is_dm(channel: &str) -> bool {
    channel.starts_with('D')
}

impl ChannelId {
    /// A direct message with the app (see [`is_dm`]).
    pub fn is_dm(&self) -> bool {
        is_dm(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_accept_slack_shapes_seen_in_fixtures() {
        for s in [
            "T111",
            "E-auth",
            "T_INSTALLED",
            "Ev111",
            "EXXXXXXXXXXX",
            "A0B1C2",
        ] {
            assert!(TeamId::parse(s).is_ok(), "{s}");
        }
    }

    #[test]
    fn ids_reject_empty_long_and_odd_characters() {
        assert_eq!(TeamId::parse(""), Err(IdError::Empty { kind: "team_id" }));
        assert!(matches!(
            TeamId::parse("T".repeat(65)),
            Err(IdError::TooLong { .. })
        ));
        assert!(matches!(
            ChannelId::parse("C1 2"),
            Err(IdError::BadChar { .. })
        ));
        assert!(matches!(
            EventId::parse("Ev1\n"),
            Err(IdError::BadChar { .. })
        ));
    }

    #[test]
    fn ts_parses_and_orders_numerically() {
        let a = Ts::parse("9.000100").expect("valid");
        let b = Ts::parse("10.000000").expect("valid");
        assert!(a < b);
        assert!(Ts::parse("1595926230.009600").is_ok());
        for bad in ["", "1595926230", ".1", "1.", "1.2.3", "a.1", "-1.0"] {
            assert!(Ts::parse(bad).is_err(), "{bad:?}");
        }
    }
}
