//! Checks of a loaded configuration that no single setting can make: paths that collide,
//! settings that need one another, limits that contradict each other.

use super::{limits, Config, ConfigError};

impl Config {
    /// Checks relations between values that each parse fine on their own.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let paths = [
            ("ws_path", Some(&self.ws_path)),
            ("sse_path", Some(&self.sse_path)),
            ("poll_path", Some(&self.poll_path)),
            ("stream_path", Some(&self.stream_path)),
            ("echo_path", self.echo_path.as_ref()),
        ];
        for (i, (name, path)) in paths.iter().enumerate() {
            let Some(p) = path else { continue };
            if !p.starts_with('/') {
                return Err(ConfigError::Invalid(format!("{name} must start with '/'")));
            }
            for (other, q) in paths.iter().skip(i + 1) {
                if q.is_some_and(|q| q == *p) {
                    return Err(ConfigError::Invalid(format!(
                        "{name} and {other} must differ"
                    )));
                }
            }
        }
        if !(1..=9).contains(&self.compression_level)
            || !(9..=15).contains(&self.compression_window_bits)
            || !(9..=15).contains(&self.compression_client_window_bits)
        {
            return Err(ConfigError::Invalid(
                "compression_level is 1 to 9; compression_window_bits and \
                 compression_client_window_bits are 9 to 15"
                    .into(),
            ));
        }
        if self.poll_timeout > self.poll_max_timeout {
            return Err(ConfigError::Invalid(
                "poll_timeout must not exceed poll_max_timeout".into(),
            ));
        }
        if self.poll_max_timeout > 3600 || self.history_ttl > u64::from(u32::MAX) {
            return Err(ConfigError::Invalid(
                "poll_max_timeout is at most 3600 s and history_ttl at most 2^32 s".into(),
            ));
        }
        if self
            .cors_allow_origin
            .bytes()
            .any(|b| b < 0x20 || b == 0x7f)
        {
            return Err(ConfigError::Invalid(
                "cors_allow_origin must not contain control characters".into(),
            ));
        }
        if self.max_message_size == 0 || self.max_backlog == 0 || self.read_buffer < 1024 {
            return Err(ConfigError::Invalid(
                "max_message_size and max_backlog must be > 0, read_buffer >= 1024".into(),
            ));
        }
        if self.ping_interval > 0
            && self.idle_timeout > 0
            && self.ping_interval >= self.idle_timeout
        {
            return Err(ConfigError::Invalid(
                "ping_interval must be below idle_timeout".into(),
            ));
        }
        if self.redis_tls_cert.is_some() != self.redis_tls_key.is_some() {
            return Err(ConfigError::Invalid(
                "redis_tls_cert and redis_tls_key go together: set both for mutual TLS with \
                 Redis, or neither"
                    .into(),
            ));
        }
        let redis_tls = self.redis_tls_ca.is_some()
            || self.redis_tls_cert.is_some()
            || self.redis_tls_server_name.is_some();
        let broker = self.broker.as_deref().unwrap_or("");
        // rediss://, rediss+sentinel:// and rediss+cluster:// all ask for TLS.
        let tls_url = broker.split(',').any(|u| u.trim().starts_with("rediss"));
        if redis_tls && !tls_url {
            // The operator expects an encryption the URLs do not ask for.
            return Err(ConfigError::Invalid(
                "redis_tls_* is set but no broker URL is rediss://: use rediss:// for TLS to \
                 Redis, or remove the redis_tls_* settings"
                    .into(),
            ));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::Invalid(
                "tls_cert and tls_key go together".into(),
            ));
        }
        if self.grip_backend_threads == 0 || self.grip_backend_timeout == 0 {
            return Err(ConfigError::Invalid(
                "grip_backend_threads and grip_backend_timeout must be at least 1".into(),
            ));
        }
        if self.presence_max_members == 0 || self.presence_max_topics == 0 {
            return Err(ConfigError::Invalid(
                "presence_max_members and presence_max_topics must be at least 1".into(),
            ));
        }
        if self.presence_max_info > 16 * 1024 {
            return Err(ConfigError::Invalid(
                "presence_max_info is at most 16384 bytes (it travels with every join and leave)"
                    .into(),
            ));
        }
        for p in &self.presence_topics {
            clarion_proto::auth::Pattern::parse(p)
                .map_err(|e| ConfigError::Invalid(format!("presence_topics {p:?}: {e}")))?;
        }
        for p in &self.delta_topics {
            clarion_proto::auth::Pattern::parse(p)
                .map_err(|e| ConfigError::Invalid(format!("delta_topics {p:?}: {e}")))?;
        }
        if self.hook_threads == 0 || self.hook_timeout_ms == 0 || self.hook_max_in_flight == 0 {
            return Err(ConfigError::Invalid(
                "hook_threads, hook_timeout_ms and hook_max_in_flight must be at least 1".into(),
            ));
        }
        if !matches!(self.hook_connect_with_token.as_str(), "skip" | "call")
            || !matches!(self.hook_on_failure.as_str(), "refuse" | "token")
        {
            return Err(ConfigError::Invalid(
                "hook_connect_with_token is skip or call; hook_on_failure is refuse or token"
                    .into(),
            ));
        }
        if self.dashboard_max_feeds == 0 || self.dashboard_window < 10 {
            return Err(ConfigError::Invalid(
                "dashboard_max_feeds must be at least 1 and dashboard_window at least 10".into(),
            ));
        }
        if !matches!(self.tls_min_version.as_str(), "1.2" | "1.3") {
            return Err(ConfigError::Invalid(
                "tls_min_version is \"1.2\" or \"1.3\"".into(),
            ));
        }
        if self.processes == 0 || self.processes > limits::GROUP_MAX_PROCESSES {
            return Err(ConfigError::Invalid(format!(
                "processes is 1 to {}",
                limits::GROUP_MAX_PROCESSES
            )));
        }
        if self.processes > 1 && self.broker.is_none() {
            return Err(ConfigError::Invalid(format!(
                "processes = {} needs a broker to join them (--broker redis://127.0.0.1:6379, \
                 `broker` in the file or CLARION_BROKER): without one, a publish on one process \
                 would reach only that process's subscribers",
                self.processes
            )));
        }
        if self.history_dir.is_some() {
            if self.broker.is_some() {
                return Err(ConfigError::Invalid(
                    "history_dir is for a server without a broker: with Redis, history lives in \
                     Redis (make Redis durable with AOF); NATS nodes keep history in memory"
                        .into(),
                ));
            }
            if !self.history_limits().enabled() {
                return Err(ConfigError::Invalid(
                    "history_dir needs history: history_size, history_ttl and history_memory \
                     must all be above 0"
                        .into(),
                ));
            }
            if self.history_segment_bytes < 4096 {
                return Err(ConfigError::Invalid(
                    "history_segment_bytes is at least 4096".into(),
                ));
            }
        }
        self.validate_pusher()?;
        self.validate_conflate()?;
        let certs = self.tls_settings().map_or(0, |s| s.certs.len());
        if certs == 0 && (self.tls_listen.is_some() || self.tls_api) {
            return Err(ConfigError::Invalid(
                "tls_listen and tls_api need a certificate (tls_cert and tls_key)".into(),
            ));
        }
        Ok(())
    }
}
