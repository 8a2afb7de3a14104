// C++ build of include_order.inc.
#include "tests/abi/include_order.inc"
