// Checked mode (issue 9): the default of GqaConfig::checked and MlaConfig::checked.
//
// Page tables, lengths and sparse indices that live in device memory cannot be validated on the
// host without a copy and a synchronisation per call. A checked plan runs kernels that test each
// of them as they read it, skip (mask) what is out of range instead of dereferencing it, and
// record the first offender in the workspace; deca::check_gqa_run / check_mla_run turn that record
// into a deca::Error. Unchecked plans run kernels compiled without the tests (nothing to pay).
#pragma once

namespace deca {

// DECA_CHECKED=1 or 0 in the environment when set; else on when libdeca was built without
// NDEBUG (a debug build) and off in a release build. deca's test executables set DECA_CHECKED=1
// unless the environment says otherwise (tests/common/checked_on.cpp). A run-time value rather
// than a macro: a default member initializer that differed between libdeca and its caller would
// make GqaConfig's constructor differ between translation units.
bool checked_by_default();

}  // namespace deca
