// The families kvrun runs: one line each.
#include "arch/family.h"

namespace kvrun {

extern const Family kLlama;
extern const Family kQwen2;
extern const Family kQwen3;
extern const Family kGemma3;
extern const Family kPhi3;
extern const Family kGemma4;
extern const Family kQwen35;
extern const Family kQwen3Moe;
extern const Family kQwen35Moe;

namespace {
const Family* const kFamilies[] = {&kLlama,  &kQwen2,  &kQwen3,    &kGemma3,   &kPhi3,
                                   &kGemma4, &kQwen35, &kQwen3Moe, &kQwen35Moe};
} // namespace

const Family* find_family(std::string_view arch) {
    for (const Family* f : kFamilies)
        if (arch == f->name) return f;
    return nullptr;
}

const std::string& family_names() {
    static const std::string names = [] {
        std::string s;
        for (const Family* f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f->name);
        return s;
    }();
    return names;
}

} // namespace kvrun
