"""The UNTRUSTED side of the kernelbot protocol: imports the submission and runs `custom_kernel`.

Shipped on its own (copied into the sandbox's working directory and run as a script), so it imports
nothing from the harness. Nothing it reports is believed: the trusted parent checks every output against
its own reference and checks the reported times against the wall time it watched. Everything here only
makes honest submissions measurable and catches careless cheats early with a clear message.

Tensors travel by handle, never as bytes through a pipe (so no size limit and no host round trip):
a CPU tensor lives in a memfd, a CUDA tensor in a driver allocation exported as a file descriptor
(cuMemCreate + cuMemExportToShareableHandle), and the descriptors cross to the other process with
SCM_RIGHTS, which works across the sandbox's pid namespace and uid. The parent lends each call's inputs
in buffers of its own (its pristine copies stay in memory the child never sees); the child copies each
output into buffers of its own, which the parent copies from the moment the output message arrives.
This module also holds the buffer code the parent uses (`Buffer`, `encode`, `decode`), so both sides
speak one format.

Messages (one JSON object per SOCK_SEQPACKET message, descriptors attached):
Parent -> child: {"op": "call"|"time"|"profile"|"echo"|"warm"|"ping"|"import"|"exit", "id": k, "data": TREE,
"new": [{"buf", "kind", "size"}], "drop": [buf ids]} with one descriptor per "new" entry.
Child -> parent: {"op": "pong", "id"}, {"op": "hello", "seconds"}, {"op": "sample", "ns", "late"} (Yardstick),
{"op": "output", "out": TREE, "new", "drop"},
{"op": "error", "kind": "import|kernel|output|threads|tamper", "message", "oom": bool (torch's error type)},
{"op": "profile", "report"}.
TREE: {"T": [buf, dtype, shape, stride|null, offset]} for a tensor (null stride: contiguous), {"tuple": [...]},
{"list": [...]}, {"dict": [[key, TREE], ...]}, {"dtype": name}, {"device": name}, or a JSON scalar.
"""

import time

# Captured before torch and the submission are imported: the submission cannot patch these references.
_perf_ns = time.perf_counter_ns
_CLOCKS = {name: getattr(time, name) for name in ("perf_counter", "perf_counter_ns", "monotonic",
                                                   "monotonic_ns", "time", "time_ns", "process_time")}

import contextlib  # noqa: E402
import ctypes  # noqa: E402
import fcntl  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import mmap  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402

L2_FLUSH_BYTES = 256 << 20
MAX_MESSAGE = 160 << 10  # under the default socket buffer, so one message always fits
MAX_FDS = 64  # descriptors per message: the sandbox may hold 256 open files
PAGE = mmap.PAGESIZE
THREAD_CPU_NS = 1_000_000  # CPU other threads may use during one timed call (library threads wake briefly)
F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW = 0x1, 0x2, 0x4
F_ADD_SEALS, F_GET_SEALS = 1033, 1034
# Backend flags the parent has once the problem is imported; the child starts from the same (as eval.py's
# single process would), so a submission and the reference agree on e.g. TF32 unless the submission changes it.
BACKEND_FLAGS = ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32",
                 "torch.backends.cudnn.deterministic", "torch.backends.cudnn.benchmark",
                 "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
                 "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction")


# glibc's malloc, set alike in both processes before they time anything: its default adapts the size past which a
# block is a fresh mmap (first-touch page faults on every call) to what each process freed before, so the parent
# and the child would serve the same allocation differently. Fixed: blocks under 32 MiB (glibc's maximum) come from
# the heap, which keeps up to 1 GiB freed; larger ones are fresh mappings on both sides.
MALLOPT = {-3: 32 << 20, -1: 1 << 30}  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD


def same_malloc() -> None:
    """Set MALLOPT in this process (a no-op where the C library is not glibc)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        for option, value in MALLOPT.items():
            libc.mallopt(option, value)


class ProtocolError(Exception):
    """The other side sent something that is not a valid message."""


# -- messages -----------------------------------------------------------------------------------------------
def send_message(sock: socket.socket, header: dict, fds: list[int] = ()) -> None:
    blob = json.dumps(header).encode()
    if len(blob) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(blob)} bytes exceeds {MAX_MESSAGE}")
    if fds:
        socket.send_fds(sock, [blob], list(fds))
    else:
        sock.sendall(blob)


def recv_message(sock: socket.socket) -> tuple[dict, list[int]]:
    """One message; EOFError when the other side is gone. Descriptors of a rejected message are closed."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE + 1, MAX_FDS)
    try:
        if not data:
            raise EOFError
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(data) > MAX_MESSAGE:
            raise ProtocolError("oversized message (or too many descriptors)")
        try:
            header = json.loads(data)
        except (UnicodeDecodeError, ValueError):
            raise ProtocolError("undecodable message") from None
        if not isinstance(header, dict) or not isinstance(header.get("op"), str):
            raise ProtocolError("malformed message")
        return header, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


# -- CUDA driver allocations shared by file descriptor --------------------------------------------------------
class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


PINNED, POSIX_FD, ON_DEVICE, PROT_READ, PROT_READWRITE = 1, 1, 1, 1, 3


class CudaError(RuntimeError):
    pass


class Driver:
    """The few CUDA driver calls that share device memory by file descriptor (the stable C ABI of libcuda)."""

    _instance = None

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        u64, size_t = ctypes.c_uint64, ctypes.c_size_t
        sig = {"cuMemGetAllocationGranularity": [ctypes.POINTER(size_t), ctypes.POINTER(_AllocProp), ctypes.c_int],
               "cuMemCreate": [ctypes.POINTER(u64), size_t, ctypes.POINTER(_AllocProp), u64],
               "cuMemExportToShareableHandle": [ctypes.c_void_p, u64, ctypes.c_int, u64],
               "cuMemImportFromShareableHandle": [ctypes.POINTER(u64), ctypes.c_void_p, ctypes.c_int],
               "cuMemAddressReserve": [ctypes.POINTER(u64), size_t, size_t, u64, u64],
               "cuMemMap": [u64, size_t, size_t, u64, u64],
               "cuMemSetAccess": [u64, size_t, ctypes.POINTER(_AccessDesc), size_t],
               "cuMemUnmap": [u64, size_t], "cuMemAddressFree": [u64, size_t], "cuMemRelease": [u64],
               "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]}
        for name, args in sig.items():
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int

    @classmethod
    def get(cls) -> "Driver":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def check(self, rc: int, what: str) -> None:
        if rc:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise CudaError(f"{what} failed: {(name.value or b'?').decode()} ({rc})")

    def prop(self, device: int) -> _AllocProp:
        prop = _AllocProp()
        prop.type, prop.requestedHandleTypes = PINNED, POSIX_FD
        prop.location.type, prop.location.id = ON_DEVICE, device
        return prop

    def granularity(self, device: int) -> int:
        out = ctypes.c_size_t()
        self.check(self.lib.cuMemGetAllocationGranularity(ctypes.byref(out), ctypes.byref(self.prop(device)), 0),
                   "cuMemGetAllocationGranularity")
        return out.value

    def create(self, size: int, device: int) -> tuple[int, int]:
        """(allocation handle, exported descriptor) of a new allocation of `size` bytes."""
        handle, fd = ctypes.c_uint64(), ctypes.c_int(-1)
        self.check(self.lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(self.prop(device)), 0),
                   "cuMemCreate")
        try:
            self.check(self.lib.cuMemExportToShareableHandle(ctypes.byref(fd), handle.value, POSIX_FD, 0),
                       "cuMemExportToShareableHandle")
        except CudaError:
            self.lib.cuMemRelease(handle.value)
            raise
        return handle.value, fd.value

    def import_fd(self, fd: int) -> int:
        handle = ctypes.c_uint64()
        self.check(self.lib.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd), POSIX_FD),
                   "cuMemImportFromShareableHandle")
        return handle.value

    def map(self, handle: int, size: int, device: int, writable: bool) -> int:
        ptr = ctypes.c_uint64()
        self.check(self.lib.cuMemAddressReserve(ctypes.byref(ptr), size, 0, 0, 0), "cuMemAddressReserve")
        try:
            self.check(self.lib.cuMemMap(ptr.value, size, 0, handle, 0), "cuMemMap")
            access = _AccessDesc()
            access.location.type, access.location.id = ON_DEVICE, device
            access.flags = PROT_READWRITE if writable else PROT_READ
            rc = self.lib.cuMemSetAccess(ptr.value, size, ctypes.byref(access), 1)
            if rc:
                self.lib.cuMemUnmap(ptr.value, size)
                self.check(rc, "cuMemSetAccess")
        except CudaError:
            self.lib.cuMemAddressFree(ptr.value, size)
            raise
        return ptr.value

    def free(self, ptr: int, size: int, handle: int) -> None:
        self.lib.cuMemUnmap(ptr, size)
        self.lib.cuMemAddressFree(ptr, size)
        self.lib.cuMemRelease(handle)


class _DeviceMemory:
    """Owner of one mapping; torch tensors made from it keep it alive, and the last one unmaps it."""

    def __init__(self, ptr: int, size: int, handle: int):
        self.ptr, self.size, self.handle = ptr, size, handle
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 2}

    def __del__(self):
        with contextlib.suppress(Exception):
            Driver.get().free(self.ptr, self.size, self.handle)


class Buffer:
    """A shared allocation of `size` bytes on "cpu" (memfd) or "cuda" (driver allocation), as a uint8 tensor."""

    def __init__(self, torch, bid: int, kind: str, size: int, u8, fd: int = -1):
        self.torch, self.id, self.kind, self.size, self.u8, self.fd = torch, bid, kind, size, u8, fd

    @classmethod
    def create(cls, torch, bid: int, kind: str, nbytes: int) -> "Buffer":
        """A new buffer of at least `nbytes`, exported: `fd` is the descriptor to send (closed once sent)."""
        if kind == "cuda":
            device = torch.cuda.current_device()
            driver = Driver.get()
            gran = driver.granularity(device)
            size = max(gran, -(-nbytes // gran) * gran)
            handle, fd = driver.create(size, device)
            try:
                memory = _DeviceMemory(driver.map(handle, size, device, True), size, handle)
            except CudaError:
                driver.lib.cuMemRelease(handle)
                os.close(fd)
                raise
            return cls(torch, bid, kind, size, torch.as_tensor(memory, device="cuda"), fd)
        size = max(PAGE, -(-nbytes // PAGE) * PAGE)
        fd = os.memfd_create("kernelbot-tensor", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)  # its size can never change
            view = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            os.close(fd)
            raise
        return cls(torch, bid, kind, size, torch.frombuffer(view, dtype=torch.uint8), fd)

    @classmethod
    def attach(cls, torch, bid: int, kind: str, size: int, fd: int, writable: bool) -> "Buffer":
        """Map a buffer the other side exported. Raises ProtocolError for a descriptor that is not what it
        claims (wrong kind, smaller than said, resizable): the descriptor is closed either way."""
        try:
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                raise ProtocolError(f"buffer {bid}: bad size {size!r}")
            if kind == "cuda":
                if not torch.cuda.is_available():
                    raise ProtocolError(f"buffer {bid}: a CUDA buffer where there is no GPU")
                device = torch.cuda.current_device()
                driver = Driver.get()
                try:
                    handle = driver.import_fd(fd)
                except CudaError as exc:
                    raise ProtocolError(f"buffer {bid}: {exc}") from None
                try:
                    ptr = driver.map(handle, size, device, writable)
                except CudaError as exc:
                    driver.lib.cuMemRelease(handle)
                    raise ProtocolError(f"buffer {bid}: {exc}") from None
                return cls(torch, bid, kind, size, torch.as_tensor(_DeviceMemory(ptr, size, handle), device="cuda"))
            if kind != "cpu":
                raise ProtocolError(f"buffer {bid}: unknown kind {kind!r}")
            st = os.fstat(fd)
            seals = fcntl.fcntl(fd, F_GET_SEALS) if (st.st_mode & 0o170000) == 0o100000 else 0
            if not seals & F_SEAL_SHRINK or st.st_size < size:
                raise ProtocolError(f"buffer {bid}: not a sealed shared-memory file of {size} bytes")
            if writable:
                view = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            else:  # a private view: nothing the other side can resize, nothing written back
                view = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
            return cls(torch, bid, kind, size, torch.frombuffer(view, dtype=torch.uint8))
        except OSError as exc:
            raise ProtocolError(f"buffer {bid}: {exc}") from None
        finally:
            os.close(fd)

    def tensor(self, dtype, shape, stride, offset: int):
        """A tensor over this buffer (a view: no copy)."""
        flat = self.u8.view(dtype)  # sizes are whole pages (or allocation granules): every itemsize divides them
        if stride is None:
            n = 1
            for s in shape:
                n *= s
            return flat[offset: offset + n].view(shape)
        return flat.as_strided(shape, stride, offset)

    def describe(self) -> dict:
        return {"buf": self.id, "kind": self.kind, "size": self.size}


class Pool:
    """Buffers one side exports, reused call after call: slot k of a kind holds the k-th storage of a call.
    `take` gives the slot's buffer, replacing it (the old one is dropped on the other side) when too small."""

    def __init__(self, torch, first_id: int):
        self.torch, self.next_id = torch, first_id
        self.slots: dict[str, dict[int, Buffer]] = {"cpu": {}, "cuda": {}}
        self.new: list[Buffer] = []
        self.dropped: list[int] = []
        self.host_staged = ""  # why CUDA tensors go through host memory (slower, still no pipe), if they do

    def take(self, kind: str, slot: int, nbytes: int) -> Buffer:
        if kind == "cuda" and not self.host_staged:
            try:
                return self._take(kind, slot, nbytes)
            except (CudaError, OSError) as exc:  # no shareable device memory here: stage through host memory
                self.host_staged = f"{type(exc).__name__}: {exc}"
        return self._take("cpu" if kind == "cuda" else kind, slot + (1 << 20 if kind == "cuda" else 0), nbytes)

    def _take(self, kind: str, slot: int, nbytes: int) -> Buffer:
        slots = self.slots[kind]
        if slot in slots and slots[slot].size >= nbytes:
            return slots[slot]
        buf = Buffer.create(self.torch, self.next_id, kind, nbytes)
        self.next_id += 2  # parent: even ids, child: odd ids
        self.new.append(buf)
        if slot in slots:
            self.dropped.append(slots[slot].id)
        slots[slot] = buf
        return buf

    def send(self, sock: socket.socket, header: dict) -> None:
        """Send `header` with this call's new buffers ("new", "drop"): descriptors past one message's worth go
        ahead in "buffers" messages. Each descriptor is closed once sent: the other side holds the buffer now."""
        new, self.new = self.new, []
        header = {**header, "drop": self.dropped}
        self.dropped = []
        while len(new) > MAX_FDS:
            chunk, new = new[:MAX_FDS], new[MAX_FDS:]
            self._send(sock, {"op": "buffers"}, chunk)
        self._send(sock, header, new)

    @staticmethod
    def _send(sock: socket.socket, header: dict, buffers: list[Buffer]) -> None:
        try:
            send_message(sock, {**header, "new": [b.describe() for b in buffers]}, [b.fd for b in buffers])
        finally:
            for b in buffers:
                os.close(b.fd)
                b.fd = -1


class Imports:
    """Buffers the other side exported, by id."""

    def __init__(self, torch, writable: bool, max_buffers: int = 4096):
        self.torch, self.writable, self.max_buffers = torch, writable, max_buffers
        self.buffers: dict[int, Buffer] = {}

    def update(self, header: dict, fds: list[int]) -> None:
        new, drop = header.get("new") or [], header.get("drop") or []
        if not isinstance(new, list) or not isinstance(drop, list) or len(new) != len(fds):
            for fd in fds:
                os.close(fd)
            raise ProtocolError("buffer announcements do not match the descriptors sent")
        for bid in drop:
            self.buffers.pop(bid, None) if isinstance(bid, int) else None
        for i, (entry, fd) in enumerate(zip(new, fds, strict=True)):
            bid = entry.get("buf") if isinstance(entry, dict) else None
            if not isinstance(bid, int) or bid in self.buffers or len(self.buffers) >= self.max_buffers:
                for rest in fds[i:]:
                    os.close(rest)
                raise ProtocolError(f"bad or duplicate buffer announcement {entry!r}")
            self.buffers[bid] = Buffer.attach(self.torch, bid, entry.get("kind"), entry.get("size"), fd,
                                              self.writable)


# -- trees of tensors ------------------------------------------------------------------------------------------
def dtype_named(torch, name):
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ProtocolError(f"unknown dtype {name!r}")
    return dtype


def _ints(value, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                              for v in value) or len(value) > 64:
        raise ProtocolError(f"bad {what} {value!r}")
    return value


def encode(torch, obj, pool: Pool, contiguous: bool = False) -> dict | list | int | float | str | bool | None:
    """Place every tensor of `obj` in `pool`'s buffers and describe the structure. `contiguous`: copy each tensor
    densely (outputs); else copy each distinct storage whole, keeping strides and aliasing (inputs)."""
    slots = {"cpu": 0, "cuda": 0}
    storages: dict[tuple, Buffer] = {}

    def walk(o):
        if isinstance(o, torch.Tensor):
            kind = o.device.type
            if kind not in slots:
                raise ValueError(f"tensors on {o.device} cannot be shared")
            name = str(o.dtype).removeprefix("torch.")
            if contiguous:
                nbytes = o.numel() * o.element_size()
                buf = pool.take(kind, slots[kind], nbytes)
                slots[kind] += 1
                if nbytes:
                    buf.u8[:nbytes].view(o.dtype).view(o.shape).copy_(o)
                return {"T": [buf.id, name, list(o.shape), None, 0, *staged(buf, kind)]}
            storage = o.untyped_storage()
            key = (kind, o.device.index, storage.data_ptr(), storage.nbytes())
            if key not in storages:
                buf = storages[key] = pool.take(kind, slots[kind], storage.nbytes())
                slots[kind] += 1
                if storage.nbytes():
                    buf.u8[: storage.nbytes()].copy_(torch.empty(0, dtype=torch.uint8, device=o.device).set_(storage))
            return {"T": [storages[key].id, name, list(o.shape), list(o.stride()), o.storage_offset(),
                          *staged(storages[key], kind)]}
        if isinstance(o, tuple):
            return {"tuple": [walk(x) for x in o]}
        if isinstance(o, list):
            return {"list": [walk(x) for x in o]}
        if isinstance(o, dict):
            return {"dict": [[k, walk(v)] for k, v in o.items()]}
        if isinstance(o, torch.dtype):
            return {"dtype": str(o).removeprefix("torch.")}
        if isinstance(o, torch.device):
            return {"device": str(o)}
        if o is None or isinstance(o, (bool, int, float, str)):
            return o
        raise ValueError(f"a {type(o).__name__} cannot be passed between the processes")

    def staged(buf: Buffer, kind: str) -> list[str]:
        return ["cuda"] if kind == "cuda" and buf.kind == "cpu" else []

    tree = walk(obj)
    if slots["cuda"]:
        torch.cuda.synchronize()  # the copies are done before the other process reads them
    return tree


def decode(torch, tree, buffers: dict[int, Buffer], copy: bool = False, max_bytes: int | None = None):
    """The object a tree describes. `copy`: each tensor becomes a dense copy of its own (what the parent takes of
    an output), at most `max_bytes` in all; else views over the shared buffers (what the child gets)."""
    total = 0

    def walk(t, depth=0):
        nonlocal total
        if depth > 32:
            raise ProtocolError("structure nested too deeply")
        if isinstance(t, dict) and len(t) == 1:
            (key, value), = t.items()
            if key == "T":
                if not isinstance(value, list) or len(value) not in (5, 6) or value[5:] not in ([], ["cuda"]):
                    raise ProtocolError(f"bad tensor description {value!r}")
                bid, name, shape, stride, offset = value[:5]
                staged = len(value) == 6  # a CUDA tensor staged through host memory
                buf = buffers.get(bid) if isinstance(bid, int) else None
                if buf is None:
                    raise ProtocolError(f"unknown buffer {bid!r}")
                dtype = dtype_named(torch, name)
                shape = _ints(shape, "shape")
                itemsize = torch.empty(0, dtype=dtype).element_size()
                if stride is None:
                    extent = 1
                    for s in shape:
                        extent *= s
                    offset = 0
                else:
                    stride, offset = _ints(stride, "stride"), _ints([offset], "offset")[0]
                    if len(stride) != len(shape):
                        raise ProtocolError("stride and shape differ in length")
                    span = sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
                    extent = 0 if 0 in shape else offset + 1 + span
                if extent * itemsize > buf.size:
                    raise ProtocolError(f"tensor of {extent * itemsize} bytes does not fit buffer {bid}")
                view = buf.tensor(dtype, shape, stride, offset)
                if staged:
                    if not torch.cuda.is_available():
                        raise ProtocolError("a CUDA tensor where there is no GPU")
                    view = view.to("cuda")
                if not copy:
                    return view
                total += view.numel() * itemsize
                if max_bytes is not None and total > max_bytes:
                    raise ProtocolError(f"outputs of more than {max_bytes} bytes")
                return view.clone(memory_format=torch.contiguous_format)
            if key in ("tuple", "list") and isinstance(value, list):
                items = [walk(x, depth + 1) for x in value]
                return tuple(items) if key == "tuple" else items
            if key == "dict" and isinstance(value, list):
                out = {}
                for pair in value:
                    if not isinstance(pair, list) or len(pair) != 2:
                        raise ProtocolError("bad dict entry")
                    out[pair[0]] = walk(pair[1], depth + 1)
                return out
            if key == "dtype":
                return dtype_named(torch, value)
            if key == "device" and isinstance(value, str):
                return torch.device(value)
        if t is None or isinstance(t, (bool, int, float, str)):
            return t
        raise ProtocolError(f"bad structure {str(t)[:200]}")

    return walk(tree)


# -- threads ---------------------------------------------------------------------------------------------------
def thread_times(pid: str = "self", skip: int | None = None) -> dict[int, int]:
    """tid -> ns on a CPU so far, for every thread of `pid` but `skip` (kernel accounting)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for name in tids:
        tid = int(name)
        if tid == skip:
            continue
        try:
            with open(f"/proc/{pid}/task/{name}/schedstat", "rb") as f:
                out[tid] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return out


def busy_threads(before: dict[int, int], after: dict[int, int]) -> tuple[int, list[int]]:
    """(ns the threads used between two `thread_times`, the tids that used any)."""
    used = {tid: ns - before.get(tid, 0) for tid, ns in after.items()}
    return sum(max(0, v) for v in used.values()), sorted(t for t, v in used.items() if v > 0)


def _out_of_memory() -> bool:
    """The current exception is torch's out-of-memory error by its type, or was raised from one (whose fault it is,
    the parent decides from the device's memory)."""
    oom, exc = getattr(sys.modules.get("torch"), "OutOfMemoryError", None), sys.exc_info()[1]
    for _ in range(8):
        if exc is None or oom is None:
            return False
        if isinstance(exc, oom):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def synchronize_all(synchronize: Callable[[int], object], devices: range) -> None:
    for index in devices:
        synchronize(index)


class Yardstick:
    """The one clock both sides are timed by: the child times the submission with it, the trusted parent the
    reference, each on inputs lent to it the same way just before the call (a shared buffer of a pool that is
    reused call after call). Returns (output, ns, late ns). On a GPU: events on the stream the call runs on, after
    the same L2 flush; `late` is how much later than the end mark the devices as a whole went idle (a synchronize of
    every device the process can see, then a third mark): a host round trip for a call whose work is all on its
    stream, the hidden work's duration for one that leaves work on another stream or device. On the CPU: the host
    clock, `late` 0. References to the clock functions are taken here, before the submission is imported."""

    def __init__(self, torch, cuda: bool | None = None, clock: Callable[[], int] = _perf_ns):
        self.torch = torch
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self.clock = clock  # the host clock in ns (a test's fake one drives the timing loop deterministically)
        self.flush = None
        if self.cuda:
            cuda = torch.cuda
            self.event, self.elapsed = cuda.Event, cuda.Event.elapsed_time
            # every device of the run (all this process can see), not the current one only: work a call leaves on
            # another device is late work too
            self.sync = functools.partial(synchronize_all, cuda.synchronize, range(cuda.device_count()))

    def warm(self) -> None:
        """The L2 flush buffer (and with it the device context)."""
        if self.cuda and self.flush is None:
            self.flush = self.torch.empty(L2_FLUSH_BYTES, dtype=self.torch.int8, device="cuda")
            self.sync()

    def __call__(self, fn, data):
        if not self.cuda:
            t0 = self.clock()
            out = fn(data)
            return out, self.clock() - t0, 0
        self.warm()
        start, end, idle = (self.event(enable_timing=True) for _ in range(3))
        self.sync()
        self.flush.zero_()  # as eval.py: the start mark is queued behind the flush, so launch latency is hidden
        start.record()
        out = fn(data)
        end.record()
        self.sync()  # every stream of every device
        idle.record()
        idle.synchronize()
        ns = int(self.elapsed(start, end) * 1e6)
        return out, ns, max(0, int(self.elapsed(start, idle) * 1e6) - ns)


def _format_error() -> str:
    """The current exception's traceback without the harness's own frames, and without the server's paths: the
    workdir's files by their names, libraries from site-packages on."""
    exc = traceback.TracebackException(*sys.exc_info())
    exc.stack = traceback.StackSummary.from_list([f for f in exc.stack if f.filename != __file__][-8:])
    text = "".join(exc.format())[-4000:]
    libraries = {os.path.dirname(p) + "/" for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    for prefix in sorted({os.getcwd() + "/", *libraries}, key=len, reverse=True):
        text = text.replace(prefix, "")
    return re.sub(r'File "/[^"]*/(lib/python[0-9.]+/)', r'File "\1', text)


def _thread_name(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return str(tid)


class Runner:
    def __init__(self, sock: socket.socket):
        started = _perf_ns()
        import torch

        self.torch, self.sock = torch, sock
        self.cuda = torch.cuda.is_available()
        self.seconds = {"torch_import": (_perf_ns() - started) / 1e9}  # reported to the parent: informational
        torch.ones(1 << 16).sum()  # spin up torch's own thread pools before anything is measured
        self.yardstick = Yardstick(torch)
        self.sync = self.yardstick.sync if self.cuda else None  # every device, as the timed calls' end
        self.watched = self.references()
        self.main_tid = threading.get_native_id()
        self.inputs = Imports(torch, writable=True)
        self.outputs = Pool(torch, first_id=1)
        self.kernel = None

    def send(self, header: dict) -> None:
        send_message(self.sock, header)

    def receive(self) -> tuple[dict, object]:
        header, fds = recv_message(self.sock)
        self.inputs.update(header, fds)
        while header["op"] == "buffers":
            header, fds = recv_message(self.sock)
            self.inputs.update(header, fds)
        return header, decode(self.torch, header.get("data"), self.inputs.buffers)

    def references(self) -> dict[str, object]:
        """What the timing relies on, as found now: the clocks, torch's CUDA calls, the Yardstick's own references to
        them and its class's call (a submission that swaps any of them times itself)."""
        import torch

        stick = self.yardstick
        return {**{f"time.{k}": getattr(time, k) for k in _CLOCKS}, "_perf_ns": globals().get("_perf_ns"),
                "torch.cuda.synchronize": torch.cuda.synchronize,
                "torch.cuda.Event": torch.cuda.Event, "Yardstick.__call__": Yardstick.__call__, "yardstick": stick,
                **{f"yardstick.{k}": getattr(stick, k, None)
                   for k in ("sync", "elapsed", "event", "flush", "cuda", "clock")}}

    def tampering(self) -> str | None:
        current = self.references()
        changed = [k for k, v in current.items() if v is not self.watched[k]]
        return f"the submission replaced {', '.join(changed)}" if changed else None

    def threads(self, before: dict[int, int]) -> str | None:
        """Threads other than the one that ran the timed call must not work during it: idle library threads
        (torch.compile's, triton's, the CUDA driver's) are fine, a submission's worker is not."""
        used, tids = busy_threads(before, thread_times(skip=self.main_tid))
        if used <= THREAD_CPU_NS:
            return None
        names = ", ".join(_thread_name(t) for t in tids[:8])
        return (f"other threads ran for {used / 1e6:.1f} ms during a timed call ({names}): work outside the "
                "timed thread is refused; timing refused")

    def apply_flags(self, flags) -> None:
        for name, value in (flags or {}).items() if isinstance(flags, dict) else ():
            if name in BACKEND_FLAGS and isinstance(value, bool):
                owner, attr = name.rsplit(".", 1)
                with contextlib.suppress(Exception):
                    obj = self.torch
                    for part in owner.split(".")[1:]:
                        obj = getattr(obj, part)
                    setattr(obj, attr, value)

    def warm_device(self) -> None:
        """The device context and the L2 flush buffer, made now rather than in the run: only when the parent says the
        device is free (a spare never holds memory on a device a reservation holds)."""
        if self.cuda and self.yardstick.flush is None:
            started = _perf_ns()
            self.yardstick.warm()
            self.seconds["device_context"] = (_perf_ns() - started) / 1e9
            self.watched = self.references()  # its flush buffer, made here before any submission exists

    def import_submission(self) -> None:
        self.warm_device()  # not before its run, unless warmed ahead on a free device
        started = _perf_ns()
        importlib.invalidate_caches()  # submission.py may have been written after this interpreter started
        import submission

        self.seconds["submission_import"] = (_perf_ns() - started) / 1e9
        kernel = getattr(submission, "custom_kernel", None)
        if not callable(kernel):
            raise AttributeError("submission.py does not define a callable custom_kernel(data)")
        self.kernel = kernel

    def output_problem(self, out) -> str | None:
        """Outputs must be plain dense tensors. Writing into a preallocated output passed among the inputs
        (`(a, b, out)` -> `out`) is fine: the parent copies whatever is returned as it is now."""
        torch = self.torch
        for t in list(out) if isinstance(out, (tuple, list)) else [out]:
            if type(t) is not torch.Tensor:
                return f"custom_kernel must return a plain torch.Tensor, got {type(t).__module__}.{type(t).__name__}"
            if t.layout != torch.strided or t.is_quantized or t.is_meta:
                return f"the output must be a dense strided tensor, got layout {t.layout}"
            if any(st == 0 and sz > 1 for st, sz in zip(t.stride(), t.shape, strict=True)) or (
                    torch._debug_has_internal_overlap(t) == 1):
                return "the output has overlapping memory (an expanded/strided alias), no own storage"
            if t.device.type not in ("cpu", "cuda"):
                return f"the output is on {t.device}, not on the CPU or the GPU"
        return None

    def integrity(self, before: dict[int, int] | None) -> tuple[str, str] | None:
        if problem := self.tampering():
            return "tamper", problem
        if before is not None and (problem := self.threads(before)):
            return "threads", problem
        return None

    def finish(self, rid, out, before: dict[int, int] | None = None) -> None:
        problem = self.output_problem(out)
        if problem:
            self.send({"op": "error", "id": rid, "kind": "output", "message": problem})
            return
        try:
            tree = encode(self.torch, tuple(out) if isinstance(out, list) else out, self.outputs, contiguous=True)
        except (ValueError, RuntimeError) as exc:
            self.send({"op": "error", "id": rid, "kind": "output", "message": f"the output cannot be returned: {exc}"})
            return
        if problem := self.integrity(before):  # threads are judged once the output is copied, not before
            self.send({"op": "error", "id": rid, "kind": problem[0], "message": problem[1]})
            return
        self.outputs.send(self.sock, {"op": "output", "id": rid, "out": tree})

    def timed(self, data):
        return self.yardstick(self.kernel, data)

    def profile(self, data, calls: int):
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        with profile(activities=activities, record_shapes=True) as prof:
            for _ in range(calls):
                out = self.kernel(data)
            if self.cuda:
                self.sync()
        sort = "cuda_time_total" if self.cuda else "cpu_time_total"
        return out, prof.key_averages().table(sort_by=sort, row_limit=25)[:60000]

    def serve(self) -> None:
        while True:
            header, data = self.receive()
            op, rid = header.get("op"), header.get("id")
            if op == "exit":
                return
            before = None
            try:
                if op == "time":
                    if problem := self.tampering():
                        self.send({"op": "error", "id": rid, "kind": "tamper", "message": problem})
                        continue
                    before = thread_times(skip=self.main_tid)
                    out, ns, late = self.timed(data)
                    self.send({"op": "sample", "id": rid, "ns": ns, "late": late})
                elif op == "profile":
                    out, report = self.profile(data, int(header.get("calls", 5)))
                    self.send({"op": "profile", "id": rid, "report": report})
                else:
                    out = self.kernel(data)
            except Exception:
                self.send({"op": "error", "id": rid, "kind": "kernel", "message": _format_error(),
                           "oom": _out_of_memory()})
                continue
            self.finish(rid, out, before)


def calibrate(runner: Runner) -> dict:
    """Before the submission exists in this process: echo outputs back so the parent can measure what moving
    one call's data costs, a figure the submission cannot inflate. Returns the message that ended it."""
    while True:
        header, data = runner.receive()
        if header.get("op") == "warm":
            runner.warm_device()
            continue
        if header.get("op") == "ping":  # the parent waits for this interpreter and torch to be ready
            runner.send({"op": "pong", "id": header.get("id")})
            continue
        if header.get("op") != "echo":
            return header
        runner.finish(header.get("id"), data[1])  # data: (inputs, output)


def main(argv: list[str]) -> int:
    same_malloc()
    sock = socket.socket(fileno=int(argv[1]))
    runner = Runner(sock)
    try:
        header = calibrate(runner)
    except EOFError:
        return 0
    if header.get("op") != "import":
        return 0
    runner.apply_flags(header.get("flags"))
    try:
        runner.import_submission()
    except BaseException:
        runner.send({"op": "error", "kind": "import", "message": _format_error(), "oom": _out_of_memory()})
        return 0
    runner.send({"op": "hello", "seconds": runner.seconds})
    with contextlib.suppress(EOFError):
        runner.serve()
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the parent waits for this exit: skip tearing torch down (more than half a second)
