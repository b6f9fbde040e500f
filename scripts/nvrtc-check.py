#!/usr/bin/env python3
"""Compile every kernels/*.cu (common.cuh first, as src/nn/cuda/kernels.rs does) with NVRTC for
sm_90, without a GPU: a syntax and type check of the kernels on a machine with only libnvrtc
(`pip install nvidia-cuda-nvrtc-cu12`). Usage: scripts/nvrtc-check.py [FILE.cu ...]"""
import ctypes, glob, os, sys

def load():
    cands = [os.environ.get("NVRTC_LIB", "")]
    try:
        import nvidia.cuda_nvrtc as m
        cands += glob.glob(os.path.join(list(m.__path__)[0], "lib", "libnvrtc.so*"))
    except ImportError:
        pass
    cands += ["libnvrtc.so", "libnvrtc.so.12", "libnvrtc.so.13"]
    for c in cands:
        if c and "builtins" not in c and "alt" not in c:
            try:
                return ctypes.CDLL(c)
            except OSError:
                pass
    sys.exit("no libnvrtc found: pip install nvidia-cuda-nvrtc-cu12")

def main():
    lib = load()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels")
    common = open(os.path.join(root, "common.cuh")).read()
    files = sys.argv[1:] or sorted(glob.glob(os.path.join(root, "*.cu")))
    bad = 0
    for f in files:
        src = common + "\n" + open(f).read()
        prog = ctypes.c_void_p()
        lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), os.path.basename(f).encode(), 0, None, None)
        opts = [b"--gpu-architecture=sm_90", b"-std=c++17"]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        r = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        text = log.value.decode(errors="replace").strip()
        print(f"{os.path.basename(f)}: {'ok' if r == 0 else 'FAILED'}")
        if text:
            print(text)
        bad += r != 0
    sys.exit(1 if bad else 0)

main()
