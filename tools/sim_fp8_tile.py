"""Float64 emulation of kernels/gqa/sm90/fp8_tile.cuh's arithmetic (ml_dtypes' e4m3): one
128-token tile, d 128, 8 query rows; q split in two e4m3 terms after a per-row power of two into
[128, 256), P scaled by 256 and split likewise, against the float64 reference on the same stored
cache. Prints the relative RMS of the output and the largest LSE error per q spread (20 draws):
the bounds of tests/gpu/gqa_sm90_fp8_tile_test.cpp come from here.

    python tools/sim_fp8_tile.py
"""
import numpy as np, ml_dtypes
e4=ml_dtypes.float8_e4m3fn
rng=np.random.default_rng(5)
T=D=128;R=8
def q8(x): return x.astype(np.float32).astype(e4).astype(np.float64)
for sig in (1.0, 3.0, 8.0):
  errs=[];lerr=[]
  for trial in range(20):
    k=rng.standard_normal((T,D)); ks=np.abs(k).max()/448; kb=q8(k/ks)
    v=rng.standard_normal((T,D)); vs=np.abs(v).max()/448; vb=q8(v/vs)
    q=(sig*rng.standard_normal((R,D))).astype(np.float32).astype(np.float64)
    sm=1/np.sqrt(D)
    lg=(q@kb.T)*ks*sm; m=lg.max(1,keepdims=True); p=np.exp(lg-m); L=p.sum(1,keepdims=True)
    ref=(p/L)@(vb*vs); lse=(m+np.log(L))[:,0]
    # kernel emulation
    amax=np.abs(q).max(1,keepdims=True); ex=np.frexp(amax)[1]; sc=np.ldexp(1.0,8-ex)
    qs=q*sc; hi=q8(qs); lo=q8(qs-hi)
    acc=(hi@kb.T)+(lo@kb.T)
    s2=acc/sc*ks*sm*np.log2(np.e); m2=s2.max(1,keepdims=True); pr=np.exp2(s2-m2); L2=pr.sum(1,keepdims=True)
    ps=pr*256; ph=q8(ps); pl=q8(ps-ph)
    o=((ph+pl)@vb)*vs/256/L2
    errs.append(np.sqrt(((o-ref)**2).sum()/(ref**2).sum())); lerr.append(np.abs((m2[:,0]+np.log2(L2[:,0]))*np.log(2)-lse).max())
  print(sig, "rel rms max %.4f%% mean %.4f%%"%(100*max(errs),100*np.mean(errs)), "lse max %.2e"%max(lerr))
