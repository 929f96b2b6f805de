"""Torch side of bench/src/ops/quant.rs (same keys): W8A8 in plain torch, as a user writes it.

Per-token quantisation: amax over the row, scale = amax / 127, q = round(x / scale).clamp(+-127)
(int8). Dequantisation of an int32 GEMM output: acc.float() * act_scale[:, None] * w_scale[None, :].
RMSNorm: F.rms_norm; RoPE: the Hugging Face rotate-half formula with gathered cos/sin caches;
SwiGLU: F.silu(gate) * up. The int8 GEMM is torch._int_mm (cuBLAS IMMA, int32 out) against
torch.mm in fp16 on the same shapes.

BERT encoder ops (post-LayerNorm, GELU) at BERT-base / BERT-large shapes: F.layer_norm + the
per-token quantisation above (the f16 output kept, as the encoder keeps its hidden state);
dequantise + bias + residual + F.layer_norm (residual overwritten) + quantisation; dequantise +
bias + F.gelu (erf) + quantisation; and static quantisation with a calibrated per-tensor amax:
q = round(x * (127 / amax)).clamp(+-127), scale = amax / 127 for every token.
"""
import torch
import torch.nn.functional as F

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
EPS = 1e-5
ROW_SIZES = [(1, 4096), (16, 4096), (64, 4096), (1, 8192), (64, 8192), (65536, 8192)]
DEQ_SIZES = [(1, 4096), (16, 4096), (64, 4096), (1, 8192), (64, 8192), (16384, 8192)]
SILU_SIZES = [(1, 11008), (16, 11008), (64, 11008), (1, 28672), (64, 28672), (8192, 14336)]
ROPE_SIZES = [(1, 32, 8), (16, 32, 8), (64, 32, 8), (1, 64, 8), (64, 64, 8), (16384, 32, 8)]
GEMM_SHAPES = [(4096, 4096, 4096), (2048, 4096, 4096), (2048, 4096, 11008), (2048, 11008, 4096),
               (2048, 11008, 11008), (2048, 12288, 4096), (2048, 12288, 11008)]
HEAD_DIM, THETA, MAX_POS = 128, 500000.0, 8192
ENC_LN_SIZES = [(4096, 768), (4096, 1024)]     # (tokens, hidden): BERT-base, BERT-large
ENC_FFN_SIZES = [(4096, 3072), (4096, 4096)]   # (tokens, FFN width)
LN_EPS = 1e-12


def rnd(shape, dt):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(DT[dt])


def rnd_acc(shape):
    return torch.randint(-100000, 100000, shape, device="cuda", dtype=torch.int32)


def rnd_i8(shape):
    return torch.randint(-127, 128, shape, device="cuda", dtype=torch.int8)


def quantize(v):
    amax = v.abs().amax(dim=-1, keepdim=True).float()
    scale = amax / 127.0
    q = torch.round(v.float() / scale).clamp(-127, 127).to(torch.int8)
    return q, scale.squeeze(-1)


def dequant(acc, sa, sw):
    return acc.float() * sa[:, None] * sw[None, :]


def rms_norm_quant(x, w):
    return quantize(F.rms_norm(x, (x.shape[-1],), w, EPS))


def dequant_add_rms_norm_quant(acc, sa, sw, res, w):
    res.add_(dequant(acc, sa, sw).to(res.dtype))
    return quantize(F.rms_norm(res, (res.shape[-1],), w, EPS))


def dequant_add(acc, sa, sw, res):
    res.add_(dequant(acc, sa, sw).to(res.dtype))


def dequant_silu_mul_quant(acc, sa, sw):
    d = dequant(acc, sa, sw)
    gate, up = d.chunk(2, dim=-1)
    return quantize(F.silu(gate) * up)


def quantize_calibrated(x, amax):
    scale = (amax / 127.0).expand(x.shape[0])
    q = torch.round(x.float() * (127.0 / amax)).clamp(-127, 127).to(torch.int8)
    return q, scale


def layer_norm_quant(x, w, b):
    y = F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)
    return y, quantize(y)


def dequant_bias_add_layer_norm_quant(acc, sa, sw, bias, res, w, b):
    h = res.float() + (dequant(acc, sa, sw) + bias.float())
    v = F.layer_norm(h, (h.shape[-1],), w.float(), b.float(), LN_EPS)
    res.copy_(v)
    return quantize(v)


def dequant_bias_gelu_quant(acc, sa, sw, bias):
    return quantize(F.gelu(dequant(acc, sa, sw) + bias.float()))


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def cos_sin_cache(dt):
    inv_freq = 1.0 / (THETA ** (torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM))
    freqs = torch.outer(torch.arange(MAX_POS, device="cuda", dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(DT[dt]), emb.sin().to(DT[dt])


def dequant_rope(acc, sa, sw, cos_c, sin_c, pos, hq, hkv, dt):
    t = acc.shape[0]
    x = dequant(acc, sa, sw).to(DT[dt]).view(t, hq + 2 * hkv, HEAD_DIM)
    q, k, v = x.split([hq, hkv, hkv], dim=1)
    cos, sin = cos_c[pos].unsqueeze(1), sin_c[pos].unsqueeze(1)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    return q, k, v


def both(fn, *args):
    c = torch.compile(fn)
    return {"eager": lambda: fn(*args), "compile": lambda: c(*args)}


def cases():
    for r, h in ROW_SIZES:
        def make(r=r, h=h):
            return both(quantize, rnd((r, h), "bf16"))
        yield f"quantize_per_token|bf16|{r}x{h}", make
        for dt in ["f16", "bf16"]:
            def make(r=r, h=h, dt=dt):
                return both(rms_norm_quant, rnd((r, h), dt), rnd((h,), dt))
            yield f"rms_norm_quant|{dt}|{r}x{h}", make
    for r, h in DEQ_SIZES:
        def make(r=r, h=h):
            sa = torch.full((r,), 1e-3, device="cuda")
            sw = torch.full((h,), 1e-4, device="cuda")
            return both(dequant_add_rms_norm_quant, rnd_acc((r, h)), sa, sw, rnd((r, h), "bf16"),
                        rnd((h,), "bf16"))
        yield f"dequant_add_rms_norm_quant|bf16|{r}x{h}", make

        def make(r=r, h=h):
            sa = torch.full((r,), 1e-3, device="cuda")
            sw = torch.full((h,), 1e-4, device="cuda")
            return both(dequant_add, rnd_acc((r, h)), sa, sw, rnd((r, h), "bf16"))
        yield f"dequant_add|bf16|{r}x{h}", make
    for r, i in SILU_SIZES:
        def make(r=r, i=i):
            sa = torch.full((r,), 1e-3, device="cuda")
            sw = torch.full((2 * i,), 1e-4, device="cuda")
            return both(dequant_silu_mul_quant, rnd_acc((r, 2 * i)), sa, sw)
        yield f"dequant_silu_mul_quant|i32|{r}x{i}", make
    for r, hq, hkv in ROPE_SIZES:
        def make(r=r, hq=hq, hkv=hkv):
            w = (hq + 2 * hkv) * HEAD_DIM
            sa = torch.full((r,), 1e-3, device="cuda")
            sw = torch.full((w,), 1e-4, device="cuda")
            cos_c, sin_c = cos_sin_cache("bf16")
            pos = torch.arange(r, device="cuda") * 7 % MAX_POS
            return both(dequant_rope, rnd_acc((r, w)), sa, sw, cos_c, sin_c, pos, hq, hkv, "bf16")
        yield f"dequant_rope|bf16|{r}x{hq}x{hkv}x{HEAD_DIM}", make
    for r, h in ENC_LN_SIZES:
        def make(r=r, h=h):
            return both(quantize_calibrated, rnd((r, h), "f16"),
                        torch.full((1,), 4.0, device="cuda"))
        yield f"quantize_calibrated|f16|{r}x{h}", make
        for dt in ["f16", "bf16"]:
            def make(r=r, h=h, dt=dt):
                return both(layer_norm_quant, rnd((r, h), dt), rnd((h,), dt), rnd((h,), dt))
            yield f"layer_norm_quant|{dt}|{r}x{h}", make

        def make(r=r, h=h):
            sa = torch.full((r,), 1e-3, device="cuda")
            sw = torch.full((h,), 1e-4, device="cuda")
            return both(dequant_bias_add_layer_norm_quant, rnd_acc((r, h)), sa, sw,
                        rnd((h,), "f16"), rnd((r, h), "f16"), rnd((h,), "f16"), rnd((h,), "f16"))
        yield f"dequant_bias_add_layer_norm_quant|f16|{r}x{h}", make
    for r, i in ENC_FFN_SIZES:
        def make(r=r, i=i):
            sa = torch.full((r,), 1e-3, device="cuda")
            sw = torch.full((i,), 1e-4, device="cuda")
            return both(dequant_bias_gelu_quant, rnd_acc((r, i)), sa, sw, rnd((i,), "f16"))
        yield f"dequant_bias_gelu_quant|f16|{r}x{i}", make
    for m, n, k in GEMM_SHAPES:
        def make(m=m, n=n, k=k):
            a, w = rnd_i8((m, k)), rnd_i8((n, k))
            wt = w.t()  # [k, n] column-major view: the TN product cuBLAS runs on tensor cores
            return {"eager": lambda: torch._int_mm(a, wt), "compile": None}
        yield f"gemm_i8|i8|{m}x{n}x{k}", make

        def make(m=m, n=n, k=k):
            a, w = rnd((m, k), "f16"), rnd((n, k), "f16")
            wt = w.t()
            return {"eager": lambda: torch.mm(a, wt), "compile": None}
        yield f"gemm|f16|{m}x{n}x{k}", make
