#include "cli/args.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "error.h"
#include "ggml-like/cpu/gemm.h"
#include "ggml-like/cpu/ops.h"
#include "ggml-like/kernels.h"
#include "version_info.h"

namespace kvrun::cli {

namespace {

// What a llama.cpp spelling becomes here.
enum class AliasKind {
    rename, // the option `to` (applies only where the app has it)
    ignore, // accepted and dropped: it asks for what kvrun always does (`why`)
    refuse, // a usage error saying what kvrun lacks (`why`)
};

struct Alias {
    const char* from;
    AliasKind kind;
    const char* to;     // rename: the option; ignore: an option the app must have for it to apply
    const char* why;    // ignore / refuse: for the README table and the error
    bool value = false; // ignore: also drops a following on/off/auto value
};

// The flags a llama-cli user types every day (README, "Coming from llama.cpp").
// Single-letter ones that mean the same (-m -p -f -n -c -b -t -s -e -i -v)
// are the options' own short names; -r is an alias only where the app has no
// -r of its own (bench's -r is --repetitions).
constexpr Alias kAliases[] = {
    {"-ctk", AliasKind::rename, "--ctk", nullptr},
    {"-ctv", AliasKind::rename, "--ctv", nullptr},
    {"-ngl", AliasKind::rename, "--n-gpu-layers", nullptr},
    {"--gpu-layers", AliasKind::rename, "--n-gpu-layers", nullptr},
    {"-dev", AliasKind::rename, "--device", nullptr},
    {"-pg", AliasKind::rename, "--pg", nullptr},
    {"-np", AliasKind::rename, "--parallel", nullptr},
    {"-cb", AliasKind::ignore, "--parallel", "batching is always continuous"},
    {"--cont-batching", AliasKind::ignore, "--parallel", "batching is always continuous"},
    {"-sys", AliasKind::rename, "--system", nullptr},
    {"--system-prompt", AliasKind::rename, "--system", nullptr},
    {"-sysf", AliasKind::rename, "--system-file", nullptr},
    {"--system-prompt-file", AliasKind::rename, "--system-file", nullptr},
    {"-r", AliasKind::rename, "--stop", nullptr},
    {"--reverse-prompt", AliasKind::rename, "--stop", nullptr},
    {"--predict", AliasKind::rename, "--n-predict", nullptr},
    {"--display-prompt", AliasKind::rename, "--echo", nullptr},
    {"-fa", AliasKind::ignore, "--model", "attention is always one fused (online-softmax) kernel",
     true},
    {"--flash-attn", AliasKind::ignore, "--model",
     "attention is always one fused (online-softmax) kernel", true},
    {"-co", AliasKind::ignore, "--model", "output is never coloured"},
    {"--color", AliasKind::ignore, "--model", "output is never coloured"},
    {"--no-display-prompt", AliasKind::ignore, "--model", "the prompt is printed only with --echo"},
    {"--no-escape", AliasKind::ignore, "--escape", "escapes are processed only with -e"},
    {"--jinja", AliasKind::ignore, "--chat-template", "the model's own template is always used"},
    {"-no-cnv", AliasKind::ignore, "--model", "a plain run is never a conversation"},
    {"--no-conversation", AliasKind::ignore, "--model", "a plain run is never a conversation"},
    {"-cnv", AliasKind::ignore, "--system", "kvrun chat is already a conversation"},
    {"--conversation", AliasKind::ignore, "--system", "kvrun chat is already a conversation"},
    {"-md", AliasKind::rename, "--draft-model", nullptr},
    {"--model-draft", AliasKind::rename, "--draft-model", nullptr},
    {"--draft", AliasKind::rename, "--draft-max", nullptr},
    {"--draft-n", AliasKind::rename, "--draft-max", nullptr},
    {"--mlock", AliasKind::ignore, "--model",
     "weights are copied into memory (huge pages) or "
     "mapped for the GPU by kvrun itself"},
    {"--no-mmap", AliasKind::ignore, "--model",
     "weights are copied into memory (huge pages) or "
     "mapped for the GPU by kvrun itself"},
    {"--no-warmup", AliasKind::ignore, "--model", "kvrun runs no warm-up pass"},
    {"--lora", AliasKind::refuse, nullptr, "LoRA adapters are not supported"},
    {"-nkvo", AliasKind::refuse, nullptr,
     "the KV cache of offloaded layers stays on the GPU (--kv-gpu-window W keeps only the newest W "
     "tokens there)"},
    {"--no-kv-offload", AliasKind::refuse, nullptr,
     "the KV cache of offloaded layers stays on the GPU (--kv-gpu-window W keeps only the newest W "
     "tokens there)"},
};

// For --help: the llama-cli spellings this app takes, and those it accepts
// without effect.
std::string alias_help(const CLI::App& app) {
    std::string renamed, ignored;
    for (const Alias& a : kAliases) {
        if (!a.to || !app.get_option_no_throw(a.to) || app.get_option_no_throw(a.from)) continue;
        // In a plain run -cnv is not ignored: it starts the chat REPL (run.cpp).
        const bool starts_chat =
            !std::strcmp(a.from, "-cnv") || !std::strcmp(a.from, "--conversation");
        if (starts_chat && app.get_option_no_throw("--chat")) continue;
        std::string& list = a.kind == AliasKind::rename ? renamed : ignored;
        if (!list.empty()) list += ", ";
        list += a.kind == AliasKind::rename ? fmt::format("{} = {}", a.from, a.to) : a.from;
    }
    // Wrapped at 100 columns, at the commas.
    const auto wrap = [](const std::string& text) {
        std::string out, line;
        size_t at = 0;
        while (at < text.size()) {
            size_t end = text.find(", ", at);
            end = end == std::string::npos ? text.size() : end + 2;
            const std::string piece = text.substr(at, end - at);
            if (line.size() + piece.size() > 100) {
                while (!line.empty() && line.back() == ' ') line.pop_back();
                out += line + "\n";
                line = "  ";
            }
            line += piece;
            at = end;
        }
        while (!line.empty() && line.back() == ' ') line.pop_back();
        return out + line;
    };
    std::string s;
    if (!renamed.empty()) s += wrap("llama-cli spellings: " + renamed + ".");
    if (!ignored.empty())
        s += (s.empty() ? "" : "\n") + wrap("Accepted, no effect: " + ignored + ".");
    return s;
}

const Alias* find_alias(std::string_view word) {
    for (const Alias& a : kAliases)
        if (word == a.from) return &a;
    return nullptr;
}

// Flags expect no value (CLI11 gives them expected(0)).
bool takes_value(const CLI::Option* o) {
    return o->get_expected_max() > 0 && o->get_type_size_max() > 0;
}

// -fa on|off|auto|1|0 (llama.cpp took 1/0 before on/off).
bool is_switch_value(const char* v) {
    for (const char* w : {"on", "off", "auto", "1", "0"})
        if (!std::strcmp(v, w)) return true;
    return false;
}

// Edits (insert, delete, substitute; '_' for '-' is free) between two words.
size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); j++) row[j] = j;
    for (size_t i = 1; i <= a.size(); i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); j++) {
            const char x = a[i - 1] == '_' ? '-' : a[i - 1], y = b[j - 1] == '_' ? '-' : b[j - 1];
            const size_t next = std::min({row[j] + 1, row[j - 1] + 1, diag + (x == y ? 0 : 1)});
            diag = row[j];
            row[j] = next;
        }
    }
    return row[b.size()];
}

// The app's long option nearest `name` (--top_k: --top-k), or "" when none
// is close: at most 2 edits, and fewer than a third of the word.
std::string nearest_option(const CLI::App& app, const std::string& name) {
    std::string best;
    size_t best_d = SIZE_MAX;
    for (const CLI::Option* o : app.get_options())
        for (const std::string& l : o->get_lnames()) {
            const std::string cand = "--" + l;
            const size_t d = edit_distance(name, cand);
            if (d < best_d) best_d = d, best = cand;
        }
    return best_d <= 2 && best_d * 3 < name.size() ? best : "";
}

// `probe`: the spelling to look near (-top-k is looked up as --top-k).
[[noreturn]] void unknown_option(const CLI::App& app, const std::string& name,
                                 const std::string& probe) {
    const std::string near = nearest_option(app, probe);
    if (!near.empty()) fail(Exit::usage, "unknown option {} (did you mean {}?)", name, near);
    fail(Exit::usage, "unknown option {}", name);
}

bool numeric_start(std::string_view s) {
    if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
    return !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.');
}

// argv with the aliases applied; throws Error(usage) for refused flags and
// for single-dash words that are no option here.
std::vector<std::string> rewrite(CLI::App& app, int argc, char** argv) {
    std::vector<std::string> out{argv[0]};
    bool value_next = false; // the previous word was an option that takes a value
    for (int i = 1; i < argc; i++) {
        const std::string w = argv[i];
        if (value_next || w == "--" || w.size() < 2 || w[0] != '-' ||
            !(std::isalpha(static_cast<unsigned char>(w[1])) || w[1] == '-')) {
            value_next = false;
            out.push_back(w);
            if (w == "--")
                for (i++; i < argc; i++) out.emplace_back(argv[i]);
            continue;
        }
        const std::string name = w.substr(0, w.find('='));
        const CLI::Option* own = app.get_option_no_throw(name);
        if (const Alias* a = own ? nullptr : find_alias(name)) {
            switch (a->kind) {
            case AliasKind::rename:
                if (app.get_option_no_throw(a->to)) {
                    out.push_back(a->to + w.substr(name.size()));
                    value_next = name.size() == w.size();
                    continue;
                }
                break;
            case AliasKind::ignore:
                if (app.get_option_no_throw(a->to)) {
                    if (a->value && i + 1 < argc && is_switch_value(argv[i + 1])) {
                        i++;
                    } else if (a->value && i + 1 < argc && argv[i + 1][0] != '-') {
                        // -fa 2: a value it does not take, not a stray word.
                        fail(Exit::usage, "{} {}: expected on, off or auto (or 1, 0); {}", name,
                             argv[i + 1], a->why);
                    }
                    continue;
                }
                break;
            case AliasKind::refuse:
                fail(Exit::usage, "{}: {}", name, a->why);
            }
        }
        if (own || w[1] == '-') {
            // An unknown long option is named here: CLI11 would take its
            // value for a stray word ("unexpected argument 16 --ubatch-size").
            if (!own) unknown_option(app, name, name);
            value_next = takes_value(own) && name.size() == w.size();
            out.push_back(w);
            continue;
        }
        // -x, -x5 (a short option and its value), -ve (short flags together).
        const CLI::Option* first = app.get_option_no_throw(w.substr(0, 2));
        bool ok = first != nullptr;
        if (ok && w.size() == 2) {
            value_next = takes_value(first);
        } else if (ok && takes_value(first)) {
            ok = numeric_start(std::string_view(w).substr(2));
        } else {
            for (size_t k = 2; ok && k < w.size(); k++) {
                const CLI::Option* o = app.get_option_no_throw(std::string{'-', w[k]});
                ok = o && !takes_value(o);
            }
        }
        if (!ok) {
            const std::string dashed = "-" + name;
            if (app.get_option_no_throw(dashed))
                fail(Exit::usage, "unknown option {} (did you mean {}?)", name, dashed);
            unknown_option(app, name, dashed);
        }
        out.push_back(w);
    }
    return out;
}

// CLI11's message, reworded where it is vague.
std::string describe(const CLI::ParseError& e) {
    std::string m = e.what();
    for (const char* p : {"The following argument was not expected: ",
                          "The following arguments were not expected: "})
        if (m.rfind(p, 0) == 0) {
            const std::string rest = m.substr(std::strlen(p));
            return (rest.rfind('-', 0) == 0 ? "unknown option " : "unexpected argument ") + rest;
        }
    // "--n-predict: 1 required INT:INT in [...] missing"
    const size_t colon = m.find(": ");
    if (colon != std::string::npos && m.find(" required ", colon) != std::string::npos &&
        m.size() > 8 && m.compare(m.size() - 8, 8, " missing") == 0)
        return m.substr(0, colon) + " needs a value";
    return m;
}

std::string range_text(double lo, double hi) {
    return fmt::format("{:g} to {:g}", lo, hi);
}

} // namespace

CLI::Validator real_in(double lo, double hi, bool above_lo) {
    return CLI::Validator(
        [lo, hi, above_lo](std::string& s) -> std::string {
            errno = 0;
            char* end = nullptr;
            const double v = std::strtod(s.c_str(), &end);
            if (s.empty() || end == s.c_str() || *end != '\0') return "'" + s + "' is not a number";
            if (std::isnan(v)) return "'" + s + "' is not a number";
            if (!std::isfinite(v) || errno == ERANGE) return "'" + s + "' is not a finite number";
            if (above_lo && v <= lo)
                return fmt::format("'{}' is out of range (more than {:g}, at most {:g})", s, lo,
                                   hi);
            if (v < lo || v > hi) return "'" + s + "' is out of range (" + range_text(lo, hi) + ")";
            return {};
        },
        "NUMBER in [" + range_text(lo, hi) + "]");
}

CLI::Validator int_in(int64_t lo, int64_t hi) {
    return CLI::Validator(
        [lo, hi](std::string& s) -> std::string {
            errno = 0;
            char* end = nullptr;
            const long long v = std::strtoll(s.c_str(), &end, 10);
            if (s.empty() || end == s.c_str() || *end != '\0')
                return "'" + s + "' is not a whole number";
            if (errno == ERANGE || v < lo || v > hi)
                return fmt::format("'{}' is out of range ({} to {})", s, lo, hi);
            return {};
        },
        fmt::format("INT in [{} to {}]", lo, hi));
}

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
    app.set_version_flag("--version", version_string(),
                         "print the version and build features, then exit");
    // A repeated option takes its last value (scripts append overrides);
    // options that collect values (--stop, bench's -m) keep collecting.
    for (CLI::Option* o : app.get_options())
        if (o->nonpositional() && o->get_multi_option_policy() == CLI::MultiOptionPolicy::Throw &&
            o->get_items_expected_max() <= 1)
            o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    std::string where = app.get_name().empty() ? "kvrun" : app.get_name();
    if (const std::string aliases = alias_help(app); !aliases.empty())
        app.footer(app.get_footer() + (app.get_footer().empty() ? "" : "\n") + aliases);
    try {
        std::vector<std::string> args = rewrite(app, argc, argv);
        std::vector<char*> ptrs;
        for (std::string& a : args) ptrs.push_back(a.data());
        // Extra words are collected, in order, and named below (CLI11's own
        // message lists them backwards).
        app.allow_extras();
        app.parse(static_cast<int>(ptrs.size()), ptrs.data());
        const std::vector<std::string> extra = app.remaining();
        if (!extra.empty()) {
            std::string words;
            for (const std::string& x : extra) words += (words.empty() ? "'" : " '") + x + "'";
            fail(Exit::usage, "unexpected argument{} {}{}", extra.size() == 1 ? "" : "s", words,
                 app.get_option_no_throw("--prompt") ? " (a prompt goes after -p, in quotes)" : "");
        }
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e); // --help, --version
        std::fflush(stdout);
        fmt::print(stderr, "kvrun: error: {} (see {} --help)\n", describe(e), where);
        return static_cast<int>(Exit::usage);
    } catch (const Error& e) {
        std::fflush(stdout);
        fmt::print(stderr, "kvrun: error: {} (see {} --help)\n", e.what(), where);
        return static_cast<int>(e.code());
    }
    return std::nullopt;
}

std::string version_string() {
    std::string features;
#if defined(__x86_64__)
    features = "x86-64 kernels: AVX2, AVX-VNNI, AVX-512, AMX";
#elif defined(__aarch64__)
    features = "arm64 kernels: NEON";
#else
    features = "scalar kernels";
#endif
#ifdef GL_USE_BLAS
    features += ", OpenBLAS";
#endif
#ifdef KVRUN_HAS_CUDA
    features += ", CUDA";
#endif
    return fmt::format("kvrun {} ({}, {}; this CPU: {}, prompt batches on {}; {})", KVRUN_VERSION,
                       KVRUN_GIT_DESCRIBE, features, gl::cpu::isa_name(),
                       gl::ops::batch_paths_summary(), gl::gemm::blas_description());
}

} // namespace kvrun::cli
