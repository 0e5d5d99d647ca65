// The AVX-VNNI GEMM of the block-chain types (avxvnni_chain.cpp), for the
// AVX-VNNI kernel table (avx2.cpp).
#pragma once

#include "ggml-like/kernels.h"

namespace gl::avxvnni_chain {

void gemm_q4_0(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
               float* y, size_t y_stride, void* scratch);
void gemm_q8_0(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
               float* y, size_t y_stride, void* scratch);
void gemm_q5_0(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
               float* y, size_t y_stride, void* scratch);
void gemm_q4_1(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
               float* y, size_t y_stride, void* scratch);
void gemm_q5_1(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
               float* y, size_t y_stride, void* scratch);
void gemm_iq4_nl(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
                 float* y, size_t y_stride, void* scratch);
void gemm_q2_K(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
               float* y, size_t y_stride, void* scratch);
void gemm_q3_K(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
               float* y, size_t y_stride, void* scratch);
void gemm_q4_K(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
               float* y, size_t y_stride, void* scratch);
void gemm_q5_K(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
               float* y, size_t y_stride, void* scratch);
void gemm_q6_K(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
               float* y, size_t y_stride, void* scratch);

} // namespace gl::avxvnni_chain
