#include "model_summary.h"

#include <cctype>
#include <map>

#include <fmt/format.h>

#include "tensor_names.h"

namespace kvrun {

// The numbering of general.file_type that GGUF files carry (the format's
// published enum; 4-6 and 19+ are types kvrun does not name).
const char* file_type_name(uint64_t t) {
    switch (t) {
    case 0:
        return "F32";
    case 1:
        return "F16";
    case 2:
        return "Q4_0";
    case 3:
        return "Q4_1";
    case 7:
        return "Q8_0";
    case 8:
        return "Q5_0";
    case 9:
        return "Q5_1";
    case 10:
        return "Q2_K";
    case 11:
        return "Q3_K_S";
    case 12:
        return "Q3_K_M";
    case 13:
        return "Q3_K_L";
    case 14:
        return "Q4_K_S";
    case 15:
        return "Q4_K_M";
    case 16:
        return "Q5_K_S";
    case 17:
        return "Q5_K_M";
    case 18:
        return "Q6_K";
    case 32:
        return "BF16";
    default:
        return nullptr;
    }
}

std::string params_text(uint64_t p) {
    if (p >= 1000000000) return fmt::format("{:.2f}B", p / 1e9);
    if (p >= 1000000) return fmt::format("{:.1f}M", p / 1e6);
    if (p >= 1000) return fmt::format("{:.1f}K", p / 1e3);
    return fmt::format("{}", p);
}

ModelSummary summarize_model(const GgufFile& f) {
    ModelSummary s;
    if (auto n = f.get_str("general.name")) s.name = std::string(*n);
    // By bytes, the type most of the weights are stored in (norms are F32
    // but small): the label when the file does not say.
    std::map<std::string, uint64_t> bytes_by_type;
    const std::optional<std::string_view> arch = f.get_str("general.architecture");
    const uint64_t used =
        arch ? f.get_u64(std::string(*arch) + ".expert_used_count").value_or(0) : 0;
    const bool tied = !f.tensor(std::string(tensor_names::output));
    for (const GgufTensor& t : f.tensors()) {
        const uint64_t n = static_cast<uint64_t>(t.n_elements());
        s.params += n;
        s.weight_bytes += t.nbytes;
        bytes_by_type[gl::type_name(t.type)] += t.nbytes;
        // Experts: slices of the last of 3 dimensions, "blk.N.ffn_*_exps".
        const bool experts = t.n_dims == 3 && tensor_names::is_experts(t.name) && used > 0 &&
                             used <= static_cast<uint64_t>(t.ne[2]);
        if (experts) {
            s.n_expert = static_cast<int>(t.ne[2]);
            s.n_expert_used = static_cast<int>(used);
            s.active_params += n / t.ne[2] * used;
            s.bytes_per_token += t.nbytes / t.ne[2] * used;
        } else {
            s.active_params += n;
            const bool table = t.name == tensor_names::token_embd && !tied && t.ne[1] > 0;
            s.bytes_per_token += table ? t.nbytes / t.ne[1] : t.nbytes;
        }
    }
    const std::optional<uint64_t> ft = f.get_u64("general.file_type");
    if (const char* name = ft ? file_type_name(*ft) : nullptr) {
        s.file_type = name;
    } else {
        uint64_t most = 0;
        for (const auto& [type, bytes] : bytes_by_type)
            if (bytes > most) most = bytes, s.file_type = type;
        // Written as file types are ("F32", "Q4_0"), not as tensor types.
        for (char& c : s.file_type)
            c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    return s;
}

} // namespace kvrun
