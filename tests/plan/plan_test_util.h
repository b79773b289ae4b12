// Shared by the plan tests: a prediction's term by name.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plan/plan_parts.h"

namespace trident::testing {

// The value of the term called `name`; a test failure (and 0) where there is none.
inline double term(const std::vector<PlanTerm>& terms, const std::string& name) {
  for (const PlanTerm& t : terms)
    if (t.name == name) return t.value;
  ADD_FAILURE() << "no term " << name;
  return 0;
}

}  // namespace trident::testing
