"""One fuzz case, run inside a worker process (test_fuzz.py isolates crashes and hangs).

A case is a plain dict (the op, its shape parameters, a mutation, a seed) so that hypothesis can
generate and shrink it in the parent and a worker can rebuild the same arrays from it. Every
output lives inside a sentinel-filled byte buffer with guard bytes on both sides. The property:
the call either raises deca.Error and changes no byte of any output or input buffer, or it
succeeds, leaves the guards intact and matches the numpy reference. The mutation decides which
of the two is required: layout-only mutations (read-only, strided, stride-0 or deca.Tensor
inputs) must succeed; the others (outputs overlapping inputs or each other, read-only outputs,
mismatched dtype keywords, bad indices, NaN scales, too-small maxima) must be refused.
"""

import math
import os
import signal
import time

import numpy as np

import deca
import numpy_reference as ref

GUARD = 64
SENTINEL = 0xA5

# Mutations that change only how valid data is laid out or passed: the call must succeed.
VALID = ("none", "ro_inputs", "tensor_inputs", "strided_inputs", "broadcast_input")
# Mutations that make the call invalid: it must raise deca.Error and write nothing.
INVALID = ("out_overlaps_input", "out_overlaps_lse", "out_self_overlap", "ro_out",
           "ro_out_tensor", "dtype_keyword", "bad_index", "nan_scale", "small_max_seq_len",
           "huge_out")
OPS = ("gqa_decode", "gqa_plan", "mla_dense", "mla_sparse", "combine", "quantize_fp8",
       "quantize_int8", "pack_mla_fp8", "unpack_mla_fp8")


class Outcome(Exception):
    """A failed property: kind is 'silent' (an invalid call accepted) or 'wrong'."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def _aligned_bytes(n, rng=None):
    """n sentinel bytes (plus guards) at a 64-byte aligned address: (buffer, view of n bytes)."""
    raw = np.full(n + 2 * GUARD + 64, SENTINEL, np.uint8)
    skip = (-raw.ctypes.data) % 64
    buf = raw[skip:skip + n + 2 * GUARD]
    return buf, buf[GUARD:GUARD + n]


def _output(shape, dtype):
    """A sentinel-filled output of numpy dtype `dtype` inside a guarded buffer."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    buf, body = _aligned_bytes(n)
    return buf, body.view(dtype).reshape(shape)


# ----------------------------------------------------------------------------- op builders
# Each returns a dict: inputs (name -> array), outputs (name -> (shape, numpy dtype)),
# call(inputs, outputs, **kw), reference(inputs) -> {name: (expected, compare)}, and the
# names of index inputs a bad_index mutation may corrupt.

def _page_table(rng, lens, page):
    """A page table for requests of `lens` tokens over shuffled pages, one spare page (in every
    unused slot) past what they need; returns (table, num_pages)."""
    need = [math.ceil(n / page) for n in lens]
    num_pages = sum(need) + 1
    ids = rng.permutation(num_pages)
    table = np.full((len(lens), max(need + [1])), ids[-1], np.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = ids[at:at + n]
        at += n
    return table, num_pages


def _gqa(rng, p, planned):
    batch, q_len, hkv, group = p["batch"], p["q_len"], p["hkv"], p["group"]
    d, page, layout, kv_dtype = p["d"], p["page"], p["layout"], p["kv_dtype"]
    hq = hkv * group
    lens = [int(rng.integers(q_len, 20)) if rng.random() < 0.85 else 0 for _ in range(batch)]
    table, num_pages = _page_table(rng, lens, page)
    shape = (num_pages, page, hkv, d) if layout == "NHD" else (num_pages, hkv, page, d)
    kv_np = {"bf16": ref.BF16, "fp16": np.float16, "fp8_e4m3": ref.FP8, "int8": np.int8}[kv_dtype]
    if kv_dtype == "int8":
        k = rng.integers(-127, 128, shape).astype(np.int8)
        v = rng.integers(-127, 128, shape).astype(np.int8)
    else:
        k = rng.standard_normal(shape).astype(kv_np)
        v = rng.standard_normal(shape).astype(kv_np)
    inputs = dict(q=rng.standard_normal((batch, q_len, hq, d)).astype(ref.BF16), k_cache=k,
                  v_cache=v, page_table=table, seq_lens=np.asarray(lens, np.int32))
    scale = 0.05 if kv_dtype == "int8" else 1.0
    if p["per_head"]:
        inputs["k_scales"] = (rng.uniform(0.5, 2, hkv) * scale).astype(np.float32)
        inputs["v_scales"] = (rng.uniform(0.5, 2, hkv) * scale).astype(np.float32)
    outputs = {"out": ((batch, q_len, hq, d), ref.BF16)}
    if p["lse"]:
        outputs["lse"] = ((batch, q_len, hq), np.float32)

    def scales(i):
        if p["per_head"]:
            return dict(k_scales=i["k_scales"], v_scales=i["v_scales"])
        return dict(k_scale=scale, v_scale=scale)

    def call(i, o, dtype_keyword=None, max_seq_len=None):
        if planned:
            plan = deca.GqaPlan(hq, hkv, d, page, layout=layout, kv_dtype=kv_dtype,
                                max_batch=max(batch, 1), max_q_len=q_len,
                                max_seq_len=max_seq_len or table.shape[1] * page, lse=p["lse"],
                                per_head_kv_scale=p["per_head"])
            return plan.run(i["q"], i["k_cache"], i["v_cache"], i["page_table"], i["seq_lens"],
                            o["out"], lse=o.get("lse"), **scales(i))
        kw = {}
        if dtype_keyword is not None:
            kw["q_dtype"] = dtype_keyword
        if max_seq_len is not None:
            kw["max_seq_len"] = max_seq_len
        return deca.gqa_decode(i["q"], i["k_cache"], i["v_cache"], i["page_table"],
                               i["seq_lens"], o["out"], layout=layout, lse=o.get("lse"),
                               **scales(i), **kw)

    def reference(i):
        s = scales(i)
        out, lse = ref.gqa_decode(ref.to_f64(i["q"]), ref.to_f64(i["k_cache"]),
                                  ref.to_f64(i["v_cache"]), np.asarray(i["page_table"]),
                                  np.asarray(i["seq_lens"]), layout=layout, **s)
        return {"out": (out, "bf16"), "lse": (lse, "lse")}

    case = dict(inputs=inputs, outputs=outputs, call=call, reference=reference,
                index=("page_table",), bound=num_pages, lens=lens,
                scales=p["per_head"] and ("k_scales",))
    if not planned:  # a plan carries its dtypes: GqaPlan.run has no dtype keyword
        case["dtype_keyword"] = "fp16"
    return case


def _mla_dense(rng, p):
    batch, q_len, heads, page = p["batch"], p["q_len"], p["hkv"], p["page"]
    lens = [int(rng.integers(q_len, 12)) if rng.random() < 0.85 else 0 for _ in range(batch)]
    table, blocks = _page_table(rng, lens, page)
    inputs = dict(q=(rng.standard_normal((batch, q_len, heads, 576)) * 0.1).astype(ref.BF16),
                  kv_cache=rng.standard_normal((blocks, page, 1, 576)).astype(ref.BF16),
                  block_table=table, cache_seqlens=np.asarray(lens, np.int32))
    outputs = {"out": ((batch, q_len, heads, 512), ref.BF16)}
    if p["lse"]:
        outputs["lse"] = ((batch, q_len, heads), np.float32)

    def call(i, o, dtype_keyword=None, max_seq_len=None):
        return deca.mla_decode_dense(i["q"], i["kv_cache"], i["block_table"], i["cache_seqlens"],
                                     o["out"], lse=o.get("lse"))

    def reference(i):
        out, lse = ref.mla_dense(ref.to_f64(i["q"]), ref.to_f64(i["kv_cache"]),
                                 np.asarray(i["block_table"]), np.asarray(i["cache_seqlens"]))
        return {"out": (out, "bf16"), "lse": (lse, "lse")}

    return dict(inputs=inputs, outputs=outputs, call=call, reference=reference,
                index=("block_table",), bound=blocks, lens=lens)


def _mla_sparse(rng, p):
    batch, q_len, heads, page, topk = p["batch"], p["q_len"], p["hkv"], p["page"], p["topk"]
    blocks = int(rng.integers(1, 4))
    tokens = rng.standard_normal((blocks, page, 1, 576)).astype(ref.BF16)
    kv = deca.pack_mla_fp8(tokens)
    indices = rng.integers(-1, blocks * page, (batch, q_len, topk)).astype(np.int32)
    inputs = dict(q=(rng.standard_normal((batch, q_len, heads, 576)) * 0.1).astype(ref.BF16),
                  kv_cache=kv, indices=indices)
    if p["per_head"]:
        inputs["topk_length"] = rng.integers(0, topk + 1, batch).astype(np.int32)
        inputs["attn_sink"] = rng.standard_normal(heads).astype(np.float32)
    outputs = {"out": ((batch, q_len, heads, 512), ref.BF16)}
    if p["lse"]:
        outputs["lse"] = ((batch, q_len, heads), np.float32)

    def call(i, o, dtype_keyword=None, max_seq_len=None):
        return deca.mla_decode_sparse(i["q"], i["kv_cache"], i["indices"], o["out"],
                                      topk_length=i.get("topk_length"),
                                      attn_sink=i.get("attn_sink"), lse=o.get("lse"))

    def reference(i):
        out, lse = ref.mla_sparse(ref.to_f64(i["q"]), np.asarray(i["kv_cache"]),
                                  np.asarray(i["indices"]), i.get("topk_length"),
                                  i.get("attn_sink"))
        return {"out": (out, "bf16"), "lse": (lse, "lse")}

    return dict(inputs=inputs, outputs=outputs, call=call, reference=reference,
                index=("indices",), bound=blocks * page)


def _combine(rng, p):
    splits, batch, q_len, heads = p["topk"] % 3 + 1, p["batch"], p["q_len"], p["hkv"]
    dv = p["d"] // 4
    po = rng.standard_normal((splits, batch, q_len, heads, dv)).astype(np.float32)
    pl = rng.standard_normal((splits, batch, q_len, heads)).astype(np.float32)
    pl[rng.random(pl.shape) < 0.2] = -np.inf
    inputs = dict(partial_out=po, partial_lse=pl)
    if p["per_head"]:
        inputs["attn_sink"] = rng.standard_normal(heads).astype(np.float32)
    outputs = {"out": ((batch, q_len, heads, dv), np.float32)}
    if p["lse"]:
        outputs["lse"] = ((batch, q_len, heads), np.float32)

    def call(i, o, dtype_keyword=None, max_seq_len=None):
        kw = {} if dtype_keyword is None else {"out_dtype": dtype_keyword}
        return deca.combine(i["partial_out"], i["partial_lse"], o["out"],
                            attn_sink=i.get("attn_sink"), lse=o.get("lse"), **kw)

    def reference(i):
        out, lse = ref.combine(np.asarray(i["partial_out"]), np.asarray(i["partial_lse"]),
                               i.get("attn_sink"))
        return {"out": (out, "fp32"), "lse": (lse, "lse")}

    return dict(inputs=inputs, outputs=outputs, call=call, reference=reference,
                dtype_keyword="bf16")


def _quantize(rng, p, kind):
    shape = tuple(int(x) for x in rng.integers(0, 5, p["q_len"]))
    src = (rng.standard_normal(shape) * 3).astype(np.float32)
    out_np = ref.FP8 if kind == "fp8" else np.int8
    scale = 0.5

    def call(i, o, dtype_keyword=None, max_seq_len=None):
        kw = {} if dtype_keyword is None else {"src_dtype": dtype_keyword}
        op = deca.quantize_fp8 if kind == "fp8" else deca.quantize_int8
        return op(i["src"], scale, o["out"], **kw)

    def reference(i):
        x = np.asarray(i["src"], np.float64) / scale
        if kind == "fp8":
            want = x.astype(np.float32).astype(ref.FP8)
        else:
            want = np.clip(np.rint(x), -127, 127).astype(np.int8)
        return {"out": (want, "exact")}

    return dict(inputs=dict(src=src), outputs={"out": (shape, out_np)}, call=call,
                reference=reference, dtype_keyword="bf16", huge=True)


def _pack(rng, p):
    n = p["batch"]
    src = rng.standard_normal((n, 576)).astype(ref.BF16)

    def call(i, o, dtype_keyword=None, max_seq_len=None):
        kw = {} if dtype_keyword is None else {"src_dtype": dtype_keyword}
        return deca.pack_mla_fp8(i["src"], o["out"], **kw)

    def reference(i):
        return {"out": (np.asarray(i["src"]), "packed")}

    return dict(inputs=dict(src=src), outputs={"out": ((n, 656), np.uint8)}, call=call,
                reference=reference, dtype_keyword="fp16", huge=True)


def _unpack(rng, p):
    n = p["batch"]
    src = np.asarray(deca.pack_mla_fp8(rng.standard_normal((n, 576)).astype(ref.BF16)))

    def call(i, o, dtype_keyword=None, max_seq_len=None):
        kw = {} if dtype_keyword is None else {"out_dtype": dtype_keyword}
        return deca.unpack_mla_fp8(i["src"], o["out"], **kw)

    def reference(i):
        s = np.asarray(i["src"])
        want = np.array([ref.unpack_fp8_token(t) for t in s]).reshape(n, 576)
        return {"out": (want, "exact")}

    return dict(inputs=dict(src=src), outputs={"out": ((n, 576), np.float32)}, call=call,
                reference=reference, dtype_keyword="bf16", huge=True)


def build(rng, spec):
    op = spec["op"]
    if op in ("gqa_decode", "gqa_plan"):
        return _gqa(rng, spec, op == "gqa_plan")
    if op == "mla_dense":
        return _mla_dense(rng, spec)
    if op == "mla_sparse":
        return _mla_sparse(rng, spec)
    if op == "combine":
        return _combine(rng, spec)
    if op in ("quantize_fp8", "quantize_int8"):
        return _quantize(rng, spec, op[-4:].lstrip("_"))
    if op == "pack_mla_fp8":
        return _pack(rng, spec)
    return _unpack(rng, spec)


# ----------------------------------------------------------------------------- checks

def _compare(name, got, want, how):
    got = np.asarray(got)
    if how == "exact":
        if not np.array_equal(got.astype(np.float64), np.asarray(want).astype(np.float64),
                              equal_nan=True):
            raise Outcome("wrong", f"{name}: not the reference values")
    elif how == "packed":
        want = np.asarray(want)
        for t in range(got.shape[0]):
            back = ref.unpack_fp8_token(got[t])
            x = want[t].astype(np.float64)
            if not np.array_equal(back[512:], x[512:]):
                raise Outcome("wrong", f"{name}: token {t}: RoPE values changed")
            for g in range(4):
                xs, bs = x[g * 128:(g + 1) * 128], back[g * 128:(g + 1) * 128]
                amax = np.abs(xs).max()
                if np.abs(bs - xs).max() > amax / 8 + 1e-30:
                    raise Outcome("wrong", f"{name}: token {t} group {g}: beyond fp8 rounding")
    elif how == "lse":
        got = got.astype(np.float64)
        if not np.array_equal(np.isneginf(got), np.isneginf(want)):
            raise Outcome("wrong", f"{name}: -inf rows differ from the reference")
        fin = np.isfinite(want)
        if not np.allclose(got[fin], want[fin], rtol=1e-4, atol=1e-4):
            raise Outcome("wrong", f"{name}: differs from the reference")
    else:
        rtol = {"bf16": 2.0 ** -6, "fp32": 1e-5}[how]
        if not np.allclose(got.astype(np.float64), want, rtol=rtol, atol=2e-2 if how == "bf16"
                           else 1e-5):
            raise Outcome("wrong", f"{name}: differs from the reference")


def _readonly(x):
    x = np.asarray(x).view()
    x.flags.writeable = False
    return x


def _strided(x):
    """The same values in a buffer twice as long along dim 0 (rows 16-byte aligned still)."""
    x = np.asarray(x)
    if x.ndim < 2 or x.shape[0] == 0:
        return x  # a 1-D index tensor's only dim is its last, which must stay contiguous
    big = np.zeros((2 * x.shape[0],) + x.shape[1:], x.dtype)
    big[::2] = x
    return big[::2]


def _broadcast_dim0(x):
    """x with every row equal to row 0, as a stride-0 view (read-only, as numpy makes it).
    1-D tensors stay: their only dim is the last, which deca requires contiguous."""
    x = np.asarray(x)
    if x.ndim < 2 or x.shape[0] < 2:
        return x
    return np.broadcast_to(x[:1], x.shape)


def _overlapping_output(base, shape, dtype, rng):
    """An output of `shape` laid over the bytes of array `base`: (new base, output)."""
    base = np.asarray(base)
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    off = int(rng.integers(0, max(base.nbytes // 16, 1))) * 16
    buf, body = _aligned_bytes(max(base.nbytes, off + n))
    body[:base.nbytes] = np.ascontiguousarray(base).view(np.uint8).reshape(-1)
    new_base = body[:base.nbytes].view(base.dtype).reshape(base.shape)
    out = body[off:off + n].view(dtype).reshape(shape)
    return buf, new_base, out


def run_case(spec):
    """Runs one case; returns 'ok' or 'refused', raises Outcome when the property fails."""
    rng = np.random.default_rng(spec["seed"])
    case = build(rng, spec)
    inputs, mutation = dict(case["inputs"]), spec["mutation"]
    bufs, outputs = {}, {}
    for name, (shape, dtype) in case["outputs"].items():
        bufs[name], outputs[name] = _output(shape, dtype)
    kw = {}
    expect_error = mutation in INVALID
    numel = {k: int(np.prod(v[0])) for k, v in case["outputs"].items()}

    if mutation == "ro_inputs":
        inputs = {k: _readonly(v) for k, v in inputs.items()}
    elif mutation == "tensor_inputs":
        inputs = {k: deca.as_tensor(v, name=k) for k, v in inputs.items()}
    elif mutation == "strided_inputs":
        inputs = {k: _strided(v) for k, v in inputs.items()}
    elif mutation == "broadcast_input":
        name = sorted(inputs)[spec["pick"] % len(inputs)]
        inputs[name] = _broadcast_dim0(inputs[name])
    elif mutation == "out_overlaps_input":
        name = sorted(inputs)[spec["pick"] % len(inputs)]
        shape, dtype = case["outputs"]["out"]
        if numel["out"] == 0 or np.asarray(inputs[name]).nbytes == 0:
            expect_error = False
        else:
            bufs["in:" + name], inputs[name], outputs["out"] = _overlapping_output(
                inputs[name], shape, dtype, rng)
    elif mutation == "out_overlaps_lse":
        if "lse" not in outputs or numel["lse"] == 0:
            expect_error = False
        else:
            shape, dtype = case["outputs"]["lse"]
            n = numel["lse"] * 4
            body = bufs["out"][GUARD:GUARD + outputs["out"].nbytes]
            off = int(rng.integers(0, max((body.nbytes - n) // 16, 0) + 1)) * 16
            if off + n <= body.nbytes:
                outputs["lse"] = body[off:off + n].view(np.float32).reshape(shape)
            else:
                expect_error = False
    elif mutation == "out_self_overlap":
        o = outputs["out"]
        dims = [d for d in range(o.ndim) if o.shape[d] > 1]
        if not dims or numel["out"] == 0:
            expect_error = False
        else:
            strides = list(o.strides)
            strides[dims[spec["pick"] % len(dims)]] = 0
            outputs["out"] = np.lib.stride_tricks.as_strided(o, o.shape, strides,
                                                             writeable=True)
    elif mutation == "ro_out":
        outputs["out"] = _readonly(outputs["out"])
    elif mutation == "ro_out_tensor":
        outputs["out"] = deca.as_tensor(_readonly(outputs["out"]))
    elif mutation == "dtype_keyword":
        if "dtype_keyword" not in case:
            expect_error = False
        else:
            kw["dtype_keyword"] = case["dtype_keyword"]
    elif mutation == "bad_index":
        name = (case.get("index") or (None,))[0]
        arr = np.array(inputs[name]) if name else None
        used = None
        if name == "indices" and arr.size:
            used = tuple(int(rng.integers(0, s)) for s in arr.shape)
            if "topk_length" in inputs and used[2] >= inputs["topk_length"][used[0]]:
                used = None
        elif name and arr.size:
            live = [b for b, n in enumerate(case["lens"]) if n > 0]
            if live:
                b = live[int(rng.integers(0, len(live)))]
                used = (b, 0)
        if used is None:
            expect_error = False
        else:
            arr[used] = case["bound"] + int(rng.integers(0, 3))
            inputs[name] = arr
    elif mutation == "nan_scale":
        if not case.get("scales"):
            expect_error = False
        else:
            s = np.array(inputs["k_scales"])
            s[spec["pick"] % s.size] = np.nan
            inputs["k_scales"] = s
    elif mutation == "small_max_seq_len":
        if spec["op"] != "gqa_decode" or max(case.get("lens", [0]) + [0]) <= 1:
            expect_error = False
        else:
            kw["max_seq_len"] = 1
    elif mutation == "huge_out":
        o, src = outputs["out"], np.asarray(inputs["src"]) if "src" in inputs else None
        if not case.get("huge") or o.ndim == 0 or o.size == 0 or src.size == 0:
            expect_error = False
        else:
            # src and out as stride-0 views of 2^31 - 1 rows: refused at once (out overlaps
            # itself), never iterated.
            def huge(x, **kw):
                return np.lib.stride_tricks.as_strided(x, (2 ** 31 - 1,) + x.shape[1:],
                                                       (0,) + x.strides[1:], **kw)
            inputs["src"] = huge(src, writeable=False)
            outputs["out"] = huge(o, writeable=True)

    before = {k: v.copy() for k, v in bufs.items()}
    try:
        case["call"](inputs, outputs, **kw)
    except deca.Error as e:
        for k, v in bufs.items():
            if not np.array_equal(v, before[k]):
                raise Outcome("wrong", f"deca.Error raised after writing {k}: {e}")
        if not expect_error:
            raise Outcome("wrong", f"valid call refused: {e}")
        return "refused"
    except Exception as e:  # anything but deca.Error fails the property
        raise Outcome("wrong", f"{type(e).__name__} instead of deca.Error: {e}") from None
    if expect_error:
        raise Outcome("silent", f"{mutation} accepted")
    for k, v in bufs.items():
        if not (np.all(v[:GUARD] == SENTINEL) and np.all(v[-GUARD:] == SENTINEL)):
            raise Outcome("wrong", f"{k}: guard bytes overwritten")
    want = case["reference"]({k: np.asarray(v) if not isinstance(v, deca.Tensor) else
                              case["inputs"][k] for k, v in inputs.items()})
    for name, o in outputs.items():
        if isinstance(o, deca.Tensor):
            continue
        _compare(name, o, *want[name])
    return "ok"


def worker(spec):
    """The pool's entry point: ('ok' | 'refused' | 'silent' | 'wrong', message)."""
    if spec["op"] == "__crash__":  # the harness's own test: a worker that dies
        os.kill(os.getpid(), signal.SIGSEGV)
    if spec["op"] == "__hang__":
        time.sleep(3600)
    try:
        return run_case(spec), ""
    except Outcome as o:
        return o.kind, f"{o}"
    except Exception as e:  # building the case failed: the harness's fault, reported as such
        return "wrong", f"case construction: {type(e).__name__}: {e}"
