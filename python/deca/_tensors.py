"""How deca reads the tensors it is given, in one place.

The dtype of a tensor is the dtype of the tensor itself (read through DLPack). Two escape hatches
cover what an array library cannot express:

* numpy has no bf16 or fp8: pass ``ml_dtypes.bfloat16`` / ``ml_dtypes.float8_e4m3fn`` arrays
  (deca reads their bits), or raw bits -- ``uint16`` for bf16/fp16, ``uint8`` for fp8 -- together
  with the dtype keyword of that argument (``q_dtype=``, ``kv_dtype=``, ``out_dtype=`` ...).
* A dtype keyword given for a tensor that has a real dtype must match it; it never relabels
  real numbers.

Outputs deca allocates follow the library of the reference input: numpy (with ml_dtypes dtypes)
for CPU arrays, torch for torch tensors on any device; other libraries pass ``out=``.
"""

from __future__ import annotations

import collections
import functools

import ml_dtypes
import numpy as np

from . import _C

Error = _C.Error

# How often each entry point's one-C++-call fast path refused a call, which was then retried on
# its checked path (a wrong argument, or an input the fast import does not take). A repeated
# call of one shape should never come here; tools/py_host_cost.py prints it beside each time.
FALLBACKS = collections.Counter()

# numpy dtypes from ml_dtypes -> (deca dtype, the unsigned type that holds the same bits).
_ML_DTYPES = {
    np.dtype(ml_dtypes.bfloat16): ("bf16", np.uint16),
    np.dtype(ml_dtypes.float8_e4m3fn): ("fp8_e4m3", np.uint8),
}

_NUMPY_DTYPES = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
    "fp8_e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32),
}

_TORCH_DTYPES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "fp8_e4m3": "float8_e4m3fn",
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "uint32": "uint32",
}


def _defined_in(cls, name):
    """Whether class cls or one of its bases was defined in package `name` ("torch", "cupy").
    Written as torch.compile's tracer follows it: no str methods, no iteration of __mro__."""
    dotted = name + "."
    while cls is not None:
        module = cls.__module__
        if module == name or module[:len(dotted)] == dotted:
            return True
        cls = cls.__base__
    return False


# torch.compiler.is_compiling, once a prepared call (made in eager mode, never inside a
# torch.compile trace) has met a torch tensor: what compiling() calls per call, with neither a
# module lookup nor an import.
IS_COMPILING = None


def remember_torch(torch):
    global IS_COMPILING
    IS_COMPILING = torch.compiler.is_compiling


def torch_of(x):
    """The torch module when x is a torch tensor (its subclasses too: Parameter, FakeTensor, and
    what torch.compile traces), else None.

    Decided from x's own class, never by looking torch up in sys.modules: torch.compile's tracer
    walks the whole sys.modules dict for such a lookup and fails when one of its own imports
    changes the dict mid-walk. A class of torch's means torch is loaded, so the import below only
    binds it (and the tracer handles import statements); deca never loads torch itself."""
    if x is None or type(x) is np.ndarray or not _defined_in(type(x), "torch"):
        return None
    import torch
    return torch if isinstance(x, torch.Tensor) else None


def cupy_of(x):
    """The cupy module when x is a cupy array, else None (as torch_of, without a load).

    A torch tensor is answered first, from its own class: walking its bases up to object reaches
    torch._C.TensorBase, whose __module__ torch.compile's tracer reads as a descriptor and cannot
    slice (the traced flash_attn_with_kvcache on CUDA failed so)."""
    if x is None or type(x) is np.ndarray or _defined_in(type(x), "torch") \
            or not _defined_in(type(x), "cupy"):
        return None
    import cupy
    return cupy if isinstance(x, cupy.ndarray) else None


# Tensor arguments that may be None (absent). Any other tensor argument given as None is refused
# here, by name, rather than by nanobind's unnamed "incompatible function arguments".
_OPTIONAL = frozenset({"lse", "tree_mask", "sinks", "k_scales", "v_scales", "workspace",
                       "topk_length", "attn_sink", "extra_kv_cache", "extra_indices",
                       "extra_topk_length", "positions"})


def tensor(x, where, dtype=None, writable=False):
    """Imports x as a deca._C.Tensor named `where` ("gqa_decode: q"); None stays None for the
    optional arguments."""
    if x is None:
        if where.rsplit(": ", 1)[-1] in _OPTIONAL:
            return None
        raise Error(f"{where}: expected a tensor, got None")
    if isinstance(x, _C.Tensor):
        # A deca.Tensor carries its dtype and its writability: a keyword must match the first
        # (README), and an output must have the second.
        if dtype is not None and _C.parse_dtype(dtype, where) != x.dtype:
            raise Error(f"{where}: expected dtype {dtype}, got {x.dtype} (a deca.Tensor)")
        if writable and not x.writable:
            raise Error(f"{where}: expected a writable tensor, got a deca.Tensor of read-only "
                        f"memory")
        return x
    if isinstance(x, np.ndarray) and x.dtype in _ML_DTYPES:
        native, bits = _ML_DTYPES[x.dtype]
        if dtype is not None and _C.parse_dtype(dtype, where) != native:
            raise Error(f"{where}: expected dtype {dtype}, got {native} (ml_dtypes.{x.dtype})")
        x, dtype = x.view(bits), native
    torch = torch_of(x)
    if torch is not None and x.requires_grad:
        x = x.detach()  # torch refuses DLPack export of tensors that require grad
    if torch is not None and x.dtype == getattr(torch, "float8_e4m3fn", None):
        # Not every torch version exports float8 through DLPack; its bits always go through.
        if dtype is not None and _C.parse_dtype(dtype, where) != "fp8_e4m3":
            raise Error(f"{where}: expected dtype {dtype}, got fp8_e4m3 (torch.float8_e4m3fn)")
        x, dtype = x.view(torch.uint8), "fp8_e4m3"
    if writable and isinstance(x, np.ndarray) and not x.flags.writeable:
        raise Error(f"{where}: expected a writable array, got a read-only numpy array")
    if writable and type(x).__module__.split(".")[0] in ("jax", "jaxlib"):
        # Plain DLPack carries no read-only flag, so this is the one place to refuse them.
        raise Error(f"{where}: expected a writable array, got an immutable jax array")
    return _C.Tensor(x, dtype, where, writable)


def arg_meta(x):
    """Hashable facts of an argument that decide its plan, read from its own attributes without
    an import: (shape, dtype) of a numpy array, (shape, dtype, device) of a torch tensor (their
    own objects); None for anything else (whose calls go through the import every time)."""
    kind = type(x)
    if kind is np.ndarray:
        return (x.shape, x.dtype)
    if kind.__name__ == "Tensor" and kind.__module__ == "torch":  # torch.Tensor, no import
        return (x.shape, x.dtype, x.device)
    return None


# The key of a call's shape in the prepared-call memos of the plan-less entry points (the compat
# calls, deca's one-off calls): call_key(tensors, values), two tuples -- the call's tensor
# arguments (None, or an int where a tensor may be one, allowed) and its options -- is one C++
# call that reads each torch tensor's rank, shape, dtype and device through DLPack's C exchange
# API and takes None, bool, int, float, str and tuple values as they are (a bytes object); None
# when it meets anything else, and the caller then uses py_key(tensors, values).
call_key = _C.call_key


def py_key(tensors, values):
    """call_key's key built in Python, for the calls call_key does not describe: a numpy array
    or a torch tensor among `tensors` as arg_meta names it (None and ints as they are, a tuple
    item by item); the options in `values` as they are when None, a bool, an int, a float, a str,
    a numpy scalar or a tuple of these. None when a tensor is of another library (or a torch
    subclass) or an option is anything else (an array or a tensor, whose metadata would not name
    its value): such calls are prepared anew every time."""
    key = _tensor_parts(tensors)
    if key is None:
        return None
    for v in values:
        if not (v is None or type(v) in _PLAIN or isinstance(v, np.generic) or
                (type(v) is tuple and all(i is None or type(i) in _PLAIN for i in v))):
            return None
    return key, values


_PLAIN = frozenset({bool, int, float, str})


def _tensor_parts(tensors):
    key = []
    for t in tensors:
        if t is None or type(t) is int:
            key.append(t)
        elif type(t) is tuple:
            part = _tensor_parts(t)
            if part is None:
                return None
            key.append(part)
        else:
            meta = arg_meta(t)
            if meta is None:
                return None
            key.append(meta)
    return tuple(key)


_BITS = {dtype: bits for dtype, (_, bits) in _ML_DTYPES.items()}


def bits_views(dtype, *arrays):
    """numpy arrays of the ml_dtypes dtype `dtype` (np.dtype: bf16 or fp8) as views of their raw
    bits (uint16 / uint8), the others as they are: what a plan's fast path imports, the plan
    naming that dtype. An array of another dtype is left alone, so that the plan refuses it."""
    bits = _BITS.get(dtype)
    if bits is None:
        return arrays
    return tuple(a.view(bits) if type(a) is np.ndarray and a.dtype == dtype else a
                 for a in arrays)


def numpy_dtype(name):
    """numpy's dtype (ml_dtypes' for bf16 / fp8) of a deca dtype name."""
    return _NUMPY_DTYPES[name]


def allocator(like, where, like_t=None):
    """A function of (shape, dtype) that returns a new uninitialised tensor beside `like`, the
    library and device looked up once here (a prepared call binds it, then allocates per call):
    a torch tensor on like's device, a cupy array on like's device, or a numpy array for a numpy
    array and for any other library's host memory (a jax CPU array, a deca.Tensor). dtype:
    deca's name ("bf16", "fp32", ...) or an object of that library (like.dtype).

    Raises deca.Error naming `where` (the output: "gqa_decode: out") for another library's
    device memory (deca allocates there through torch and cupy only), and, per call, for a
    dtype cupy has no arrays of (bf16, fp8). like_t: like imported, where the caller has it;
    only another library's tensor is imported (to read its device)."""
    if type(like) is np.ndarray:
        return _numpy_empty
    torch = torch_of(like)
    if torch is not None:
        empty, device = torch.empty, like.device

        def torch_empty(shape, dtype):
            if type(dtype) is str:
                dtype = getattr(torch, _TORCH_DTYPES[dtype])
            return empty(shape, dtype=dtype, device=device)
        return torch_empty
    cupy = cupy_of(like)
    if cupy is not None:
        device = like.device.id

        def cupy_empty(shape, dtype):
            dt = _NUMPY_DTYPES[dtype] if type(dtype) is str else np.dtype(dtype)
            if dt in _ML_DTYPES:
                raise Error(f"{where}: expected an output tensor for {_ML_DTYPES[dt][0]} "
                            f"results in cupy memory, got None (cupy has no such dtype for "
                            f"deca to allocate)")
            with cupy.cuda.Device(device):
                return cupy.empty(shape, dtype=dt)
        return cupy_empty
    if like_t is None:
        like_t = tensor(like, where)
    if is_cpu(like_t):
        return _numpy_empty
    raise Error(f"{where}: expected an output tensor for {like_t.dtype} inputs on "
                f"{like_t.device} (deca allocates numpy arrays, torch tensors and cupy arrays "
                f"only)")


def _numpy_empty(shape, dtype):
    return np.empty(shape, _NUMPY_DTYPES[dtype] if type(dtype) is str else dtype)


def maker(like, shape, dtype, where):
    """A function of no arguments returning a new uninitialised tensor of `shape` and `dtype`
    (as allocator's) beside `like`: what a prepared call of one shape allocates its outputs
    with, per call. For a torch.Tensor it is torch.empty_like of a one-element template
    expanded to `shape`, in the contiguous format: the tensor torch.empty(shape, dtype=dtype,
    device=...) makes (same strides, device, dtype), with a fraction of torch.empty's argument
    parsing (tuple, dtype, device) per call; for numpy np.empty with its arguments bound; else
    allocator's."""
    shape = tuple(shape)
    torch = torch_of(like)
    if torch is not None and type(like) is torch.Tensor:
        remember_torch(torch)
        if type(dtype) is str:
            dtype = getattr(torch, _TORCH_DTYPES[dtype])
        template = torch.empty((), dtype=dtype, device=like.device).expand(shape)
        return functools.partial(torch.empty_like, template,
                                 memory_format=torch.contiguous_format)
    if type(like) is np.ndarray:
        return functools.partial(np.empty, shape, _NUMPY_DTYPES[dtype] if type(dtype) is str
                                 else dtype)
    return functools.partial(allocator(like, where), shape, dtype)


def is_cpu(t):
    return t.device.kind == _C.DeviceKind.CPU


def zeros_bytes(like, like_t, nbytes, where):
    """A zeroed byte buffer (a plan workspace) beside `like`, or None when nbytes is 0."""
    if nbytes == 0:
        return None
    torch = torch_of(like)
    if torch is not None:
        return torch.zeros(nbytes, dtype=torch.uint8, device=like.device)
    cupy = cupy_of(like)
    if cupy is not None:
        with cupy.cuda.Device(like_t.device.index):
            return cupy.zeros(nbytes, dtype=np.uint8)
    if is_cpu(like_t):
        return np.zeros(nbytes, dtype=np.uint8)
    raise Error(f"{where}: expected a workspace tensor of {nbytes} bytes for inputs on "
                f"{like_t.device}, got None")


def stream_handle(stream, like, like_t, where):
    """A cudaStream_t as an int: the given one, else the current stream of like's library."""
    if is_cpu(like_t):
        return 0
    if stream is None:
        torch = torch_of(like)
        if torch is not None:
            return int(torch.cuda.current_stream(like.device).cuda_stream)
        cupy = cupy_of(like)
        if cupy is not None:
            return int(cupy.cuda.get_current_stream().ptr)
        return 0
    return stream_int(stream, where)


def stream_int(stream, where):
    """A cudaStream_t as an int from an int-like or an object with .cuda_stream / .ptr."""
    if isinstance(stream, (int, np.integer)):
        return int(stream)
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise Error(f"{where}: stream: expected an int handle or an object with .cuda_stream or "
                f".ptr, got {type(stream).__name__}")


def stream_getter(cuda_index, like):
    """current_stream(cuda_index, like) as a function of no arguments, bound once by a prepared
    call (whose key fixes the library and device): torch's raw-handle lookup with the index
    bound, cupy's; for a CPU plan or another library the builtin int, whose int() is 0."""
    if cuda_index < 0:
        return int
    torch = torch_of(like)
    if torch is not None:
        return functools.partial(torch._C._cuda_getCurrentRawStream, cuda_index)
    cupy = cupy_of(like)
    if cupy is not None:
        return lambda: int(cupy.cuda.get_current_stream().ptr)
    return int


def current_stream(cuda_index, like):
    """The current stream of like's library on CUDA device cuda_index, as an int: torch's raw
    handle (without building a torch.cuda.Stream object: what torch's own kernel launchers
    read), cupy's; 0 for a CPU plan (cuda_index < 0) or another library (the legacy default
    stream). The plans' per-call fast paths take it."""
    if cuda_index < 0:
        return 0
    torch = torch_of(like)
    if torch is not None:
        return torch._C._cuda_getCurrentRawStream(cuda_index)
    cupy = cupy_of(like)
    if cupy is not None:
        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def choice(where, name, value, allowed):
    if value not in allowed:
        expected = " or ".join(f'"{a}"' for a in allowed)
        raise Error(f"{where}: {name}: expected {expected}, got {value!r}")
    return value


def expect_rank(where, name, t, rank, layout):
    if len(t.shape) != rank:
        raise Error(f"{where}: {name}: expected rank {rank} {layout}, got "
                    f"{list(t.shape)} {t.dtype}")


def expect_dim_range(where, name, t, dim, dim_name, lo, hi):
    """A size a one-shot wrapper derives a plan field from, checked on the tensor that carries
    it, so that the message names the caller's argument and not the derived config field."""
    size = t.shape[dim]
    if not lo <= size <= hi:
        raise Error(f"{where}: {name}: dim {dim} ({dim_name}): expected {lo}..{hi}, got {size}")


def parse_device(value, where):
    """'cpu', 'cuda', 'cuda:N', an int N (CUDA device N) or a torch.device -> _C.Device."""
    d = _C.Device()
    text = str(value) if not isinstance(value, (int, np.integer)) else f"cuda:{int(value)}"
    if text == "cpu":
        return d
    if text == "cuda" or text.startswith("cuda:"):
        d.kind = _C.DeviceKind.CUDA
        index = text[5:] or "0"
        if not index.isdigit():
            raise Error(f"{where}: device: expected 'cpu', 'cuda' or 'cuda:N', got {value!r}")
        d.index = int(index)
        return d
    raise Error(f"{where}: device: expected 'cpu', 'cuda' or 'cuda:N', got {value!r}")


# Other spellings of deca's dtype names: the bench CLI's "fp8", the array libraries' names.
DTYPE_ALIASES = {
    "fp8": "fp8_e4m3", "e4m3": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3", "fp8e4m3": "fp8_e4m3",
    "float8_e4m3": "fp8_e4m3", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "float32": "fp32", "float": "fp32",
}
# Names deca has no dtype for that users reach for, each with what to use instead.
_DTYPE_HINTS = {
    "e5m2": "deca reads fp8 as e4m3 only: fp8_e4m3", "fp8_e5m2": "deca reads fp8 as e4m3 only: "
    "fp8_e4m3", "float8_e5m2": "deca reads fp8 as e4m3 only: fp8_e4m3",
    "float8_e4m3fnuz": "deca reads the OCP e4m3 format (float8_e4m3fn): fp8_e4m3",
    "fp4": "deca has no fp4 cache", "nvfp4": "deca has no fp4 cache",
}


def dtype_keyword(where, name, value):
    """A dtype keyword's value as deca names it: deca's own names, and the aliases above ("fp8",
    "bfloat16", "float16", ...); anything else raises, naming the keyword and what was meant."""
    if not isinstance(value, str):
        raise Error(f"{where}: {name}: expected a dtype name such as \"bf16\", got "
                    f"{type(value).__name__} {value!r}")
    text = DTYPE_ALIASES.get(value.lower(), value.lower())
    if text in _DTYPE_NAMES:
        return text
    hint = _DTYPE_HINTS.get(text)
    raise Error(f"{where}: {name}: expected a dtype name (bf16, fp16, fp32, fp8_e4m3 -- also "
                f"spelled fp8 or e4m3 --, int8, uint8, int32, uint32), got \"{value}\""
                + (f" ({hint})" if hint else ""))


_DTYPE_NAMES = frozenset(_NUMPY_DTYPES)


def check_dtype_keywords(where, **keywords):
    """Each dtype keyword as deca names it (dtype_keyword), None left alone, in the order given:
    a bad one is named itself ("gqa_decode: kv_dtype: ...") before any tensor is read."""
    return tuple(None if value is None else dtype_keyword(where, name, value)
                 for name, value in keywords.items())


_INT32_MAX = 2 ** 31 - 1


def check_scalars(where, ints=None, floats=None, bools=None):
    """Names a scalar argument of the wrong type or range ("gqa_decode: window: ...") before it
    reaches a C++ field, where nanobind would raise an unnamed TypeError. None is left alone
    (it means the default)."""
    for name, value in (ints or {}).items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise Error(f"{where}: {name}: expected an int, got {type(value).__name__} {value!r}")
        if not -_INT32_MAX - 1 <= int(value) <= _INT32_MAX:
            raise Error(f"{where}: {name}: expected an int32 value, got {int(value)}")
    for name, value in (floats or {}).items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise Error(f"{where}: {name}: expected a float, got {type(value).__name__} {value!r}")
    for name, value in (bools or {}).items():
        if value is None:
            continue
        if not isinstance(value, (bool, np.bool_)):
            raise Error(f"{where}: {name}: expected True or False, got {type(value).__name__} "
                        f"{value!r}")
