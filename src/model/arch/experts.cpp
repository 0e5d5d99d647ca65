// The keys of a mixture-of-experts FFN (qwen3moe, qwen35moe). The reference
// engine hard-wires, for these families, a softmax router whose top-k
// probabilities are renormalised to sum 1: it reads neither
// expert_weights_norm nor expert_weights_scale, and nor does kvrun.
#include <algorithm>

#include "arch/family.h"
#include "error.h"
#include "gguf.h"
#include "model.h"

namespace kvrun {

void read_expert_hparams(const GgufFile& f, Hparams& hp) {
    const std::string p = hp.arch + ".";
    auto count = [&](const std::string& key, uint64_t max, bool required) {
        const std::optional<uint64_t> v = f.get_u64(p + key);
        if (!v) {
            if (required) fail(Exit::bad_model, "{}: missing key '{}{}'", f.path(), p, key);
            return 0;
        }
        if (*v == 0 || *v > max)
            fail(Exit::bad_model, "{}: '{}{}' = {} is out of range (1 .. {})", f.path(), p, key, *v,
                 max);
        return static_cast<int>(*v);
    };
    hp.n_expert = count("expert_count", 4096, true);
    const uint64_t used = f.need_u64(p + "expert_used_count");
    if (used == 0 || used > static_cast<uint64_t>(hp.n_expert))
        fail(Exit::bad_model, "{}: '{}expert_used_count' = {} must be 1 .. the {} experts",
             f.path(), p, used, hp.n_expert);
    hp.n_expert_used = static_cast<int>(used);
    hp.n_ff_exp = count("expert_feed_forward_length", 1u << 20, true);
    hp.n_ff_shexp = count("expert_shared_feed_forward_length", 1u << 20, false);
    // The file's feed_forward_length (written by converters, unused here)
    // gives way to the widest FFN a token runs: the buffers' width.
    hp.n_ff = std::max(hp.n_ff_exp, hp.n_ff_shexp);
    hp.n_ff_layers.clear();
}

} // namespace kvrun
