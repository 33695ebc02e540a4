#!/usr/bin/env python3
"""Rewrites kernels/cuda/flash_attention.cu into host C++ that runs on the CPU emulator (shim.h).

    transform.py KERNEL.cu KCUDA.cuh OUT.cpp

Run by meson at build time on the file in the tree, so the test checks whatever the kernel is
now, never a copy. What it rewrites, and nothing else:
  - the kernel's own tile header (flash_tiles.cuh, beside it) is inlined where it is included,
    under #line directives, and rewritten with the kernel;
  - the CUDA includes (cuda_bf16.h, cuda_fp16.h, kcuda.cuh) become one #include "shim.h";
  - each inline-PTX asm statement becomes a call of the emulator, generated from the statement's
    own operand lists (so a swapped operand in the kernel is a swapped operand here); only the
    instructions in INSTRUCTIONS are known;
  - `extern __shared__ ... name[];` becomes a pointer to the block's dynamic shared memory;
  - kernel<<<grid, block, smem, stream>>>(args) becomes emu_launch(kernel, grid, ..., args);
  - the __device__ helpers of kcuda.cuh that the kernel calls (ddp__warp_sum) are copied in
    from that header, so they are tested too.
Line numbers are kept (a rewritten statement keeps its newlines) and a #line directive names
the kernel file, so compiler errors and sanitizer reports point into flash_attention.cu.

It fails (exit 1, a message naming the reason) rather than emit something that tests less than
it seems to: an unknown include or asm instruction, a static __shared__ array (each emulated
thread would get its own), __CUDA_ARCH__ (the host build would take the other branch), or a
count of asm statements or launches other than EXPECTED_*. When the kernel legitimately gains
one, review that the emulator models it (shim.h, shim.cpp), then update the count here.
"""
import os
import re
import sys

# Inline-PTX statements and kernel launches in flash_attention.cu as reviewed (2 mma.sync, one
# per 16-bit type; 2 ldmatrix, plain and .trans; 4 cp.async: 16 and 4 bytes, commit_group,
# wait_group; launches: the flash kernels through one fa_launch, and fa_rowdot_kernel).
EXPECTED_ASM = 8
EXPECTED_LAUNCHES = 2

# PTX instruction -> (emulator function, operand group sizes, extra argument)
INSTRUCTIONS = {
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32": ("mma", (4, 4, 2, 4), "EMU_BF16"),
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32": ("mma", (4, 4, 2, 4), "EMU_F16"),
    "ldmatrix.sync.aligned.m8n8.x4.shared.b16": ("ldsm", (4, 1), "false"),
    "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16": ("ldsm", (4, 1), "true"),
    "cp.async.cg.shared.global": ("cp_async", (1, 1, 1, 1), "16"),
    "cp.async.ca.shared.global": ("cp_async", (1, 1, 1, 1), "4"),
    "cp.async.commit_group": ("cp_commit", (), ""),
    "cp.async.wait_group": ("cp_wait", (1,), ""),
}

# include line -> replacement (None: the line goes; the shim stands in for it)
INCLUDES = {
    "<cuda_bf16.h>": None,
    "<cuda_fp16.h>": None,
    '"kernels/cuda/kcuda.cuh"': None,
    "<string.h>": "<string.h>",
    "<stdint.h>": "<stdint.h>",
}

# headers of the kernel's own, inlined (looked up beside the kernel file)
INLINED = ('"kernels/cuda/flash_tiles.cuh"',)


class Mismatch(Exception):
    """The kernel no longer has the shape this transform was written for."""


def line_of(src, pos):
    return src.count("\n", 0, pos) + 1


def skip_string(src, i):
    """Index just past the string or character literal that starts at src[i]."""
    quote = src[i]
    i += 1
    while src[i] != quote:
        i += 2 if src[i] == "\\" else 1
    return i + 1


def matching(src, i, open_ch, close_ch):
    """Index of the bracket closing the one at src[i], skipping literals."""
    depth = 0
    while i < len(src):
        c = src[i]
        if c in "\"'":
            i = skip_string(src, i)
            continue
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise Mismatch("unbalanced %s" % open_ch)


def split_top(text, sep):
    """Splits text at `sep` outside brackets and literals."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c in "\"'":
            i = skip_string(text, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def keep_lines(replacement, original):
    """The replacement on one line, then as many newlines as the original had."""
    return re.sub(r"\s*\n\s*", " ", replacement) + "\n" * original.count("\n")


# ---- asm statements ----

def parse_operands(text):
    """'"+f"(c[0]), "r"(b0)' -> [("+f", "c[0]"), ("r", "b0")]"""
    ops = []
    for item in split_top(text, ",") if text.strip() else []:
        m = re.fullmatch(r'"([^"]*)"\s*\((.*)\)', item, re.S)
        if not m:
            raise Mismatch("asm operand not understood: %s" % item)
        ops.append((m.group(1), m.group(2).strip()))
    return ops


def asm_call(body, where):
    """The emulator call for one asm statement's body (the text between its parentheses)."""
    sections = split_top(body, ":") + ["", ""]  # basic asm or no inputs: empty lists
    template = "".join(bytes(s, "utf-8").decode("unicode_escape")
                       for s in re.findall(r'"((?:[^"\\]|\\.)*)"', sections[0]))
    outputs, inputs = parse_operands(sections[1]), parse_operands(sections[2])
    operands = outputs + inputs
    insns = [s.strip() for s in template.split(";") if s.strip()]
    if len(insns) != 1:
        raise Mismatch("%s: an asm statement must hold one instruction, not %d"
                       % (where, len(insns)))
    m = re.fullmatch(r"([\w.]+)(?:\s+(.*))?", insns[0], re.S)
    if not m or m.group(1) not in INSTRUCTIONS:
        raise Mismatch("%s: PTX instruction '%s' is not emulated (known: %s)"
                       % (where, insns[0].split()[0], ", ".join(INSTRUCTIONS)))
    kind, sizes, extra = INSTRUCTIONS[m.group(1)]
    groups = []
    for g in split_top(m.group(2), ",") if m.group(2) else []:
        inner = re.fullmatch(r"[{\[](.*)[}\]]", g, re.S)
        groups.append(split_top(inner.group(1), ",") if inner else [g])
    if tuple(len(g) for g in groups) != sizes:
        raise Mismatch("%s: %s with operand groups %s, expected sizes %s"
                       % (where, m.group(1), groups, sizes))

    def operand(ref, allowed):
        mm = re.fullmatch(r"%(\d+)", ref)
        if not mm or int(mm.group(1)) >= len(operands):
            raise Mismatch("%s: operand %s is not a %%N of the statement" % (where, ref))
        constraint, expr = operands[int(mm.group(1))]
        if constraint not in allowed:
            raise Mismatch("%s: operand %s has constraint \"%s\", expected one of %s"
                           % (where, ref, constraint, allowed))
        return "(" + expr + ")"

    if kind == "mma":
        d = [operand(r, ("=f", "+f")) for r in groups[0]]
        a = [operand(r, ("r",)) for r in groups[1]]
        b = [operand(r, ("r",)) for r in groups[2]]
        c = [operand(r, ("f", "+f")) for r in groups[3]]
        return ("{ const uint32_t emu_a[4] = {%s}; const uint32_t emu_b[2] = {%s}; "
                "const float emu_c[4] = {%s}; float emu_d[4]; "
                "emu_mma_m16n8k16(emu_d, emu_a, emu_b, emu_c, %s); %s }"
                % (", ".join(a), ", ".join(b), ", ".join(c), extra,
                   " ".join("%s = emu_d[%d];" % (x, i) for i, x in enumerate(d))))
    if kind == "cp_async":
        if groups[2] != [extra]:
            raise Mismatch("%s: %s copies %s bytes, the emulator was written for %s"
                           % (where, m.group(1), groups[2][0], extra))
        return ("emu_cp_async((uint32_t)%s, %s, %s, %s);"
                % (operand(groups[0][0], ("r",)), operand(groups[1][0], ("l",)), extra,
                   operand(groups[3][0], ("r",))))
    if kind == "cp_commit":
        return "emu_cp_async_commit();"
    if kind == "cp_wait":
        return "emu_cp_async_wait(%s);" % operand(groups[0][0], ("n",))
    d = [operand(r, ("=r",)) for r in groups[0]]
    addr = operand(groups[1][0], ("r",))
    return ("{ uint32_t emu_d[4]; emu_ldmatrix_x4(emu_d, %s, %s); %s }"
            % (addr, extra, " ".join("%s = emu_d[%d];" % (x, i) for i, x in enumerate(d))))


def rewrite_asm(src):
    out, pos, count = [], 0, 0
    for m in re.finditer(r"\basm\b(\s+volatile)?\s*\(", src):
        if m.start() < pos:
            continue
        close = matching(src, m.end() - 1, "(", ")")
        semi = re.compile(r"\s*;").match(src, close + 1)
        if not semi:
            raise Mismatch("line %d: asm statement not followed by ';'" % line_of(src, m.start()))
        call = asm_call(src[m.end():close], "line %d" % line_of(src, m.start()))
        out += [src[pos:m.start()], keep_lines(call, src[m.start():semi.end()])]
        pos = semi.end()
        count += 1
    out.append(src[pos:])
    return "".join(out), count


# ---- launches ----

def rewrite_launches(src):
    out, pos, count = [], 0, 0
    for m in re.finditer(r"<<<", src):
        if m.start() < pos:
            continue
        where = "line %d" % line_of(src, m.start())
        stmt_start = max(src.rfind(c, 0, m.start()) for c in ";{}") + 1
        kernel = src[stmt_start:m.start()].strip()
        if not re.fullmatch(r"[\w:]+(<[^;{}]*>)?", kernel):
            raise Mismatch("%s: launch of '%s' not understood" % (where, kernel))
        cfg_end = src.find(">>>", m.end())
        paren = re.compile(r"\s*\(").match(src, cfg_end + 3) if cfg_end >= 0 else None
        if not paren:
            raise Mismatch("%s: launch without >>>(...)" % where)
        close = matching(src, paren.end() - 1, "(", ")")
        semi = re.compile(r"\s*;").match(src, close + 1)
        cfg = split_top(src[m.end():cfg_end], ",")
        if not semi or not 2 <= len(cfg) <= 4:
            raise Mismatch("%s: launch configuration not understood" % where)
        cfg += ["0", "nullptr"][len(cfg) - 2:]
        args = src[paren.end():close].strip()
        call = "emu_launch(%s, %s%s);" % (kernel, ", ".join(cfg), ", " + args if args else "")
        leading = src[stmt_start:m.start()]
        lead_ws = leading[:len(leading) - len(leading.lstrip())]
        out += [src[pos:stmt_start], lead_ws, keep_lines(call, src[m.start():semi.end()])]
        pos = semi.end()
        count += 1
    out.append(src[pos:])
    return "".join(out), count


# ---- shared memory, includes, guards ----

def rewrite_shared(src):
    pat = re.compile(r"extern\s+__shared__\s+(__align__\(\s*\d+\s*\)\s+)?unsigned\s+char\s+"
                     r"(\w+)\s*\[\s*\]\s*;")
    src, n = pat.subn(lambda m: "unsigned char *const %s = emu_dynamic_smem();" % m.group(2), src)
    stray = re.search(r"\b__shared__\b", src)
    if stray:
        raise Mismatch("line %d: a __shared__ declaration other than 'extern __shared__ unsigned "
                       "char name[]' (static shared arrays are not emulated: each emulated "
                       "thread would get its own copy)" % line_of(src, stray.start()))
    return src, n


def rewrite_includes(src):
    def repl(m):
        name = m.group(1).strip()
        if name not in INCLUDES:
            raise Mismatch("line %d: #include %s is not known to the emulator (shim.h must "
                           "provide what it declares)" % (line_of(src, m.start()), name))
        return "#include %s" % INCLUDES[name] if INCLUDES[name] else ""
    return re.sub(r"^[ \t]*#[ \t]*include[ \t]+(\S+)[^\n]*", repl, src, flags=re.M)


def device_helpers(kernel_src, header_src, header_path):
    """The __device__ function definitions of the header that the kernel uses (transitively),
    in header order, each under a #line directive."""
    defs = {}
    pat = re.compile(r"^(template\s*<[^>]*>\s*)?[\w ]*__device__[^;{(]*?\b(ddp__\w+)\s*\(", re.M)
    for m in pat.finditer(header_src):
        brace = header_src.find("{", m.end())
        end = matching(header_src, brace, "{", "}")
        defs[m.group(2)] = (m.start(), header_src[m.start():end + 1])
    wanted, todo = set(), set(re.findall(r"\bddp__\w+", kernel_src)) & set(defs)
    while todo:
        name = todo.pop()
        wanted.add(name)
        todo |= (set(re.findall(r"\bddp__\w+", defs[name][1])) & set(defs)) - wanted
    return "".join('#line %d "%s"\n%s\n'
                   % (line_of(header_src, defs[n][0]), header_path, defs[n][1])
                   for n in sorted(wanted, key=lambda n: defs[n][0]))


def inline_headers(src, kernel_path):
    """src with each #include of INLINED replaced by that header's text, between #line
    directives that name the header and then the kernel file again."""
    def repl(m):
        name = m.group(1).strip()
        if name not in INLINED:
            return m.group(0)
        path = os.path.join(os.path.dirname(kernel_path), os.path.basename(name.strip('"')))
        return '#line 1 "%s"\n%s\n#line %d "%s"' % (path, open(path).read(),
                                                     line_of(src, m.start()) + 1, kernel_path)
    return re.sub(r"^[ \t]*#[ \t]*include[ \t]+(\S+)[^\n]*", repl, src, flags=re.M)


def transform(kernel_path, header_path):
    src = inline_headers(open(kernel_path).read(), kernel_path)
    header = open(header_path).read()
    for guard in ("__CUDA_ARCH__", "__CUDACC__"):
        if guard in src:
            raise Mismatch("%s is tested: the host build would compile the other branch" % guard)
    src = rewrite_includes(src)
    src, n_asm = rewrite_asm(src)
    if n_asm != EXPECTED_ASM:
        raise Mismatch("%d asm statements, the emulator was reviewed for %d (EXPECTED_ASM)"
                       % (n_asm, EXPECTED_ASM))
    src, n_launch = rewrite_launches(src)
    if n_launch != EXPECTED_LAUNCHES:
        raise Mismatch("%d kernel launches, the emulator was reviewed for %d (EXPECTED_LAUNCHES)"
                       % (n_launch, EXPECTED_LAUNCHES))
    src, n_smem = rewrite_shared(src)
    if n_smem == 0:
        raise Mismatch("no 'extern __shared__' array: the kernels no longer stage tiles?")
    for left in (r"\basm\b\s*(volatile\s*)?\(", "<<<", ">>>"):
        if re.search(left, src):
            raise Mismatch("'%s' left after the rewrite" % left)
    return ("/* Generated by tests/unit/kernels_cuda/emu/transform.py from %s: do not edit. */\n"
            '#include "shim.h"\n%s#line 1 "%s"\n%s'
            % (kernel_path, device_helpers(src, header, header_path), kernel_path, src))


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: transform.py KERNEL.cu KCUDA.cuh OUT.cpp")
    try:
        text = transform(sys.argv[1], sys.argv[2])
    except Mismatch as e:
        sys.exit("transform.py: %s: %s\n  The CPU emulation of the CUDA kernels "
                 "(tests/unit/kernels_cuda/emu) must be updated with the kernel."
                 % (sys.argv[1], e))
    with open(sys.argv[3], "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
