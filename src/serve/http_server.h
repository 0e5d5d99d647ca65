// kvrun serve's HTTP side (cpp-httplib): the routes of OpenAI's API and
// llama-server's extras over the Engine. It listens before the model is
// loaded (/health answers 503 until attach()), answers every error with
// OpenAI's error object, and never serves or writes a file.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "api.h"
#include "engine.h"
#include "loader.h"

namespace kvrun::serve {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;         // 0: any free port (port() tells which)
    std::string api_key;     // "" = none
    std::string cors_origin; // "" = no CORS headers
    size_t max_body = 8u << 20;
    int read_timeout_s = 30, write_timeout_s = 30, keep_alive_s = 5;
    int http_threads = 32; // connections served at once (a stream holds one)
    bool verbose = false;
};

// What the routes need once the model is loaded.
struct Service {
    const LoadedModel* lm = nullptr;
    const ApiReader* api = nullptr;
    Engine* engine = nullptr;
    int64_t n_ctx = 0;
    int parallel = 0;
    int64_t created = 0;     // /v1/models' "created": when the model was loaded
    bool fixed_seed = false; // --seed given: requests without "seed" use it, not a random one
};

class HttpServer {
  public:
    explicit HttpServer(ServerOptions o);
    ~HttpServer();
    // Binds the port (throws Error(usage) when it cannot) and starts
    // answering in a thread of its own.
    void start();
    int port() const { return port_; }
    void attach(const Service& s); // ready
    // Shutdown, first: new requests get 503 while in-flight ones go on.
    void drain() { draining_ = true; }
    // Answers in flight: submitted, and not yet ready (a whole answer) or
    // not yet sent to the last byte (a stream).
    int in_flight() const;
    // Then: closes the port and waits for every connection to end.
    void stop();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    int port_ = 0;
    std::atomic<bool> draining_{false};
    std::atomic<bool> listener_ended_{false};
    std::thread listener_;
};

} // namespace kvrun::serve
