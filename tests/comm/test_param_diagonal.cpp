// The sanitized build's choice of MPI test cases (Note [Parameter diagonal]): each pattern of a
// value-parameterized suite keeps one parameter, in turn, so that every pattern and every
// parameter still runs; plain tests and other suites are untouched.
#include <gtest/gtest.h>

#include <algorithm>

#include "param_diagonal.h"

namespace trident::testing {
namespace {

std::vector<ParamTest> matrix(const std::string& suite, const std::vector<std::string>& patterns,
                              const std::vector<std::string>& params) {
  std::vector<ParamTest> tests;
  for (const std::string& pattern : patterns)
    for (const std::string& param : params) tests.push_back({suite, pattern + "/" + param, true});
  return tests;
}

TEST(ParamDiagonal, KeepsEachPatternOnceAndEachParameterInSomePattern) {
  std::vector<ParamTest> tests = matrix("Families/Ring", {"Tp2", "Sp", "Pieces"}, {"a", "b"});
  tests.insert(tests.begin(), {"Plain", "Alone", false});
  const std::vector<std::string> out = off_diagonal(tests);
  // Kept: Tp2/a, Sp/b, Pieces/a (pattern i with parameter i mod 2).
  const std::vector<std::string> want = {"Families/Ring.Tp2/b", "Families/Ring.Sp/a",
                                         "Families/Ring.Pieces/b"};
  EXPECT_EQ(out, want);
}

TEST(ParamDiagonal, SuitesAreCountedApart) {
  std::vector<ParamTest> tests = matrix("One/S", {"P", "Q"}, {"x", "y", "z"});
  const std::vector<ParamTest> other = matrix("Two/S", {"R"}, {"u", "v"});
  tests.insert(tests.end(), other.begin(), other.end());
  const std::vector<std::string> out = off_diagonal(tests);
  // More parameters than patterns: One/S keeps P/x, Q/y and P/z (j = 0, 1, 2); Two/S keeps R/u
  // and R/v, its own pairs.
  const std::vector<std::string> want = {"One/S.P/y", "One/S.Q/x", "One/S.Q/z"};
  EXPECT_EQ(out, want);
}

TEST(ParamDiagonal, EveryParameterRunsWhenThereAreFewerPatterns) {
  // Context parallelism's shape: 3 layouts, 6 (family, comm mode) parameters.
  const std::vector<ParamTest> tests =
      matrix("F/Cp", {"World", "Zero", "Recompute"}, {"g_r", "g_a", "n_r", "n_a", "l_r", "l_a"});
  const std::vector<std::string> out = off_diagonal(tests);
  EXPECT_EQ(out.size(), tests.size() - 6);
  for (const std::string& param : {"g_r", "g_a", "n_r", "n_a", "l_r", "l_a"}) {
    int kept = 0;
    for (const std::string& pattern : {"World", "Zero", "Recompute"})
      kept += std::count(out.begin(), out.end(), "F/Cp." + pattern + "/" + param) == 0;
    EXPECT_EQ(kept, 1) << param;
  }
}

TEST(ParamDiagonal, LeavesUnparameterizedTestsAlone) {
  // A typed or plain test whose name has a slash is not a parameter pattern.
  const std::vector<ParamTest> tests = {
      {"S", "Plain", false}, {"T/0", "Typed", false}, {"U", "Not/param", false}};
  EXPECT_TRUE(off_diagonal(tests).empty());
}

}  // namespace
}  // namespace trident::testing
