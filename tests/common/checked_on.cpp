// deca's tests run checked plans by default (issue 9): GqaConfig::checked and MlaConfig::checked
// default to deca::checked_by_default(), which reads DECA_CHECKED. Set here before main, without
// overwriting, so that DECA_CHECKED=0 in the environment still runs the suites unchecked.
#include <cstdlib>

namespace {

const bool kCheckedOn = [] {
  setenv("DECA_CHECKED", "1", /*overwrite=*/0);
  return true;
}();

}  // namespace
