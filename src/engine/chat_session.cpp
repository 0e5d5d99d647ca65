#include "chat_session.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "error.h"
#include "file_io.h"
#include "prompt_cache.h"
#include "speculative.h"
#include "stop_sequences.h"

namespace kvrun {

namespace {

void append(std::vector<int32_t>& out, const std::vector<int32_t>& more) {
    out.insert(out.end(), more.begin(), more.end());
}

constexpr int kSaveVersion = 1;

// nlohmann's DOM builder behind a SAX pass that polls a stop request every
// few thousand events. (json::parse with a callback polls too, but its
// builder scans the parent array for a discarded element at the end of every
// object: quadratic in the turns, minutes for a file under the size cap.)
class PollingDomBuilder {
  public:
    using json = nlohmann::json;
    using number_integer_t = json::number_integer_t;
    using number_unsigned_t = json::number_unsigned_t;
    using number_float_t = json::number_float_t;
    using string_t = json::string_t;
    using binary_t = json::binary_t;

    PollingDomBuilder(json& root, const std::function<bool()>& should_stop)
        : dom_(root, true), should_stop_(should_stop) {}

    bool null() { return poll() && dom_.null(); }
    bool boolean(bool v) { return poll() && dom_.boolean(v); }
    bool number_integer(number_integer_t v) { return poll() && dom_.number_integer(v); }
    bool number_unsigned(number_unsigned_t v) { return poll() && dom_.number_unsigned(v); }
    bool number_float(number_float_t v, const string_t& s) {
        return poll() && dom_.number_float(v, s);
    }
    bool string(string_t& v) { return poll() && dom_.string(v); }
    bool binary(binary_t& v) { return poll() && dom_.binary(v); }
    bool start_object(std::size_t n) { return poll() && dom_.start_object(n); }
    bool key(string_t& v) { return dom_.key(v); }
    bool end_object() { return dom_.end_object(); }
    bool start_array(std::size_t n) { return poll() && dom_.start_array(n); }
    bool end_array() { return dom_.end_array(); }
    template <class Exception>
    bool parse_error(std::size_t at, const std::string& token, const Exception& e) {
        return dom_.parse_error(at, token, e);
    }

  private:
    // False ends the parse: sax_parse then returns false.
    bool poll() { return ++events_ % 4096 != 0 || !should_stop_ || !should_stop_(); }

    nlohmann::detail::json_sax_dom_parser<json> dom_;
    const std::function<bool()>& should_stop_;
    size_t events_ = 0;
};

} // namespace

std::vector<int32_t> chat_tokens(const Tokenizer& tok, const ChatText& text, bool at_start) {
    std::vector<int32_t> ids = tok.encode(text.text, false, text.content);
    const Vocab& v = tok.vocab();
    if (at_start && v.add_bos && v.bos >= 0 && (ids.empty() || ids[0] != v.bos))
        ids.insert(ids.begin(), v.bos);
    return ids;
}

ReplyEnd reply_end(const ChatTemplate& t, const Tokenizer& tok) {
    ReplyEnd r;
    for (const std::string& m : t.end_markers()) {
        if (m.empty()) continue;
        const std::vector<int32_t> ids = tok.encode(m, false, true);
        if (ids.size() == 1 && tok.piece(ids[0]).empty())
            r.ids.push_back(ids[0]); // a control token
        else
            r.strings.push_back(m);
    }
    return r;
}

ChatSession::ChatSession(const LoadedModel& lm, ChatTemplate tmpl, int n_ctx, gl::Type type_k,
                         gl::Type type_v, Placement placement, ChatConfig cfg)
    : lm_(lm), tmpl_(std::move(tmpl)),
      // keep = 0: the session never wraps the ring (see the header), so the
      // pinned system prompt needs no sink copies.
      s_(lm, KvCacheConfig::for_model(lm.model.hp, n_ctx, 0, type_k, type_v, cfg.k_rotate),
         std::move(placement), std::min(cfg.batch, n_ctx)),
      sampler_(cfg.sampling, lm.model.hp.n_vocab), cfg_(std::move(cfg)),
      end_(reply_end(tmpl_, lm.tokenizer)) {
    s_.keep_states(true); // /retry and /undo on recurrent layers (Session::keep_states)
}

void ChatSession::set_sampling(const SamplerParams& p, bool reseed) {
    const Sampler::State before = sampler_.state();
    cfg_.sampling = p;
    sampler_ = Sampler(p, lm_.model.hp.n_vocab);
    // The penalty's memory, as sync() built it: the cached tokens, in order.
    for (int32_t t : s_.tokens()) sampler_.accept(t);
    // The generator goes on where it was unless a seed was set (a /set of
    // the temperature must not replay the draws the answers began with).
    if (!reseed) {
        Sampler::State now = sampler_.state();
        std::copy(std::begin(before.rng), std::end(before.rng), std::begin(now.rng));
        sampler_.restore(now);
    }
    if (cfg_.speculate) cfg_.speculate->set_sampling(p); // a draft model samples with it
}

std::string ChatSession::effective_system() const {
    return system_.empty() ? tmpl_.default_system() : system_;
}

std::vector<int32_t> ChatSession::turn_tokens(size_t i, bool first, const std::string& sys) const {
    const Tokenizer& tok = lm_.tokenizer;
    const Turn& t = turns_[i];
    // Each piece is tokenized on its own, so the tokens of a turn never
    // depend on what follows it: earlier turns stay a prefix.
    std::vector<int32_t> out =
        chat_tokens(tok, tmpl_.user_text(t.user, first, sys) + tmpl_.generation_prompt(), false);
    append(out, t.reply_tokens);
    if (!t.open) append(out, chat_tokens(tok, tmpl_.close(), false));
    return out;
}

std::vector<int32_t> ChatSession::target() const {
    const std::string sys = effective_system();
    std::vector<int32_t> out = chat_tokens(lm_.tokenizer, tmpl_.prefix_text(sys), false);
    for (size_t i = first_live_; i < turns_.size(); i++)
        append(out, turn_tokens(i, i == first_live_, sys));
    const Vocab& v = lm_.tokenizer.vocab();
    if (v.add_bos && v.bos >= 0 && (out.empty() || out[0] != v.bos)) out.insert(out.begin(), v.bos);
    return out;
}

size_t ChatSession::first_live_within(size_t max_tokens) const {
    const size_t n = turns_.size();
    if (first_live_ + 1 >= n) return first_live_; // only the current turn is left
    const std::string sys = effective_system();
    const std::vector<int32_t> prefix = chat_tokens(lm_.tokenizer, tmpl_.prefix_text(sys), false);
    const Vocab& v = lm_.tokenizer.vocab();
    // target(f) = bos? + prefix + turn f as the first + the turns after it.
    size_t best = n - 1;
    size_t after = 0; // tokens of the turns after f
    for (size_t f = n - 1;; f--) {
        // The turns after f alone fill the window: so do they for every
        // earlier f, which the walk need never tokenize.
        if (after > max_tokens) break;
        const std::vector<int32_t> head = turn_tokens(f, true, sys);
        const int32_t first_token = !prefix.empty() ? prefix[0] : head.empty() ? -1 : head[0];
        const size_t bos = v.add_bos && v.bos >= 0 && first_token != v.bos ? 1 : 0;
        if (bos + prefix.size() + head.size() + after <= max_tokens) best = f;
        if (f == first_live_) break;
        after += turn_tokens(f, false, sys).size();
    }
    return best;
}

void ChatSession::rewind_to_common_prefix(const std::vector<int32_t>& want) {
    // Always possible for a global ring (the session never wraps it); a
    // sliding-window layer's ring that moved past the prefix starts again,
    // recurrent states from the last kept copy before it.
    s_.rewind_within(static_cast<int64_t>(common_prefix(s_.tokens(), want)));
}

bool ChatSession::sync(const std::vector<int32_t>& want, const ChatHooks& hooks, TurnStats& st,
                       bool opens_turn) {
    const auto t0 = std::chrono::steady_clock::now();
    EvalHooks eh;
    eh.should_stop = hooks.should_stop;
    eh.on_progress = hooks.on_progress;
    const Session::Synced r = s_.sync(want, eh);
    const size_t m = static_cast<size_t>(r.kept);
    if (opens_turn) st.reused = r.kept;
    // The repetition penalty remembers what was evaluated, as it was evaluated.
    for (size_t i = m; i < s_.tokens().size(); i++) sampler_.accept(s_.tokens()[i]);
    st.evaluated += static_cast<int64_t>(s_.tokens().size() - m);
    if (!r.done) return false;
    st.prompt_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return true;
}

std::vector<int32_t> ChatSession::evict(std::vector<int32_t> want, const ChatHooks& hooks,
                                        TurnStats& st) {
    const std::vector<int32_t> before = want;
    const size_t first_before = first_live_;
    // Down to half the window, not just enough for this turn: dropping one
    // turn at a time would leave the window full and evict again next turn.
    const size_t low = static_cast<size_t>(s_.n_ctx()) / 2;
    if (want.size() > low) first_live_ = first_live_within(low);
    const size_t n = first_live_ - first_before;
    if (n == 0) return want;
    st.evicted_turns += static_cast<int>(n);
    want = target();
    if (hooks.on_notice)
        hooks.on_notice(fmt::format(
            "the context is full (-c {}): dropped the {} oldest turn{} ({} tokens); the system "
            "prompt stays",
            s_.n_ctx(), n, n == 1 ? "" : "s",
            before.size() - std::min(before.size(), want.size())));
    drop_evicted(before, want, hooks);
    return want;
}

void ChatSession::drop_evicted(const std::vector<int32_t>& before,
                               const std::vector<int32_t>& after, const ChatHooks& hooks) {
    auto detail = [&](const std::string& s) {
        if (hooks.on_detail) hooks.on_detail(s);
    };
    const std::vector<int32_t>& c = s_.tokens();
    // before = [a shared prefix][the evicted turns: d tokens][the kept turns];
    // after = [the shared prefix][the kept turns], unless the template
    // renders the new first turn differently (it then differs early).
    const size_t a = common_prefix(before, after);
    const size_t held = common_prefix(c, before);
    if (before.size() <= after.size()) return;
    const size_t d = before.size() - after.size();
    if (held <= a + d) {
        detail("eviction: the cache held no kept turn: nothing to move");
        return;
    }
    if (s_.cache().config().has_recurrent()) {
        detail("eviction: recurrent layers' states cannot forget the evicted turns: the kept "
               "turns are evaluated again");
        return;
    }
    size_t k = a; // the kept tokens the cache holds, at their new places
    while (k + d < held && k < after.size() && before[k + d] == after[k]) k++;
    if (!cfg_.evict_in_place) {
        detail("eviction: the kept turns are evaluated again");
        return;
    }
    if (k == a) {
        detail("eviction: the kept turns change (the template folds the system prompt into the "
               "first message): they are evaluated again");
        return;
    }
    if (!s_.rewind(static_cast<int64_t>(k + d)) ||
        !s_.drop(static_cast<int64_t>(a), static_cast<int64_t>(a + d))) {
        detail("eviction: a sliding-window ring no longer holds the kept prefix: the kept turns "
               "are evaluated again");
        return;
    }
    detail(fmt::format("eviction: {} cached tokens moved down {} positions in place (keys "
                       "re-rotated), none evaluated again",
                       k - a, d));
}

TurnStats ChatSession::respond(const std::string& message, const ChatHooks& hooks) {
    TurnStats st;
    turns_.push_back(Turn{message, "", {}, true});
    const int64_t n_ctx = s_.n_ctx();
    // Room for the reply: what -n asks for, at most a quarter of the window
    // (a longer reply evicts more turns as it grows).
    const int64_t reserve =
        std::max<int64_t>(1, std::min(cfg_.n_predict >= 0 ? cfg_.n_predict : n_ctx, n_ctx / 4));
    std::vector<int32_t> want = target();
    if (static_cast<int64_t>(want.size()) + reserve > n_ctx)
        want = evict(std::move(want), hooks, st);
    if (static_cast<int64_t>(want.size()) >= n_ctx) {
        turns_.pop_back();
        fail(Exit::context_overflow,
             "the system prompt and this message take {} tokens but the context (-c) holds {}",
             want.size(), n_ctx);
    }
    if (!sync(want, hooks, st, true)) {
        turns_.pop_back(); // not answered: as if never asked
        st.stop = "interrupted";
        return st;
    }
    generate(hooks, st);
    return st;
}

bool ChatSession::retry(const ChatHooks& hooks, TurnStats* stats) {
    if (turns_.size() <= first_live_) return false;
    TurnStats st;
    Turn& t = turns_.back();
    t.reply.clear();
    t.reply_tokens.clear();
    t.open = true;
    const std::vector<int32_t> want = target();
    if (sync(want, hooks, st, true))
        generate(hooks, st);
    else
        st.stop = "interrupted", t.open = false;
    if (stats) *stats = st;
    return true;
}

bool ChatSession::undo() {
    if (turns_.size() <= first_live_) return false;
    turns_.pop_back();
    rewind_to_common_prefix(target());
    return true;
}

void ChatSession::reset() {
    turns_.clear();
    first_live_ = 0;
    rewind_to_common_prefix(target());
}

void ChatSession::set_system(std::string system) {
    system_ = std::move(system);
    rewind_to_common_prefix(target());
}

void ChatSession::generate(const ChatHooks& hooks, TurnStats& st) {
    Turn& t = turns_.back();
    GenerateParams gp;
    gp.n_predict = cfg_.n_predict;
    gp.speculate = cfg_.speculate;
    gp.end_ids = end_.ids;
    gp.stop = end_.strings;
    gp.stop.insert(gp.stop.end(), cfg_.stop.begin(), cfg_.stop.end());
    GenerateHooks gh;
    // The reply text leaves out the space the model writes after the
    // template's "Assistant:" or [/INST]; the tokens keep it.
    gh.on_text = [&](std::string s) {
        if (t.reply.empty()) s.erase(0, std::min(s.size(), s.find_first_not_of(" \t\n")));
        if (s.empty()) return;
        t.reply += s;
        if (hooks.on_text) hooks.on_text(s);
    };
    gh.should_stop = hooks.should_stop;
    gh.on_token = [&](int32_t id) {
        t.reply_tokens.push_back(id);
    }; // target() sees the reply so far
    // The reply filled the window: drop old turns, move the rest down.
    gh.on_full = [&]() -> const char* {
        const size_t first_before = first_live_;
        const std::vector<int32_t> want = evict(target(), hooks, st);
        if (first_live_ == first_before || want.size() >= static_cast<size_t>(s_.n_ctx()))
            return "context full";
        if (!sync(want, hooks, st)) return "interrupted";
        return nullptr;
    };
    const auto t0 = std::chrono::steady_clock::now();
    const double prompt_before = st.prompt_s;
    sampler_.restart_grammar(); // each reply is a sentence of its own
    const GenerateResult r = s_.generate(gp, sampler_, gh);
    t.reply_tokens = r.tokens; // without the tokens that spell a stop string
    st.generated += r.generated;
    st.stop = r.stop;
    t.open = false;
    st.gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
               (st.prompt_s - prompt_before);
}

namespace {

// A save's JSON begins with its sorted keys: "first_live_turn", "format".
bool is_chat_save_head(std::string_view head) {
    return head.find("\"kvrun-chat\"") != std::string_view::npos;
}

uint64_t file_bytes(const std::string& path) {
    std::error_code ec;
    const uintmax_t n = std::filesystem::file_size(path, ec);
    return ec ? 0 : static_cast<uint64_t>(n);
}

// nlohmann's messages start with "[json.exception.type_error.302] ".
std::string json_reason(const std::exception& e) {
    std::string s = e.what();
    if (s.rfind("[json.exception.", 0) == 0 && s.find("] ") != std::string::npos)
        s.erase(0, s.find("] ") + 2);
    return s;
}

} // namespace

void ChatSession::save(const std::string& path) const {
    const uint64_t digest = s_.model_digest();
    nlohmann::json j;
    j["format"] = "kvrun-chat";
    j["version"] = kSaveVersion;
    // A string: as a JSON number it would exceed 2^53, which jq and
    // JavaScript round.
    j["model_digest"] = fmt::format("{:016x}", digest);
    j["template"] = tmpl_.name();
    j["system"] = system_;
    // The oldest evicted turns are left out where the file would pass what
    // load() takes (the window holds only the newest turns anyway).
    auto dump = [](const nlohmann::json& x, int indent) {
        // Replace, not throw, on bytes that are not UTF-8 (a reply cut
        // inside a character): the save must not fail on the model's output.
        return x.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
    };
    std::vector<nlohmann::json> jturns;
    std::vector<uint64_t> sizes; // a bound on each turn's bytes, indented (a token a line)
    uint64_t bytes = dump(j, 1).size() + 64;
    for (const Turn& t : turns_) {
        jturns.push_back({{"user", t.user}, {"reply", t.reply}, {"reply_tokens", t.reply_tokens}});
        sizes.push_back(dump(jturns.back(), -1).size() + 16 * (4 + t.reply_tokens.size()));
        bytes += sizes.back();
    }
    size_t skip = 0;
    for (; skip < first_live_ && bytes > kMaxConversationBytes; skip++) bytes -= sizes[skip];
    j["first_live_turn"] = first_live_ - skip;
    j["turns"] = nlohmann::json::array();
    for (size_t i = skip; i < jturns.size(); i++) j["turns"].push_back(std::move(jturns[i]));
    const std::string text = dump(j, 1) + "\n";
    // The bound said too large: the text itself decides, and its size is told
    // in bytes ("16.0 MiB, more than 16 MiB" said nothing).
    if (text.size() > kMaxConversationBytes)
        fail(Exit::usage,
             "the conversation is {} bytes, more than a saved one can be ({} bytes, {} MiB)",
             text.size(), kMaxConversationBytes, kMaxConversationBytes >> 20);
    // The JSON goes to its temporary first, then the binary cache is saved,
    // then the JSON renamed: any failure before that leaves FILE.json as it
    // was (a cache that no longer matches it is only not reused).
    AtomicFile meta(path + ".json", "conversation", is_chat_save_head);
    meta.write(text);
    s_.save_prompt_cache(path, digest);
    meta.commit();
}

std::string ChatSession::load(const std::string& path, const std::function<bool()>& should_stop) {
    const std::string meta = path + ".json";
    const ReadResult file = try_read_regular_file(meta, kMaxConversationBytes);
    if (file.too_large)
        fail(Exit::usage,
             "'{}' is {} bytes, more than a kvrun conversation can be ({} bytes, {} MiB): not "
             "loaded",
             meta, file_bytes(meta), kMaxConversationBytes, kMaxConversationBytes >> 20);
    if (!file.ok) fail(Exit::usage, "cannot read '{}': {}", meta, file.why);
    auto bad = [&](const std::string& why) -> void {
        fail(Exit::usage, "'{}' is not a kvrun conversation ({})", meta, why);
    };
    auto stopped = [&] {
        if (should_stop && should_stop())
            fail(Exit::interrupted, "loading '{}' interrupted: the conversation is as it was",
                 meta);
    };
    const uint64_t digest = s_.model_digest();
    // Everything is read and checked before the session changes: a bad
    // file leaves the current conversation as it was.
    std::vector<Turn> turns;
    std::string system, saved_template;
    size_t first_live = 0;
    try {
        // Checked every few thousand JSON events: a Ctrl-C stops the parse.
        nlohmann::json j;
        PollingDomBuilder builder(j, should_stop);
        // Parse errors throw; a false return is a stop request, whatever
        // should_stop says when asked again.
        if (!nlohmann::json::sax_parse(file.data, &builder))
            fail(Exit::interrupted, "loading '{}' interrupted: the conversation is as it was",
                 meta);
        if (!j.is_object() || j.value("format", std::string()) != "kvrun-chat")
            bad("no kvrun-chat format");
        if (j.at("version") != kSaveVersion) bad("version " + j.at("version").dump());
        uint64_t saved_digest = 0;
        if (const auto d = j.find("model_digest"); d != j.end()) {
            if (d->is_string()) { // since the digest became a string
                const std::string& hex = d->get_ref<const std::string&>();
                char* end = nullptr;
                saved_digest = std::strtoull(hex.c_str(), &end, 16);
                if (hex.empty() || *end) bad("model_digest is not a hex number");
            } else if (d->is_number_unsigned()) { // older saves: a number
                saved_digest = d->get<uint64_t>();
            } else {
                bad("model_digest is neither a string nor a number");
            }
        }
        const bool same_model = saved_digest == digest;
        system = j.value("system", std::string());
        saved_template = j.value("template", std::string());
        if (const auto f = j.find("first_live_turn"); f != j.end()) {
            if (!f->is_number_unsigned()) bad("first_live_turn is not a count");
            first_live = static_cast<size_t>(std::min<uint64_t>(f->get<uint64_t>(), SIZE_MAX));
        }
        const nlohmann::json& jturns = j.at("turns");
        if (!jturns.is_array()) bad("turns is not an array");
        // The last turn is never evicted: a first live turn past it was not
        // written by kvrun.
        if (first_live > 0 && first_live >= jturns.size())
            bad(fmt::format("first_live_turn {} is past its {} turn{}", first_live, jturns.size(),
                            jturns.size() == 1 ? "" : "s"));
        turns.reserve(jturns.size());
        for (const auto& jt : jturns) {
            if (turns.size() % 1024 == 0) stopped();
            if (!jt.is_object()) bad("a turn is not an object");
            Turn t{jt.at("user").get<std::string>(), jt.at("reply").get<std::string>(), {}, false};
            if (same_model) {
                const nlohmann::json& ids = jt.at("reply_tokens");
                if (!ids.is_array()) bad("reply_tokens is not an array");
                for (const auto& id : ids) {
                    // Checked as the number it is: a cast first would turn
                    // 2^32 + 5 into token 5.
                    const bool ok =
                        id.is_number_unsigned()
                            ? id.get<uint64_t>() < static_cast<uint64_t>(lm_.tokenizer.n_vocab())
                            : id.is_number_integer() && id.get<int64_t>() >= 0 &&
                                  id.get<int64_t>() < lm_.tokenizer.n_vocab();
                    if (!ok) bad("bad token id " + id.dump());
                    t.reply_tokens.push_back(static_cast<int32_t>(id.get<int64_t>()));
                }
            } else {
                // Token ids mean nothing to another model: re-tokenize the reply.
                t.reply_tokens = lm_.tokenizer.encode(t.reply, false, false);
            }
            turns.push_back(std::move(t));
        }
    } catch (const nlohmann::json::exception& e) {
        bad(json_reason(e));
    }
    turns_ = std::move(turns);
    system_ = std::move(system);
    first_live_ = first_live;
    // Only the turns the window can hold are live; they are what a turn
    // costs to tokenize, whatever the file's length.
    first_live_ = first_live_within(static_cast<size_t>(s_.n_ctx()) - 1);
    const std::vector<int32_t> want = target();
    const PromptCacheLoad pc = s_.load_prompt_cache(path, digest, want);
    const char* s = turns_.size() == 1 ? "" : "s";
    std::string msg = fmt::format("loaded {} turn{}", turns_.size(), s);
    if (first_live_ > 0)
        msg +=
            fmt::format(" ({} in the window, the older ones evicted)", turns_.size() - first_live_);
    if (!saved_template.empty() && saved_template != tmpl_.name())
        msg += fmt::format("; saved with the '{}' template, continued with '{}'", saved_template,
                           tmpl_.name());
    if (!pc.ok)
        return msg +
               fmt::format("; cache not used ({}): it is recomputed at the next turn", pc.why);
    return msg + fmt::format("; {} token{} of cache reused", pc.reused, pc.reused == 1 ? "" : "s");
}

} // namespace kvrun
