// GoogleTest main for the unit-test programs: the product's BLAS kernel first
// (Note [Tests' BLAS core]), then every test.
#include <gtest/gtest.h>

#include "products_blas_core.h"

int main(int argc, char** argv) {
  trident::testing::use_products_blas_core(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
