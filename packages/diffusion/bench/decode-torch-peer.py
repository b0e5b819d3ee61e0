"""
PyTorch peer of the LLM decode cases of `bun run bench gpu` (./gpu.bench.ts): the weight-streaming work
of one decoded token of a Qwen3-shaped model in PyTorch eager, bf16, as a child process that reads one
JSON request per line on stdin and answers one JSON line on stdout.

Per token and layer, with x [1, hidden] (M = 1):
    q = x·Wqᵀ, k = x·Wkᵀ, v = x·Wvᵀ                         (k, v computed, the cache is not appended)
    o = sdpa(q [1, H, 1, d], K [1, KV, ctx, d], V [1, KV, ctx, d])   GQA (enable_gqa where this torch has
                                                             it, else K/V repeat_interleave'd per call;
                                                             softmax(q·kᵀ/√d)·v before torch 2.0)
    x·Woᵀ of o; down(silu(x·Wgateᵀ) · x·Wupᵀ)
and once per token the LM head x·Wheadᵀ [vocab, hidden]; with `"attention": false` the o projection
multiplies q instead (the matmuls alone). Every layer has its own weight tensors (random
bf16, torch.nn.functional.linear → cuBLAS) and KV cache (bf16), so the weights stream from memory as
in a real decode; no norms, RoPE or sampling (the bench's own side does the same ops).

Requests:
  {"op": "info"} → versions, threads, sdpa, cuda (device name or null)
  {"op": "decode", "layers": n, "hidden": D, "intermediate": I, "heads": H, "kvheads": KV,
   "head_dim": d, "vocab": V, "ctx": C, "tokens": T, "attention": true | false, "device": "cuda" | "cpu"}
      seconds per token: T tokens timed together between two torch.cuda.synchronize() calls
      (the model is built on the first request of its shape and reused).
"""
import math

import torch
import torch.nn.functional as F
from torch_peer import serve, timed

torch.manual_seed(0)
BF = torch.bfloat16
_models = {}


def _model(req):
    dev = req.get("device", "cpu")
    key = tuple(req[k] for k in ("layers", "hidden", "intermediate", "heads", "kvheads", "head_dim", "vocab", "ctx")) + (dev,)
    if key not in _models:
        _models.clear()  # one model at a time: the previous one's memory goes back first
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()
        n, D, I, H, KV, d, V, C, _ = key

        def w(rows, cols):
            return (torch.randn(rows, cols, device=dev) * cols**-0.5).to(BF)

        layers = []
        for _ in range(n):
            layers.append(
                {
                    "wq": w(H * d, D),
                    "wk": w(KV * d, D),
                    "wv": w(KV * d, D),
                    "wo": w(D, H * d),
                    "gate": w(I, D),
                    "up": w(I, D),
                    "down": w(D, I),
                    "k": torch.randn(1, KV, C, d, device=dev).to(BF),
                    "v": torch.randn(1, KV, C, d, device=dev).to(BF),
                }
            )
        _models[key] = {"layers": layers, "head": w(V, D), "x": torch.randn(1, D, device=dev).to(BF)}
    return _models[key]


def _attention(q, k, v, rep):
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is None:  # torch < 2.0: softmax(q·kᵀ/√d)·v
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        return torch.matmul(torch.softmax(s, dim=-1), v)
    try:
        return sdpa(q, k, v, enable_gqa=True)
    except TypeError:  # torch < 2.5: no enable_gqa
        return sdpa(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))


def _token(m, H, KV, d, attend):
    x = m["x"]
    for p in m["layers"]:
        q = F.linear(x, p["wq"])
        F.linear(x, p["wk"])
        F.linear(x, p["wv"])
        if attend:
            o = _attention(q.view(1, 1, H, d).transpose(1, 2), p["k"], p["v"], H // KV)
            o = o.transpose(1, 2).reshape(1, H * d)
        else:
            o = q
        F.linear(o, p["wo"])
        F.linear(F.silu(F.linear(x, p["gate"])) * F.linear(x, p["up"]), p["down"])
    return F.linear(x, m["head"])


def _decode(req):
    m = _model(req)
    cuda = req.get("device", "cpu").startswith("cuda")
    H, KV, d, T = req["heads"], req["kvheads"], req["head_dim"], req["tokens"]

    def tokens():
        for _ in range(T):
            y = _token(m, H, KV, d, req.get("attention", True))
        return y

    y, s = timed(tokens, cuda)
    s /= T
    if not torch.isfinite(y).all():
        return {"error": "non-finite LM head output"}
    return {"seconds": s}


if __name__ == "__main__":
    serve({"decode": _decode})
