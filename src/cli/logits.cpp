// `kvrun logits -m M --tokens 1,2,3 --top-k 10`: feed the ids in one batch and
// print, per position, the log-sum-exp of the logit row and its top entries —
// the row format of the reference goldens, for conformance checks.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "error.h"
#include "forward.h"
#include "loader.h"
#include "context.h"
#include "session.h"

namespace kvrun::cli {

int run_logits(int argc, char** argv) {
    CommonOptions c;
    std::string tokens_s, prompt, ctx = "auto";
    int top_k = 10;
    CLI::App app{"kvrun logits: per-position log-sum-exp and top logits as JSON", "kvrun logits"};
    add_model_option(app, c);
    add_runtime_options(app, c);
    auto* t_opt = app.add_option("--tokens", tokens_s, "comma-separated token ids (fed as given, no BOS added)");
    auto* p_opt = app.add_option("-p,--prompt", prompt, "text to tokenize and feed instead of --tokens");
    app.add_option("--top-k", top_k, "entries per row")->capture_default_str()->check(int_in(1, 1 << 20));
    app.add_option("-c,--ctx-size", ctx, "context size (auto = the number of tokens)")->capture_default_str();
    if (const auto done = parse_command_line(app, argc, argv)) return *done;
    if (!*t_opt == !*p_opt) fail(Exit::usage, "give exactly one of --tokens IDS or -p TEXT");
    ContextRequest req;
    set_cache_types(c, req, false);
    const gl::Type tk = req.type_k, tv = req.type_v;

    auto lm = LoadedModel::load(c.model, layers_home(c), !c.precise);
    const Hparams& hp = lm->model.hp;
    std::vector<int32_t> ids = *t_opt ? parse_token_list(tokens_s) : lm->tokenizer.encode(read_prompt(prompt, "", true), true, true);
    for (int32_t id : ids)
        if (id >= hp.n_vocab) fail(Exit::usage, "--tokens: id {} is outside the vocabulary (0..{})", id, hp.n_vocab - 1);
    const int64_t n = static_cast<int64_t>(ids.size());
    req.use = ContextRequest::Use::logits;
    req.ctx = ctx;
    req.n_prompt = n;
    req.type_k = tk;
    req.type_v = tv;
    req.batch = static_cast<int>(std::min<int64_t>(n, 512));
    const ContextPlan plan = plan_context(*lm, req);
    const Backends backends = make_backends(c, resolve_threads(c.threads), hp);
    Session session(*lm, plan.cache, backends.placement(), plan.batch);
    const int k = std::min(top_k, hp.n_vocab);

    nlohmann::json out = nlohmann::json::array();
    std::vector<int32_t> order(hp.n_vocab);
    EvalHooks hooks;
    hooks.on_rows = [&](int64_t, int nb, const float* rows) {
        for (int r = 0; r < nb; r++) {
            const float* row = rows + static_cast<size_t>(r) * hp.n_vocab;
            float mx = *std::max_element(row, row + hp.n_vocab);
            double sum = 0;
            for (int v = 0; v < hp.n_vocab; v++) sum += std::exp(static_cast<double>(row[v]) - mx);
            for (int v = 0; v < hp.n_vocab; v++) order[v] = v;
            std::partial_sort(order.begin(), order.begin() + k, order.end(),
                              [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
            nlohmann::json top = nlohmann::json::array();
            for (int j = 0; j < k; j++) top.push_back({order[j], row[order[j]]});
            out.push_back({{"lse", mx + std::log(sum)}, {"top", top}});
        }
    };
    session.eval(ids, hooks);
    fmt::print("{}\n", out.dump());
    return 0;
}

} // namespace kvrun::cli
