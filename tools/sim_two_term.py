#!/usr/bin/env python3
"""Float64 simulation of 8-bit tensor-core attention over an 8-bit KV cache (issue 8).

fp8 e4m3 cache, e4m3 mma.sync:

K and V are stored in e4m3 (with a per-tensor scale); the reference is double-precision
attention over those same stored values. The kernel variants differ only in how the operands
that are not already 8-bit, q and the softmax weights P, reach an e4m3 product:

  one-term: q_s = q * 2^e (per row, largest |q| in [128, 256)), q8 = e4m3(q_s); P_s = P * 256
            after the running max, P8 = e4m3(P_s).
  two-term: q_hi = e4m3(q_s), q_lo = e4m3(q_s - q_hi); P_hi = e4m3(P_s), P_lo = e4m3(P_s - P_hi)
            (the residual is taken in fp16, as the kernel does), both products into one fp32 sum.

The online softmax runs over chunks of `chunk` keys with a running max, as one warp of the
kernel does; the denominator sums the unrounded P (fp32 in the kernel). The output is rounded
to bf16. `bf16 out` is the error of rounding the exact result to bf16 alone: the floor.

int8 cache (symmetric codes, scale max|x| / 127), int8 mma.sync (IMMA, int32 sums, exact):

  widen:    q per row into fp16 range, K/V widened to fp16 exactly, P rounded to fp16: the
            fp16 path the kernel takes today (products exact, sums in fp32).
  one-term: q_s = q * 127 / max|q| (per row), q8 = round(q_s); P_s = P * 127, P8 = round(P_s).
  two-term: q_hi = round(q_s), q_lo = round((q_s - q_hi) * 2^7) (|q_lo| <= 64); the same for
            P_s. One int32 sum per product: acc = q_lo . k + 64, then (acc >> 7) + q_hi . k
            (an arithmetic shift: the rounding of the low term is the only inexact step).
  two-term QK: q as two-term, P and V through the fp16 widening (DECA_GQA_FP8_MMA=two_term_qk).

  python tools/sim_two_term.py            (prints relative RMS per case, fp8 then int8)
"""
import argparse

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn


def e4m3(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(E4M3).astype(np.float64)


def bf16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def fp16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


def row_pow2(q):
    """Per row, the power of two that brings max |q| into [128, 256) (1 for a zero row)."""
    amax = np.max(np.abs(q), axis=-1, keepdims=True)
    safe = np.where(amax > 0, amax, 1.0)
    e = 7 - np.floor(np.log2(safe))
    return np.where(amax > 0, np.exp2(e), 1.0)


def split(x_s, terms):
    """x_s (already scaled into e4m3 range) as the sum of `terms` e4m3 values."""
    hi = e4m3(x_s)
    if terms == 1:
        return hi
    # The kernel forms the residual in fp16 (P) or fp32 (q); fp16 is the worse of the two.
    return hi + e4m3(fp16(fp16(x_s) - hi))


def make_case(rng, head_dim, group, keys, outliers=False, cache="fp8"):
    """q (bf16) and K / V stored as `cache` codes with per-tensor scales: fp8 e4m3 (largest
    magnitude at 448), or int8 as deca's quantize_int8 stores it (round, clamp to +-127)."""
    q = rng.standard_normal((group, head_dim))
    k = rng.standard_normal((keys, head_dim))
    v = rng.standard_normal((keys, head_dim))
    if outliers:
        # A few channels 20x larger in q and K, as LLM activations have.
        ch = rng.choice(head_dim, size=max(1, head_dim // 32), replace=False)
        q[:, ch] *= 20.0
        k[:, ch] *= 20.0
    q = bf16(q)
    top = 448.0 if cache == "fp8" else 127.0
    k_scale = np.max(np.abs(k)) / top
    v_scale = np.max(np.abs(v)) / top
    if cache == "fp8":
        k8, v8 = e4m3(k / k_scale), e4m3(v / v_scale)  # stored codes' values
    else:
        k8 = np.clip(np.rint(k / k_scale), -127, 127)
        v8 = np.clip(np.rint(v / v_scale), -127, 127)
    return q, k8, k_scale, v8, v_scale


def f32(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def split_int8(x_s, terms):
    """x_s (|x_s| <= 127) as int8 terms: hi, and lo in units of 2^-7 (zeros for one term)."""
    hi = np.rint(x_s)
    lo = np.rint((x_s - hi) * 128.0) if terms == 2 else np.zeros_like(hi)
    assert np.all(np.abs(hi) <= 127) and np.all(np.abs(lo) <= 64)
    return hi, lo


def imma_two_term(hi, lo, b):
    """hi @ b + ((lo @ b + 64) >> 7): the int32 sums of the kernel (exact in float64 here)."""
    return hi @ b + np.floor((lo @ b + 64.0) / 128.0)


def simulate_int8(q, k8, k_scale, v8, v_scale, scale, terms, chunk=32, pv_widen=False):
    """The int8 kernel: q and P as int8 terms on IMMA (terms 1 or 2), or widened (terms 0);
    pv_widen: q as int8 terms, P and V widened to fp16."""
    rows, d = q.shape
    amax = np.max(np.abs(q), axis=-1, keepdims=True)
    if terms == 0:
        qs = row_pow2(q) * 2.0 ** 7  # largest |q| in [2^14, 2^15): fp16 range
        q_w = fp16(q * qs)
    else:
        qs = f32(np.where(amax > 0, 127.0 / np.where(amax > 0, amax, 1.0), 1.0))
        q_hi, q_lo = split_int8(f32(q * qs), terms)
    p_scale = 1.0 if terms == 0 or pv_widen else 127.0
    m = np.full((rows, 1), -np.inf)
    l = np.zeros((rows, 1))
    o = np.zeros((rows, d))
    for t0 in range(0, k8.shape[0], chunk):
        kc, vc = k8[t0:t0 + chunk], v8[t0:t0 + chunk]
        s_int = q_w @ kc.T if terms == 0 else imma_two_term(q_hi, q_lo, kc.T)
        s = f32(s_int) / qs * (k_scale * scale)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        alpha = np.exp(m - m_new)
        p = f32(np.exp(s - m_new) * p_scale)
        l = l * alpha + p.sum(axis=-1, keepdims=True)
        if terms == 0 or pv_widen:
            pv = fp16(p) @ vc
        else:
            p_hi, p_lo = split_int8(p, terms)
            pv = imma_two_term(p_hi, p_lo, vc)
        o = o * alpha + pv
        m = m_new
    return bf16(o / l * v_scale)


def reference(q, k8, k_scale, v8, v_scale, scale):
    logits = (q @ (k8 * k_scale).T) * scale
    logits -= logits.max(axis=-1, keepdims=True)
    p = np.exp(logits)
    return (p @ (v8 * v_scale)) / p.sum(axis=-1, keepdims=True)


def simulate(q, k8, k_scale, v8, v_scale, scale, terms, chunk=32):
    """The kernel's arithmetic: e4m3 q and P terms, fp32-like sums kept in float64."""
    qs = row_pow2(q)
    q_terms = split(q * qs, terms)
    rows, d = q.shape
    m = np.full((rows, 1), -np.inf)
    l = np.zeros((rows, 1))
    o = np.zeros((rows, d))
    for t0 in range(0, k8.shape[0], chunk):
        kc, vc = k8[t0:t0 + chunk], v8[t0:t0 + chunk]
        s = (q_terms @ kc.T) / qs * (k_scale * scale)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        alpha = np.exp(m - m_new)
        p = np.exp(s - m_new)
        l = l * alpha + p.sum(axis=-1, keepdims=True)
        p_terms = split(p * 256.0, terms)
        o = o * alpha + (p_terms @ vc) / 256.0
        m = m_new
    return bf16(o / l * v_scale)


def rel_rms(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def errors(seed, head_dim, group, keys, outliers=False):
    rng = np.random.default_rng(seed)
    q, k8, ks, v8, vs = make_case(rng, head_dim, group, keys, outliers)
    scale = 1.0 / np.sqrt(head_dim)
    ref = reference(q, k8, ks, v8, vs, scale)
    return {
        "bf16_out": rel_rms(bf16(ref), ref),
        "one_term": rel_rms(simulate(q, k8, ks, v8, vs, scale, 1), ref),
        "two_term": rel_rms(simulate(q, k8, ks, v8, vs, scale, 2), ref),
    }


def errors_int8(seed, head_dim, group, keys, outliers=False):
    rng = np.random.default_rng(seed)
    q, k8, ks, v8, vs = make_case(rng, head_dim, group, keys, outliers, cache="int8")
    scale = 1.0 / np.sqrt(head_dim)
    ref = reference(q, k8, ks, v8, vs, scale)
    return {
        "bf16_out": rel_rms(bf16(ref), ref),
        "widen": rel_rms(simulate_int8(q, k8, ks, v8, vs, scale, 0), ref),
        "one_term": rel_rms(simulate_int8(q, k8, ks, v8, vs, scale, 1), ref),
        "two_term": rel_rms(simulate_int8(q, k8, ks, v8, vs, scale, 2), ref),
        "two_term_qk": rel_rms(simulate_int8(q, k8, ks, v8, vs, scale, 2, pv_widen=True), ref),
    }


CASES = [
    # (head_dim, group, keys, outliers)
    (128, 8, 4096, False),
    (128, 8, 32768, False),
    (128, 16, 8192, False),
    (64, 16, 8192, True),
    (64, 8, 4096, False),
    (256, 8, 8192, False),
    (128, 8, 8192, True),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(f"{'head_dim':>8} {'group':>5} {'keys':>6} {'outliers':>8}  {'bf16 out':>9} {'one-term':>9} {'two-term':>9}")
    for d, g, n, out in CASES:
        e = errors(args.seed, d, g, n, out)
        print(f"{d:>8} {g:>5} {n:>6} {str(out):>8}  {e['bf16_out']:9.3%} {e['one_term']:9.3%} {e['two_term']:9.3%}")
    print("\nint8 cache, IMMA (one-/two-term) against the fp16 widening")
    print(f"{'head_dim':>8} {'group':>5} {'keys':>6} {'outliers':>8}  {'bf16 out':>9} {'widen':>9} {'one-term':>9} {'two-term':>9} {'2term QK':>9}")
    for d, g, n, out in CASES:
        e = errors_int8(args.seed, d, g, n, out)
        print(f"{d:>8} {g:>5} {n:>6} {str(out):>8}  {e['bf16_out']:9.3%} {e['widen']:9.3%} {e['one_term']:9.3%} {e['two_term']:9.3%} {e['two_term_qk']:9.3%}")


if __name__ == "__main__":
    main()
