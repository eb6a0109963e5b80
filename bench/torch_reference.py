# torch_reference.py — PyTorch timing at the real shapes, for the README's side-by-side table (issue 8).
# Random weights, the same dtypes and shapes as `mm3 bench --full` (MODEL.md §1.2, §1.3, §4.1); it times
# the computation only, it is not a reference for values (the goldens are).
# Run with the interpreter that has torch (Debian's python3-torch):
#   /usr/bin/python3 bench/torch_reference.py dit_bf16 3      # DiT forward, L = 689, batch 1 (also dit_f32)
#   /usr/bin/python3 bench/torch_reference.py dit_int8 3      # the same, its block Linears dynamically quantized
#       (torch.ao quantize_dynamic, per-channel int8 weights, per-tensor int8 activations; the 'onednn'
#       engine, the one Debian's torch has on x86); also prints rel_rms_vs_f32 of the output
#   /usr/bin/python3 bench/torch_reference.py depth_bf16 5    # the 7 depth steps of one frame, 2 rows (eager)
#   /usr/bin/python3 bench/torch_reference.py lm_step_bf16 5  # one LM decode step, 2 rows, 512 cached, 16385 head rows
#   /usr/bin/python3 bench/torch_reference.py vocoder_f32 3   # the vocoder over one 689-latent window (also vocoder_bf16)
# Prints one JSON line: stage, median_s, runs.
import sys, time, json, math, torch
import torch.nn.functional as F
torch.set_num_threads(2)
torch.manual_seed(0)
STAGES = ("dit_f32", "dit_bf16", "dit_int8", "depth_bf16", "lm_step_bf16", "vocoder_f32", "vocoder_bf16")
if len(sys.argv) < 2 or sys.argv[1] not in STAGES:
    sys.exit("usage: torch_reference.py STAGE [RUNS]   (STAGE: " + ", ".join(STAGES) + "; see the header)")
which = sys.argv[1]
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
extra = {}  # stage-specific fields of the JSON line

def med(f, runs):
    f()  # warmup
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    ts.sort(); return ts[len(ts)//2], ts

def rope_partial(x, cos, sin):  # x [B,H,S,64]; rotate dims 0:32
    r, p = x[..., :32], x[..., 32:]
    a, b = r[..., :16], r[..., 16:]
    rh = torch.cat([-b, a], -1)
    return torch.cat([r * cos + rh * sin, p], -1)

if which.startswith("dit"):
    dt = torch.bfloat16 if which == "dit_bf16" else torch.float32  # dit_int8: the f32 model, then quantized
    L, D, H, FF, NL = 689, 2048, 32, 8192, 36
    S = L + 1
    def W(o, i): return (torch.randn(o, i) * 0.02).to(dt)
    layers = []
    for _ in range(NL):
        layers.append(dict(ln1w=torch.ones(D, dtype=dt), ln1b=torch.zeros(D, dtype=dt), q=W(D, D), k=W(D, D), v=W(D, D), o=W(D, D),
                           ln2w=torch.ones(D, dtype=dt), ln2b=torch.zeros(D, dtype=dt), fi=W(2 * FF, D), fib=torch.zeros(2 * FF, dtype=dt),
                           fo=W(D, FF), fob=torch.zeros(D, dtype=dt)))
    pre = W(2304, 2304); pin = W(D, 2304); pout = W(128, D); post = W(128, 128)
    x = torch.randn(1, 2304, L).to(dt)
    inv = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
    fr = torch.outer(torch.arange(S).float(), inv); emb = torch.cat([fr, fr], -1)
    cos, sin = emb.cos().to(dt), emb.sin().to(dt)
    temb = torch.randn(1, 1, D).to(dt)
    def lin(l, name, x, b=None):  # a block Linear: the quantized module once dit_int8 made one
        qm = l.get("q_" + name)
        return qm(x) if qm is not None else F.linear(x, l[name], b)
    def fwd():
        with torch.no_grad():
            z = F.conv1d(x, pre.unsqueeze(-1)) + x
            h = F.linear(z.transpose(1, 2), pin)
            h = torch.cat([temb, h], 1)
            for l in layers:
                n = F.layer_norm(h, (D,), l["ln1w"], l["ln1b"], 1e-5)
                q = lin(l, "q", n).view(1, S, H, 64).transpose(1, 2)
                k = lin(l, "k", n).view(1, S, H, 64).transpose(1, 2)
                v = lin(l, "v", n).view(1, S, H, 64).transpose(1, 2)
                q, k = rope_partial(q, cos, sin), rope_partial(k, cos, sin)
                a = torch.softmax((q @ k.transpose(-1, -2)) * 0.125, -1) @ v
                h = h + lin(l, "o", a.transpose(1, 2).reshape(1, S, D))
                n = F.layer_norm(h, (D,), l["ln2w"], l["ln2b"], 1e-5)
                ag = lin(l, "fi", n, l["fib"])
                h = h + lin(l, "fo", ag[..., :FF] * F.silu(ag[..., FF:]), l["fob"])
            o = F.linear(h[:, 1:], pout).transpose(1, 2)
            return F.conv1d(o, post.unsqueeze(-1)) + o
    if which == "dit_int8":
        # the f32 forward once, then every block Linear swapped for its dynamically quantized module
        ref = fwd()
        torch.backends.quantized.engine = "onednn"
        qcfg = {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
        for l in layers:
            for name, bias in (("q", None), ("k", None), ("v", None), ("o", None), ("fi", "fib"), ("fo", "fob")):
                mod = torch.nn.Linear(l[name].shape[1], l[name].shape[0], bias=bias is not None)
                with torch.no_grad():
                    mod.weight.copy_(l[name])
                    if bias: mod.bias.copy_(l[bias])
                l["q_" + name] = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(mod), qcfg, dtype=torch.qint8)
        got = fwd()
        extra["rel_rms_vs_f32"] = ((got - ref).norm() / ref.norm()).item()
    m, ts = med(fwd, runs)
elif which == "depth_bf16":
    dt = torch.bfloat16
    D, H, HD, I, NL = 4096, 16, 256, 6144, 4
    def W(o, i): return (torch.randn(o, i) * 0.02).to(dt)
    proj = W(D, D); pos = W(16, D); heads = [W(1024, D) for _ in range(7)]
    layers = [dict(n1=torch.ones(D, dtype=dt), n2=torch.ones(D, dtype=dt), q=W(D, D), k=W(D, D), v=W(D, D), o=W(D, D),
                   g=W(I, D), u=W(I, D), d=W(D, I)) for _ in range(NL)]
    fn = torch.ones(D, dtype=dt)
    def rms(x, w): 
        xf = x.float(); return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt) * w
    def frame():
        # eager reference (MODEL.md 2.7): 7 steps, step j recomputes the whole prefix (length j+1, 2..8) for the 2 CFG rows
        with torch.no_grad():
            seq = [F.linear(torch.randn(2, 1, D).to(dt), proj), F.linear(torch.randn(2, 1, D).to(dt), proj)]
            for j in range(7):
                x = torch.cat(seq, 1) + pos[: len(seq)].unsqueeze(0)
                S = x.shape[1]
                for l in layers:
                    n = rms(x, l["n1"])
                    q = F.linear(n, l["q"]).view(2, S, H, HD).transpose(1, 2)
                    k = F.linear(n, l["k"]).view(2, S, H, HD).transpose(1, 2)
                    v = F.linear(n, l["v"]).view(2, S, H, HD).transpose(1, 2)
                    s = (q @ k.transpose(-1, -2)) / 16.0
                    s = s + torch.triu(torch.full((S, S), float("-inf")), 1).to(dt)
                    a = torch.softmax(s, -1) @ v
                    x = x + F.linear(a.transpose(1, 2).reshape(2, S, D), l["o"])
                    n = rms(x, l["n2"])
                    x = x + F.linear(F.silu(F.linear(n, l["g"])) * F.linear(n, l["u"]), l["d"])
                logits = F.linear(rms(x[:, -1:], fn), heads[j]).float()
                code = torch.argmax(logits, -1)
                if j < 6: seq.append(F.linear(torch.randn(2, 1, D).to(dt), proj))
    m, ts = med(frame, runs)
elif which.startswith("vocoder"):
    # MODEL.md 5.1, weight norm folded (as [S] does at load): one 689-latent window, both stereo streams
    # batched [2, 64, L] like the reference's fold; F32 (the checkpoint dtype) or BF16 (a diffusers bf16 run).
    dt = torch.bfloat16 if which == "vocoder_bf16" else torch.float32
    L = 689
    def Wc(o, i, k): return (torch.randn(o, i, k) * (1.0 / math.sqrt(i * k))).to(dt)
    def B(o): return torch.zeros(o, dtype=dt)
    def A(c): return torch.ones(1, c, 1, dtype=dt)
    def snake(x, a): return x + (a + 1e-9).reciprocal() * torch.sin(a * x).pow(2)
    inp = (Wc(1024, 64, 1), B(1024)); cin = (Wc(1536, 1024, 7), B(1536))
    blocks, ch = [], 1536
    for s in [8, 8, 4, 2]:
        out = ch // 2
        res = [dict(a1=A(out), c1=Wc(out, out, 7), b1=B(out), d=d, a2=A(out), c2=Wc(out, out, 1), b2=B(out)) for d in (1, 3, 9)]
        blocks.append(dict(a=A(ch), up=(torch.randn(ch, out, 2 * s) * (1.0 / math.sqrt(ch * 2))).to(dt), ub=B(out), s=s, res=res))
        ch = out
    aout = A(ch); cout = (Wc(1, ch, 7), B(1))
    z = torch.randn(2, 64, L).to(dt)
    def voc():
        with torch.no_grad():
            x = F.conv1d(z, *inp)
            x = F.conv1d(x, cin[0], cin[1], padding=3)
            for b in blocks:
                x = F.conv_transpose1d(snake(x, b["a"]), b["up"], b["ub"], stride=b["s"], padding=(b["s"] + 1) // 2)
                for r in b["res"]:
                    y = F.conv1d(snake(x, r["a1"]), r["c1"], r["b1"], padding=3 * r["d"], dilation=r["d"])
                    x = x + F.conv1d(snake(y, r["a2"]), r["c2"], r["b2"])
            return torch.tanh(F.conv1d(snake(x, aout), cout[0], cout[1], padding=3))
    try:
        assert voc().shape[-1] == 512 * L
    except RuntimeError as e:  # torch 1.13's CPU bf16 conv_transpose1d rejects this weight ("expected input to have 768 channels")
        print(json.dumps({"stage": "torch_" + which, "error": str(e).splitlines()[0], "torch": torch.__version__}))
        sys.exit(1)
    m, ts = med(voc, runs)
if which != "lm_step_bf16": print(json.dumps({"stage": "torch_" + which, "median_s": m, "runs": ts, "torch": torch.__version__, "threads": torch.get_num_threads(), **extra}))

if which == "lm_step_bf16":
    dt = torch.bfloat16
    D, Hq, Hkv, HD, I, NL, P = 4096, 32, 8, 128, 12288, 36, 512
    def W(o, i): return torch.empty(o, i, dtype=dt).normal_(0, 0.02)
    layers = [dict(n1=torch.ones(D, dtype=dt), n2=torch.ones(D, dtype=dt), qn=torch.ones(HD, dtype=dt), kn=torch.ones(HD, dtype=dt),
                   q=W(Hq * HD, D), k=W(Hkv * HD, D), v=W(Hkv * HD, D), o=W(D, Hq * HD), g=W(I, D), u=W(I, D), d=W(D, I),
                   kc=torch.randn(2, Hkv, P + 1, HD).to(dt), vc=torch.randn(2, Hkv, P + 1, HD).to(dt)) for _ in range(NL)]
    head = W(16385, D); fn = torch.ones(D, dtype=dt)
    def rms(x, w):
        xf = x.float(); return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt) * w
    def step():
        with torch.no_grad():
            x = torch.randn(2, 1, D).to(dt)
            for l in layers:
                n = rms(x, l["n1"])
                q = rms(F.linear(n, l["q"]).view(2, 1, Hq, HD), l["qn"]).transpose(1, 2)
                k = rms(F.linear(n, l["k"]).view(2, 1, Hkv, HD), l["kn"]).transpose(1, 2)
                v = F.linear(n, l["v"]).view(2, 1, Hkv, HD).transpose(1, 2)
                l["kc"][:, :, P:P + 1] = k; l["vc"][:, :, P:P + 1] = v
                kk = l["kc"].repeat_interleave(Hq // Hkv, 1); vv = l["vc"].repeat_interleave(Hq // Hkv, 1)
                a = torch.softmax((q @ kk.transpose(-1, -2)) / math.sqrt(HD), -1) @ vv
                x = x + F.linear(a.transpose(1, 2).reshape(2, 1, Hq * HD), l["o"])
                n = rms(x, l["n2"])
                x = x + F.linear(F.silu(F.linear(n, l["g"])) * F.linear(n, l["u"]), l["d"])
            return F.linear(rms(x, fn), head).float()
    m, ts = med(step, runs)
    print(json.dumps({"stage": "torch_" + which, "median_s": m, "runs": ts, "torch": torch.__version__, "threads": torch.get_num_threads()}))
