// MLA dense decode on the GPU: the host side (plan, launches) of the dense kernels. The kernels
// (the portable kernel's dense mode and the sm90 kernel's) are not in this build yet, so a CUDA
// dense plan is refused here, at plan time, with the message a user can act on; mla_dense_decode
// is reached only with a plan this function made, and refuses the same way.
#include <string>

#include "cuda/backend.hpp"
#include "deca/error.hpp"

namespace deca::cuda {

namespace {

[[noreturn]] void refuse(const char* fn, const char* arg, const MlaConfig& c) {
  throw Error(std::string(fn) + ": " + arg +
              ": expected cpu (this build has no CUDA kernels for dense MLA decode), got " +
              to_string(c.device));
}

}  // namespace

void plan_mla_dense(MlaPlan& plan) { refuse("plan_mla_decode", "config.device", plan.config); }

void mla_dense_decode(const MlaPlan& plan, const MlaDenseParams&, void*, void*, bool) {
  refuse("mla_decode_dense", "plan.config.device", plan.config);
}

}  // namespace deca::cuda
