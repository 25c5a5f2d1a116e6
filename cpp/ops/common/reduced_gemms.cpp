// Why some ops choose by this is in reduced_gemms.h.

#include "ops/common/reduced_gemms.h"

#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include <ATen/cpu/Utils.h>
#include <c10/util/Exception.h>

namespace fuseops::detail {
namespace {

// Whether this CPU has one of the named features (as cpuinfo, which ATen
// reads them with, names them).
bool cpu_has_any(std::initializer_list<const char*> features) {
  const auto capabilities = at::cpu::get_cpu_capabilities();
  for (const char* feature : features) {
    const auto found = capabilities.find(feature);
    if (found != capabilities.end() && found->second.isBool() && found->second.toBool()) {
      return true;
    }
  }
  return false;
}

// The value of the environment variable `name` when set and not empty, which
// must be one of `allowed`; a clear error otherwise. Read at every call, so a
// process (or a test) can change its choice between calls; getenv is a scan of
// a few dozen strings, small against the products these switches choose.
std::optional<std::string_view> env_choice(const char* name,
                                           std::initializer_list<std::string_view> allowed) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return std::nullopt;
  }
  const std::string_view choice(value);
  for (const std::string_view option : allowed) {
    if (choice == option) {
      return choice;
    }
  }
  std::ostringstream options;
  for (const std::string_view option : allowed) {
    options << "'" << option << "', ";
  }
  TORCH_CHECK(false, "fuseops: the environment variable ", name, " must be ", options.str(),
              "or unset, got '", std::string(choice), "'");
}

// FUSEOPS_WEIGHT_PAIRS's choice, if set.
std::optional<bool> weight_pairs_override() {
  const auto choice = env_choice("FUSEOPS_WEIGHT_PAIRS", {"1", "0"});
  if (!choice) {
    return std::nullopt;
  }
  return *choice == "1";
}

}  // namespace

bool reduced_gemms_emulated(at::ScalarType dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) {
    return false;
  }
  if (const auto choice = env_choice("FUSEOPS_REDUCED_GEMMS", {"emulated", "native"})) {
    return *choice == "emulated";
  }
  static const bool bfloat16_native = cpu_has_any({"avx512_bf16", "amx_bf16"});
  static const bool float16_native = cpu_has_any({"avx512_fp16", "amx_fp16"});
  return dtype == at::kBFloat16 ? !bfloat16_native : !float16_native;
}

bool bfloat16_dot_products_without_amx() {
  if (env_choice("FUSEOPS_REDUCED_GEMMS", {"emulated", "native"})) {
    return false;
  }
  static const bool without_amx = cpu_has_any({"avx512_bf16"}) && !cpu_has_any({"amx_bf16"});
  return without_amx;
}

bool weight_pairs() {
  static const bool without_amx = !cpu_has_any({"amx_bf16"});
  return weight_pairs_override().value_or(without_amx);
}

}  // namespace fuseops::detail
