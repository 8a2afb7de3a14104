// C++ build of redecl.inc.
#include "tests/abi/redecl.inc"
