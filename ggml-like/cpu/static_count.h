// A run-time count turned into a template parameter, for kernels whose
// per-count arrays of vectors must live in registers (with a run-time count
// the compiler keeps them on the stack: ~3x slower, measured).
#pragma once

#include <algorithm>
#include <type_traits>
#include <utility>

namespace gl {

// Calls f(std::integral_constant<int, n>{}) and returns true when n is in
// [1, Max]; returns false otherwise.
template <int Max, typename F> bool with_static_count(int n, F&& f) {
    return [&]<int... I>(std::integer_sequence<int, I...>) {
        return ((n == I + 1 ? (f(std::integral_constant<int, I + 1>{}), true) : false) || ...);
    }
    (std::make_integer_sequence<int, Max>{});
}

// Calls f(std::integral_constant<int, n>{}, j0) for nh items cut into groups
// [j0, j0 + n) of at most Max (query heads sharing one pass of a kernel).
template <int Max, typename F> void for_static_groups(int nh, F&& f) {
    for (int j0 = 0; j0 < nh; j0 += Max)
        with_static_count<Max>(std::min(nh - j0, Max), [&](auto n) { f(n, j0); });
}

} // namespace gl
