#!/usr/bin/env python3
"""Float64 simulation of e4m3 tensor-core attention over an fp8 e4m3 KV cache (issue 8).

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

  python tools/sim_two_term.py            (prints relative RMS per case)
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


def make_case(rng, head_dim, group, keys, outliers=False):
    q = rng.standard_normal((group, head_dim))
    k = rng.standard_normal((keys, head_dim))
    v = rng.standard_normal((keys, head_dim))
    if outliers:
        # A few channels 20x larger in q and K, as LLM activations have.
        ch = rng.choice(head_dim, size=max(1, head_dim // 32), replace=False)
        q[:, ch] *= 20.0
        k[:, ch] *= 20.0
    q = bf16(q)
    k_scale = np.max(np.abs(k)) / 448.0
    v_scale = np.max(np.abs(v)) / 448.0
    k8 = e4m3(k / k_scale)  # stored codes' values
    v8 = e4m3(v / v_scale)
    return q, k8, k_scale, v8, v_scale


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


if __name__ == "__main__":
    main()
