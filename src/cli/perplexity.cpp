// `kvrun perplexity -m M -f TEXT -c N`: how well the model predicts a text.
//
// The text is tokenized whole (with BOS) and cut into consecutive chunks of N
// tokens; each chunk's first token is replaced by BOS and the chunk is
// evaluated from an empty cache. The tokens of each chunk's second half are
// scored (each predicted from everything before it in its chunk), so every
// scored token has at least N/2 tokens of context. Prints PPL ± its standard
// error, the convention of the reference engine, so the numbers compare.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <unistd.h>

#include "ggml-like/kernels.h"
#include "cli/common.h"
#include "error.h"
#include "forward.h"
#include "loader.h"
#include "context.h"
#include "session.h"

namespace kvrun::cli {

int run_perplexity(int argc, char** argv) {
    CommonOptions c;
    std::string file;
    int n_ctx = 512, batch = 512;
    int64_t max_chunks = -1;
    bool json = false;
    CLI::App app{"kvrun perplexity: perplexity of a model on a text file", "kvrun perplexity"};
    add_model_option(app, c);
    add_runtime_options(app, c);
    app.add_option("-f,--file", file, "text file (- for stdin)")->required();
    app.add_option("-c,--ctx-size", n_ctx, "chunk length in tokens")->capture_default_str()->check(int_in(8, 1 << 20));
    app.add_option("-b,--batch-size", batch, "tokens per batch")->capture_default_str()->check(int_in(1, 1 << 16));
    app.add_option("--chunks", max_chunks, "score at most this many chunks (-1 = all)")
        ->check(CLI::Validator(
            [](std::string& v) -> std::string {
                return v == "-1" || int_in(1, int64_t{1} << 40)(v).empty() ? "" : "must be >= 1, or -1 for all";
            },
            "N >= 1 or -1"));
    app.add_flag("--json", json, "print a JSON object instead of a line");
    if (const auto done = parse_command_line(app, argc, argv)) return *done;
    ContextRequest req;
    set_cache_types(c, req, false);
    const gl::Type tk = req.type_k, tv = req.type_v;
    const std::string text = read_prompt("", file, false);
    const StopPoint stop_point; // its loops poll interrupted()
    auto lm = LoadedModel::load(c.model, layers_home(c), !c.precise);
    const Hparams& hp = lm->model.hp;
    const std::vector<int32_t> tokens = lm->tokenizer.encode(text, true, false);
    int64_t n_chunks = static_cast<int64_t>(tokens.size()) / n_ctx;
    if (max_chunks >= 0) n_chunks = std::min(n_chunks, max_chunks);
    if (n_chunks < 1)
        fail(Exit::usage, "the text has {} tokens, fewer than one chunk of {} (-c)", tokens.size(),
             n_ctx);
    req.use = ContextRequest::Use::score;
    req.ctx = std::to_string(n_ctx);
    req.type_k = tk;
    req.type_v = tv;
    req.batch = batch;
    const ContextPlan plan = plan_context(*lm, req);
    const Backends backends = make_backends(c, resolve_threads(c.threads), hp);
    Session session(*lm, plan.cache, backends.placement(), plan.batch);
    const bool progress = isatty(2);
    const int first = n_ctx / 2;
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    std::vector<int32_t> chunk(n_ctx);
    std::vector<float> exps(static_cast<size_t>(hp.n_vocab));
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t ci = 0; ci < n_chunks && !interrupted(); ci++) {
        std::copy(tokens.begin() + ci * n_ctx, tokens.begin() + (ci + 1) * n_ctx, chunk.begin());
        if (lm->tokenizer.bos() >= 0) chunk[0] = lm->tokenizer.bos();
        session.clear();
        EvalHooks hooks;
        hooks.rows_from = first; // the first half is context only: no logits
        hooks.on_rows = [&](int64_t i, int nb, const float* rows) {
            for (int r = 0; r < nb; r++) {
                const int64_t pos = i + r;
                if (pos < first || pos + 1 >= n_ctx) continue;
                const float* row = rows + static_cast<size_t>(r) * hp.n_vocab;
                // log-sum-exp with the SIMD kernels of attention's softmax:
                // one exp per vocabulary entry and scored token (Gemma 3's
                // 262144: in double through libm this took half the run).
                const float mx = gl::cpu::max_of(row, hp.n_vocab);
                std::copy(row, row + hp.n_vocab, exps.begin());
                const double sum = gl::cpu::exp_sum(exps.data(), hp.n_vocab, mx);
                const double l = -(row[chunk[pos + 1]] - mx - std::log(sum));
                nll += l;
                nll2 += l * l;
                count++;
            }
        };
        session.eval(chunk, hooks);
        if (progress)
            fmt::print(stderr, "\rkvrun perplexity: chunk {}/{}, PPL so far {:.4f}", ci + 1, n_chunks,
                       std::exp(nll / count));
    }
    if (progress) fmt::print(stderr, "\n");
    if (interrupted()) return interrupted_status();
    const double mean = nll / count;
    const double var = nll2 / count - mean * mean;
    const double ppl = std::exp(mean);
    const double err = count > 1 ? ppl * std::sqrt(std::max(var, 0.0) / (count - 1)) : 0.0;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (json)
        fmt::print("{{\"ppl\": {:.6f}, \"stderr\": {:.6f}, \"chunks\": {}, \"ctx\": {}, "
                   "\"scored_tokens\": {}, "
                   "\"cache_type_k\": \"{}\", \"cache_type_v\": \"{}\", \"k_rotate\": {}, "
                   "\"seconds\": {:.3f}}}\n",
                   ppl, err, n_chunks, n_ctx, count, gl::type_name(tk), gl::type_name(tv),
                   plan.cache.k_rotate, secs);
    else
        fmt::print("PPL = {:.4f} +/- {:.4f} ({} chunks of {} tokens, {} scored, cache {}/{}{}, "
                   "{:.1f} s)\n",
                   ppl, err, n_chunks, n_ctx, count, gl::type_name(tk), gl::type_name(tv),
                   plan.cache.k_rotate > 0 ? ", keys rotated" : "", secs);
    return 0;
}

} // namespace kvrun::cli
