// `kvrun-lab matrices`: how fast the weight matrices of one generated
// token stream on the CPU, read plainly and multiplied by the kernels, through
// the same thread pool and the same parallel loop per matrix. The gap between
// the two is the kernels' share of a missed bandwidth target; the gap between
// the plain read and `kvrun-lab roofline`'s bandwidth is the loops'.
#pragma once

#include "model.h"

namespace kvrun::lab {

// Milliseconds per token, mean over repetitions.
struct MatrixTimes {
    double bytes = 0;     // every layer's weight matrices and the output matrix
    double read_ms = 0;   // a plain read of each, its rows cut as ops::matmul cuts them
    double matmul_ms = 0; // ops::matmul of each by one activation row
};

// Runs the two passes alternately, each matrix in the order a token uses it.
MatrixTimes bench_matrices(const Model& m, int threads, int reps);

} // namespace kvrun::lab
