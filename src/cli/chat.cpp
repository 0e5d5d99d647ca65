// `kvrun chat -m M` (or `kvrun -m M -i`): a chat REPL whose KV cache carries
// over from turn to turn (see chat_session.h). With stdin not a terminal it
// answers one message (-p, or stdin when there is no -p) and exits: it never
// waits for input that cannot come, and leaves stdin unread when -p is given.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <random>
#include <sstream>
#include <csignal>
#include <sys/stat.h>
#include <unistd.h>

#include <clocale>
#include <editline/readline.h>
#include <langinfo.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include "chat_session.h"
#include "cli/common.h"
#include "cli/grammar_options.h"
#include "json_schema.h"
#include "cli/speculative_options.h"
#include "error.h"
#include "file_io.h"
#include "context.h"
#include "unicode.h"

namespace kvrun::cli {

namespace {

struct ChatOptions {
    CommonOptions common;
    std::string ctx = "auto", prompt, system, system_file, chat_template;
    int64_t n_predict = -1;
    int batch = 512;
    std::vector<std::string> stop;
    SamplerParams sampling;
    GrammarOptions grammar;
    SpeculativeOptions speculative;
    bool escape = false;
};

constexpr const char* kHelp =
    "commands:\n"
    "  /stats         tokens reused vs evaluated, cache fill, speed, GPU memory\n"
    "  /undo          drop the last exchange (the cache keeps what stays)\n"
    "  /retry         generate the last answer again\n"
    "  /reset, /clear forget the conversation (the system prompt stays)\n"
    "  /system [TEXT] show or set the system prompt\n"
    "  /set parameter NAME VALUE   temperature, top_k, top_p, min_p, repeat_penalty,\n"
    "                 repeat_last_n, seed, num_predict for the next answers (as Ollama);\n"
    "                 /set system TEXT is /system TEXT\n"
    "  /grammar [GBNF | SCHEMA | off]  show or set what the next answers must\n"
    "                 follow: a GBNF grammar, or a JSON schema (it starts with {)\n"
    "  /save FILE     save the conversation and its cache (FILE, FILE.json)\n"
    "  /load FILE     load them (the cache is used only if it matches)\n"
    "  /help, /?      this text\n"
    "  /exit, /bye    leave (so do /quit and Ctrl-D)\n"
    "A line ending in \\ continues on the next line; so does everything between\n"
    "two lines of \"\"\" (Ollama's multi-line input). Ctrl-C stops an answer or a\n"
    "/load; twice at the prompt exits. At --temp 0, /retry may still differ:\n"
    "the answer is evaluated after the turns before it, not as they were then.\n";

// Ollama's /set, as far as kvrun has it: `/set system TEXT` and `/set
// parameter NAME VALUE` for the sampling and reply length. What it has not is
// refused with the kvrun spelling. The reply, without its brackets.
std::string set_command(ChatSession& session, const std::string& arg) {
    std::istringstream in(arg);
    std::string what, name, value;
    in >> what;
    if (what == "system") {
        const size_t at = arg.find_first_not_of(' ', arg.find("system") + 6);
        const std::string text = at == std::string::npos ? "" : arg.substr(at);
        if (!unicode::valid_utf8(text)) return "the system prompt is not valid UTF-8: not set";
        session.set_system(text);
        return text.empty() ? "system prompt cleared" : "system prompt set";
    }
    constexpr const char* kNames =
        "temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, num_predict";
    if (what != "parameter")
        return fmt::format("/set {} is not supported here; kvrun has /set system TEXT and /set "
                           "parameter NAME VALUE ({})",
                           what, kNames);
    in >> name >> value;
    std::string rest;
    if (name.empty() || value.empty() || (in >> rest))
        return fmt::format("/set parameter NAME VALUE, one value ({})", kNames);
    if (name == "num_ctx")
        return "num_ctx is the cache's size, fixed for a chat: start kvrun chat with -c N";
    if (name == "stop")
        return "stop strings are fixed for a chat: start kvrun chat with --stop TEXT";
    SamplerParams p = session.sampling();
    char* end = nullptr;
    errno = 0;
    const double x = std::strtod(value.c_str(), &end);
    const bool number = *end == '\0' && errno == 0 && std::isfinite(x);
    const bool whole = number && x == std::floor(x);
    auto bad = [&](const char* expect) {
        return fmt::format("/set parameter {} {}: expected {}; unchanged", name, value, expect);
    };
    if (name == "temperature") {
        if (!number || x < 0 || x > 100) return bad("a number from 0 (greedy) to 100");
        p.temp = static_cast<float>(x);
    } else if (name == "top_k") {
        if (!whole || x < 0 || x > (1 << 30)) return bad("a whole number, 0 = off");
        p.top_k = static_cast<int>(x);
    } else if (name == "top_p" || name == "min_p") {
        if (!number || x < 0 || x > 1) return bad("a number from 0 to 1");
        (name == "top_p" ? p.top_p : p.min_p) = static_cast<float>(x);
    } else if (name == "repeat_penalty") {
        if (!number || x <= 0 || x > 100) return bad("a number above 0, 1 = off");
        p.repeat_penalty = static_cast<float>(x);
    } else if (name == "repeat_last_n") {
        if (!whole || x < 0 || x > (1 << 20)) return bad("a whole number");
        p.repeat_last_n = static_cast<int>(x);
    } else if (name == "seed") {
        char* seed_end = nullptr;
        errno = 0;
        const uint64_t seed = std::strtoull(value.c_str(), &seed_end, 10);
        if (value[0] == '-' || *seed_end != '\0' || errno != 0)
            return bad("a whole number from 0 to 18446744073709551615");
        p.seed = seed;
    } else if (name == "num_predict") {
        if (!whole || x < -1 || x > (1 << 30))
            return bad("a whole number, -1 = until the turn ends");
        session.set_n_predict(static_cast<int64_t>(x));
        return fmt::format("num_predict {} (-n)", value);
    } else {
        return fmt::format("unknown parameter {} (kvrun's: {})", name, kNames);
    }
    session.set_sampling(p, name == "seed"); // a seed set restarts the draws
    return fmt::format("{} {}", name, value);
}

std::string rtrim(std::string s) {
    while (!s.empty() && std::strchr(" \t\r\n", s.back())) s.pop_back();
    return s;
}

void out(std::string_view s) {
    write_stdout(s);
}

// Ctrl-C at the prompt, whether the terminal turns it into SIGINT (read
// interrupted) or hands it over as a byte (libedit's raw mode), ends the
// line like Ctrl-D but is told apart by this flag; libedit's own signal
// handling is off so the one SIGINT handler stays ours.
bool g_prompt_ctrl_c = false;

// One byte of the terminal, waiting for it; EOF at its end, a read error or
// Ctrl-C (see read_key).
int read_byte() {
    // SIGINT stays blocked between the flag check and the wait, and ppoll
    // unblocks it atomically: a Ctrl-C that the terminal turned into SIGINT
    // just before this wait (the prompt can be on screen before libedit
    // switches the terminal to raw mode) ends the wait instead of being lost.
    sigset_t block, orig;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    while (true) {
        pthread_sigmask(SIG_BLOCK, &block, &orig);
        if (interrupted()) {
            pthread_sigmask(SIG_SETMASK, &orig, nullptr);
            g_prompt_ctrl_c = true;
            return EOF;
        }
        pollfd p{0, POLLIN, 0};
        const int r = ppoll(&p, 1, nullptr, &orig);
        pthread_sigmask(SIG_SETMASK, &orig, nullptr);
        if (r < 0) {
            if (errno == EINTR) continue; // the flag check above decides
            return EOF;
        }
        unsigned char c;
        const ssize_t n = ::read(0, &c, 1);
        if (n == 1 && c != 3) return c;
        if (n == 1) { // Ctrl-C as a byte (raw mode)
            g_prompt_ctrl_c = true;
            return EOF;
        }
        if (n < 0 && errno == EINTR) continue;
        return EOF;
    }
}

// libedit takes what rl_getc_function returns as one whole character (a
// wchar_t), so a UTF-8 sequence is read and decoded here: handed over byte
// by byte, each byte of "é" would become a character of its own, which the
// line then drops (or garbles) when it converts back to multibyte text.
int read_key(FILE*) {
    const int c = read_byte();
    if (c == EOF || c < 0x80) return c;
    const int len = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    if (len == 0) return 0xFFFD; // not a lead byte
    int cp = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        const int b = read_byte();
        if (b == EOF) return EOF;
        if ((b & 0xC0) != 0x80) return 0xFFFD;
        cp = cp << 6 | (b & 0x3F);
    }
    return cp;
}

// libedit reads and writes the line in the locale's multibyte encoding: the
// "C" locale (no LANG, or LANG=C) has none beyond ASCII and every other
// character would be dropped from the message. kvrun's messages are UTF-8,
// so the character type (only that) is the environment's when it is UTF-8,
// otherwise C.UTF-8.
void use_utf8_ctype() {
    const char* got = std::setlocale(LC_CTYPE, "");
    auto utf8 = [] {
        const char* cs = nl_langinfo(CODESET);
        return cs && (std::strcmp(cs, "UTF-8") == 0 || std::strcmp(cs, "utf8") == 0);
    };
    if (got && utf8()) return;
    if (!std::setlocale(LC_CTYPE, "C.UTF-8") || !utf8()) std::setlocale(LC_CTYPE, "C");
}

// One message from the terminal: a line, or several joined while each ends
// in a backslash. nullopt at end of input (Ctrl-D).
std::optional<std::string> read_message() {
    std::string msg;
    const char* prompt = "> ";
    bool ctrl_c = false, in_block = false;
    while (true) {
        g_prompt_ctrl_c = false;
        char* line = readline(prompt);
        if (!line && terminated()) {
            out("\n");
            return std::nullopt; // SIGTERM leaves, whatever was typed
        }
        if (!line && (g_prompt_ctrl_c || interrupted())) {
            // libedit gives up the line on Ctrl-C: a first one discards the
            // input, a second in a row leaves.
            clear_interrupt();
            if (ctrl_c) {
                out("\n");
                return std::nullopt;
            }
            ctrl_c = true;
            msg.clear();
            in_block = false;
            prompt = "> ";
            out("\n(Ctrl-C again to exit)\n");
            continue;
        }
        if (!line) {
            if (msg.empty()) {
                out("\n"); // Ctrl-D: the shell's prompt starts on its own line
                return std::nullopt;
            }
            return msg;
        }
        ctrl_c = false;
        std::string l = line;
        std::free(line);
        // """ opens a block that runs to a line ending in """ (Ollama's way).
        if (!in_block && msg.empty() && l.rfind("\"\"\"", 0) == 0) {
            l.erase(0, 3);
            in_block = true;
            if (l.size() >= 3 && l.compare(l.size() - 3, 3, "\"\"\"") == 0) {
                l.resize(l.size() - 3);
                in_block = false;
            }
            msg += l;
            if (!in_block) break;
            if (!l.empty()) msg += '\n';
            prompt = ". ";
            continue;
        }
        if (in_block) {
            const bool end = l.size() >= 3 && l.compare(l.size() - 3, 3, "\"\"\"") == 0;
            if (end) l.resize(l.size() - 3);
            msg += l;
            if (end) break;
            msg += '\n';
            continue;
        }
        const bool more = !l.empty() && l.back() == '\\';
        if (more) l.pop_back();
        msg += l;
        if (!more) break;
        msg += '\n';
        prompt = ". ";
    }
    while (!msg.empty() && msg.back() == '\n') msg.pop_back();
    if (!msg.empty()) add_history(msg.c_str());
    return msg;
}

struct Totals {
    int64_t reused = 0, evaluated = 0, generated = 0;
};

// `gpu`: gpu_memory_summary(), printed as a second line when not empty.
void print_stats(const ChatSession& s, const TurnStats& t, const Totals& all,
                 const std::string& gpu, const Speculator* spec) {
    const double fill = 100.0 * s.cached_tokens() / s.n_ctx();
    out(fmt::format(
        "[stats] last turn: reused {} tokens, evaluated {}, generated {} | cache {}/{} ({:.0f}%) | "
        "prompt {:.1f} tok/s, generation {:.1f} tok/s | turns {} ({} evicted) | session: reused "
        "{}, "
        "evaluated {}, generated {}\n",
        t.reused, t.evaluated, t.generated, s.cached_tokens(), s.n_ctx(), fill,
        t.prompt_s > 0 ? t.evaluated / t.prompt_s : 0.0, t.gen_s > 0 ? t.generated / t.gen_s : 0.0,
        s.turns().size(), s.first_live_turn(), all.reused, all.evaluated, all.generated));
    if (!gpu.empty()) out("[stats] " + gpu + "\n");
    if (spec) out("[stats] session" + speculation_summary(*spec) + "\n");
}

} // namespace

int run_chat(int argc, char** argv) {
    std::signal(SIGPIPE, SIG_DFL);
    ChatOptions o;
    CLI::App app{"kvrun chat: talk to a GGUF chat model; the KV cache carries over between turns",
                 "kvrun chat"};
    app.footer(
        std::string(kHelp) +
        "With stdin not a terminal: answer one message (-p, or stdin without -p) and exit, as\n"
        "kvrun --chat does (the same answer, stats line and -c auto).\n"
        "Templates are detected from tokenizer.chat_template; without one, from the vocabulary's\n"
        "turn markers (<start_of_turn>, <|im_start|>, ...), and failing those the plain fallback "
        "is\n"
        "\"{system}\\n\\n\" then \"User: {message}\\nAssistant: {reply}\\n\" per turn.\n"
        "Exit status: 0 ok, 1 other error, 2 bad usage, 3 bad or unsupported model,\n"
        "4 message longer than the context, 5 out of memory, 6 chat template error, 130 "
        "interrupted.");
    add_model_option(app, o.common);
    add_runtime_options(app, o.common, true);
    app.add_option("-p,--prompt", o.prompt, "first message");
    app.add_option("-c,--ctx-size", o.ctx,
                   "context size in tokens, or auto (the model's, at most 4096)")
        ->capture_default_str();
    app.add_option("-n,--n-predict", o.n_predict,
                   "tokens per answer at most (-1 = until the model ends its turn)")
        ->check(int_in(-1, int64_t{1} << 40));
    app.add_option("-b,--batch-size", o.batch, "prompt tokens evaluated per batch")
        ->capture_default_str()
        ->check(int_in(1, 1 << 16));
    app.add_option("--system", o.system, "system prompt");
    app.add_option("--system-file", o.system_file, "read the system prompt from FILE");
    app.add_option("--chat-template", o.chat_template,
                   std::string("template family instead of the model's (") + ChatTemplate::names() +
                       ")");
    app.add_option("--stop", o.stop, "also end an answer at STRING (repeatable)");
    app.add_flag("-e,--escape", o.escape,
                 "process \\n \\t \\\\ \\\" \\' in -p, --system and --stop");
    add_sampling_options(app, o.sampling);
    add_grammar_options(app, o.grammar);
    add_speculative_options(app, o.speculative);
    if (const auto done = parse_command_line(app, argc, argv)) return *done;
    check_text_options(app, o.escape, o.prompt, o.system, o.stop);
    if (o.grammar.given() && o.speculative.any())
        fail(Exit::usage, "a grammar does not go with speculative decoding (--lookup, "
                          "--draft-model) yet");
    o.grammar.compile();
    if (!o.system_file.empty())
        o.system = rtrim(read_regular_file(o.system_file, "system prompt file", Exit::usage));
    check_utf8(o.system, "the system prompt");
    ContextRequest types; // the cache's fields, checked before the model loads
    set_cache_types(o.common, types, true);
    const bool tty = ::isatty(0) == 1;

    // Without a terminal: one message, answered exactly as `kvrun --chat`
    // answers it (the same text, stats line, cut notices and -c auto), so
    // the two ways of asking one question never differ.
    if (!tty) {
        std::vector<std::string> words = {"kvrun", "--chat"};
        // Conversation-mode flags would send the run back here.
        for (int i = 1; i < argc; i++)
            if (std::strcmp(argv[i], "-cnv") && std::strcmp(argv[i], "--conversation"))
                words.emplace_back(argv[i]);
        std::vector<char*> ptrs;
        for (std::string& w : words) ptrs.push_back(w.data());
        ptrs.push_back(nullptr);
        return run_generate(static_cast<int>(words.size()), ptrs.data());
    }

    const StopPoint stop_point; // its loops poll interrupted()
    auto lm = LoadedModel::load(o.common.model, layers_home(o.common), !o.common.precise);
    ChatTemplate tmpl = ChatTemplate::for_model(lm->file, lm->tokenizer, o.chat_template);
    const int threads = resolve_threads(o.common.threads);
    ContextRequest req = types;
    req.use = ContextRequest::Use::chat;
    req.ctx = o.ctx;
    req.batch = o.batch;
    req.threads = threads;
    const ContextPlan plan = plan_and_tell(*lm, req, o.common.verbose);
    const int n_ctx = plan.cache.n_ctx;
    const GpuFitInput fit{lm->file, plan.cache, plan.batch};
    const Backends backends = make_backends(o.common, threads, lm->model.hp, &fit);
    ChatConfig cfg;
    cfg.batch = o.batch;
    cfg.n_predict = o.n_predict;
    cfg.sampling = o.sampling;
    cfg.stop = o.stop;
    // Turns moved in place keep K/V computed with the dropped turns in view:
    // not what a fresh conversation would compute, which --deterministic promises.
    cfg.evict_in_place = !o.common.deterministic;
    cfg.k_rotate = plan.cache.k_rotate;
    if (o.common.verbose || tty)
        fmt::print(stderr, "kvrun chat: template {} ({}), n_ctx {}, {} threads{}{}\n", tmpl.name(),
                   !o.chat_template.empty() ? "--chat-template"
                   : tmpl.inferred()        ? "the model has none: inferred from its vocabulary"
                   : tmpl.family() == ChatFamily::plain ? "the model has none: plain fallback"
                                                        : "from the model",
                   n_ctx, threads,
                   o.common.verbose ? fmt::format(", seed {}", o.sampling.seed) : std::string(),
                   tty ? "; /help for commands" : "");
    // The draft's cache is shaped like the conversation's (chat_session.cpp: keep 0, no slide).
    KvCacheConfig draft_shape = plan.cache;
    draft_shape.keep = 0;
    Speculation speculation = make_speculation(o.speculative, *lm, draft_shape, backends, threads,
                                               o.common.deterministic, o.batch, o.sampling);
    cfg.speculate = speculation.get();
    ChatSession session(*lm, std::move(tmpl), n_ctx, plan.cache.type_k, plan.cache.type_v,
                        backends.placement(), cfg);
    // The grammar's end tokens are the template's: bound once the session knows them.
    const auto vocab_bytes = std::make_shared<const TokenBytes>(lm->tokenizer);
    std::string grammar_text = o.grammar.source; // what /grammar shows
    auto set_grammar = [&](std::shared_ptr<const Grammar> g, const std::string& source) {
        SamplerParams p = session.sampling();
        p.grammar = g ? std::make_shared<const OutputGrammar>(OutputGrammar{
                            std::move(g), vocab_bytes, session.reply_end_ids(), false, source})
                      : nullptr;
        session.set_sampling(p);
    };
    if (o.grammar.compiled) set_grammar(o.grammar.compiled, o.grammar.source);
    if (!o.system.empty()) session.set_system(o.system);

    ChatHooks hooks;
    // Tests slow answers down to press Ctrl-C in the middle of one.
    const char* delay = std::getenv("KVRUN_TEST_TOKEN_DELAY_MS");
    const int delay_ms = delay ? std::atoi(delay) : 0;
    hooks.on_text = [&](std::string_view s) {
        clear_progress();
        out(s);
        if (delay_ms > 0) ::usleep(static_cast<useconds_t>(delay_ms) * 1000);
    };
    hooks.should_stop = [] { return interrupted() || stdout_failed(); };
    hooks.on_progress = [](int64_t done, int64_t total) {
        if (total > 256) show_progress(done, total);
    };
    hooks.on_notice = [](const std::string& s) {
        clear_progress();
        fmt::print(stderr, "\nkvrun: {}\n", s);
    };
    if (o.common.verbose)
        hooks.on_detail = [](const std::string& s) { fmt::print(stderr, "[kvrun] {}\n", s); };
    // An answer that did not end by itself says why (stderr: stdout is the answer).
    auto tell_cut = [&](const TurnStats& st) {
        if (st.stop == "context full")
            fmt::print(stderr, "[answer cut: the context is full (-c {})]\n", n_ctx);
        else if (st.stop == "length")
            fmt::print(stderr, "[answer cut at -n {} tokens]\n", session.n_predict());
        if (session.grammar_incomplete() && st.stop != "interrupted")
            fmt::print(stderr, "[the answer is not a whole sentence of the grammar]\n");
    };

    use_utf8_ctype();
    rl_catch_signals = 0;
    rl_getc_function = read_key;
    using_history();
    TurnStats last;
    Totals all;
    auto account = [&](const TurnStats& st) {
        last = st;
        all.reused += st.reused;
        all.evaluated += st.evaluated;
        all.generated += st.generated;
        clear_progress();
        out(st.stop == "interrupted" ? "\n[interrupted]\n" : "\n");
        tell_cut(st);
        clear_interrupt();
    };
    auto answer = [&](const std::string& msg) {
        try {
            account(session.respond(msg, hooks));
        } catch (const Error& e) {
            clear_interrupt();
            if (e.code() != Exit::context_overflow) throw;
            fmt::print(stderr, "kvrun: {}\n", e.what());
        }
    };
    if (!o.prompt.empty()) {
        out("> " + o.prompt + "\n"); // the transcript shows what was asked
        answer(o.prompt);
    }
    while (!terminated()) { // SIGTERM: the answer or /save under way ends, then the REPL
        std::optional<std::string> msg = read_message();
        clear_interrupt(); // a Ctrl-C at the prompt must not stop the next answer
        if (!msg) break;
        const std::string line = rtrim(*msg);
        if (line.empty()) continue;
        if (line[0] != '/') {
            answer(line);
            continue;
        }
        const size_t sp = line.find(' ');
        const std::string cmd = line.substr(0, sp);
        const std::string arg =
            sp == std::string::npos ? "" : rtrim(line.substr(line.find_first_not_of(' ', sp)));
        if (cmd == "/exit" || cmd == "/quit" || cmd == "/bye")
            break; // the Enter that sent it ended the line
        else if (cmd == "/help" || cmd == "/?")
            out(kHelp);
        else if (cmd == "/stats")
            print_stats(session, last, all,
                        backends.gpu
                            ? gpu_memory_summary(backends.gpu->memory_use(), backends.n_gpu_layers,
                                                 lm->model.hp.n_layer, session.kv_bytes())
                            : std::string(),
                        speculation.get());
        else if (cmd == "/undo")
            out(session.undo() ? "[undone]\n" : "[nothing to undo]\n");
        else if (cmd == "/reset" || cmd == "/clear")
            session.reset(), out("[conversation cleared]\n");
        else if (cmd == "/retry") {
            TurnStats st;
            if (session.retry(hooks, &st))
                account(st);
            else
                out("[nothing to retry]\n");
        } else if (cmd == "/system") {
            if (arg.empty())
                out(session.system().empty() && !session.effective_system().empty()
                        ? fmt::format("[system, the template's default] {}\n",
                                      session.effective_system())
                        : fmt::format("[system] {}\n", session.system()));
            else if (!unicode::valid_utf8(arg))
                out("[the system prompt is not valid UTF-8: not set]\n");
            else
                session.set_system(arg), out("[system prompt set]\n");
        } else if (cmd == "/grammar") {
            if (arg.empty()) {
                out(grammar_text.empty() ? "[no grammar]\n" : "[grammar: " + grammar_text + "]\n");
            } else if (arg == "off") {
                set_grammar(nullptr, ""), grammar_text.clear();
                out("[no grammar]\n");
            } else if (speculation.get()) {
                out("[a grammar does not go with speculative decoding yet; unchanged]\n");
            } else {
                try { // a schema is JSON, an object: GBNF never starts with {
                    const bool schema = arg[0] == '{';
                    auto g = std::make_shared<const Grammar>(
                        compile_gbnf(schema ? json_schema_to_gbnf(arg) : arg));
                    grammar_text = schema ? "JSON schema " + arg : arg;
                    set_grammar(std::move(g), "/grammar");
                    out(schema ? "[the answers follow the JSON schema]\n"
                               : "[the answers follow the grammar]\n");
                } catch (const Error& e) {
                    out(fmt::format("[{}; unchanged]\n", e.what()));
                }
            }
        } else if (cmd == "/set") {
            out("[" + set_command(session, arg) + "]\n");
        } else if (cmd == "/save" || cmd == "/load") {
            if (arg.empty()) {
                out(fmt::format("[{} needs a file name]\n", cmd));
                continue;
            }
            try {
                if (cmd == "/save")
                    session.save(arg), out(fmt::format("[saved to {} and {}.json]\n", arg, arg));
                else
                    out("[" + session.load(arg, [] { return interrupted(); }) + "]\n");
            } catch (const std::exception& e) { // save and load keep the session whatever the file
                fmt::print(stderr, "kvrun: {}\n", e.what());
            }
            clear_interrupt(); // a Ctrl-C that stopped a /load must not stop the next answer
        } else {
            out(fmt::format("[unknown command {}; /help lists them]\n", cmd));
        }
    }
    return terminated() ? interrupted_status() : 0;
}

} // namespace kvrun::cli
