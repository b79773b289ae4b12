// The sanitized build's selection of value-parameterized MPI tests (Note [Parameter diagonal]).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace trident::testing {

// Note [Parameter diagonal]
// Under ASan + UBSan (TRIDENT_TEST_PARAM_DIAGONAL=1, set for the sanitized build's MPI tests)
// a value-parameterized suite of n patterns (Tp2, WithRecomputation...) and P parameters (gpt2,
// neox...) runs only the pairs (j mod n, j mod P) for j < max(n, P): every layout and every
// family at least once, not every pair. The sanitizers look for our memory and undefined-
// behaviour faults, which a code path shows once; the main build runs the whole matrix.

struct ParamTest {
  std::string suite;  // "Families/TpOverlapTraining"
  std::string name;   // "Tp2/gpt2": pattern "Tp2", parameter "gpt2"
  bool parameterized = false;
};

// The full names ("Suite.Test") the diagonal leaves out, in the order given.
inline std::vector<std::string> off_diagonal(const std::vector<ParamTest>& tests) {
  std::map<std::string, std::map<std::string, int>> patterns, params;  // per suite: first seen
  for (const ParamTest& t : tests) {
    const size_t slash = t.name.rfind('/');
    if (!t.parameterized || slash == std::string::npos) continue;
    auto& pat = patterns[t.suite];
    auto& par = params[t.suite];
    pat.emplace(t.name.substr(0, slash), int(pat.size()));
    par.emplace(t.name.substr(slash + 1), int(par.size()));
  }
  std::vector<std::string> out;
  for (const ParamTest& t : tests) {
    const size_t slash = t.name.rfind('/');
    if (!t.parameterized || slash == std::string::npos) continue;
    const int n = int(patterns[t.suite].size()), P = int(params[t.suite].size());
    const int i = patterns[t.suite].at(t.name.substr(0, slash));
    const int p = params[t.suite].at(t.name.substr(slash + 1));
    bool kept = false;  // the pairs (j mod n, j mod P), j < max(n, P), are distinct and cover both
    for (int j = i; j < std::max(n, P) && !kept; j += n) kept = j % P == p;
    if (!kept) out.push_back(t.suite + "." + t.name);
  }
  return out;
}

// Called between InitGoogleTest and RUN_ALL_TESTS: with the variable set and no filter given,
// the off-diagonal tests become a negative filter. Returns how many were left out.
inline int apply_param_diagonal() {
  const char* on = std::getenv("TRIDENT_TEST_PARAM_DIAGONAL");
  if (!on || std::string(on) != "1" || GTEST_FLAG_GET(filter) != "*") return 0;
  std::vector<ParamTest> tests;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const ::testing::TestInfo& info = *suite.GetTestInfo(t);
      tests.push_back({info.test_suite_name(), info.name(), info.value_param() != nullptr});
    }
  }
  const std::vector<std::string> left_out = off_diagonal(tests);
  if (left_out.empty()) return 0;
  std::string filter = "-";
  for (const std::string& name : left_out) filter += (filter.size() > 1 ? ":" : "") + name;
  GTEST_FLAG_SET(filter, filter);
  return int(left_out.size());
}

}  // namespace trident::testing
