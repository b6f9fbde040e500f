#!/usr/bin/env python3
"""The fixed cost CUDA itself puts on any process that trains with cuDNN and cuBLAS (issue 24).

A child process loads the driver, makes the primary context, creates a cuDNN and a cuBLAS handle
and exits, doing nothing on the GPU; this one times it from spawn to exit, less the time of a child
that only starts the interpreter. Usage: python3 scripts/cuda-floor.py [rounds]
"""
import ctypes
import glob
import os
import subprocess
import sys
import time


def library(name):
    """The newest `name` (a glob) in the usual places and Python's nvidia wheels, else the name."""
    for d in sys.path + ["/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64"]:
        found = sorted(glob.glob(f"{d}/nvidia/*/lib/{name}") + glob.glob(f"{d}/{name}"))
        if found:
            return found[-1]
    return name


def child():
    t0 = time.perf_counter()
    marks = []
    mark = lambda what: marks.append(f"{what} {time.perf_counter() - t0:.3f}")
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0, "cuInit failed"
    mark("cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    cu.cuDeviceGet(ctypes.byref(dev), 0)
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0, "no context"
    cu.cuCtxSetCurrent(ctx)
    mark("context")
    h = ctypes.c_void_p()
    dnn = ctypes.CDLL(library("libcudnn.so.[0-9]*"))
    assert dnn.cudnnCreate(ctypes.byref(h)) == 0, "cudnnCreate failed"
    mark("cudnn")
    blas = ctypes.CDLL(library("libcublas.so.[0-9]*"))
    assert blas.cublasCreate_v2(ctypes.byref(h)) == 0, "cublasCreate failed"
    mark("cublas")
    print(", ".join(marks), flush=True)
    # As prep ends: no library teardown, the driver frees the GPU at exit.
    os._exit(0)


def timed(args):
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, out.stdout.strip()


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        child()
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        bare, _ = timed(["-c", "pass"])
        wall, marks = timed([__file__, "--child"])
        last = float(marks.rsplit(" ", 1)[1])
        print(f"floor: {marks}; exit {wall - bare - last:.3f}; total {wall - bare:.3f} s")
