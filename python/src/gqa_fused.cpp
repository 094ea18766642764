// The fused decode step's binding (GqaConfig::rope_style; docs/semantics.md, "Fused decode
// step"): one run entry point with a plan, the plain run's arguments plus this step's tokens,
// the cos/sin cache and optional positions. Tensors arrive imported and named by the Python layer.
#include "bindings.hpp"

namespace deca::python {

void register_gqa_fused(nb::module_& m) {
  m.def(
      "gqa_decode_fused_planned",
      [](const GqaPlan& plan, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
         const Tensor& cos_sin_cache, const Tensor* positions, const Tensor& k_cache,
         const Tensor& v_cache, const Tensor& page_table, const Tensor& seq_lens, const Tensor& out,
         const Tensor* lse, const Tensor* tree_mask, const Tensor* sinks, const Tensor* k_scales,
         const Tensor* v_scales, float k_scale, float v_scale, float softmax_scale, float out_scale,
         const Tensor* workspace, std::uintptr_t stream) {
        GqaDecodeArgs a = make_args(q, k_cache, v_cache, page_table, seq_lens, out, lse, tree_mask, sinks,
                                    k_scales, v_scales, k_scale, v_scale, softmax_scale, out_scale,
                                    workspace, stream);
        a.k_new = k_new.view;
        a.v_new = v_new.view;
        a.cos_sin_cache = cos_sin_cache.view;
        a.positions = view_or_absent(positions);
        nb::gil_scoped_release release;
        gqa_decode(plan, a);
      },
      nb::arg("plan"), nb::arg("q"), nb::arg("k_new"), nb::arg("v_new"), nb::arg("cos_sin_cache"),
      nb::arg("positions").none(), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("page_table"),
      nb::arg("seq_lens"), nb::arg("out"), nb::arg("lse").none(), nb::arg("tree_mask").none(),
      nb::arg("sinks").none(), nb::arg("k_scales").none(), nb::arg("v_scales").none(),
      nb::arg("k_scale"), nb::arg("v_scale"), nb::arg("softmax_scale"), nb::arg("out_scale"),
      nb::arg("workspace").none(), nb::arg("stream"));
}

}  // namespace deca::python
