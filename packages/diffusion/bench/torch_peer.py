"""
What the PyTorch peers in this folder share (krea2-torch-peer.py, qwen-image-torch-peer.py,
decode-torch-peer.py). The benches start each as `python3 <this folder>/<peer>.py THREADS`
(scripts/bench-harness.ts startTorch), so Python puts this folder on sys.path and `import torch_peer`
finds this file.

  serve(ops)          the JSON-lines loop: one request per stdin line, one answer per stdout line;
                      {"op": "info"} answers versions, threads, sdpa, torch's build config and the CUDA
                      device's name (null without one), every other op runs ops[op](request); an
                      exception is answered as {"error": "<type>: <message>"} so the bench's row says why
  timed(fn, cuda)     fn() under inference_mode, timed (seconds) between two torch.cuda.synchronize()
                      calls on CUDA
  attention(q, k, v)  scaled_dot_product_attention where this torch has it (2.0+), else
                      softmax(q·kᵀ/√d)·v (Debian bookworm ships torch 1.13)
"""
import json
import math
import sys
import time

import torch
import torch.nn.functional as F


def attention(q, k, v):
    """softmax(q·kᵀ/√d)·v over [..., L, d] (no mask), sdpa when this torch has it."""
    f = getattr(F, "scaled_dot_product_attention", None)
    if f is not None:
        return f(q, k, v)
    s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def timed(fn, cuda):
    """(fn(), seconds it took) under torch.inference_mode(); on CUDA between two synchronize() calls."""
    with torch.inference_mode():
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        y = fn()
        if cuda:
            torch.cuda.synchronize()
        return y, time.perf_counter() - t


def serve(ops):
    """The peer's main loop: threads from argv[1] (default torch's), then answer stdin until it closes."""
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads()
    torch.set_num_threads(threads)
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "info":
            out = {
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "sdpa": hasattr(F, "scaled_dot_product_attention"),
                "config": torch.__config__.show(),
                "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            }
        elif op in ops:
            try:
                out = ops[op](req)
            except Exception as e:  # noqa: BLE001 (answered, so the bench's row says why)
                out = {"error": f"{type(e).__name__}: {e}"}
        else:
            out = {"error": f"unknown op {op}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
