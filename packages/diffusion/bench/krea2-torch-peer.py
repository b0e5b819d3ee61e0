"""
PyTorch peer of `bun run bench krea2` (packages/diffusion/bench/krea2.bench.ts) and of `bun run bench gpu`
(./gpu.bench.ts): one Krea 2 single-stream DiT block in bf16 on the CPU, or on a CUDA device when the
request says `"device": "cuda"`, as a child process that reads one JSON request per line on stdin and
answers one JSON line on stdout, so the bench interleaves torch's runs with its own in one session.

The block is ../shared/spec/krea2.md §3.3 (ComfyUI comfy/ldm/krea2/model.py `SingleStreamBlock`) with
random bf16 weights of the real sizes (the sizes come in the request):
    m = tvec + mod.lin → prescale, preshift, pregate, postscale, postshift, postgate
    a = (1 + prescale) · (rmsnorm(x) · (1 + prenorm)) + preshift
    x += pregate · Wo(attn(a) · sigmoid(Wgate a))      48 heads / 12 KV heads of 128, per-head QK-norm,
                                                       3-axis interleaved RoPE, no mask
    b = (1 + postscale) · (rmsnorm(x) · (1 + postnorm)) + postshift
    x += postgate · Wdown(silu(Wgate' b) · Wup b)
Linears in bf16 (torch.nn.functional.linear → oneDNN), RMSNorm and RoPE in f32 and cast back (ComfyUI's
`rms_norm` / flux `apply_rope`), attention with scaled_dot_product_attention when this torch has it (2.0+),
else softmax(q·kᵀ/√d)·v over all heads at once in bf16 (Debian bookworm ships torch 1.13), GQA by
repeat_interleave as ComfyUI does.

Requests:
  {"op": "info"} → versions, threads, sdpa, BLAS, cuda (the CUDA device's name, or null without one)
  {"op": "block", "features": F, "heads": H, "kvheads": KV, "head_dim": D, "mlp_hidden": M,
   "txt": S, "h": h, "w": w, "device": "cpu" | "cuda"}
      seconds of one block forward over S text + h·w image tokens (weights made on the first request of a
      size and reused; the first call of a shape is a warm-up the bench discards). On cuda the weights,
      inputs and RoPE tables live on the device and the forward is timed between two
      torch.cuda.synchronize() calls.
"""
import torch
import torch.nn.functional as F
from torch_peer import attention, serve, timed

torch.manual_seed(0)
BF = torch.bfloat16
_blocks = {}
_inputs = {}


def _rand(*shape, std, device="cpu"):
    return (torch.randn(*shape, device=device) * std).to(BF)


def _block(req):
    dev = req.get("device", "cpu")
    key = (req["features"], req["heads"], req["kvheads"], req["head_dim"], req["mlp_hidden"], dev)
    if key not in _blocks:
        _blocks.clear()
        f, h, kv, d, m, _ = key
        w = {
            "wq": _rand(h * d, f, std=f**-0.5, device=dev),
            "wk": _rand(kv * d, f, std=f**-0.5, device=dev),
            "wv": _rand(kv * d, f, std=f**-0.5, device=dev),
            "gate": _rand(h * d, f, std=f**-0.5, device=dev),
            "wo": _rand(f, h * d, std=(h * d) ** -0.5, device=dev),
            "mlp_gate": _rand(m, f, std=f**-0.5, device=dev),
            "mlp_up": _rand(m, f, std=f**-0.5, device=dev),
            "mlp_down": _rand(f, m, std=m**-0.5, device=dev),
            "prenorm": torch.zeros(f, device=dev),
            "postnorm": torch.zeros(f, device=dev),
            "qnorm": torch.zeros(d, device=dev),
            "knorm": torch.zeros(d, device=dev),
            "mod": _rand(6 * f, std=0.02, device=dev),
            "tvec": _rand(6 * f, std=0.02, device=dev),
        }
        _blocks[key] = w
    return _blocks[key]


def _rope_table(txt, h, w, d):
    """cos/sin [L, d/2] f32 of the 3-axis interleaved RoPE (krea2.md §3.5): axes [32, 48, 48], theta 1000."""
    u = d // 16
    axes = [d - 12 * u, 6 * u, 6 * u]
    L = txt + h * w
    pos = torch.zeros(3, L, dtype=torch.float64)
    r = torch.arange(h, dtype=torch.float64).repeat_interleave(w)
    c = torch.arange(w, dtype=torch.float64).repeat(h)
    pos[1, txt:] = r
    pos[2, txt:] = c
    angles = []
    for a, dim in enumerate(axes):
        k = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        angles.append(pos[a].unsqueeze(1) * (1000.0**-k).unsqueeze(0))
    th = torch.cat(angles, dim=1)
    return th.cos().float(), th.sin().float()


def _rms(x, scale, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1 + scale)).to(x.dtype)


def _rope(x, cos, sin):
    # x [1, heads, L, d]; pairs (2p, 2p+1)
    xf = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)


def _forward(p, x, cos, sin, heads, kvheads, d):
    L = x.shape[1]
    m = (p["tvec"] + p["mod"]).chunk(6)
    prescale, preshift, pregate, postscale, postshift, postgate = m
    a = (1 + prescale) * _rms(x, p["prenorm"]) + preshift
    q = F.linear(a, p["wq"]).view(1, L, heads, d).transpose(1, 2)
    k = F.linear(a, p["wk"]).view(1, L, kvheads, d).transpose(1, 2)
    v = F.linear(a, p["wv"]).view(1, L, kvheads, d).transpose(1, 2)
    g = F.linear(a, p["gate"])
    q = _rope(_rms(q, p["qnorm"]), cos, sin)
    k = _rope(_rms(k, p["knorm"]), cos, sin)
    rep = heads // kvheads
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    o = attention(q, k, v).transpose(1, 2).reshape(1, L, heads * d)
    x = x + pregate * F.linear(o * torch.sigmoid(g), p["wo"])
    b = (1 + postscale) * _rms(x, p["postnorm"]) + postshift
    y = F.linear(F.silu(F.linear(b, p["mlp_gate"])) * F.linear(b, p["mlp_up"]), p["mlp_down"])
    return x + postgate * y


def _run_block(req):
    p = _block(req)
    dev = req.get("device", "cpu")
    cuda = dev.startswith("cuda")
    key = (req["features"], req["head_dim"], req["txt"], req["h"], req["w"], dev)
    if key not in _inputs:
        _inputs.clear()
        L = req["txt"] + req["h"] * req["w"]
        cos, sin = _rope_table(req["txt"], req["h"], req["w"], req["head_dim"])
        x = torch.randn(1, L, req["features"], device=dev).to(BF)
        _inputs[key] = (x, cos.to(dev), sin.to(dev))
    x, cos, sin = _inputs[key]
    y, s = timed(lambda: _forward(p, x, cos, sin, req["heads"], req["kvheads"], req["head_dim"]), cuda)
    if not torch.isfinite(y).all():
        return {"error": "non-finite block output"}
    return {"seconds": s}


if __name__ == "__main__":
    serve({"block": _run_block})
