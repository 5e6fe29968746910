//! The two fixed documents of the client listener: `GET /`, a plain answer naming the
//! transports and where publishing goes, and `GET /client.js`, the browser subscriber client
//! (`@clarion/client`, node/client/index.js, compiled in) with the module it imports
//! (`/delta.js`, node/client/delta.js), so that a page needs no CDN and no build step:
//! `import { ClarionClient } from 'http://HOST:8080/client.js'`.
//!
//! Both are static: built from the configuration once per answer, no state, no body read.

use crate::worker::socket::Socket;
use crate::worker::Engine;

/// The browser client, the same bytes as the npm package's `index.js`.
pub const CLIENT_JS: &str = include_str!("../../../../../node/client/index.js");

/// The module the client imports as `./delta.js` (applying deltas), served beside it.
pub const CLIENT_DELTA_JS: &str = include_str!("../../../../../node/client/delta.js");

/// The client's version: its validator (`ETag`), so a browser revalidates with a cheap 304.
const CLIENT_ETAG: &str = concat!("\"clarion-client-", env!("CARGO_PKG_VERSION"), "\"");

/// The paths of the fixed documents.
pub(crate) const INDEX_PATH: &str = "/";
/// See [`INDEX_PATH`].
pub(crate) const CLIENT_JS_PATH: &str = "/client.js";
/// See [`INDEX_PATH`]: where `./delta.js` resolves from [`CLIENT_JS_PATH`].
pub(crate) const CLIENT_DELTA_JS_PATH: &str = "/delta.js";

impl<S: Socket> Engine<S> {
    /// Answers `GET`/`HEAD` for `/` and `/client.js`; other methods get 405.
    pub(crate) fn serve_page(
        &mut self,
        k: u32,
        method: &str,
        path: &str,
        if_none_match: Option<&str>,
        keep: bool,
    ) {
        if method != "GET" && method != "HEAD" {
            self.respond(
                k,
                405,
                &[("Allow", "GET, HEAD")],
                "this page takes GET",
                keep,
            );
            return;
        }
        let head_only = method == "HEAD";
        let module = match path {
            CLIENT_JS_PATH => Some(CLIENT_JS),
            CLIENT_DELTA_JS_PATH => Some(CLIENT_DELTA_JS),
            _ => None,
        };
        if let Some(module) = module {
            let fresh =
                if_none_match.is_some_and(|v| v.split(',').any(|t| t.trim() == CLIENT_ETAG));
            let headers = [
                ("ETag", CLIENT_ETAG),
                // Revalidated on each load (a 304 while the server's version is the same).
                ("Cache-Control", "no-cache"),
                // A module script from another origin needs CORS, and the client is public.
                ("Access-Control-Allow-Origin", "*"),
                ("Content-Type", "text/javascript; charset=utf-8"),
            ];
            let (status, body) = if fresh { (304, "") } else { (200, module) };
            self.document(k, status, &headers, body, head_only, keep);
            return;
        }
        let text = self.index_text();
        let headers = [("Content-Type", "text/plain; charset=utf-8")];
        self.document(k, 200, &headers, &text, head_only, keep);
    }

    /// What `GET /` says: the transports at their configured paths, the client, the API.
    fn index_text(&self) -> String {
        let c = &self.shared.config;
        format!(
            "Clarion {version}: a realtime push server. This is the client listener.\n\
             \n\
             Subscribe to topics with:\n\
             \x20 WebSocket           GET {ws}?topic=NAME (in-band subscribe, permessage-deflate)\n\
             \x20 Server-Sent Events  GET {sse}?topic=NAME (Last-Event-ID resumes)\n\
             \x20 HTTP streaming      GET {stream}?topic=NAME (NDJSON lines)\n\
             \x20 long-polling        GET {poll}?topic=NAME&since=ID\n\
             The browser client: import {{ ClarionClient }} from '{client}' (served here).\n\
             \n\
             Publishing, /healthz, /metrics and the dashboard are on the API listener \
             (api_listen, 127.0.0.1:8081 by default).\n\
             Protocol: docs/protocol.md; clients: docs/clients.md.\n",
            version = env!("CARGO_PKG_VERSION"),
            ws = c.ws_path,
            sse = c.sse_path,
            stream = c.stream_path,
            poll = c.poll_path,
            client = CLIENT_JS_PATH,
        )
    }

    /// An answer with `body` (none for `HEAD`, whose `Content-Length` still says how long it
    /// would be; none for a `304`, which has no length).
    fn document(
        &mut self,
        k: u32,
        status: u16,
        headers: &[(&str, &str)],
        body: &str,
        head_only: bool,
        keep: bool,
    ) {
        let mut all: Vec<(&str, &str)> = Vec::with_capacity(headers.len() + 1);
        all.extend_from_slice(headers);
        if !keep {
            all.push(("Connection", "close"));
        }
        let mut out = Vec::with_capacity(256 + body.len());
        let length = (status != 304).then_some(body.len());
        clarion_proto::http1::write_response_head(&mut out, status, &all, length);
        if !head_only {
            out.extend_from_slice(body.as_bytes());
        }
        self.finish_answer(k, out.into(), keep, status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compiled_in_client_is_the_package_s_module() {
        assert!(CLIENT_JS.contains("export class ClarionClient"));
        // Its one import resolves to the other document served here.
        assert!(CLIENT_JS.contains("from './delta.js';"));
        assert_eq!(CLIENT_JS.matches("\nimport ").count(), 1);
        assert!(CLIENT_DELTA_JS.contains("export function applyDelta"));
        assert!(!CLIENT_DELTA_JS.contains("\nimport "));
        assert!(CLIENT_ETAG.starts_with("\"clarion-client-") && CLIENT_ETAG.ends_with('"'));
    }
}
