// A measurement, not part of kvrun: how far the reference engine's own CPU
// path (its quantized kernels, 8-bit activations) lands from a golden file's
// logits (the reference on the F32 twin, ../shared/golden*/README.md), by the
// goldens' measure: the largest |difference| over every row's top-10 logits
// and its log-sum-exp. All rows are evaluated in one batch, teacher forced,
// as kvrun's golden test feeds them; F16 KV cache, 2 threads. Built and run
// by scripts/reference-distance.sh against a llama.cpp build outside this
// repository; it links that build's libllama.
#include <llama.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <vector>

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: golden_distance MODEL.gguf GOLDEN.json\n");
        return 2;
    }
    const auto golden = nlohmann::json::parse(std::ifstream(argv[2]));
    std::vector<llama_token> tokens = golden["prompt_tokens"].get<std::vector<llama_token>>();
    const auto gen = golden["gen_tokens"].get<std::vector<llama_token>>();
    tokens.insert(tokens.end(), gen.begin(), gen.end() - 1);
    std::vector<nlohmann::json> rows(golden["prompt_logits"].begin(), golden["prompt_logits"].end());
    rows.insert(rows.end(), golden["gen_logits"].begin(), golden["gen_logits"].end());
    if (rows.size() != tokens.size()) {
        std::fprintf(stderr, "%s: %zu rows for %zu tokens\n", argv[2], rows.size(), tokens.size());
        return 1;
    }

    llama_backend_init();
    llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
    llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) {
        std::fprintf(stderr, "%s: cannot load\n", argv[1]);
        return 1;
    }
    const int n = static_cast<int>(tokens.size());
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(std::max(n, 64));
    cp.n_threads = cp.n_threads_batch = 2;
    llama_context* ctx = llama_init_from_model(model, cp);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) {
        std::fprintf(stderr, "decode failed\n");
        return 1;
    }
    double worst = 0;
    int worst_row = 0, checked = 0, flips = 0;
    for (int i = 0; i < n; i++) {
        const float* logits = llama_get_logits_ith(ctx, i);
        const float mx = *std::max_element(logits, logits + n_vocab);
        double sum = 0;
        for (int v = 0; v < n_vocab; v++) sum += std::exp(static_cast<double>(logits[v]) - mx);
        double d = std::fabs(mx + std::log(sum) - rows[i]["lse"].get<double>());
        const auto& top = rows[i]["top"];
        for (const auto& p : top) d = std::max(d, std::fabs(logits[p[0].get<int>()] - p[1].get<double>()));
        if (d > worst) worst = d, worst_row = i;
        if (top[0][1].get<double>() - top[1][1].get<double>() > 0.7) {
            checked++;
            flips += static_cast<int>(std::max_element(logits, logits + n_vocab) - logits) !=
                     top[0][0].get<int>();
        }
    }
    std::printf("%s: max |diff| %.3f (row %d of %d), argmax differs on %d of %d rows with margin > 0.7\n",
                argv[2], worst, worst_row, n, flips, checked);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
