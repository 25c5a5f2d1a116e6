#pragma once
// Dispatcher handles for the C++ API, typed once from the API function itself
// (`find_op<decltype(rms_norm)>`, as torchvision does) rather than from a
// signature spelled out a second time: the dispatcher checks that type against
// the schema on first use, so API and schema cannot drift apart silently.

#include <ATen/core/dispatch/Dispatcher.h>

namespace fuseops::detail {

template <typename Fn>
c10::TypedOperatorHandle<Fn> find_op(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).typed<Fn>();
}

template <typename Fn>
struct ReturningNothing;
template <typename R, typename... Args>
struct ReturningNothing<R(Args...)> {
  using type = void(Args...);
};

// out= schemas return `()` (torch.compile functionalizes a custom op that
// mutates an argument, not one whose output aliases it), while their C++ API
// functions return the out tensors for chaining: the handle takes the API
// function's arguments and returns nothing.
template <typename Fn>
c10::TypedOperatorHandle<typename ReturningNothing<Fn>::type> find_out_op(const char* name,
                                                                          const char* overload) {
  return find_op<typename ReturningNothing<Fn>::type>(name, overload);
}

}  // namespace fuseops::detail
