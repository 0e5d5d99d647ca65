// The weight matrices the CPU's packed GEMM reads (ggml-like/kernels.h,
// "weights kept in the GEMM's layout"), packed once at load.
//
// A packed matrix's GEMM serves one token and many alike, computing the
// block-chain arithmetic: generation reads the same bytes as from the file
// with no horizontal sums (AVX-512: fewer uops a weight than the dot
// products), and a token's logits are the same bits whatever else is in its
// batch, so `kvrun batch` decodes many sequences on the GEMM and still gives
// each the answer of a lone run. The plain rows stay in the file mapping for
// every other reader (--precise, a GPU, an embedding table that is also the
// output), their pages dropped once packed so memory holds the weights once.
#pragma once

#include <cstdint>

#include "gguf.h"
#include "model.h"
#include "system_memory.h"

namespace kvrun {

class PackedWeights {
  public:
    PackedWeights() = default;
    // Whether a GGUF tensor of this type would be packed here (the active
    // kernel table has a packed GEMM for it) unless packing is off
    // (KVRUN_PACK=0 in the environment: the dot products and per-batch
    // panels instead, for comparison).
    static bool packs(gl::Type type);
    static bool enabled();
    // Packs every matrix of m that packs() takes and points its
    // Tensor::packed there; their pages in f's mapping are dropped. Nothing
    // when packing is off or the memory cannot be had (the plain paths run).
    static PackedWeights pack(Model& m, const GgufFile& f);

  private:
    HugeBytes block_;
};

} // namespace kvrun
