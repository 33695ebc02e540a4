"""The matrix products of one GPT-2 124M step at B=8 T=1024 in PyTorch (bf16), beside
tests/gpu/gemm_shapes (ddpd's cuBLASLt set-up): what PyTorch's autocast runs for each linear
layer (addmm with the bias; the input gradient; the weight gradient in bf16, as autocast
computes it before adding it to the fp32 .grad) and for the LM head over all 8,192 rows at
once (logits [8192, 50257]). Random bf16 operands, CUDA events around each of 20 runs after 3
warm-ups, medians; the step's total at the end. Then causal attention as PyTorch runs it
(scaled_dot_product_attention, its flash kernel, B = N / 1024, 12 heads of 64, T = 1024),
forward and forward + backward: the reference for ddpd's attention_fwd/_bwd rows of the
per-op profile (FLOPs counted as there: 2 B NH T^2 hs forward, 2.5 times that backward).

    python3 gemm_shapes.py [N tokens (8192)]
"""
import sys

import torch


def median_ms(fn):
    times = []
    for r in range(23):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if r >= 3:
            times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    c, qkv, fh, v = 768, 2304, 3072, 50257
    dev, bf = "cuda", torch.bfloat16

    def r(*shape):
        return torch.rand(*shape, device=dev, dtype=bf) * 2 - 1

    layers = [("qkv", c, qkv), ("attn proj", c, c), ("fc", c, fh), ("fc proj", fh, c)]
    rows = []
    for name, k_in, k_out in layers:  # x [n, k_in] @ W [k_in, k_out] (+ b), 12 a step
        x, w, b, dy = r(n, k_in), r(k_in, k_out), r(k_out), r(n, k_out)
        fl = 2 * n * k_in * k_out  # (default arguments: each lambda keeps its own tensors)
        rows.append((name + " fwd", 12, fl, lambda x=x, w=w, b=b: torch.addmm(b, x, w)))
        rows.append((name + " dinp", 12, fl, lambda w=w, dy=dy: dy @ w.t()))
        rows.append((name + " dweight", 12, fl, lambda x=x, dy=dy: x.t() @ dy))
    x, wte, dy = r(n, c), r(v, c), r(n, v)
    rows.append(("lm head fwd", 1, 2 * n * c * v, lambda: x @ wte.t()))
    rows.append(("lm head dinp", 1, 2 * n * c * v, lambda: dy @ wte))
    rows.append(("lm head dweight", 1, 2 * n * c * v, lambda: dy.t() @ x))
    total, flops = 0.0, 0.0
    print(f"{'product':22} {'calls':>5} {'ms':>9} {'TFLOP/s':>8}   "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__})")
    for name, calls, fl, fn in rows:
        ms = median_ms(fn)
        total += calls * ms
        flops += calls * fl
        print(f"{name:22} {calls:5d} {ms:9.4f} {fl / (ms * 1e9):8.1f}")
    print(f"step (N {n}): {flops / 1e9:.1f} GFLOP in {total:.3f} ms "
          f"({flops / (total * 1e9):.0f} TFLOP/s)")

    t, nh, hs = 1024, 12, 64
    bsz = max(1, n // t)
    q, k, vv = (r(bsz, nh, t, hs).requires_grad_() for _ in range(3))
    dout = r(bsz, nh, t, hs)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    fwd = median_ms(lambda: sdpa(q, k, vv, is_causal=True))
    both = median_ms(lambda: sdpa(q, k, vv, is_causal=True).backward(dout))
    fl = 2 * bsz * nh * t * t * hs
    print(f"attention B {bsz} x {nh} heads x {hs}, T {t} (a layer): fwd {fwd:.4f} ms "
          f"({fl / (fwd * 1e9):.0f} TFLOP/s), bwd {both - fwd:.4f} ms "
          f"({2.5 * fl / ((both - fwd) * 1e9):.0f} TFLOP/s); 12 layers: {12 * both:.2f} ms")


if __name__ == "__main__":
    main()
