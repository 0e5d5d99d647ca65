// A chat on a hybrid model (Qwen 3.5: Gated DeltaNet layers beside attention
// layers). A recurrent state cannot give positions back, so the session keeps
// copies where each turn's evaluation began and ended (Session::keep_states):
// /retry evaluates nothing again, /undo only what follows the copy, and an
// eviction evaluates the kept turns again (a state cannot forget a span).
// After every step the cache equals a fresh one that evaluated the
// conversation's tokens from scratch, ring rows and states byte for byte (on
// the batch-invariant backend, --deterministic), and each greedy answer is
// the answer a fresh session with the same history gives.
#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "cache_compare.h"
#include "chat_session.h"
#include "loader.h"
#include "session.h"
#include "test_util.h"

using namespace kvrun;

namespace {

const std::string kQwen35 = kvtest::shared("models/next/tiny-qwen35-Q4_K_M.gguf");

ChatConfig greedy_config(int64_t n_predict) {
    ChatConfig c;
    c.n_predict = n_predict;
    c.sampling.temp = 0;
    return c;
}

struct Chat {
    Chat(const LoadedModel& lm, gl::Backend& be, int n_ctx, int64_t n_predict)
        : lm(lm), be(be),
          session(lm, ChatTemplate::for_model(lm.file, lm.tokenizer, ""), n_ctx, gl::Type::F16,
                  gl::Type::F16, Placement::all(be, lm.model.hp.n_layer),
                  greedy_config(n_predict)) {}
    const LoadedModel& lm;
    gl::Backend& be;
    ChatSession session;

    // What the cache holds is what a fresh cache makes of the same tokens.
    void check_as_fresh() const {
        Session fresh(lm, session.cache_config(), Placement::all(be, lm.model.hp.n_layer), 64);
        fresh.eval(session.cached());
        kvtest::require_same_cache(session.cache(), fresh.cache());
    }
    std::string say(const std::string& msg, TurnStats* st = nullptr) {
        const TurnStats s = session.respond(msg, {});
        if (st) *st = s;
        return session.turns().back().reply;
    }
};

} // namespace

TEST_CASE("chat on recurrent layers: turns, /retry and /undo go back to kept states; the cache "
          "equals a fresh evaluation's") {
    auto lm = LoadedModel::load(kQwen35);
    REQUIRE(!lm->model.hp.recurrent_layers.empty());
    auto be = gl::make_cpu_backend(2, true);
    Chat a(*lm, *be, 512, 12);
    TurnStats st;
    const std::string a1 = a.say("Hello", &st);
    CHECK(st.reused == 0);
    CHECK(st.generated == 12);
    a.check_as_fresh();
    const int64_t after1 = a.session.cached_tokens();

    // Turn 2 reuses all of turn 1 (the state goes on from where it was).
    const std::string a2 = a.say("Tell me a story", &st);
    CHECK(st.reused == after1);
    a.check_as_fresh();

    // /retry: the states and logits kept at the end of turn 2's prompt;
    // nothing is evaluated again, and the greedy answer is the same.
    TurnStats rs;
    REQUIRE(a.session.retry({}, &rs));
    CHECK(rs.evaluated == 0);
    CHECK(a.session.turns().back().reply == a2);
    a.check_as_fresh();

    // /undo: back to the states kept where turn 2's evaluation began (the
    // end of turn 1's reply); the next turn evaluates only what follows.
    const std::string a3 = a.say("Where is the cat");
    (void)a3;
    const int64_t before3 = a.session.cached_tokens();
    REQUIRE(a.session.undo());
    CHECK(a.session.cached_tokens() < before3);
    CHECK(a.session.cached_tokens() > after1);
    a.check_as_fresh();
    const std::string a4 = a.say("Where is the dog", &st);
    CHECK(st.reused > after1);
    a.check_as_fresh();
    // /undo twice: the states kept for turn 1's end are gone, so back to the
    // start (nothing kept that early): the cache is rebuilt, not wrong.
    REQUIRE(a.session.undo());
    REQUIRE(a.session.undo());
    a.check_as_fresh();

    // The answers are those of a fresh session with the same history.
    Chat b(*lm, *be, 512, 12);
    CHECK(b.say("Hello") == a1);
    CHECK(b.say("Tell me a story") == a2);
    CHECK(b.say("Where is the dog") == a4);
    b.check_as_fresh();
}

TEST_CASE("chat on recurrent layers: an eviction evaluates the kept turns again, and says why") {
    auto lm = LoadedModel::load(kQwen35);
    auto be = gl::make_cpu_backend(2, true);
    Chat a(*lm, *be, 160, 12);
    std::string detail;
    ChatHooks hooks;
    hooks.on_detail = [&](const std::string& s) { detail += s + "\n"; };
    int evicted = 0;
    for (const char* msg : {"Hello there", "Tell me a story about a cat", "What did the cat eat",
                            "And the dog", "Where did they go", "Why", "Who was there",
                            "The end"}) {
        CAPTURE(msg);
        const TurnStats st = a.session.respond(msg, hooks);
        evicted += st.evicted_turns;
        a.check_as_fresh();
    }
    REQUIRE(evicted > 0);
    CHECK_MESSAGE(detail.find("recurrent layers' states cannot forget") != std::string::npos,
                  detail);
}
