//! Pusher applications: `id` (in the HTTP API's paths), `key` (in client URLs and signatures),
//! `secret` (signs everything) and per-application limits. Configured as `[[pusher_apps]]`
//! tables in the file, and one application from flags or the environment
//! (`pusher_app_id`, `pusher_app_key`, `pusher_app_secret`). A secret never appears in `Debug`
//! output, logs or errors.

use std::fmt;

use serde::Deserialize;

use super::{Config, ConfigError};

/// One application as configured.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// The application id (`/apps/{id}/...`): 1 to 64 of `A-Z a-z 0-9 _ -`.
    pub id: String,
    /// The public key clients connect with (`/app/{key}`): 1 to 128 printable characters, no
    /// `:` (the signature strings are `key:signature`).
    pub key: String,
    /// The secret that signs API requests, channel authorizations and webhooks.
    pub secret: String,
    /// Whether clients may send `client-` events (off, as on Pusher, until enabled).
    #[serde(default)]
    pub enable_client_messages: bool,
    /// Most connections at once (`0`: no limit of its own); past it a client gets 4004.
    #[serde(default)]
    pub max_connections: usize,
    /// Client events one connection may send per second (Pusher: 10).
    #[serde(default = "default_client_event_rate")]
    pub client_event_rate: u32,
    /// Largest `data` of one event, in bytes (Pusher: 10 KB).
    #[serde(default = "default_max_event_bytes")]
    pub max_event_bytes: usize,
    /// Most events in one batch trigger (Pusher: 10).
    #[serde(default = "default_max_batch")]
    pub max_batch_events: usize,
    /// Where Pusher's webhooks are sent (`http://...`); none when unset.
    #[serde(default)]
    pub webhook_url: Option<String>,
}

fn default_client_event_rate() -> u32 {
    10
}
fn default_max_event_bytes() -> usize {
    10 * 1024
}
fn default_max_batch() -> usize {
    10
}

/// Largest `max_event_bytes`: an event is one message of the server's, which keeps history
/// and per-connection queues in bounds with `max_publish_size`.
const MAX_EVENT_BYTES_CAP: usize = 1024 * 1024;
/// Largest `max_batch_events`.
const MAX_BATCH_CAP: usize = 1000;

impl fmt::Debug for AppConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppConfig")
            .field("id", &self.id)
            .field("key", &self.key)
            .field("secret", &crate::redact::HIDDEN)
            .field("enable_client_messages", &self.enable_client_messages)
            .field("max_connections", &self.max_connections)
            .field("client_event_rate", &self.client_event_rate)
            .field("max_event_bytes", &self.max_event_bytes)
            .field("max_batch_events", &self.max_batch_events)
            .field(
                "webhook_url",
                &self.webhook_url.as_deref().map(crate::redact::Urls),
            )
            .finish()
    }
}

impl AppConfig {
    /// The protocol limits of this application.
    pub fn limits(&self) -> clarion_proto::pusher::Limits {
        clarion_proto::pusher::Limits {
            max_event_data: self.max_event_bytes,
            max_batch: self.max_batch_events,
            ..Default::default()
        }
    }

    fn check(&self) -> Result<(), String> {
        let id_ok = !self.id.is_empty()
            && self.id.len() <= 64
            && self
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !id_ok {
            return Err(format!(
                "pusher app id {:?}: 1 to 64 of A-Z a-z 0-9 _ -",
                self.id
            ));
        }
        let key_ok = !self.key.is_empty()
            && self.key.len() <= 128
            && self.key.bytes().all(|b| b.is_ascii_graphic() && b != b':');
        if !key_ok {
            return Err(format!(
                "pusher app {}: key must be 1 to 128 printable characters without ':'",
                self.id
            ));
        }
        if self.secret.is_empty() || self.secret.len() > 256 {
            return Err(format!(
                "pusher app {}: secret must be 1 to 256 bytes",
                self.id
            ));
        }
        if let Some(url) = &self.webhook_url {
            if !url.starts_with("http://") {
                return Err(format!(
                    "pusher app {}: webhook_url {:?}: only http:// is supported",
                    self.id,
                    crate::redact::Urls(url)
                ));
            }
        }
        if self.max_event_bytes == 0 || self.max_event_bytes > MAX_EVENT_BYTES_CAP {
            return Err(format!(
                "pusher app {}: max_event_bytes is 1 to {MAX_EVENT_BYTES_CAP}",
                self.id
            ));
        }
        if self.max_batch_events == 0 || self.max_batch_events > MAX_BATCH_CAP {
            return Err(format!(
                "pusher app {}: max_batch_events is 1 to {MAX_BATCH_CAP}",
                self.id
            ));
        }
        Ok(())
    }
}

impl Config {
    /// The application given by flags or environment, if any (all three parts set).
    fn pusher_flag_app(&self) -> Option<AppConfig> {
        Some(AppConfig {
            id: self.pusher_app_id.clone()?,
            key: self.pusher_app_key.clone()?,
            secret: self.pusher_app_secret.clone()?,
            enable_client_messages: self.pusher_client_messages,
            max_connections: 0,
            client_event_rate: default_client_event_rate(),
            max_event_bytes: default_max_event_bytes(),
            max_batch_events: default_max_batch(),
            webhook_url: self.pusher_webhook_url.clone(),
        })
    }

    /// Whether any Pusher application is configured.
    pub fn pusher_enabled(&self) -> bool {
        !self.pusher_apps.is_empty() || self.pusher_app_id.is_some()
    }

    /// The application with this id (`/apps/{id}/...`).
    pub fn pusher_app(&self, id: &str) -> Option<AppConfig> {
        match self.pusher_apps.iter().find(|a| a.id == id) {
            Some(a) => Some(a.clone()),
            None => self.pusher_flag_app().filter(|a| a.id == id),
        }
    }

    /// The application with this key (`auth_key`).
    pub fn pusher_app_by_key(&self, key: &str) -> Option<AppConfig> {
        match self.pusher_apps.iter().find(|a| a.key == key) {
            Some(a) => Some(a.clone()),
            None => self.pusher_flag_app().filter(|a| a.key == key),
        }
    }

    /// Every configured application: the file's, then the one from flags.
    pub fn pusher_all(&self) -> Vec<AppConfig> {
        self.pusher_apps
            .iter()
            .cloned()
            .chain(self.pusher_flag_app())
            .collect()
    }

    /// Checks the Pusher applications: the flag trio complete, each valid, ids and keys unique.
    pub(crate) fn validate_pusher(&self) -> Result<(), ConfigError> {
        let parts = [
            self.pusher_app_id.is_some(),
            self.pusher_app_key.is_some(),
            self.pusher_app_secret.is_some(),
        ];
        if parts.iter().any(|p| *p) && !parts.iter().all(|p| *p) {
            return Err(ConfigError::Invalid(
                "pusher_app_id, pusher_app_key and pusher_app_secret go together: set all three \
                 (or use [[pusher_apps]] in the file)"
                    .into(),
            ));
        }
        let all: Vec<AppConfig> = self
            .pusher_apps
            .iter()
            .cloned()
            .chain(self.pusher_flag_app())
            .collect();
        for (i, a) in all.iter().enumerate() {
            a.check().map_err(ConfigError::Invalid)?;
            for b in all.iter().skip(i + 1) {
                if a.id == b.id {
                    return Err(ConfigError::Invalid(format!(
                        "two pusher apps have the id {:?}",
                        a.id
                    )));
                }
                if a.key == b.key {
                    return Err(ConfigError::Invalid(format!(
                        "pusher apps {} and {} have the same key",
                        a.id, b.id
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn with_file(toml_text: &str) -> Result<Config, String> {
        let c: Config = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        c.validate_pusher().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn apps_from_the_file_are_found_by_id_with_defaults() {
        let c = with_file(
            "[[pusher_apps]]\nid = \"app1\"\nkey = \"key1\"\nsecret = \"s3cret\"\n\
             enable_client_messages = true\nmax_connections = 5\n",
        )
        .unwrap();
        let a = c.pusher_app("app1").unwrap();
        assert_eq!((a.key.as_str(), a.max_connections), ("key1", 5));
        assert!(a.enable_client_messages);
        assert_eq!(
            (a.client_event_rate, a.max_event_bytes, a.max_batch_events),
            (10, 10240, 10)
        );
        assert!(c.pusher_app("app2").is_none());
        assert_eq!(c.pusher_app_by_key("key1").unwrap().id, "app1");
        assert!(c.pusher_app_by_key("app1").is_none());
        assert!(c.pusher_enabled());
    }

    #[test]
    fn the_flag_app_needs_all_three_parts() {
        let mut c = Config {
            pusher_app_id: Some("1".into()),
            ..Default::default()
        };
        let e = c.validate_pusher().unwrap_err().to_string();
        assert!(e.contains("go together"), "{e}");
        c.pusher_app_key = Some("k".into());
        c.pusher_app_secret = Some("s".into());
        c.validate_pusher().unwrap();
        assert_eq!(c.pusher_app("1").unwrap().secret, "s");
    }

    #[test]
    fn invalid_or_clashing_apps_are_refused_with_the_reason() {
        let app = |id: &str, key: &str| {
            format!("[[pusher_apps]]\nid = \"{id}\"\nkey = \"{key}\"\nsecret = \"s\"\n")
        };
        let e = with_file(&format!("{}{}", app("a", "k"), app("a", "k2"))).unwrap_err();
        assert!(e.contains("two pusher apps have the id"), "{e}");
        let e = with_file(&format!("{}{}", app("a", "k"), app("b", "k"))).unwrap_err();
        assert!(e.contains("same key"), "{e}");
        let e = with_file(&app("a b", "k")).unwrap_err();
        assert!(e.contains("A-Z a-z 0-9"), "{e}");
        let e = with_file(&app("a", "k:1")).unwrap_err();
        assert!(e.contains("without ':'"), "{e}");
        let e = with_file("[[pusher_apps]]\nid = \"a\"\nkey = \"k\"\nsecret = \"s\"\ncolour = 1\n")
            .unwrap_err();
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn a_webhook_url_comes_from_the_file_or_the_flag_and_must_be_http() {
        let c = with_file(
            "[[pusher_apps]]\nid = \"a\"\nkey = \"k\"\nsecret = \"s\"\n\
             webhook_url = \"http://127.0.0.1:9/pusher\"\n",
        )
        .unwrap();
        let url = c.pusher_app("a").unwrap().webhook_url;
        assert_eq!(url.as_deref(), Some("http://127.0.0.1:9/pusher"));
        let e = with_file(
            "[[pusher_apps]]\nid = \"a\"\nkey = \"k\"\nsecret = \"s\"\n\
             webhook_url = \"https://example.com/\"\n",
        )
        .unwrap_err();
        assert!(e.contains("only http://"), "{e}");
        let c = Config {
            pusher_app_id: Some("1".into()),
            pusher_app_key: Some("k".into()),
            pusher_app_secret: Some("s".into()),
            pusher_webhook_url: Some("http://127.0.0.1:9/h".into()),
            ..Default::default()
        };
        c.validate_pusher().unwrap();
        let url = c.pusher_app("1").unwrap().webhook_url;
        assert_eq!(url.as_deref(), Some("http://127.0.0.1:9/h"));
    }

    #[test]
    fn the_secret_is_never_in_debug_output() {
        let c =
            with_file("[[pusher_apps]]\nid = \"a\"\nkey = \"k\"\nsecret = \"hunter2-secret\"\n")
                .unwrap();
        let mut c2 = c.clone();
        c2.pusher_app_id = Some("b".into());
        c2.pusher_app_key = Some("k2".into());
        c2.pusher_app_secret = Some("flag-secret-value".into());
        let text = format!("{c2:?} {c2:#?}");
        assert!(!text.contains("hunter2-secret"), "{text}");
        assert!(!text.contains("flag-secret-value"), "{text}");
        assert!(text.contains("\"k\""));
    }
}
