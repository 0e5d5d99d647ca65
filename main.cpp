// kvrun: dispatch to a subcommand, map errors to exit statuses.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include "cli/common.h"
#include "cli/output.h"
#include "error.h"

int main(int argc, char** argv) {
    using namespace kvrun;
    struct Sub {
        const char* name;
        int (*fn)(int, char**);
    };
    static const Sub subs[] = {
        {"tokenize", cli::run_tokenize}, {"logits", cli::run_logits},
        {"info", cli::run_info},         {"synth", cli::run_synth},
        {"quantize", cli::run_quantize}, {"perplexity", cli::run_perplexity},
        {"bench", cli::run_bench},       {"run", cli::run_generate},
        {"chat", cli::run_chat},         {"batch", cli::run_batch},
        {"serve", cli::run_serve},
    };
    cli::guard_standard_streams();
    cli::install_interrupt_handler();
    try {
        if (argc > 1) {
            for (const Sub& s : subs)
                if (std::strcmp(argv[1], s.name) == 0)
                    return cli::finish_stdout(s.fn(argc - 1, argv + 1));
            // A first word that is no option is a subcommand kvrun lacks
            // (pull), not a stray argument of the plain run.
            if (argv[1][0] != '-') {
                std::string names;
                for (const Sub& s : subs)
                    names += (names.empty() ? "" : ", ") + std::string(s.name);
                const std::string_view w = argv[1];
                fail(Exit::usage, "unknown subcommand '{}' (subcommands: {}){}", w, names,
                     w.size() > 5 && w.substr(w.size() - 5) == ".gguf" ? "; give the model with -m"
                                                                       : "");
            }
        }
        return cli::finish_stdout(cli::run_generate(argc, argv));
    } catch (const Error& e) {
        std::fflush(stdout);
        fmt::print(stderr, "kvrun: error: {}\n", e.what());
        // An interruption says which signal: 130 for Ctrl-C, 143 for SIGTERM.
        return e.code() == Exit::interrupted ? cli::interrupted_status()
                                             : static_cast<int>(e.code());
    } catch (const std::bad_alloc&) {
        fmt::print(stderr, "kvrun: error: out of memory\n");
        return static_cast<int>(Exit::out_of_memory);
    } catch (const std::exception& e) {
        // fmt::print's failed write to stdout (a full disk, a closed stdout).
        const auto* sys = dynamic_cast<const std::system_error*>(&e);
        if (sys && std::strstr(e.what(), "cannot write to file") != nullptr) {
            fmt::print(stderr, "kvrun: error: cannot write to stdout: {}\n",
                       std::strerror(sys->code().value()));
            return static_cast<int>(Exit::error);
        }
        fmt::print(stderr, "kvrun: error: {}\n", e.what());
        return static_cast<int>(Exit::error);
    }
}
