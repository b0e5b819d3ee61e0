"""
PyTorch peer of `bun run bench cpu` (packages/backend-cpu/bench/cpu.bench.ts): a child process that
reads one JSON request per line on stdin and answers one JSON line on stdout with the seconds of one
measured call, so that the bench can interleave torch's runs with ours in the same session.

Requests:
  {"op": "matmul", "dtype": "bf16" | "f32", "m": M, "k": K, "n": N}
      y = x @ w.T with x [M, K] and w [N, K] in that dtype (torch.matmul; oneDNN for bf16, the BLAS
      torch links for f32 — OpenBLAS when libopenblas0-pthread is installed).
  {"op": "sdpa", "heads": H, "seq": S, "dim": D, "prefix": P or null}
      softmax(q kᵀ / sqrt(D) + mask) v for q, k, v [1, H, S, D] f32: scaled_dot_product_attention when
      this torch has it (2.0+), else the same maths per head (Debian bookworm ships torch 1.13).
      prefix P: keys < P are visible to every query, the rest causally (TensorPencil's fullPrefix).
  {"op": "info"}  → versions, threads, BLAS.
Tensors are made once per shape and reused; the first call of a shape is a warm-up the bench discards.
"""
import json
import sys
import time

import torch

torch.manual_seed(0)
_cache = {}


def _mm(dtype, m, k, n):
    key = ("mm", dtype, m, k, n)
    if key not in _cache:
        dt = torch.bfloat16 if dtype == "bf16" else torch.float32
        _cache.clear()  # one shape at a time: the GEMM operands are hundreds of MB
        _cache[key] = (torch.randn(m, k).to(dt), torch.randn(n, k).to(dt))
    x, w = _cache[key]
    t = time.perf_counter()
    torch.matmul(x, w.t())
    return time.perf_counter() - t


def _mask(s, prefix):
    i = torch.arange(s).unsqueeze(1)
    j = torch.arange(s).unsqueeze(0)
    return (j < prefix) | (j <= i)  # True = visible


def _sdpa(h, s, d, prefix):
    key = ("sdpa", h, s, d, prefix)
    if key not in _cache:
        _cache.clear()
        q, k, v = (torch.randn(1, h, s, d) for _ in range(3))
        _cache[key] = (q, k, v, None if prefix is None else _mask(s, prefix))
    q, k, v, mask = _cache[key]
    f = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    t = time.perf_counter()
    if f is not None:
        f(q, k, v, attn_mask=mask)
    else:
        scale = 1.0 / (d**0.5)
        for head in range(h):  # one head at a time bounds the [S, S] scores
            sc = torch.matmul(q[0, head], k[0, head].t()) * scale
            if mask is not None:
                sc = sc.masked_fill(~mask, float("-inf"))
            torch.matmul(torch.softmax(sc, dim=-1), v[0, head])
    return time.perf_counter() - t


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads()
    torch.set_num_threads(threads)
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "info":
            out = {
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "sdpa": hasattr(torch.nn.functional, "scaled_dot_product_attention"),
                "config": torch.__config__.show(),
            }
        elif op == "matmul":
            out = {"seconds": _mm(req["dtype"], req["m"], req["k"], req["n"])}
        elif op == "sdpa":
            out = {"seconds": _sdpa(req["heads"], req["seq"], req["dim"], req.get("prefix"))}
        else:
            out = {"error": f"unknown op {op}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
