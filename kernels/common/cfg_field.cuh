// Optional members of the `Cfg` struct a JIT prologue defines (src/cuda/*_spec.cpp renders it).
// DECA_CFG_FIELD(Trait, member, fallback) declares Trait<C>::value: C::member when C defines it,
// else `fallback` (of fallback's type). A variant's constant is then written into the generated
// source only for the kernels that use it, so every other kernel's source, cache key and machine
// code stay what they were. No includes (host compiler, nvcc and NVRTC).
#pragma once

#define DECA_CFG_FIELD(Trait, member, fallback)                         \
  template <class C, class = void>                                      \
  struct Trait {                                                        \
    static constexpr decltype(fallback) value = fallback;               \
  };                                                                    \
  template <class C>                                                    \
  struct Trait<C, decltype(static_cast<void>(C::member))> {             \
    static constexpr decltype(fallback) value = C::member;              \
  };
