// A plain forward pass in double precision, one token at a time, with the
// KV cache as a list of per-token entries: explicit eviction, explicit
// positions, keys rotated on the fly. The reference the ring cache and the
// optimized forward pass are tested against. Sliding-window layers (Gemma 3)
// keep their own list: the last min(window, n_ctx) positions, no sinks.
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>
#include <vector>

#include "ggml-like/kernels.h"
#include "model.h"

namespace kvtest {

using kvrun::Hparams;
using kvrun::LayerWeights;
using kvrun::Model;

// Plain forward pass for one token at a time, in double precision.
class ReferenceModel {
  public:
    ReferenceModel(const Model& m, int n_ctx, int keep)
        : m_(m), n_ctx_(n_ctx), keep_(keep), layers_(m.hp.n_layer) {}

    int64_t max_distance_seen = 0;
    size_t max_entries_seen = 0;

    std::vector<double> step(int32_t token, int64_t pos) {
        const Hparams& hp = m_.hp;
        std::vector<double> x = row(m_.token_embd, token);
        for (double& v : x) v *= m_.embed_scale;
        for (int l = 0; l < hp.n_layer; l++) {
            const LayerWeights& L = m_.layers[l];
            // A sliding-window layer: a ring of min(window, n_ctx) slots, no sinks.
            const int64_t n_ctx = hp.is_swa(l) ? std::min<int64_t>(hp.swa_window, n_ctx_) : n_ctx_;
            const int64_t keep = hp.is_swa(l) ? 0 : keep_;
            const int64_t window = n_ctx - keep;
            std::vector<double> xb = rmsnorm(x, L.attn_norm);
            Entry e{pos, matvec(L.wk, xb), matvec(L.wv, xb)};
            std::vector<double> q = matvec(L.wq, xb);
            if (!L.bq.empty()) {
                for (size_t i = 0; i < q.size(); i++) q[i] += L.bq[i];
                for (size_t i = 0; i < e.k.size(); i++) e.k[i] += L.bk[i], e.v[i] += L.bv[i];
            }
            if (!L.q_norm.empty()) {
                head_norm(q, L.q_norm);
                head_norm(e.k, L.k_norm);
            }
            auto& list = layers_[l];
            list.push_back(std::move(e));
            // explicit eviction: drop window tokens older than the window
            if (pos >= n_ctx)
                for (auto it = list.begin(); it != list.end();)
                    it = (it->pos >= keep && it->pos < pos - window + 1) ? list.erase(it) : it + 1;
            max_entries_seen = std::max(max_entries_seen, list.size());
            const kvrun::Rope rope = m_.layer_rope(l, n_ctx_);
            rotate(q, hp.n_head, static_cast<double>(pos), rope);
            std::vector<double> att(hp.q_dim(), 0.0);
            const int group = hp.n_head / hp.n_head_kv;
            for (int h = 0; h < hp.n_head; h++) {
                const int kvh = h / group;
                std::vector<double> scores;
                for (const Entry& en : list) {
                    // sinks sit just before the oldest window token once the window slid
                    const int64_t vpos =
                        (pos >= n_ctx && en.pos < keep) ? pos - (n_ctx - 1 - en.pos) : en.pos;
                    max_distance_seen = std::max(max_distance_seen, pos - vpos);
                    std::vector<double> k(en.k.begin() + kvh * hp.head_dim,
                                          en.k.begin() + (kvh + 1) * hp.head_dim);
                    rotate(k, 1, static_cast<double>(vpos), rope);
                    double s = 0;
                    for (int d = 0; d < hp.head_dim; d++) s += q[h * hp.head_dim + d] * k[d];
                    scores.push_back(s * m_.attn_scale());
                }
                double mx = -1e300, sum = 0;
                for (double s : scores) mx = std::max(mx, s);
                for (double& s : scores) sum += (s = std::exp(s - mx));
                for (size_t i = 0; i < list.size(); i++)
                    for (int d = 0; d < hp.head_dim; d++)
                        att[h * hp.head_dim + d] +=
                            scores[i] / sum * list[i].v[kvh * hp.head_dim + d];
            }
            std::vector<double> o = matvec(L.wo, att);
            if (!L.post_attn_norm.empty()) o = rmsnorm(o, L.post_attn_norm);
            add(x, o);
            xb = rmsnorm(x, L.ffn_norm);
            std::vector<double> g = matvec(L.w_gate, xb), u = matvec(L.w_up, xb);
            for (size_t i = 0; i < g.size(); i++) {
                if (m_.gelu_ffn) // GELU, tanh form
                    g[i] = 0.5 * g[i] *
                           (1 + std::tanh(0.7978845608028654 *
                                          (g[i] + 0.044715 * g[i] * g[i] * g[i]))) *
                           u[i];
                else
                    g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
            }
            o = matvec(L.w_down, g);
            if (!L.post_ffn_norm.empty()) o = rmsnorm(o, L.post_ffn_norm);
            add(x, o);
        }
        return matvec(m_.output, rmsnorm(x, m_.output_norm));
    }

  private:
    struct Entry {
        int64_t pos;
        std::vector<double> k, v; // k unrotated
    };

    static std::vector<double> row(const gl::Tensor& t, int64_t r) {
        std::vector<float> f(t.ne0);
        gl::ref::dequantize_row(t.type, t.row(r), f.data(), t.ne0);
        return {f.begin(), f.end()};
    }
    static std::vector<double> matvec(const gl::Tensor& w, const std::vector<double>& x) {
        std::vector<double> y(w.ne1);
        for (int64_t r = 0; r < w.ne1; r++) {
            std::vector<double> wr = row(w, r);
            double s = 0;
            for (int64_t i = 0; i < w.ne0; i++) s += wr[i] * x[i];
            y[r] = s;
        }
        return y;
    }
    std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<float>& w) const {
        double ss = 0;
        for (double v : x) ss += v * v;
        const double s = 1.0 / std::sqrt(ss / x.size() + m_.hp.rms_eps);
        std::vector<double> o(x.size());
        for (size_t i = 0; i < x.size(); i++) o[i] = x[i] * s * w[i];
        return o;
    }
    static void add(std::vector<double>& y, const std::vector<double>& x) {
        for (size_t i = 0; i < y.size(); i++) y[i] += x[i];
    }
    // Each head of v normed over head_dim (qwen3, gemma3).
    void head_norm(std::vector<double>& v, const std::vector<float>& w) const {
        const int hd = m_.hp.head_dim;
        for (size_t h = 0; h < v.size() / hd; h++) {
            std::vector<double> one(v.begin() + h * hd, v.begin() + (h + 1) * hd);
            one = rmsnorm(one, w);
            std::copy(one.begin(), one.end(), v.begin() + h * hd);
        }
    }
    void rotate(std::vector<double>& v, int n_heads, double pos, const kvrun::Rope& rope) const {
        const Hparams& hp = m_.hp;
        for (int h = 0; h < n_heads; h++)
            for (int i = 0; i < hp.rope_dims / 2; i++) {
                const int a = hp.rope_neox ? i : 2 * i,
                          b = hp.rope_neox ? i + hp.rope_dims / 2 : 2 * i + 1;
                const double th = pos * rope.inv_freq[i];
                double& x0 = v[h * hp.head_dim + a];
                double& x1 = v[h * hp.head_dim + b];
                const double r0 = x0 * std::cos(th) - x1 * std::sin(th),
                             r1 = x0 * std::sin(th) + x1 * std::cos(th);
                x0 = r0 * rope.attn_factor; // LongRoPE's attention factor on the rotated dims
                x1 = r1 * rope.attn_factor;
            }
    }

    const Model& m_;
    int n_ctx_, keep_;
    std::vector<std::deque<Entry>> layers_;
};

} // namespace kvtest
