#include "jit/nvrtc_compile.hpp"

#include <nvrtc.h>

#include <atomic>
#include <chrono>
#include <memory>

#include "deca/error.hpp"
#include "jit/embedded.hpp"
#include "jit/test_hooks.hpp"
#include "jit/toolkit_paths.hpp"

namespace deca::jit {

namespace {

std::atomic<std::uint64_t> g_compile_count{0};

void check(nvrtcResult rc, const char* call, const JitSpec& spec) {
  if (rc != NVRTC_SUCCESS) {
    throw Error(std::string("jit::compile: ") + call + " for \"" + spec.name +
                "\": expected NVRTC_SUCCESS, got " + nvrtcGetErrorString(rc));
  }
}

struct ProgramDeleter {
  void operator()(nvrtcProgram* p) const {
    nvrtcDestroyProgram(p);
    delete p;
  }
};

std::string program_log(nvrtcProgram prog) {
  std::size_t size = 0;
  if (nvrtcGetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size == 0) return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(prog, log.data()) != NVRTC_SUCCESS) return {};
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

}  // namespace

std::vector<std::string> codegen_options(const JitSpec& spec) {
  std::vector<std::string> opts = {
      "--gpu-architecture=" + gpu_arch_name(spec.arch),
      "-std=c++20",
      "-default-device",
      "-lineinfo",
      "-DNDEBUG",
      // Registers and spills per kernel go to the program log; cheap, and the benchmark and
      // tests print them.
      "--ptxas-options=-v",
  };
  opts.insert(opts.end(), spec.extra_options.begin(), spec.extra_options.end());
  return opts;
}

std::vector<int> nvrtc_supported_archs() {
  int count = 0;
  if (nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0) return {};
  std::vector<int> archs(static_cast<std::size_t>(count));
  if (nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) return {};
  return archs;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor);
}

std::vector<std::string> nvrtc_options(const JitSpec& spec) {
  std::vector<std::string> opts = codegen_options(spec);
  // Older NVRTC has no cache and would reject the option.
  int major = 0, minor = 0;
  const bool has_cache = nvrtcVersion(&major, &minor) == NVRTC_SUCCESS &&
                         (major > 12 || (major == 12 && minor >= 9));
  if (has_cache) opts.push_back("--no-cache");
  for (const std::string& dir : toolkit_include_dirs()) opts.push_back("-I" + dir);
  return opts;
}

CompileResult compile(const JitSpec& spec) {
  validate(spec);
  const auto start = std::chrono::steady_clock::now();
  g_compile_count.fetch_add(1, std::memory_order_relaxed);

  std::size_t count = 0;
  const EmbeddedFile* files = embedded_files(&count);
  std::vector<const char*> contents, names;
  for (std::size_t i = 0; i < count; ++i) {
    contents.push_back(files[i].content);
    names.push_back(files[i].path);
  }

  const std::vector<std::string> opts = nvrtc_options(spec);
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());

  std::unique_ptr<nvrtcProgram, ProgramDeleter> prog(new nvrtcProgram(nullptr));
  const std::string file = spec.name + ".cu";
  check(nvrtcCreateProgram(prog.get(), spec.source.c_str(), file.c_str(), static_cast<int>(count),
                           contents.data(), names.data()),
        "nvrtcCreateProgram", spec);

  nvrtcResult rc = nvrtcCompileProgram(*prog, static_cast<int>(argv.size()), argv.data());
  CompileResult out;
  out.log = program_log(*prog);
  if (rc != NVRTC_SUCCESS) {
    std::string cmd;
    for (const std::string& o : opts) cmd += " " + o;
    throw Error("jit::compile: \"" + spec.name + "\" (entry " + spec.entry + ", " +
                gpu_arch_name(spec.arch) + "): expected NVRTC_SUCCESS, got " +
                nvrtcGetErrorString(rc) + "\noptions:" + cmd + "\nNVRTC log:\n" + out.log);
  }

  std::size_t size = 0;
  check(nvrtcGetCUBINSize(*prog, &size), "nvrtcGetCUBINSize", spec);
  if (size == 0) {
    throw Error("jit::compile: \"" + spec.name + "\": expected a CUBIN for " +
                gpu_arch_name(spec.arch) + ", got an empty one");
  }
  out.cubin.resize(size);
  check(nvrtcGetCUBIN(*prog, out.cubin.data()), "nvrtcGetCUBIN", spec);
  out.ptxas = parse_ptxas_info(out.log, spec.entry);
  out.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return out;
}

namespace test_hooks {
std::uint64_t nvrtc_compile_count() { return g_compile_count.load(); }
}  // namespace test_hooks

}  // namespace deca::jit
