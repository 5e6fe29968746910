//! What the server side of a connection advertises to its client and enforces
//! ([`super::server::Connection`]), with defaults for an internet-facing server.

/// What this side advertises and enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`.
    pub max_streams: u32,
    /// `SETTINGS_INITIAL_WINDOW_SIZE`: what a client may send on a stream before we read it.
    pub initial_window: u32,
    /// `SETTINGS_MAX_HEADER_LIST_SIZE`: decoded request header bytes (RFC 7541 sizes).
    pub max_header_list: u32,
    /// `SETTINGS_HEADER_TABLE_SIZE`: the HPACK dynamic table a client may fill once it has
    /// acknowledged this side's SETTINGS (before that, the default 4,096). A smaller size
    /// frees the fields a browser indexed in its first requests (user agent, cookies, client
    /// hints: hundreds of bytes) at the acknowledgement instead of keeping them for the
    /// connection's life; the default stays 4,096 because some clients (h2spec, hand-written
    /// ones) ignore the setting and then refer to entries the server no longer has.
    pub header_table: u32,
    /// `SETTINGS_ENABLE_CONNECT_PROTOCOL` (RFC 8441): WebSockets over HTTP/2.
    pub connect_protocol: bool,
    /// Not advertised: requests become heads without `connection: close`
    /// ([`super::request::Builder::finish_keep_alive`]), for a caller that serves the streams one after
    /// another over one HTTP/1.1 byte stream.
    pub keep_alive_heads: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            max_streams: 256,
            initial_window: 65_535,
            max_header_list: 16_384,
            header_table: 4_096,
            connect_protocol: true,
            keep_alive_heads: false,
        }
    }
}
