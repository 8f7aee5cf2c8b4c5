#!/usr/bin/env python3
"""train.py - trains cobble, cairn's default model (or pebble, the first one: --model): a small
NemotronH (Mamba2 + attention + MoE) with one MTP block, and its byte-level BPE tokenizer, on the
conversations of data.py.

Runs on one GPU with torch and tokenizers (the H200 machine; see README.md here):

    PYTHONUNBUFFERED=1 python3 tools/train/train.py --out OUTDIR --minutes 10.5

Steps: generate the training conversations (data.py, in parallel), train the tokenizer on them
(special tokens at the Nemotron 3 ids), train the model until the time budget is spent (learning
rate on a cosine of elapsed time, so a budget always ends annealed), export in the Hugging Face
layout that cairn loads (backbone.* / mtp.* tensor names, unfused experts, BF16 with F32 router
and small vectors, shards <= 15 MB), then decode a few held-out conversations greedily in Python
and write a tokenizer sample (texts and their ids) for the check against `cairn tokenize`.

The model is written here, not taken from transformers (which has no MTP forward and whose Mamba
path without kernels is slow): the math is tools/reference/make_reference.py's reference functions
(ref_mamba, ref_attn, ref_moe, ref_mtp) with the Mamba scan in chunked SSD form. Routing follows
NemotronH: sigmoid scores, the e_score_correction_bias chooses experts only, and that bias is
trained without gradients to balance expert load (it moves against each expert's excess load).
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import random
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import data  # noqa: E402

SPECIALS = ["<unk>", "<s>", "</s>"] + [f"<SPECIAL_{i}>" for i in range(3, 10)] + [
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>"]
IM_END = 11

# The shapes this script trains (--model). pebble: the first default, compute-bound in the CPU's
# caches (a speculative verify of two rows costs ~1.4 plain steps there). cobble: the default, wide
# enough that a decode step streams its weights from memory, so a verify of two rows costs about
# one step and the MTP head's drafts pay (issue 9), at ~49 MB of BF16.
CONFIGS = dict(
    pebble=dict(
        vocab_size=2048, hidden_size=256, hybrid_override_pattern="MEMEM*EMEMEM*E",
        num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        mamba_num_heads=16, mamba_head_dim=32, n_groups=2, ssm_state_size=32, conv_kernel=4, chunk_size=64,
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, n_shared_experts=1,
        moe_shared_expert_intermediate_size=384, routed_scaling_factor=2.5, norm_topk_prob=True,
        n_group=1, topk_group=1, layer_norm_epsilon=1e-5,
    ),
    cobble=dict(
        vocab_size=2048, hidden_size=512, hybrid_override_pattern="MEM*EMEM*E",
        num_attention_heads=8, num_key_value_heads=2, head_dim=64,
        mamba_num_heads=16, mamba_head_dim=64, n_groups=2, ssm_state_size=64, conv_kernel=4, chunk_size=64,
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=192, n_shared_experts=1,
        moe_shared_expert_intermediate_size=1024, routed_scaling_factor=2.5, norm_topk_prob=True,
        n_group=1, topk_group=1, layer_norm_epsilon=1e-5,
    ),
)
CONFIG = CONFIGS["cobble"]


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


# ---- data ------------------------------------------------------------------------------------

def _gen(args):
    seed, lo, hi, split = args
    data.load_template()
    out = []
    for i in range(lo, hi):
        ex = data.example(seed, i, split)
        out.append((data.render(ex["request"]), data.completion(ex)))
    return out


def generate(seed, n, split, procs):
    step = max(1, n // (procs * 4))
    jobs = [(seed, lo, min(n, lo + step), split) for lo in range(0, n, step)]
    with mp.get_context("fork").Pool(procs) as pool:
        parts = pool.map(_gen, jobs)
    return [x for p in parts for x in p]


def train_tokenizer(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)

    def plain(t):  # special tokens are whole tokens: keep their text out of the merges
        for s in SPECIALS:
            t = t.replace(s, "\n")
        return t
    tok.train_from_iterator((plain(t) for t in texts), trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def encode_pairs(tok, pairs):
    P = tok.encode_batch([p for p, _ in pairs])
    C = tok.encode_batch([c for _, c in pairs])
    return [(a.ids, b.ids) for a, b in zip(P, C)]


def make_batches(enc, max_len, tokens_per_batch, chunk, rng):
    """Length-bucketed batches: (ids [B,L], loss mask [B,L] on completion tokens)."""
    ex = [(p + c, len(p)) for p, c in enc if len(p) + len(c) <= max_len]
    order = list(range(len(ex)))
    rng.shuffle(order)
    batches = []
    group = 256
    for g in range(0, len(order), group * 8):
        idx = sorted(order[g:g + group * 8], key=lambda i: len(ex[i][0]))
        cur = []
        for i in idx:
            L = -(-len(ex[i][0]) // chunk) * chunk  # idx is sorted by length
            if cur and L * (len(cur) + 1) > tokens_per_batch:
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return ex, batches


def to_tensors(ex, b, chunk, device):
    L = -(-max(len(ex[i][0]) for i in b) // chunk) * chunk
    ids = torch.zeros(len(b), L, dtype=torch.long)
    comp = torch.zeros(len(b), L, dtype=torch.bool)
    for r, i in enumerate(b):
        t, np_ = ex[i]
        ids[r, :len(t)] = torch.tensor(t)
        comp[r, np_:len(t)] = True
    return ids.to(device, non_blocking=True), comp.to(device, non_blocking=True)


# ---- model -----------------------------------------------------------------------------------

def rms(x, w, eps=1e-5):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def segsum(x):
    T = x.size(-1)
    x = x.unsqueeze(-1).expand(*x.shape, T)
    m = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device), -1)
    s = torch.cumsum(x.masked_fill(~m, 0), dim=-2)
    m = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device), 0)
    return s.masked_fill(~m, -torch.inf)


def ssd(X, A, B, C, cl):
    """Chunked SSD scan from a zero state. X [b,l,h,p] (dt*x), A [b,l,h] (dt*A), B/C [b,l,h,n]."""
    b, l, h, p = X.shape
    c = l // cl
    X = X.reshape(b, c, cl, h, p)
    B = B.reshape(b, c, cl, h, -1)
    C = C.reshape(b, c, cl, h, -1)
    A = A.reshape(b, c, cl, h).permute(0, 3, 1, 2)
    Acs = torch.cumsum(A, -1)
    Lm = torch.exp(segsum(A))
    CB = torch.einsum("bclhn,bcshn->bhcls", C, B)
    Y_diag = torch.einsum("bhcls,bcshp->bclhp", CB * Lm, X)
    decay = torch.exp(Acs[..., -1:] - Acs)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay, X)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], 1)
    dchunk = torch.exp(segsum(F.pad(Acs[..., -1], (1, 0))))
    states = torch.einsum("bhzc,bchpn->bzhpn", dchunk, states)[:, :-1]
    Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, torch.exp(Acs))
    return (Y_diag + Y_off).reshape(b, l, h, p)


class Mamba(nn.Module):
    def __init__(s, c):
        super().__init__()
        H, nh, hd, G, N, K = (c["hidden_size"], c["mamba_num_heads"], c["mamba_head_dim"], c["n_groups"],
                              c["ssm_state_size"], c["conv_kernel"])
        s.nh, s.hd, s.G, s.N, s.cl = nh, hd, G, N, c["chunk_size"]
        s.DI, s.CD = nh * hd, nh * hd + 2 * G * N
        s.in_proj = nn.Linear(H, s.DI + s.CD + nh, bias=False)
        s.conv1d = nn.Conv1d(s.CD, s.CD, K, groups=s.CD, padding=K - 1, bias=True)
        dt = torch.exp(torch.rand(nh) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
        s.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        s.A_log = nn.Parameter(torch.log(torch.empty(nh).uniform_(1, 16)))
        s.D = nn.Parameter(torch.ones(nh))
        s.norm = nn.Parameter(torch.ones(s.DI))
        s.out_proj = nn.Linear(s.DI, H, bias=False)

    def forward(s, x):
        b, L, _ = x.shape
        z, xBC, dt = torch.split(s.in_proj(x), [s.DI, s.CD, s.nh], -1)
        xBC = F.silu(s.conv1d(xBC.transpose(1, 2))[..., :L].transpose(1, 2))
        with torch.autocast("cuda", enabled=False):
            xs, Bm, Cm = torch.split(xBC.float(), [s.DI, s.G * s.N, s.G * s.N], -1)
            xs = xs.reshape(b, L, s.nh, s.hd)
            rep = s.nh // s.G
            Bm = Bm.reshape(b, L, s.G, s.N).repeat_interleave(rep, 2)
            Cm = Cm.reshape(b, L, s.G, s.N).repeat_interleave(rep, 2)
            dt = F.softplus(dt.float() + s.dt_bias)
            A = -torch.exp(s.A_log.float())
            y = ssd(xs * dt[..., None], dt * A, Bm, Cm, s.cl) + xs * s.D[:, None]
            y = y.reshape(b, L, s.DI) * F.silu(z.float())
            y = rms(y.reshape(b, L, s.G, s.DI // s.G), 1.0).reshape(b, L, s.DI) * s.norm
        return s.out_proj(y)


class Attn(nn.Module):
    def __init__(s, c):
        super().__init__()
        H, s.nh, s.nkv, s.hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        s.q_proj = nn.Linear(H, s.nh * s.hd, bias=False)
        s.k_proj = nn.Linear(H, s.nkv * s.hd, bias=False)
        s.v_proj = nn.Linear(H, s.nkv * s.hd, bias=False)
        s.o_proj = nn.Linear(s.nh * s.hd, H, bias=False)

    def forward(s, x):
        b, L, _ = x.shape
        q = s.q_proj(x).view(b, L, s.nh, s.hd).transpose(1, 2)
        k = s.k_proj(x).view(b, L, s.nkv, s.hd).transpose(1, 2)
        v = s.v_proj(x).view(b, L, s.nkv, s.hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return s.o_proj(o.transpose(1, 2).reshape(b, L, s.nh * s.hd))


class MoE(nn.Module):
    def __init__(s, c):
        super().__init__()
        H, E, I, Is = c["hidden_size"], c["n_routed_experts"], c["moe_intermediate_size"], \
            c["moe_shared_expert_intermediate_size"]
        s.E, s.k, s.I, s.scale = E, c["num_experts_per_tok"], I, c["routed_scaling_factor"]
        s.gate = nn.Parameter(torch.randn(E, H) * 0.02)
        s.register_buffer("bias", torch.zeros(E))
        s.up = nn.Parameter(torch.randn(E, I, H) * 0.02)
        s.down = nn.Parameter(torch.randn(E, H, I) * 0.02)
        s.shared_up = nn.Linear(H, Is, bias=False)
        s.shared_down = nn.Linear(Is, H, bias=False)
        s.load = None

    def forward(s, x):
        shp = x.shape
        xf = x.reshape(-1, shp[-1])
        with torch.autocast("cuda", enabled=False):
            sc = torch.sigmoid(xf.float() @ s.gate.float().T)
            idx = torch.topk(sc + s.bias, s.k, dim=-1).indices
            w = sc.gather(1, idx)
            w = w / (w.sum(-1, keepdim=True) + 1e-20) * s.scale
            W = torch.zeros_like(sc).scatter(1, idx, w)
        if s.training:
            s.load = torch.bincount(idx.flatten(), minlength=s.E).float().detach()
        h = F.relu(xf @ s.up.reshape(s.E * s.I, -1).T) ** 2
        h = (h.view(-1, s.E, s.I) * W[:, :, None].to(h.dtype)).reshape(-1, s.E * s.I)
        y = h @ s.down.permute(1, 0, 2).reshape(-1, s.E * s.I).T
        y = y + s.shared_down(F.relu(s.shared_up(xf)) ** 2)
        return y.reshape(shp)


class Block(nn.Module):
    def __init__(s, c, t):
        super().__init__()
        s.norm = nn.Parameter(torch.ones(c["hidden_size"]))
        s.mixer = {"M": Mamba, "*": Attn, "E": MoE}[t](c)

    def forward(s, h):
        return h + s.mixer(rms(h, s.norm))


class MTP(nn.Module):
    def __init__(s, c):
        super().__init__()
        H = c["hidden_size"]
        s.enorm = nn.Parameter(torch.ones(H))
        s.hnorm = nn.Parameter(torch.ones(H))
        s.eh_proj = nn.Linear(2 * H, H, bias=False)
        s.attn = Block(c, "*")
        s.moe = Block(c, "E")
        s.final_layernorm = nn.Parameter(torch.ones(H))

    def forward(s, hn, e):
        """The block's output before its final norm: what cairn feeds back to draft further ahead."""
        x = s.eh_proj(torch.cat([rms(e, s.enorm), rms(hn, s.hnorm)], -1))
        return s.moe(s.attn(x))


class Model(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.c = c
        s.embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"])
        s.layers = nn.ModuleList([Block(c, t) for t in c["hybrid_override_pattern"]])
        s.norm_f = nn.Parameter(torch.ones(c["hidden_size"]))
        s.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        s.mtp = MTP(c)
        n = len(s.layers)
        for name, p in s.named_parameters():
            if name.endswith(("out_proj.weight", "o_proj.weight", "shared_down.weight")) or name.endswith(".down"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n))
            elif p.dim() == 2 and "conv1d" not in name:
                nn.init.normal_(p, std=0.02)

    def hidden(s, ids):
        h = s.embeddings(ids)
        for blk in s.layers:
            h = blk(h)
        return rms(h, s.norm_f)

    def forward(s, ids, mtp=1):
        """Logits, and the MTP head's logits at each of `mtp` depths: depth d (0-based) at position i
        predicts token i + 2 + d; depth d > 0 runs the head on its own depth d - 1 output with the
        embedding of token i + 1 + d, as cairn drafts a second token (engine/speculate.c)."""
        hn = s.hidden(ids)
        logits = s.lm_head(hn)
        outs, h = [], hn
        for d in range(mtp):
            h = s.mtp(h[:, :-1], s.embeddings(ids[:, d + 1:]))
            outs.append(s.lm_head(rms(h, s.mtp.final_layernorm)))
        return logits, outs

    def moes(s):
        return [m for m in s.modules() if isinstance(m, MoE)]


# ---- export ----------------------------------------------------------------------------------

def state_for_export(model):
    """Published NemotronH names -> (tensor, dtype)."""
    out = {}

    def put(name, t, dt="BF16"):
        out[name] = (t.detach().float().cpu().contiguous(), dt)

    def mixer(p, m):
        if isinstance(m, Mamba):
            put(p + "in_proj.weight", m.in_proj.weight)
            put(p + "conv1d.weight", m.conv1d.weight, "F32")
            put(p + "conv1d.bias", m.conv1d.bias, "F32")
            put(p + "dt_bias", m.dt_bias, "F32")
            put(p + "A_log", m.A_log, "F32")
            put(p + "D", m.D, "F32")
            put(p + "norm.weight", m.norm, "F32")
            put(p + "out_proj.weight", m.out_proj.weight)
        elif isinstance(m, Attn):
            for k in ("q_proj", "k_proj", "v_proj", "o_proj"):
                put(p + k + ".weight", getattr(m, k).weight)
        else:
            put(p + "gate.weight", m.gate, "F32")
            put(p + "gate.e_score_correction_bias", m.bias, "F32")
            for e in range(m.E):
                put(p + f"experts.{e}.up_proj.weight", m.up[e])
                put(p + f"experts.{e}.down_proj.weight", m.down[e])
            put(p + "shared_experts.up_proj.weight", m.shared_up.weight)
            put(p + "shared_experts.down_proj.weight", m.shared_down.weight)

    put("backbone.embeddings.weight", model.embeddings.weight)
    for L, blk in enumerate(model.layers):
        put(f"backbone.layers.{L}.norm.weight", blk.norm, "F32")
        mixer(f"backbone.layers.{L}.mixer.", blk.mixer)
    put("backbone.norm_f.weight", model.norm_f, "F32")
    put("lm_head.weight", model.lm_head.weight)
    t = model.mtp
    put("mtp.layers.0.enorm.weight", t.enorm, "F32")
    put("mtp.layers.0.hnorm.weight", t.hnorm, "F32")
    put("mtp.layers.0.eh_proj.weight", t.eh_proj.weight)
    put("mtp.layers.0.norm.weight", t.attn.norm, "F32")
    mixer("mtp.layers.0.mixer.", t.attn.mixer)
    put("mtp.layers.1.norm.weight", t.moe.norm, "F32")
    mixer("mtp.layers.1.mixer.", t.moe.mixer)
    put("mtp.layers.1.final_layernorm.weight", t.final_layernorm, "F32")
    return out


def tensor_bytes(t, dt):
    if dt == "F32":
        return t.numpy().astype("<f4").tobytes()
    return t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()


def write_safetensors(path, entries):
    header, off = {}, 0
    for name, dt, shape, b in entries:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for e in entries:
            f.write(e[3])


def export(model, tok, template, d, max_shard=15 * 1000 * 1000):
    os.makedirs(d, exist_ok=True)
    sd = state_for_export(model)
    shards, cur, size = [], [], 0
    for name in sorted(sd):
        t, dt = sd[name]
        b = tensor_bytes(t, dt)
        if cur and size + len(b) > max_shard:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, dt, list(t.shape), b))
        size += len(b)
    shards.append(cur)
    wmap, total = {}, 0
    for i, ents in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
        write_safetensors(os.path.join(d, fn), ents)
        for e in ents:
            wmap[e[0]] = fn
            total += len(e[3])
    if len(shards) > 1:
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2, sort_keys=True)
    c = dict(CONFIG)
    pat = c["hybrid_override_pattern"]
    cfg = dict(
        architectures=["NemotronHForCausalLM"], model_type="nemotron_h", **c,
        layers_block_type=[{"M": "mamba", "*": "attention", "E": "moe"}[x] for x in pat],
        num_hidden_layers=len(pat), tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
        sliding_window=None, max_position_embeddings=262144, mamba_hidden_act="silu", mamba_proj_bias=False,
        use_bias=False, use_conv_bias=True, mamba_ssm_cache_dtype="float32", expand=2,
        time_step_min=0.001, time_step_max=0.1, time_step_floor=0.0001, intermediate_size=c["moe_intermediate_size"],
        mlp_hidden_act="relu2", mlp_bias=False, residual_in_fp32=False, rescale_prenorm_residual=True,
        initializer_range=0.02, hidden_dropout=0.0, num_logits_to_keep=1, use_cache=True,
        num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*E", mtp_layers_block_type=["attention", "moe"],
        bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="bfloat16")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": [2, IM_END], "pad_token_id": 0}, f, indent=2)
    tok.save(os.path.join(d, "tokenizer.json"))
    tc = {"add_bos_token": False, "add_eos_token": False, "bos_token": "<s>", "eos_token": "<|im_end|>",
          "pad_token": "<unk>", "unk_token": "<unk>", "clean_up_tokenization_spaces": False,
          "model_max_length": 262144, "tokenizer_class": "PreTrainedTokenizerFast",
          "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                            "single_word": False, "special": True} for i, s in enumerate(SPECIALS)},
          "chat_template": template}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2, ensure_ascii=False)
    return total


# ---- checks ----------------------------------------------------------------------------------

@torch.no_grad()
def greedy(model, ids, n_max, chunk):
    ids = list(ids)
    out = []
    for _ in range(n_max):
        L = -(-len(ids) // chunk) * chunk
        x = torch.zeros(1, L, dtype=torch.long, device="cuda")
        x[0, :len(ids)] = torch.tensor(ids)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lg, _ = model(x, mtp=0)
        t = int(lg[0, len(ids) - 1].argmax())
        out.append(t)
        ids.append(t)
        if t == IM_END:
            break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=7.5, help="training time budget")
    ap.add_argument("--n-train", type=int, default=400000)
    ap.add_argument("--tokens-per-batch", type=int, default=65536)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--model", default="cobble", choices=sorted(CONFIGS), help="the shape to train")
    ap.add_argument("--mtp-weight", type=float, default=0.5)
    ap.add_argument("--mtp2-weight", type=float, default=0.25,
                    help="loss weight of the head's second draft (its own output fed back); 0: off")
    ap.add_argument("--max-len", type=int, default=640)
    ap.add_argument("--n-check", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    global CONFIG
    CONFIG = CONFIGS[args.model]
    mtp_depth = 2 if args.mtp2_weight > 0 else 1
    t0 = time.time()
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    procs = max(1, (os.cpu_count() or 2) - 1)
    template = data.load_template()
    pairs = generate(args.seed, args.n_train, "train", procs)
    log(f"generated {len(pairs)} training conversations with {procs} processes")
    sample = [p + c for p, c in random.Random(0).sample(pairs, min(60000, len(pairs)))]
    tok = train_tokenizer(sample, CONFIG["vocab_size"])
    enc = encode_pairs(tok, pairs)
    lens = sorted(len(p) + len(c) for p, c in enc)
    log(f"tokenizer: {tok.get_vocab_size()} tokens; conversation length median {lens[len(lens) // 2]}, "
        f"p99 {lens[int(len(lens) * 0.99)]}, max {lens[-1]}; total {sum(lens)} tokens")
    rng = random.Random(args.seed)
    chunk = CONFIG["chunk_size"]
    ex, batches = make_batches(enc, args.max_len, args.tokens_per_batch, chunk, rng)
    log(f"{len(batches)} batches per epoch")

    model = Model(CONFIG).cuda()
    nparam = sum(p.numel() for p in model.parameters())
    log(f"model: {nparam / 1e6:.2f} M parameters")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "conv1d" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "conv1d" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=True)
    budget = args.minutes * 60
    t_start = time.time()
    warm = 150
    step, bi, epoch = 0, 0, 0
    moes = model.moes()
    model.train()
    while True:
        el = time.time() - t_start
        if el >= budget:
            break
        frac = el / budget
        lr = args.lr * min(1.0, (step + 1) / warm) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        if bi >= len(batches):
            bi, epoch = 0, epoch + 1
            rng.shuffle(batches)
        ids, comp = to_tensors(ex, batches[bi], chunk, "cuda")
        bi += 1
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lg, lms = model(ids, mtp=mtp_depth)
        lm = lms[0]
        tgt = ids[:, 1:]
        m1 = comp[:, 1:]
        l1 = F.cross_entropy(lg[:, :-1].float()[m1], tgt[m1])
        m2 = comp[:, 2:]
        l2 = F.cross_entropy(lm[:, :-1].float()[m2], ids[:, 2:][m2])
        loss = l1 + args.mtp_weight * l2
        if mtp_depth > 1:
            m3 = comp[:, 3:]
            l3 = F.cross_entropy(lms[1][:, :-1].float()[m3], ids[:, 3:][m3])
            loss = loss + args.mtp2_weight * l3
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for m in moes:
                if m.load is not None:
                    m.bias += 1e-3 * torch.sign(m.load.mean() - m.load)
        if step % 100 == 0:
            with torch.no_grad():
                a1 = (lg[:, :-1].argmax(-1)[m1] == tgt[m1]).float().mean()
                a2 = (lm[:, :-1].argmax(-1)[m2] == ids[:, 2:][m2]).float().mean()
                a3 = ((lms[1][:, :-1].argmax(-1)[m3] == ids[:, 3:][m3]).float().mean() if mtp_depth > 1
                      else torch.zeros(()))
                imb = max(float(m.load.max() / m.load.mean()) for m in moes)
            log(f"step {step} ep {epoch} t {el:.0f}s lr {lr:.2e} loss {l1.item():.4f} mtp {l2.item():.4f} "
                f"acc {a1.item():.4f} mtp_acc {a2.item():.4f} mtp2_acc {a3.item():.4f} max_load/mean {imb:.2f} "
                f"batch {tuple(ids.shape)}")
        step += 1
    log(f"trained {step} steps in {time.time() - t_start:.0f}s ({epoch} epochs + {bi} batches)")
    model.eval()
    total = export(model, tok, template, os.path.join(args.out, args.model))
    log(f"exported {total / 1e6:.1f} MB of weights")

    # tokenizer sample for `cairn tokenize`, and greedy held-out checks
    rs = random.Random(7)
    samp = []
    for i in range(40):
        e = data.example(args.seed, i, "heldout")
        text = data.render(e["request"]) + data.completion(e)
        samp.append({"text": text, "ids": tok.encode(text).ids})
    samp.append({"text": "Héllo wörld — 3.14 ×  tabs\tand\n\nnewlines  ", "ids": None})
    samp[-1]["ids"] = tok.encode(samp[-1]["text"]).ids
    with open(os.path.join(args.out, "tok_sample.json"), "w") as f:
        json.dump(samp, f, ensure_ascii=False)
    ok, n = 0, 0
    with torch.no_grad():
        # teacher-forced MTP accuracy on held-out completions
        hx = [data.example(args.seed, i, "heldout") for i in range(200)]
        henc = encode_pairs(tok, [(data.render(e["request"]), data.completion(e)) for e in hx])
        hex_, hb = make_batches(henc, 4096, 65536, chunk, rs)
        c1 = c2 = c3 = n1 = n2 = n3 = 0
        for b in hb:
            ids, comp = to_tensors(hex_, b, chunk, "cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                lg, lms = model(ids, mtp=2)
            m1, m2, m3 = comp[:, 1:], comp[:, 2:], comp[:, 3:]
            c1 += int((lg[:, :-1].argmax(-1)[m1] == ids[:, 1:][m1]).sum())
            n1 += int(m1.sum())
            c2 += int((lms[0][:, :-1].argmax(-1)[m2] == ids[:, 2:][m2]).sum())
            n2 += int(m2.sum())
            c3 += int((lms[1][:, :-1].argmax(-1)[m3] == ids[:, 3:][m3]).sum())
            n3 += int(m3.sum())
        log(f"held-out teacher-forced token accuracy: main {c1 / n1:.4f}, mtp (next-next) {c2 / n2:.4f}, "
            f"mtp fed back (3 ahead) {c3 / n3:.4f}")
        for i in range(args.n_check):
            e = hx[i]
            p = tok.encode(data.render(e["request"])).ids
            outp = greedy(model, p, 200, chunk)
            got = tok.decode(outp, skip_special_tokens=False)
            want = data.completion(e)
            n += 1
            ok += got == want
            if i < 8 or got != want:
                log(f"[{e['kind']} think={e['think']}] {'OK ' if got == want else 'BAD'} {got!r}" +
                    ("" if got == want else f" want {want!r}"))
    log(f"held-out greedy exact completions: {ok}/{n}; total time {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
