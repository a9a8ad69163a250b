// Force-included in the thread-safety check tree (cmake/ThreadSafety.cmake), which compiles
// against libc++ 14: the C++20 it lacks and the tree uses. Never part of a linked build.
#pragma once

#include <array>
#include <compare>
#include <cstddef>

#if defined(_LIBCPP_VERSION) && _LIBCPP_VERSION < 16000
// std::array's three-way comparison (libc++ 16), for the defaulted operator<=> of
// schema::TrajectoryId. Found by ordinary lookup from any namespace that declares no
// operator<=> of its own.
template <class T, std::size_t N>
constexpr auto operator<=>(const std::array<T, N>& a, const std::array<T, N>& b) {
  for (std::size_t i = 0; i < N; ++i) {
    if (auto order = a[i] <=> b[i]; order != 0) return order;
  }
  return decltype(a[0] <=> b[0])::equivalent;
}
#endif
