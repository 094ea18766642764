"""deca's two output allocators (deca._tensors): allocator(like, where) -- bound once, then a
function of (shape, dtype) -- and maker(like, shape, dtype, where) -- a function of no
arguments for a prepared call's fixed outputs: the library and device of `like` (numpy, torch,
cupy; numpy for another library's host memory), dtype as deca names it or as the library does,
the errors naming the output, and (torch) what torch.compile traces."""

import sys
import types

import numpy as np
import pytest

import deca
from deca import _C
from deca._tensors import allocator, maker, numpy_dtype, tensor

NAMES = ["bf16", "fp16", "fp32", "fp8_e4m3", "int8", "uint8", "int32", "uint32"]


@pytest.mark.parametrize("name", NAMES)
def test_numpy_outputs_by_name(name):
    like = np.zeros(3, np.float32)
    a = allocator(like, "f: out")((2, 3), name)
    b = maker(like, [2, 3], name, "f: out")
    c, d = b(), b()
    for x in (a, c, d):
        assert type(x) is np.ndarray and x.shape == (2, 3) and x.dtype == numpy_dtype(name)
        assert x.flags.c_contiguous and x.flags.writeable
    assert not np.shares_memory(c, d)  # a new array per call


def test_numpy_outputs_by_library_dtype():
    like = np.zeros(3, np.float16)
    assert allocator(like, "f: out")((4,), like.dtype).dtype == np.float16
    assert maker(like, (4,), np.dtype(np.int32), "f: out")().dtype == np.int32


def test_another_librarys_host_memory_gets_numpy():
    """A deca.Tensor (any DLPack producer's host memory) gets numpy arrays."""
    like = tensor(np.zeros((2, 2), np.float32), "f: q")
    assert isinstance(like, _C.Tensor)
    x = allocator(like, "f: out")((2, 5), "bf16")
    assert type(x) is np.ndarray and x.dtype == numpy_dtype("bf16")
    y = maker(like, (3,), "fp32", "f: out")()
    assert type(y) is np.ndarray and y.shape == (3,) and y.dtype == np.float32


def test_another_librarys_device_memory_is_refused_by_name():
    device = _C.Device()
    device.kind, device.index = _C.DeviceKind.CUDA, 1
    like_t = types.SimpleNamespace(dtype="bf16", device=device)
    with pytest.raises(deca.Error, match=r"^f: out: expected an output tensor for bf16 inputs "
                                         r"on .*1 \(deca allocates numpy arrays, torch tensors "
                                         r"and cupy arrays only\)"):
        allocator(object(), "f: out", like_t)


@pytest.fixture
def fake_cupy(monkeypatch):
    """A stand-in cupy module (cupy is not installed everywhere): its ndarray class, and a log
    of (shape, dtype, device) for each cupy.empty, the device being the cupy.cuda.Device
    context it ran in."""
    mod = types.ModuleType("cupy")

    class ndarray:
        def __init__(self, device):
            self.device = types.SimpleNamespace(id=device)

    ndarray.__module__ = "cupy"
    log, current = [], []

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            current.append(self.index)

        def __exit__(self, *exc):
            current.pop()

    def empty(shape, dtype):
        log.append((tuple(shape), np.dtype(dtype), current[-1] if current else None))
        return np.empty(shape, dtype)

    mod.ndarray, mod.empty, mod.cuda = ndarray, empty, types.SimpleNamespace(Device=Device)
    monkeypatch.setitem(sys.modules, "cupy", mod)
    return ndarray, log


def test_cupy_outputs_on_the_inputs_device(fake_cupy):
    ndarray, log = fake_cupy
    like = ndarray(device=2)
    new = allocator(like, "f: out")
    new((2, 3), "fp32")
    new((4,), np.dtype(np.int32))
    maker(like, (5,), "uint8", "f: lse")()
    assert log == [((2, 3), np.float32, 2), ((4,), np.int32, 2), ((5,), np.uint8, 2)]


@pytest.mark.parametrize("name", ["bf16", "fp8_e4m3"])
def test_cupy_dtypes_cupy_lacks_are_refused_by_name(fake_cupy, name):
    ndarray, log = fake_cupy
    with pytest.raises(deca.Error, match=rf"^f: out: expected an output tensor for {name} "
                                         r"results in cupy memory, got None"):
        allocator(ndarray(device=0), "f: out")((2,), name)
    with pytest.raises(deca.Error, match=r"^f: lse: expected an output tensor"):
        maker(ndarray(device=0), (2,), numpy_dtype(name), "f: lse")()
    assert log == []


@pytest.mark.parametrize("name", NAMES)
def test_torch_outputs_are_torch_empty(name):
    """allocator's and maker's tensors are what torch.empty makes (dtype, device, strides), a
    new one per call; a torch dtype is taken as it is."""
    torch = pytest.importorskip("torch")
    like = torch.zeros(3, dtype=torch.float32)
    want = torch.empty((2, 1, 3), dtype=getattr(torch, {
        "bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8_e4m3": "float8_e4m3fn",
        "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32"}[name]))
    new = maker(like, (2, 1, 3), name, "f: out")
    made = [allocator(like, "f: out")((2, 1, 3), name),
            allocator(like, "f: out")((2, 1, 3), want.dtype), new(), new(),
            maker(like, (2, 1, 3), want.dtype, "f: out")()]
    for x in made:
        assert type(x) is torch.Tensor and x.dtype == want.dtype and x.device == like.device
        assert x.shape == want.shape and x.stride() == want.stride() and x.is_contiguous()
    assert made[2].data_ptr() != made[3].data_ptr()


@pytest.mark.usefixtures("sys_modules_off_limits")
def test_torch_allocator_traces_in_one_graph():
    """torch.compile(fullgraph=True) traces allocator (the compat calls allocate so when
    traced), by deca's dtype name and by torch's."""
    torch = pytest.importorskip("torch")

    def double(x):
        new = allocator(x, "f: out")
        a = new(tuple(x.shape), "fp32").copy_(x)
        b = new(tuple(x.shape), torch.bfloat16).copy_(x)
        return a * 2, b

    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    a, b = torch.compile(double, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(a, x * 2) and b.dtype == torch.bfloat16 and torch.equal(b.float(), x)
