// µWebSockets C++ as a benchmark peer, speaking what `clarion bench` speaks: WebSocket
// subscribers on /ws?topic=T (subscribed to T when they open, nothing else), and Clarion's
// publish batch (POST /publish, {"messages":[{"topic":..,"data":..}]}) on a second port, each
// message's data published as one text message to its topic with µWebSockets' own topic tree.
//
//   uws_server PORT API_PORT [THREADS [CERT KEY]]
//
// THREADS (default 1) event loops, each with its own apps listening on both ports (uSockets
// listens with SO_REUSEPORT, so the kernel spreads connections over them); a publish reaching
// any loop is handed to every loop with Loop::defer, as µWebSockets' threaded examples do.
// With CERT and KEY (PEM files) the client port is TLS (µWebSockets' SSLApp over OpenSSL; the
// binary must be built with `build_uws.sh --tls`); the API port stays clear text.
// Built by bench/peers/build_uws.sh against a µWebSockets checkout that is not part of this
// repository. Benchmark payloads need no JSON escapes; a body this parser cannot read is 400.
#include "App.h"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

struct Sub {
    std::string topic;
};

using Batch = std::vector<std::pair<std::string, std::string>>;

struct Peer {
    uWS::Loop *loop;
    // Publishes a batch on this loop's client app (clear or TLS).
    std::function<void(const Batch &)> publish;
};

std::mutex peersLock;
std::vector<Peer> peers;

// The string value after `"key":` in [from, to) of s, or false.
bool stringField(std::string_view obj, std::string_view key, std::string &out) {
    std::string pat = "\"" + std::string(key) + "\":\"";
    size_t at = obj.find(pat);
    if (at == std::string_view::npos) return false;
    at += pat.size();
    size_t end = obj.find('"', at);
    if (end == std::string_view::npos) return false;
    out.assign(obj.substr(at, end - at));
    return true;
}

// Every {"topic","data"} object of a batch, in order; false when the body is not one.
bool parseBatch(std::string_view body, Batch &out) {
    size_t at = body.find("\"messages\"");
    if (at == std::string_view::npos) return false;
    at = body.find('[', at);
    if (at == std::string_view::npos) return false;
    for (;;) {
        size_t open = body.find('{', at);
        if (open == std::string_view::npos) break;
        size_t close = body.find('}', open);
        if (close == std::string_view::npos) return false;
        std::string_view obj = body.substr(open, close - open + 1);
        std::string topic, data;
        if (!stringField(obj, "topic", topic) || !stringField(obj, "data", data)) return false;
        out.emplace_back(std::move(topic), std::move(data));
        at = close + 1;
    }
    return true;
}

void publishEverywhere(Batch batch) {
    auto shared = std::make_shared<Batch>(std::move(batch));
    std::lock_guard<std::mutex> g(peersLock);
    for (Peer &p : peers) {
        auto publish = p.publish;
        p.loop->defer([publish, shared] { publish(*shared); });
    }
}

void listenOrExit(auto &app, int p) {
    app.listen("127.0.0.1", p, [p](auto *token) {
        if (!token) {
            std::fprintf(stderr, "cannot listen on %d\n", p);
            std::exit(1);
        }
    });
}

// One event loop: the client app (TLS when SSL) on PORT and a clear-text API app on API_PORT.
template <bool SSL>
void runLoop(int port, int apiPort, uWS::SocketContextOptions tls) {
    uWS::TemplatedApp<SSL> app(tls);
    app.template ws<Sub>("/ws", {
        .compression = uWS::DISABLED,
        .maxPayloadLength = 16 * 1024,
        .idleTimeout = 0,
        .maxBackpressure = 64 * 1024 * 1024,
        .closeOnBackpressureLimit = false,
        .resetIdleTimeoutOnSend = false,
        .sendPingsAutomatically = false,
        .upgrade = [](auto *res, auto *req, auto *context) {
            std::string topic(req->getQuery("topic"));
            res->template upgrade<Sub>({std::move(topic)}, req->getHeader("sec-websocket-key"),
                req->getHeader("sec-websocket-protocol"), req->getHeader("sec-websocket-extensions"),
                context);
        },
        .open = [](auto *ws) { ws->subscribe(ws->getUserData()->topic); },
    });
    uWS::App api;
    api.post("/publish", [](auto *res, auto * /*req*/) {
        auto body = std::make_shared<std::string>();
        res->onAborted([] {});
        res->onData([res, body](std::string_view chunk, bool last) {
            body->append(chunk);
            if (!last) return;
            Batch batch;
            if (!parseBatch(*body, batch)) {
                res->writeStatus("400 Bad Request")->end("not a publish batch");
                return;
            }
            publishEverywhere(std::move(batch));
            res->end("ok");
        });
    });
    listenOrExit(app, port);
    listenOrExit(api, apiPort);
    {
        std::lock_guard<std::mutex> g(peersLock);
        peers.push_back({uWS::Loop::get(), [&app](const Batch &batch) {
            for (auto &[topic, data] : batch) app.publish(topic, data, uWS::OpCode::TEXT, false);
        }});
    }
    std::printf("ready %d\n", port);
    std::fflush(stdout);
    app.run();
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 3 || argc == 5 || argc > 6) {
        std::fprintf(stderr, "usage: uws_server PORT API_PORT [THREADS [CERT KEY]]\n");
        return 2;
    }
    int port = std::atoi(argv[1]), apiPort = std::atoi(argv[2]);
    int threads = argc > 3 ? std::atoi(argv[3]) : 1;
    if (port <= 0 || apiPort <= 0 || threads <= 0) {
        std::fprintf(stderr, "bad arguments\n");
        return 2;
    }
    uWS::SocketContextOptions tls{};
    bool ssl = argc == 6;
    if (ssl) {
        tls.cert_file_name = argv[4];
        tls.key_file_name = argv[5];
    }
    auto loop = [ssl, port, apiPort, tls] {
        if (ssl) {
            runLoop<true>(port, apiPort, tls);
        } else {
            runLoop<false>(port, apiPort, tls);
        }
    };
    std::vector<std::thread> others;
    for (int i = 1; i < threads; i++) others.emplace_back(loop);
    loop();
    for (auto &t : others) t.join();
}
