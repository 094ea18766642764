// The stamp build of a plan's Hopper GQA kernel: compiled beside the plan's own (its key with
// GqaKernelKey::stamps), launched as gqa_decode launches the plan's kernel, between two launches
// of the module's mark kernel; its per-CTA records read back from the module global
// deca_gqa_stamps (kernels/gqa/stamps.cuh).
#include "cuda/gqa_stamps.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "deca/error.hpp"
#include "jit/driver.hpp"
#include "kernels/gqa/stamps.cuh"

namespace deca::cuda {

namespace {

void check_rt(cudaError_t rc, const char* fn, const char* what) {
  if (rc != cudaSuccess) {
    throw Error(std::string(fn) + ": " + what + ": expected cudaSuccess, got " + cudaGetErrorName(rc));
  }
}

}  // namespace

bool gqa_stamps_supported(const GqaPlan& plan) {
  return plan.config.device.kind == DeviceKind::kCUDA && gqa_stamp_key(plan).wgmma();
}

GqaStamper::GqaStamper(const GqaPlan& plan, const std::string& fn) : plan_(&plan) {
  if (!gqa_stamps_supported(plan)) {
    throw Error(fn + ": plan.kernel_name: expected a Hopper GQA kernel (\"..._wgmma...\"), the only ones with "
                "phase stamps, got \"" + plan.kernel_name + "\"");
  }
  key_ = gqa_stamp_key(plan);
  name_ = key_.name();
  const int device = plan.config.device.index;
  kernel_ = &jit::get_kernel(key_.spec(), device);
  const jit::Driver& d = jit::driver();
  jit::ScopedDevice scope(device);
  jit::check_cu(d.ModuleGetFunction(&mark_, kernel_->module, "deca_gqa_stamp_mark"), "GqaStamper",
                "cuModuleGetFunction(deca_gqa_stamp_mark)");
  jit::check_cu(d.ModuleGetGlobal(&buffer_, &bytes_, kernel_->module, "deca_gqa_stamps"), "GqaStamper",
                "cuModuleGetGlobal(deca_gqa_stamps)");
  if (bytes_ != static_cast<std::size_t>(gqa::kStampBufferWords) * 8) {
    throw Error(fn + ": deca_gqa_stamps: expected " + std::to_string(gqa::kStampBufferWords * 8) + " bytes, got " +
                std::to_string(bytes_));
  }
}

void GqaStamper::clear(void* stream) const {
  jit::ScopedDevice scope(plan_->config.device.index);
  check_rt(cudaMemsetAsync(reinterpret_cast<void*>(buffer_), 0, bytes_, static_cast<cudaStream_t>(stream)),
           "GqaStamper::clear", "cudaMemsetAsync (records)");
}

void GqaStamper::run(const GqaParams& params, void* stream) const {
  const jit::Driver& d = jit::driver();
  jit::ScopedDevice scope(plan_->config.device.index);
  auto mark = [&](int slot) {
    void* args[] = {&slot};
    jit::check_cu(d.LaunchKernel(mark_, 1, 1, 1, 1, 1, 1, 0, static_cast<CUstream>(stream), args, nullptr),
                  "GqaStamper::run", "cuLaunchKernel(deca_gqa_stamp_mark)");
  };
  mark(0);
  gqa_decode_with(*plan_, key_, *kernel_, params, stream);
  mark(1);
}

StampRun GqaStamper::read(const GqaParams& params, void* stream) const {
  jit::ScopedDevice scope(plan_->config.device.index);
  check_rt(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "GqaStamper::read",
           "cudaStreamSynchronize (stamped launch)");
  StampRun run;
  run.grid_ctas = params.batch == 0 ? 0 : gqa_grid_ctas(*plan_, params);
  const long long kept = std::min<long long>(run.grid_ctas, gqa::kStampCtas);
  std::vector<unsigned long long> words(static_cast<std::size_t>(kept) * gqa::kStampWords);
  if (!words.empty()) {
    check_rt(cudaMemcpy(words.data(), reinterpret_cast<void*>(buffer_), words.size() * 8, cudaMemcpyDeviceToHost),
             "GqaStamper::read", "cudaMemcpy (records)");
  }
  unsigned long long marks[gqa::kStampMarks] = {};
  const std::size_t marks_at = static_cast<std::size_t>(gqa::kStampCtas) * gqa::kStampWords * 8;
  check_rt(cudaMemcpy(marks, reinterpret_cast<void*>(buffer_ + marks_at), sizeof(marks), cudaMemcpyDeviceToHost),
           "GqaStamper::read", "cudaMemcpy (marks)");
  run.mark_before = marks[0];
  run.mark_after = marks[1];
  run.ctas.resize(static_cast<std::size_t>(kept));
  for (long long c = 0; c < kept; ++c) {
    const unsigned long long* r = words.data() + c * gqa::kStampWords;
    CtaStamps& s = run.ctas[static_cast<std::size_t>(c)];
    std::copy(r, r + gqa::kStampEvents, s.t.begin());
    s.sm = s.t[gqa::kStampEntry] != 0 ? static_cast<int>(r[gqa::kStampSmWord]) : -1;
    s.x = static_cast<int>(r[gqa::kStampBlockWord] & 0xFFFFu);
    s.y = static_cast<int>(r[gqa::kStampBlockWord] >> 16 & 0xFFFFu);
    s.z = static_cast<int>(r[gqa::kStampBlockWord] >> 32 & 0xFFFFu);
    s.tiles = static_cast<int>(r[gqa::kStampTilesWord]) - 1;
  }
  return run;
}

}  // namespace deca::cuda
