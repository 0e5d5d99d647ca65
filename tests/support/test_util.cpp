#include "test_util.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <cstdlib>
#include <fstream>
#include <poll.h>
#include <random>
#include <signal.h>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

namespace kvtest {

std::string shared(const std::string& rel) {
    // $KVRUN_SHARED_DIR: a copy of the test data elsewhere (scripts/gpu-check.sh).
    const char* dir = std::getenv("KVRUN_SHARED_DIR");
    return std::string(dir && *dir ? dir : KVRUN_SHARED_DIR) + "/" + rel;
}

std::string real_model(const std::string& name) {
    const char* dir = std::getenv("KVRUN_MODEL_CACHE");
    const char* home = std::getenv("HOME");
    const std::string base =
        dir && *dir ? dir : std::string(home ? home : ".") + "/.cache/kvrun-models";
    return base + "/" + name;
}

bool have_real_model(const std::string& name) {
    const std::string p = real_model(name);
    if (std::ifstream(p).good()) return true;
    FAIL_CHECK("real model " << p
                             << " is missing: run scripts/fetch-real-models.sh (make test does)");
    return false;
}

RunResult run_kvrun(const std::vector<std::string>& args, const std::string* input) {
    return run_binary(KVRUN_BINARY, args, input);
}

RunResult run_binary(const std::string& binary, const std::vector<std::string>& args,
                     const std::string* input) {
    int in_p[2], out_p[2], err_p[2];
    if (pipe(in_p) || pipe(out_p) || pipe(err_p)) return {};
    pid_t pid = fork();
    if (pid == 0) {
        dup2(in_p[0], 0);
        dup2(out_p[1], 1);
        dup2(err_p[1], 2);
        for (int fd : {in_p[0], in_p[1], out_p[0], out_p[1], err_p[0], err_p[1]}) close(fd);
        if (!input) close(0);
        std::vector<char*> argv;
        std::string bin = binary;
        argv.push_back(bin.data());
        std::vector<std::string> copy = args;
        for (auto& a : copy) argv.push_back(a.data());
        argv.push_back(nullptr);
        execv(bin.c_str(), argv.data());
        _exit(127);
    }
    close(in_p[0]);
    close(out_p[1]);
    close(err_p[1]);
    signal(SIGPIPE, SIG_IGN);
    size_t written = 0;
    if (!input) {
        close(in_p[1]);
        in_p[1] = -1;
    }
    RunResult r;
    pollfd fds[3] = {{out_p[0], POLLIN, 0}, {err_p[0], POLLIN, 0}, {in_p[1], POLLOUT, 0}};
    int open_fds = 2;
    while (open_fds > 0 || fds[2].fd >= 0) {
        if (fds[2].fd >= 0 && written == input->size()) {
            close(fds[2].fd);
            fds[2].fd = -1;
            continue;
        }
        if (poll(fds, 3, -1) < 0) break;
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
            char buf[65536];
            ssize_t n = read(fds[i].fd, buf, sizeof buf);
            if (n <= 0) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            } else {
                (i == 0 ? r.out : r.err).append(buf, n);
            }
        }
        if (fds[2].fd >= 0 && (fds[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t n = write(fds[2].fd, input->data() + written, input->size() - written);
            if (n <= 0)
                written = input->size();
            else
                written += n;
        }
    }
    int st = 0;
    waitpid(pid, &st, 0);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return r;
}

std::vector<std::string> lines(const std::string& s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    std::string l;
    while (std::getline(ss, l))
        if (!l.empty()) v.push_back(l);
    return v;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

} // namespace kvtest
