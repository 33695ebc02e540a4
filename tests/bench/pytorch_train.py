#!/usr/bin/python3
"""The PyTorch reference for the training benchmarks: the same GPT-2 as ddp-worker (pre-LN
blocks, causal multi-head attention, GELU tanh, tied LM head, GPT-2 initialisation), or for the
Llama family's presets transformers' own LlamaForCausalLM / Qwen2ForCausalLM (SDPA attention,
the loss on its logits as ddpd computes it), in fp32,
AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D parameters only), global-norm clipping
at 1.0, on random tokens of the same shapes. Times W warmup steps, then K measured steps, and
prints one JSON line: median step time, tokens/s (global), peak RSS.

  single process, N compute threads:
    /usr/bin/python3 tests/bench/pytorch_train.py --model gpt2-124M -B 4 -T 64 --threads 2
  DDP over P local processes (torch.distributed gloo, 1 thread each unless --threads):
    /usr/bin/python3 tests/bench/pytorch_train.py --model gpt2-124M -B 4 -T 64 --ddp 2
  PyTorch 2.x (a virtual environment from PyPI), bf16 autocast and torch.compile:
    /work/venv-torch/bin/python tests/bench/pytorch_train.py --amp bf16 --compile 1 --threads 2
  the out-of-memory tools: activation checkpointing per block, ZeroRedundancyOptimizer:
    /work/venv-torch/bin/python tests/bench/pytorch_train.py -B 1 -T 1024 --ddp 2 --recompute 1 --zero 1
  on a GPU at its best (flash attention through SDPA, fused AdamW, bf16 autocast, compiled):
    python3 tests/bench/pytorch_train.py --device cuda --sdpa 1 --amp bf16 --compile 1 -B 8 -T 1024
    (peak_gpu_mb: torch.cuda.max_memory_reserved, what the caching allocator held)

Use Debian's python3-torch (/usr/bin/python3). OMP_WAIT_POLICY=PASSIVE is set before torch is
imported (on 2 cores PyTorch's OpenMP and OpenBLAS pools otherwise spin against each other), and
torch.set_num_threads is explicit. In DDP mode -B is per rank and tokens/s is global; peak RSS
is the largest of the ranks'.
"""
import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def _threads_from_argv():
    """--threads N, read before torch is imported: Debian's torch calls into the pthread build of
    OpenBLAS, whose own pool ignores torch.set_num_threads, so "1 thread" would still run its
    matrix products on every core unless OPENBLAS_NUM_THREADS / OMP_NUM_THREADS say so first."""
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "1"


os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = _threads_from_argv()

PRESETS = {  # n_layer, n_head, n_embd, vocab, block — proto/spec.c
    "gpt2-tiny": (2, 4, 128, 256, 128),
    "gpt2-mini": (6, 6, 384, 256, 256),
    "gpt2-124M": (12, 12, 768, 50257, 1024),
    "gpt2-355M": (24, 16, 1024, 50257, 1024),
}
# The Llama family (proto/spec.c): transformers' config keys
LLAMA_PRESETS = {
    "llama-tiny": dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       hidden_size=128, intermediate_size=352, vocab_size=256,
                       max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                       tie_word_embeddings=False),
    "smollm2-135m": dict(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         hidden_size=576, intermediate_size=1536, vocab_size=49152,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True),
    "smollm2-360m": dict(num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
                         hidden_size=960, intermediate_size=2560, vocab_size=49152,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True),
}


def build_llama(torch, nn, F, name):
    """transformers' model of a Llama preset, wrapped to take (inputs, targets) like GPT2."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(attn_implementation="sdpa", **LLAMA_PRESETS[name])
    inner = LlamaForCausalLM(cfg)

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = inner
            self.mask = torch.zeros(1)  # the GPT-2 path's attribute, unused here

        def forward(self, idx, targets):
            logits = self.m(input_ids=idx, use_cache=False).logits
            return F.cross_entropy(logits.float().view(-1, cfg.vocab_size), targets.reshape(-1))

    return Wrapped()


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2-124M", choices=sorted(PRESETS) + sorted(LLAMA_PRESETS))
    ap.add_argument("-B", "--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("-T", "--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads and OPENBLAS_NUM_THREADS (default 1)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=8, help="measured steps")
    ap.add_argument("--ddp", type=int, default=0, help="P > 0: DDP over P local processes")
    ap.add_argument("--foreach", type=int, default=0,
                    help="1: AdamW foreach implementation (no faster here, ~600 MB more RSS on 124M)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: one GPU, one process (not with --ddp)")
    ap.add_argument("--sdpa", type=int, default=0,
                    help="1: attention through F.scaled_dot_product_attention (flash on a GPU)")
    ap.add_argument("--amp", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: torch.autocast(cpu, bfloat16) around forward and loss")
    ap.add_argument("--compile", type=int, default=0,
                    help="1: torch.compile the model (PyTorch >= 2; compiled in the warmup)")
    ap.add_argument("--recompute", type=int, default=0,
                    help="1: torch.utils.checkpoint around every block (use_reentrant=False)")
    ap.add_argument("--zero", type=int, default=0,
                    help="1: ZeroRedundancyOptimizer (ZeRO-1) around AdamW (DDP only)")
    ap.add_argument("--compress", choices=["none", "bf16", "fp16"], default="none",
                    help="DDP's gradient compression hook (bf16_compress_hook, fp16_compress_hook)")
    ap.add_argument("--progress", default="",
                    help="rank 0 appends each finished step's number to this file (a benchmark "
                         "reads interface counters between steps)")
    # a DDP rank started by the launcher, or by a benchmark across network namespaces
    # (tests/bench/cluster.sh: --rank R --master HOST:PORT with --ddp WORLD)
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--master", default="", help=argparse.SUPPRESS)
    return ap.parse_args()


def build_model(torch, nn, F, cfg, recompute=False, sdpa=False):
    import torch.utils.checkpoint  # noqa: F401 (torch.utils.checkpoint.checkpoint below)
    L, NH, C, V, BLOCK = cfg

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C)
            self.c_attn = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def forward(self, x, mask):
            b, t, _ = x.shape
            hs = C // NH
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q = q.view(b, t, NH, hs).transpose(1, 2)
            k = k.view(b, t, NH, hs).transpose(1, 2)
            v = v.view(b, t, NH, hs).transpose(1, 2)
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
                att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1)
                y = att @ v
            y = y.transpose(1, 2).reshape(b, t, C)
            x = x + self.attn_proj(y)
            x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
            return x

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(BLOCK, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            # a plain attribute, not a buffer: gloo cannot broadcast bool tensors
            self.mask = ~torch.tril(torch.ones(BLOCK, BLOCK, dtype=torch.bool))
            for name, p in self.named_parameters():
                if name.endswith(".bias"):
                    nn.init.zeros_(p)
                elif "ln" in name:
                    nn.init.ones_(p)
                else:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            b, t = idx.shape
            x = self.wte(idx) + self.wpe.weight[:t]
            for blk in self.h:
                if recompute:
                    x = torch.utils.checkpoint.checkpoint(blk, x, self.mask, use_reentrant=False)
                else:
                    x = blk(x, self.mask)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
            return F.cross_entropy(logits.view(-1, V), targets.reshape(-1))

    return GPT2()


def peak_rss_mb(who=None):
    import resource as r
    return r.getrusage(who if who is not None else r.RUSAGE_SELF).ru_maxrss / 1024.0


def train(args, rank, world):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    threads = args.threads or 1
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    if args.model in LLAMA_PRESETS:
        cfg = (0, 0, 0, LLAMA_PRESETS[args.model]["vocab_size"], 0)
        model = build_llama(torch, nn, F, args.model)
    else:
        cfg = PRESETS[args.model]
        model = build_model(torch, nn, F, cfg, bool(args.recompute), bool(args.sdpa))
    cuda = args.device == "cuda"
    if cuda:
        model = model.cuda()
        model.mask = model.mask.cuda()
    n_params = sum(p.numel() for p in model.parameters())
    if world > 1:
        import torch.distributed as dist
        host, port = args.master.split(":")
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}",
                                rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's weights
        if args.compress != "none":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            hook = {"bf16": default_hooks.bf16_compress_hook,
                    "fp16": default_hooks.fp16_compress_hook}[args.compress]
            model.register_comm_hook(None, hook)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    if args.zero and world > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, lr=6e-4,
                                      betas=(0.9, 0.95), eps=1e-8, foreach=bool(args.foreach))
    else:
        opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                                **({"fused": True} if cuda else {"foreach": bool(args.foreach)}))
    fwd = torch.compile(model) if args.compile else model
    amp_dtype = torch.bfloat16 if args.amp == "bf16" else None
    gen = torch.Generator().manual_seed(args.seed + 1000 * rank)
    V, B, T = cfg[3], args.batch, args.seq
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        tok = torch.randint(0, min(V, 256), (B, T + 1), generator=gen)  # byte-level ids
        if cuda:
            tok = tok.cuda()
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=amp_dtype or torch.bfloat16,
                            enabled=amp_dtype is not None):
            loss = fwd(tok[:, :T], tok[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        dt = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(dt)
            losses.append(lv)
        if args.progress and rank == 0:
            with open(args.progress, "a") as f:
                f.write(f"{step + 1}\n")
    med = statistics.median(times)
    res = {"impl": "pytorch", "torch": torch.__version__, "model": args.model,
           "params": n_params, "B": B, "T": T, "world": world, "threads": threads,
           "amp": args.amp, "compile": args.compile, "recompute": args.recompute,
           "zero": args.zero, "compress": args.compress,
           "warmup": args.warmup, "steps": args.steps, "median_step_s": round(med, 4),
           "min_step_s": round(min(times), 4), "max_step_s": round(max(times), 4),
           "tokens_per_s": round(world * B * T / med, 1),
           "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
           "peak_rss_mb": round(peak_rss_mb(), 1), "device": args.device, "sdpa": args.sdpa,
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
           "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
           "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}
    if cuda:
        res["gpu"] = torch.cuda.get_device_name()
        res["peak_gpu_mb"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    if world > 1:
        import torch.distributed as dist
        # Step time of the slowest rank per step is what the job sees; rank 0 waits on it anyway
        # in the all-reduce, so rank 0's times already include it.
        rss = [None] * world
        dist.all_gather_object(rss, res["peak_rss_mb"])
        res["peak_rss_mb"] = max(rss)
        res["peak_rss_mb_ranks"] = rss
        dist.destroy_process_group()
    return res


def launch_ddp(args):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    base = [sys.executable, os.path.abspath(__file__), "--model", args.model,
            "-B", str(args.batch), "-T", str(args.seq), "--threads", str(args.threads or 1),
            "--warmup", str(args.warmup), "--steps", str(args.steps),
            "--foreach", str(args.foreach), "--seed", str(args.seed),
            "--amp", args.amp, "--compile", str(args.compile),
            "--recompute", str(args.recompute), "--zero", str(args.zero),
            "--compress", args.compress,
            "--ddp", str(args.ddp), "--master", f"127.0.0.1:{port}"]
    procs = []
    for r in range(args.ddp):
        out = subprocess.PIPE if r == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen(base + ["--rank", str(r)], stdout=out))
    line = procs[0].communicate()[0].decode()
    rc = max(p.wait() for p in procs)
    if rc != 0:
        sys.exit(f"pytorch_gpt2: a DDP rank failed (status {rc})")
    sys.stdout.write(line)


def main():
    args = parse_args()
    if args.device == "cuda" and args.ddp:
        sys.exit("pytorch_gpt2: --device cuda runs one process on one GPU; drop --ddp")
    if args.ddp > 0 and args.rank < 0:
        launch_ddp(args)
        return
    world = args.ddp if args.ddp > 0 else 1
    res = train(args, max(args.rank, 0), world)
    if args.rank <= 0:
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
