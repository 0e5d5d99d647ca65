#include "http_server.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <random>

#include <fmt/format.h>
#include <httplib.h>

#include "error.h"
#include "unicode.h"

namespace kvrun::serve {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Invalid UTF-8 (a byte sequence quoted in an error message) is written as
// U+FFFD rather than failing the answer.
std::string dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump(e.body()), "application/json");
}

ApiError error(int status, std::string message, std::string type, std::string code = "") {
    ApiError e;
    e.status = status;
    e.message = std::move(message);
    e.type = std::move(type);
    e.code = std::move(code);
    return e;
}

// The secret's length is all a caller can learn from the time it takes.
bool same_secret(const std::string& given, const std::string& secret) {
    unsigned diff = given.size() != secret.size();
    for (size_t i = 0; i < secret.size(); i++)
        diff |= static_cast<unsigned char>(i < given.size() ? given[i] : 0) ^
                static_cast<unsigned char>(secret[i]);
    return diff == 0;
}

std::string random_id(const char* prefix) {
    thread_local std::mt19937_64 gen{std::random_device{}()};
    return fmt::format("{}{:016x}{:08x}", prefix, gen(), static_cast<uint32_t>(gen()));
}

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// What a worker thread's request did, for its log line (the logger runs on
// the thread that served it, after the response was written).
struct RequestNote {
    Clock::time_point t0 = Clock::now();
    std::string detail;
};
thread_local RequestNote t_note;

// The body as JSON, or null when it is none (the caller says what it wants).
json body_json(const std::string& body) {
    try {
        return parse_request_json(body);
    } catch (const std::exception&) {
        return nullptr;
    }
}

bool is_completion(const std::string& path) {
    return path == "/v1/chat/completions" || path == "/chat/completions" ||
           path == "/v1/completions" || path == "/completions";
}

// A streamed answer's state, shared by the content provider's calls.
struct Stream {
    ApiCall call;
    std::string id;
    int64_t created = 0;
    std::shared_ptr<Ticket> ticket;
    Engine* engine = nullptr;
    const Tokenizer* tok = nullptr;
    const Service* service = nullptr;
    std::vector<TokenLogprob> logprobs; // taken, not sent yet (sent with the next text)
    size_t text_offset = 0;
    std::shared_ptr<void> in_flight; // counts the answer in flight until the stream is gone
    Clock::time_point last_write = Clock::now();
    bool role_sent = false, strip = false, finished = false, cancelled = false;
};

} // namespace

struct HttpServer::Impl {
    ServerOptions o;
    httplib::Server svr;
    std::atomic<const Service*> service{nullptr};
    Service svc;
    std::atomic<bool>* draining = nullptr;
    std::mutex metrics_mu;
    std::map<int, uint64_t> statuses; // requests answered, by status
    uint64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    // Completions in flight: from submit until a stream's last byte, or
    // until a whole answer is ready (stop() waits for its write).
    std::atomic<int> in_flight{0};

    // Held while an answer is in flight (shutdown waits for none).
    std::shared_ptr<void> hold() {
        in_flight++;
        return std::shared_ptr<void>(nullptr, [this](void*) { in_flight--; });
    }

    // Why a sequence ended without an answer, as an error.
    static ApiError no_answer(const SeqResult& r, const Service& s) {
        if (r.gen.stop == "error")
            return error(500, "the engine failed: " + s.engine->failure(), "server_error",
                         "engine_failed");
        return error(503, "the server is shutting down", "server_error", "shutting_down");
    }

    // The key and the shutdown, checked after the body was read (a reply
    // sent before would leave the body to be read as the next request).
    bool admitted(const httplib::Request& q, httplib::Response& r) {
        if (!o.api_key.empty() &&
            !same_secret(q.get_header_value("Authorization"), "Bearer " + o.api_key)) {
            send_error(r, error(401, "a valid API key is needed (Authorization: Bearer KEY)",
                                "invalid_request_error", "invalid_api_key"));
            return false;
        }
        if (draining->load() && is_completion(q.path)) {
            r.set_header("Retry-After", "5");
            send_error(r,
                       error(503, "the server is shutting down", "server_error", "shutting_down"));
            return false;
        }
        return true;
    }

    const Service* ready(httplib::Response& res) {
        const Service* s = service.load();
        if (!s) {
            res.set_header("Retry-After", "1");
            send_error(res, error(503, "the model is loading", "unavailable_error", "loading"));
        }
        return s;
    }

    void count(const SeqResult& r) {
        std::lock_guard lk(metrics_mu);
        prompt_tokens += static_cast<uint64_t>(r.n_prompt);
        cached_tokens += static_cast<uint64_t>(r.cached);
        completion_tokens += static_cast<uint64_t>(r.gen.generated);
    }

    static std::string note(const SeqResult& r) {
        return fmt::format("prompt {} tok ({} cached), {} generated, {}", r.n_prompt, r.cached,
                           r.gen.generated, r.gen.stop);
    }

    void complete(Route route, const httplib::Request& req, httplib::Response& res) {
        const Service* s = ready(res);
        if (!s) return;
        ApiParse p = s->api->parse(route, req.body);
        if (!p.call) return send_error(res, p.error);
        ApiCall call = std::move(*p.call);
        if (!call.seeded && !s->fixed_seed) {
            thread_local std::mt19937_64 gen{std::random_device{}()};
            call.req.sampling.seed = gen();
        }
        SeqRequest sr = call.req;
        std::shared_ptr<void> in_flight = hold();
        std::shared_ptr<Ticket> ticket = s->engine->submit(std::move(sr));
        if (!ticket && !s->engine->failure().empty())
            return send_error(res, error(500, "the engine failed: " + s->engine->failure(),
                                         "server_error", "engine_failed"));
        if (!ticket && draining->load())
            return send_error(
                res, error(503, "the server is shutting down", "server_error", "shutting_down"));
        if (!ticket) {
            res.set_header("Retry-After", "1");
            return send_error(res, error(503,
                                         fmt::format("the server is busy ({} requests in hand); "
                                                     "retry later",
                                                     s->engine->outstanding()),
                                         "server_error", "server_busy"));
        }
        const std::string id = random_id(route == Route::chat ? "chatcmpl-" : "cmpl-");
        const int64_t created = unix_now();
        if (!call.stream) {
            std::optional<SeqResult> r;
            std::vector<TokenLogprob> lps;
            while (!r) {
                Ticket::Taken t = ticket->take(std::chrono::milliseconds(500));
                lps.insert(lps.end(), t.logprobs.begin(), t.logprobs.end());
                r = std::move(t.result);
            }
            count(*r);
            t_note.detail = note(*r);
            if (!finish_reason(r->gen.stop)) return send_error(res, no_answer(*r, *s));
            std::string text = r->text;
            // A chat reply without the space the model writes after the
            // template's "Assistant:" (as kvrun -p --chat prints it).
            if (route == Route::chat)
                text.erase(0, std::min(text.size(), text.find_first_not_of(" \t\n")));
            size_t offset = 0;
            res.set_content(dump(answer_body(call, id, created, text, *r,
                                             logprobs_body(route, s->lm->tokenizer, lps, offset))),
                            "application/json");
            return;
        }
        auto st = std::make_shared<Stream>();
        st->call = std::move(call);
        st->id = id;
        st->created = created;
        st->ticket = ticket;
        st->engine = s->engine;
        st->tok = &s->lm->tokenizer;
        st->service = s;
        st->in_flight = std::move(in_flight);
        st->strip = route == Route::chat;
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider(
            "text/event-stream",
            [this, st](size_t, httplib::DataSink& sink) { return stream_step(*st, sink); },
            [st](bool) {
                if (!st->finished && !st->cancelled) st->engine->cancel(st->ticket);
            });
    }

    // One call of the content provider: what arrived, or a check that the
    // client is still there. False (the client left) cancels the sequence.
    bool stream_step(Stream& st, httplib::DataSink& sink) {
        auto send = [&sink, &st](const json& j) {
            const std::string line = "data: " + dump(j) + "\n\n";
            st.last_write = Clock::now();
            return sink.write(line.data(), line.size());
        };
        auto leave = [&st] {
            st.cancelled = true;
            st.engine->cancel(st.ticket);
            t_note.detail = "client left: cancelled";
            return false;
        };
        if (!st.role_sent) {
            st.role_sent = true;
            if (st.call.route == Route::chat &&
                !send(chunk_body(st.call, st.id, st.created, nullptr, nullptr, true)))
                return leave();
        }
        Ticket::Taken t = st.ticket->take(std::chrono::milliseconds(100));
        if (st.strip) {
            t.text.erase(0, std::min(t.text.size(), t.text.find_first_not_of(" \t\n")));
            st.strip = t.text.empty();
        }
        st.logprobs.insert(st.logprobs.end(), t.logprobs.begin(), t.logprobs.end());
        auto logprobs = [&st] {
            json j = logprobs_body(st.call.route, *st.tok, st.logprobs, st.text_offset);
            st.logprobs.clear();
            return j;
        };
        if (!t.text.empty() &&
            !send(chunk_body(st.call, st.id, st.created, &t.text, nullptr, false, logprobs())))
            return leave();
        if (t.result) {
            st.finished = true;
            const SeqResult& r = *t.result;
            count(r);
            t_note.detail = note(r);
            if (const auto fr = finish_reason(r.gen.stop)) {
                send(chunk_body(st.call, st.id, st.created, nullptr, &*fr, false, logprobs()));
                if (st.call.usage_chunk) send(usage_chunk_body(st.call, st.id, st.created, r));
            } else {
                send(no_answer(r, *st.service).body());
            }
            const std::string end = "data: [DONE]\n\n";
            sink.write(end.data(), end.size());
            sink.done();
            return true;
        }
        // Nothing to send for a second (queued, a long prompt, text held
        // back): an SSE comment, which clients skip. Its write fails once
        // the client is gone, which is how a departure is noticed.
        if (Clock::now() - st.last_write > std::chrono::seconds(1)) {
            static constexpr char ping[] = ": ping\n\n";
            st.last_write = Clock::now();
            if (!sink.write(ping, sizeof ping - 1)) return leave();
        }
        return true;
    }

    void tokenize(const httplib::Request& req, httplib::Response& res) {
        const Service* s = ready(res);
        if (!s) return;
        const json j = body_json(req.body);
        if (!j.is_object() || !j.contains("content") || !j["content"].is_string())
            return send_error(res,
                              error(400, "give {\"content\": \"text\"}", "invalid_request_error"));
        const std::string text = j["content"].get<std::string>();
        if (!unicode::valid_utf8(text))
            return send_error(
                res, error(400, "\"content\" is not valid UTF-8", "invalid_request_error"));
        for (const char* key : {"add_special", "with_pieces"})
            if (j.contains(key) && !j[key].is_boolean())
                return send_error(res, error(400, fmt::format("\"{}\" must be true or false", key),
                                             "invalid_request_error"));
        const bool special = j.value("add_special", false);
        const bool pieces = j.value("with_pieces", false);
        const std::vector<int32_t> ids = s->lm->tokenizer.encode(text, special, true);
        json out = json::array();
        for (int32_t id : ids)
            out.push_back(pieces ? json{{"id", id}, {"piece", s->lm->tokenizer.piece(id, true)}}
                                 : json(id));
        res.set_content(dump(json{{"tokens", out}}), "application/json");
    }

    void detokenize(const httplib::Request& req, httplib::Response& res) {
        const Service* s = ready(res);
        if (!s) return;
        const json j = body_json(req.body);
        if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array())
            return send_error(res, error(400, "give {\"tokens\": [ids]}", "invalid_request_error"));
        std::vector<int32_t> ids;
        const int64_t n_vocab = s->lm->tokenizer.n_vocab();
        for (const json& t : j["tokens"]) {
            if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
                return send_error(res, error(400,
                                             fmt::format("\"tokens\" must hold token ids of this "
                                                         "model (0 to {})",
                                                         n_vocab - 1),
                                             "invalid_request_error"));
            ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
        }
        res.set_content(dump(json{{"content", s->lm->tokenizer.decode(ids)}}), "application/json");
    }

    json model_entry(const Service& s) const {
        return json{{"id", s.api->model()},
                    {"object", "model"},
                    {"created", s.created},
                    {"owned_by", "kvrun"},
                    {"meta",
                     {{"n_ctx", s.n_ctx},
                      {"n_ctx_train", s.lm->model.hp.n_ctx_train},
                      {"n_vocab", s.lm->model.hp.n_vocab},
                      {"parallel", s.parallel}}}};
    }

    std::string metrics(const Service* s) {
        std::string out;
        auto metric = [&out](const char* name, const char* type, const char* help, auto value) {
            out +=
                fmt::format("# HELP {0} {1}\n# TYPE {0} {2}\n{0} {3}\n", name, help, type, value);
        };
        {
            std::lock_guard lk(metrics_mu);
            out += "# HELP kvrun_requests_total HTTP requests answered, by status.\n"
                   "# TYPE kvrun_requests_total counter\n";
            for (const auto& [status, n] : statuses)
                out += fmt::format("kvrun_requests_total{{status=\"{}\"}} {}\n", status, n);
            metric("kvrun_prompt_tokens_total", "counter",
                   "Prompt tokens of finished requests, cached ones included.", prompt_tokens);
            metric("kvrun_prompt_tokens_cached_total", "counter",
                   "Prompt tokens found in the KV pool (shared prefixes), not evaluated.",
                   cached_tokens);
            metric("kvrun_completion_tokens_total", "counter", "Tokens generated.",
                   completion_tokens);
        }
        metric("kvrun_ready", "gauge", "1 once the model is loaded.", s ? 1 : 0);
        if (!s) return out;
        const EngineStats e = s->engine->stats();
        const SchedulerStats& st = e.sched;
        metric("kvrun_requests_waiting", "gauge", "Requests queued, not running yet.", e.waiting);
        metric("kvrun_requests_running", "gauge", "Sequences running.", e.running);
        metric("kvrun_kv_blocks_used", "gauge", "KV pool blocks the sequences hold.",
               e.held_blocks);
        metric("kvrun_kv_blocks_total", "gauge", "KV pool blocks.", e.pool_blocks);
        const double seen = static_cast<double>(st.reused + st.prompt_tokens);
        metric("kvrun_prefix_hit_ratio", "gauge",
               "Prompt tokens found in the pool over all prompt tokens.",
               seen > 0 ? static_cast<double>(st.reused) / seen : 0.0);
        metric("kvrun_decode_tokens_per_second", "gauge",
               "Tokens per second of the decode passes so far.",
               st.decode_s > 0 ? static_cast<double>(st.decoded) / st.decode_s : 0.0);
        metric("kvrun_prompt_tokens_per_second", "gauge",
               "Prompt tokens per second of the prompt passes so far.",
               st.prompt_s > 0 ? static_cast<double>(st.prompt_tokens) / st.prompt_s : 0.0);
        metric("kvrun_preempted_total", "counter",
               "Sequences preempted for want of KV blocks (recomputed).", st.preempted);
        return out;
    }

    void routes() {
        using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
        // Every route but /health asks for the key (when there is one).
        auto guarded = [this](Handler h) {
            return [this, h](const httplib::Request& q, httplib::Response& r) {
                if (admitted(q, r)) h(q, r);
            };
        };
        auto chat = guarded([this](const httplib::Request& q, httplib::Response& r) {
            complete(Route::chat, q, r);
        });
        auto completion = guarded([this](const httplib::Request& q, httplib::Response& r) {
            complete(Route::completion, q, r);
        });
        svr.Post("/v1/chat/completions", chat);
        svr.Post("/chat/completions", chat);
        svr.Post("/v1/completions", completion);
        svr.Post("/completions", completion);
        svr.Post("/tokenize", guarded([this](const httplib::Request& q, httplib::Response& r) {
                     tokenize(q, r);
                 }));
        svr.Post("/detokenize", guarded([this](const httplib::Request& q, httplib::Response& r) {
                     detokenize(q, r);
                 }));
        svr.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
            const Service* s = ready(r);
            if (!s) return;
            // Without the reason: /health needs no key (the log has it).
            if (!s->engine->failure().empty())
                return send_error(r,
                                  error(500, "the engine failed", "server_error", "engine_failed"));
            r.set_content(R"({"status":"ok"})", "application/json");
        });
        auto models = guarded([this](const httplib::Request&, httplib::Response& r) {
            if (const Service* s = ready(r))
                r.set_content(
                    dump(json{{"object", "list"}, {"data", json::array({model_entry(*s)})}}),
                    "application/json");
        });
        svr.Get("/v1/models", models);
        svr.Get("/models", models);
        svr.Get(
            R"(/v1/models/(.+))", guarded([this](const httplib::Request& q, httplib::Response& r) {
                const Service* s = ready(r);
                if (!s) return;
                if (!s->api->knows_model(q.matches[1]))
                    return send_error(
                        r,
                        error(404, fmt::format("the model '{}' does not exist", q.matches[1].str()),
                              "invalid_request_error", "model_not_found"));
                r.set_content(dump(model_entry(*s)), "application/json");
            }));
        svr.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& r) {
                    r.set_content(metrics(service.load()), "text/plain; version=0.0.4");
                }));
        if (!o.cors_origin.empty())
            svr.Options(".*", [](const httplib::Request&, httplib::Response& r) {
                r.status = 204;
                r.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
                r.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
                r.set_header("Access-Control-Max-Age", "600");
            });
    }

    void hooks() {
        svr.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
            t_note = RequestNote{};
            return httplib::Server::HandlerResponse::Unhandled;
        });
        svr.set_post_routing_handler([this](const httplib::Request&, httplib::Response& r) {
            if (!o.cors_origin.empty()) {
                r.set_header("Access-Control-Allow-Origin", o.cors_origin);
                r.set_header("Vary", "Origin");
            }
        });
        // httplib's own errors (no route, a body too large, a malformed
        // request) and any of ours without a body: OpenAI's error object.
        svr.set_error_handler([](const httplib::Request& q, httplib::Response& r) {
            if (!r.body.empty()) return;
            std::string msg;
            std::string type = "invalid_request_error";
            switch (r.status) {
            case 404:
                msg = fmt::format("no route {} {}", q.method, q.path);
                break;
            case 405:
                msg = fmt::format("{} is not allowed on {}", q.method, q.path);
                break;
            case 413:
                msg = "the request body is too large";
                break;
            case 414:
                msg = "the request URI is too long";
                break;
            case 400:
                msg = "malformed HTTP request";
                break;
            default:
                msg = fmt::format("HTTP {}", r.status);
                if (r.status >= 500) type = "server_error";
            }
            send_error(r, error(r.status, msg, type));
        });
        svr.set_exception_handler(
            [](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
                std::string what = "unknown";
                try {
                    std::rethrow_exception(ep);
                } catch (const std::exception& e) {
                    what = e.what();
                } catch (...) {
                }
                send_error(r, error(500, "internal error: " + what, "server_error"));
            });
        svr.set_logger([this](const httplib::Request& q, const httplib::Response& r) {
            {
                std::lock_guard lk(metrics_mu);
                statuses[r.status]++;
            }
            const double ms =
                std::chrono::duration<double, std::milli>(Clock::now() - t_note.t0).count();
            // Health checks and metrics scrapes are logged with -v only.
            if (!o.verbose && (q.path == "/health" || q.path == "/metrics")) return;
            fmt::print(stderr, "kvrun: serve: {} {} {} {} {:.0f} ms{}{}\n", q.remote_addr, q.method,
                       q.path, r.status, ms, t_note.detail.empty() ? "" : " | ", t_note.detail);
            t_note.detail.clear();
        });
    }
};

HttpServer::HttpServer(ServerOptions o) : impl_(std::make_unique<Impl>()) {
    impl_->o = std::move(o);
    impl_->draining = &draining_;
}

HttpServer::~HttpServer() {
    stop();
}

void HttpServer::start() {
    Impl& m = *impl_;
    const int threads = std::max(4, m.o.http_threads);
    m.svr.new_task_queue = [threads] {
        return new httplib::ThreadPool(static_cast<size_t>(threads));
    };
    m.svr.set_payload_max_length(m.o.max_body);
    m.svr.set_read_timeout(m.o.read_timeout_s, 0);
    m.svr.set_write_timeout(m.o.write_timeout_s, 0);
    m.svr.set_keep_alive_timeout(m.o.keep_alive_s);
    m.routes();
    m.hooks();
    if (m.o.port == 0) {
        port_ = m.svr.bind_to_any_port(m.o.host);
    } else {
        port_ = m.svr.bind_to_port(m.o.host, m.o.port) ? m.o.port : -1;
    }
    if (port_ < 0)
        throw Error(Exit::usage, fmt::format("cannot listen on {}:{} (in use, or not an address "
                                             "of this machine)",
                                             m.o.host, m.o.port));
    listener_ = std::thread([&m, this] {
        m.svr.listen_after_bind();
        listener_ended_ = true;
    });
    // stop() does nothing until the loop runs (httplib 0.11 has no
    // wait_until_ready): wait for it, so an early stop cannot hang.
    while (!m.svr.is_running() && !listener_ended_)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!m.svr.is_running()) {
        listener_.join();
        throw Error(Exit::error, fmt::format("cannot serve on {}:{}", m.o.host, port_));
    }
}

int HttpServer::in_flight() const {
    return impl_->in_flight.load();
}

void HttpServer::attach(const Service& s) {
    impl_->svc = s;
    impl_->service.store(&impl_->svc);
}

void HttpServer::stop() {
    if (!listener_.joinable()) return;
    impl_->svr.stop();
    listener_.join();
}

} // namespace kvrun::serve
