"""
PyTorch peer of `bun run bench qwen-image` (qwen-image.bench.ts): one Qwen-Image-2.1 transformer block
in bf16 on the CPU for the image rows of a step, with the text rows' K and V computed once beforehand
(what ComfyUI's Qwen-Image-2.1 model and TensorPencil both do after the first step). A child process
that reads one JSON request per line on stdin and answers one JSON line on stdout.

The block is ../shared/spec/qwen-image.md §5.3 with random bf16 weights of the sizes in the request:
    n1 = layernorm(x) · (1 + scale1)                 (no affine, eps 1e-6, f32 then cast)
    q, k, v = n1 Wq, n1 Wk, n1 Wv → heads × 128; q, k RMS-normed per head, 3-axis interleaved RoPE
    x += tanh(gate1) · Wo attn(q, [k_text ; k], [v_text ; v])
    n2 = layernorm(x) · (1 + scale2)
    x += tanh(gate2) · Wout(silu(Wgate n2) · Wproj n2)
Linears in bf16 (torch.nn.functional.linear), norms and RoPE in f32 and cast back, attention with
scaled_dot_product_attention when this torch has it, else softmax(q·kᵀ/√d)·v in bf16.

Requests:
  {"op": "info"}
  {"op": "block", "features": D, "heads": H, "head_dim": d, "mlp_hidden": M, "txt": L, "h": h, "w": w}
      seconds of one block over the h·w image rows (the text K/V of L tokens precomputed, untimed).
"""
import math

import torch
import torch.nn.functional as F
from torch_peer import attention, serve, timed

torch.manual_seed(0)
BF = torch.bfloat16
_state = {}


def _rand(*shape, std):
    return (torch.randn(*shape) * std).to(BF)


def _weights(f, m, d):
    key = (f, m, d)
    if _state.get("wkey") != key:
        _state.clear()
        _state["wkey"] = key
        _state["w"] = {
            "wq": _rand(f, f, std=f**-0.5),
            "wk": _rand(f, f, std=f**-0.5),
            "wv": _rand(f, f, std=f**-0.5),
            "wo": _rand(f, f, std=f**-0.5),
            "gate": _rand(m, f, std=f**-0.5),
            "proj": _rand(m, f, std=f**-0.5),
            "out": _rand(f, m, std=m**-0.5),
            "qnorm": torch.ones(d),
            "knorm": torch.ones(d),
            "mod": _rand(4 * f, std=0.02),
        }
    return _state["w"]


def _rope_table(txt, h, w, d):
    """cos/sin [h·w, d/2] f32 of the image rows: axes (16, 56, 56) of 128, theta 10000, centred grid."""
    axes = [d // 8, (d * 7) // 16, (d * 7) // 16]
    r = torch.arange(h, dtype=torch.float64).repeat_interleave(w) - math.ceil(h / 2)
    c = torch.arange(w, dtype=torch.float64).repeat(h) - math.ceil(w / 2)
    pos = [torch.full((h * w,), float(txt), dtype=torch.float64), r, c]
    ang = [pos[a].unsqueeze(1) * (10000.0 ** (-torch.arange(0, n, 2, dtype=torch.float64) / n)).unsqueeze(0) for a, n in enumerate(axes)]
    th = torch.cat(ang, dim=1)
    return th.cos().float(), th.sin().float()


def _ln(x, eps=1e-6):
    return F.layer_norm(x.float(), (x.shape[-1],), eps=eps)


def _rms(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


def _rope(x, cos, sin):
    xf = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2).to(x.dtype)


def _run_block(req):
    f, heads, d, m = req["features"], req["heads"], req["head_dim"], req["mlp_hidden"]
    p = _weights(f, m, d)
    key = (req["txt"], req["h"], req["w"])
    if _state.get("ikey") != key:
        _state["ikey"] = key
        n = req["h"] * req["w"]
        _state["x"] = torch.randn(1, n, f).to(BF)
        _state["kt"] = torch.randn(1, heads, req["txt"], d).to(BF)
        _state["vt"] = torch.randn(1, heads, req["txt"], d).to(BF)
        _state["rope"] = _rope_table(req["txt"], req["h"], req["w"], d)
    x, kt, vt = _state["x"], _state["kt"], _state["vt"]
    cos, sin = _state["rope"]
    n = x.shape[1]
    s1, g1, s2, g2 = p["mod"].float().chunk(4)

    def step():
        n1 = (_ln(x) * (1 + s1)).to(BF)
        q = F.linear(n1, p["wq"]).view(1, n, heads, d).transpose(1, 2)
        k = F.linear(n1, p["wk"]).view(1, n, heads, d).transpose(1, 2)
        v = F.linear(n1, p["wv"]).view(1, n, heads, d).transpose(1, 2)
        q = _rope(_rms(q, p["qnorm"]), cos, sin)
        k = _rope(_rms(k, p["knorm"]), cos, sin)
        o = attention(q, torch.cat([kt, k], dim=2), torch.cat([vt, v], dim=2)).transpose(1, 2).reshape(1, n, f)
        x1 = x + (torch.tanh(g1) * F.linear(o, p["wo"]).float()).to(BF)
        n2 = (_ln(x1) * (1 + s2)).to(BF)
        y = F.linear(F.silu(F.linear(n2, p["gate"])) * F.linear(n2, p["proj"]), p["out"])
        return x1 + (torch.tanh(g2) * y.float()).to(BF)

    out, s = timed(step, False)
    if not torch.isfinite(out).all():
        return {"error": "non-finite block output"}
    return {"seconds": s}


if __name__ == "__main__":
    serve({"block": _run_block})
