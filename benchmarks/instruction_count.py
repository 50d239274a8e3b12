"""Count the SASS instructions of a gatednorm kernel without a GPU.

Compiles the forward, backward or FP8-output (``--pass quantized --scale-kind N``) tile kernel
for sm_90 with the ptxas and nvdisasm that ship
in Triton's wheel and prints the instruction count by opcode, for the whole kernel or only the
body of its main loop (``--loop-only``: the backward's per-tile row loop, one iteration). On the
H200 the backward is issue-bound, and the loop body's count tracked the measured kernel time
(docs/perf-notes.md, variants 13-14), so a kernel change can be judged here before a GPU run::

    python benchmarks/instruction_count.py --pass bwd --leading-dims 2 --loop-only
    python benchmarks/instruction_count.py --pass quantized --scale-kind 0   # 1x128, fp32 scales

The FP8-output forward is issue-bound on the H200 too: divide the count by the tile's elements
(``--block-rows`` x ``--block-n``, 16 x 128 for GDN's heads) for instructions an element.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # compile, do not interpret

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from gatednorm.kernels import backward, forward  # noqa: E402
from gatednorm.quantize import kernels as quantized  # noqa: E402
from gatednorm.quantize import launch as quantized_launch  # noqa: E402

TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_for_sm90(kernel, pointer_types: dict, constexprs: dict, num_warps: int,
                     maxnreg: int | None = None):
    """Compile ``kernel``: pointers as given, every other runtime argument i32 (fp32 for eps),
    pointers and group_size specialized as multiples of 16, as the launcher's calls are;
    ``maxnreg`` caps the registers a thread, as the launch option does."""
    signature, attrs = {}, {}
    for index, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        signature[name] = pointer_types.get(name, "fp32" if name == "eps" else "i32")
        if signature[name].startswith("*") or name == "group_size":
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps,
                                       **(dict(maxnreg=maxnreg) if maxnreg else {})))


def disassemble(compiled) -> tuple[list[str], str]:
    """(SASS lines with labels, the resource-usage line) of a compiled kernel."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "kernel.cubin")
        with open(path, "wb") as handle:
            handle.write(compiled.asm["cubin"])
        sass = subprocess.run([os.path.join(TOOLS, "nvdisasm"), "-c", path],
                              capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "-res-usage", path],
                               capture_output=True, text=True, check=True).stdout
    usage_line = " ".join(line.strip() for line in usage.splitlines() if "REG" in line)
    return sass.splitlines(), usage_line


def main_loop(lines: list[str]) -> list[str]:
    """The longest span from a label to a later branch back to it."""
    labels = {line.strip().rstrip(":"): i for i, line in enumerate(lines)
              if line.strip().startswith(".L_x_")}
    best = None
    for i, line in enumerate(lines):
        match = re.search(r"BRA\s+`?\(?(\.L_x_\d+)", line)
        if match and labels.get(match.group(1), i) < i:
            start = labels[match.group(1)]
            if best is None or i - start > best[1] - best[0]:
                best = (start, i)
    return lines[best[0]:best[1] + 1] if best else lines


def opcode_counts(lines: list[str]) -> collections.Counter:
    counts = collections.Counter()
    for line in lines:
        match = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if match:
            counts[match.group(2).split(".")[0]] += 1
    return counts


def loads_before_first_shuffle(lines: list[str]) -> tuple[int, int]:
    """(global loads issued before the kernel's first SHFL, all its global loads). In a
    one-tile kernel the first shuffle starts the first row reduction: a load issued after it
    waits for that reduction, and its memory round trip adds to the program's. ptxas sinks
    loads this way where it aims at few registers (``--maxnreg`` moves them)."""
    early = total = 0
    seen_shuffle = False
    for line in lines:
        if re.search(r"\bSHFL\.", line):
            seen_shuffle = True
        if re.search(r"\bLDG\.", line):
            total += 1
            early += not seen_shuffle
    return early, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pass", dest="pass_", choices=("fwd", "bwd", "quantized"),
                        default="bwd")
    parser.add_argument("--leading-dims", type=int, default=1, choices=(1, 2, 3),
                        help="2: a gate sliced from a projection output")
    parser.add_argument("--block-rows", type=int)
    parser.add_argument("--block-n", type=int, default=128)
    parser.add_argument("--warps", type=int)
    parser.add_argument("--stages", type=int, default=3,
                        help="pipelining depth of the backward's and the forward row loop's loop")
    parser.add_argument("--rounding", type=int, default=0, help="0 te, 1 fp32, 2 hf")
    parser.add_argument("--gate-first", action="store_true")
    parser.add_argument("--loop-only", action="store_true")
    parser.add_argument("--separate-rows", action="store_true",
                        help="every tensor computes its own row offsets (*_ROWS_AS_X off); by "
                             "default all share x's, but a sliced gate (--leading-dims 2)")
    parser.add_argument("--store-rstd", action="store_true",
                        help="forward: the training forward (rstd stored)")
    parser.add_argument("--no-ptx", action="store_true",
                        help="forward and quantized: store rstd (and scales) with tl.store, as under "
                             "torch.compile")
    parser.add_argument("--tail-n", type=int, default=0,
                        help="a tail tile of this many columns after --block-n "
                             "(a group held as head + tail, config.head_and_tail)")
    parser.add_argument("--row-loop", action="store_true",
                        help="forward: the row-loop kernel (prefetching --stages deep)")
    parser.add_argument("--split-pass", type=int, default=0, choices=(0, 1, 2),
                        help="backward: 0 whole groups, 1 row dot products, 2 dx / dgate of "
                             "a group cut into column blocks (backward.SPLIT_PASS)")
    parser.add_argument("--vector-elements", type=int, default=8, choices=(1, 2, 4, 8),
                        help="the ROW_ALIGN hint: loads and stores this many elements wide "
                             "(LaunchConfig.max_vector_elements)")
    parser.add_argument("--scale-kind", type=int, default=0, choices=range(5),
                        help="quantized: 0 1x128 fp32 scales, 1 1x128 power-of-two, 2 MXFP8, "
                             "3 per-tensor given scale, 4 per-tensor current scaling")
    parser.add_argument("--fp32-y", action="store_true",
                        help="quantized: quantize y before its rounding to x's dtype")
    parser.add_argument("--maxnreg", type=int,
                        help="cap the registers a thread (the launch option), to see what a "
                             "cap costs in instructions and spills (STACK in the usage line); "
                             "0: ptxas's own choice. Default: the launcher's (the FP8 "
                             "forward caps GDN's tile for some scale kinds)")
    parser.add_argument("--dump", help="write the counted SASS lines here")
    args = parser.parse_args()

    flags = dict(LEADING_DIMS=args.leading_dims, ROW_ALIGN=args.vector_elements, HAS_WEIGHT=True,
                 ZERO_CENTERED=False, ACTIVATION=0, NORM_BEFORE_GATE=not args.gate_first,
                 ROUNDING=args.rounding, WEIGHT_PRODUCT_ROUNDED=args.rounding == 2)
    as_x = not args.separate_rows
    gate_as_x = as_x and args.leading_dims == 1
    if args.pass_ == "bwd":
        pointers = {name: "*bf16" for name in ("X", "GATE", "W", "DY", "DX", "DGATE")}
        pointers.update(RSTD="*fp32", DW_PARTIAL="*fp32", ROW_DOTS="*fp32")
        compiled = compile_for_sm90(
            backward.backward_tile_kernel, pointers,
            dict(flags, BLOCK_ROWS=args.block_rows or 4, BLOCK_N=args.block_n,
                 TAIL_N=args.tail_n, LOOP_STAGES=args.stages, GATE_ROWS_AS_X=gate_as_x,
                 DY_ROWS_AS_X=as_x, DX_ROWS_AS_X=as_x, DGATE_ROWS_AS_X=as_x,
                 SPLIT_PASS=args.split_pass,
                 DOT_BLOCKS=4 if args.split_pass else 1,
                 WAIT_FOR_PRIOR_GRID=False), args.warps or 1, args.maxnreg)
    elif args.pass_ == "quantized":
        mxfp8 = args.scale_kind == 2
        if args.maxnreg is None:
            tiling = quantized_launch.Tiling(args.block_rows or 16, args.block_n, args.tail_n, 1,
                                             args.warps or 4, 0)
            args.maxnreg = quantized_launch.rowwise_launch(tiling, args.scale_kind).get("maxnreg")
        pointers = {name: "*bf16" for name in ("X", "GATE", "W")}
        pointers.update(Q="*u8", SCALE="*i32" if mxfp8 else "*fp32", RSTD="*fp32",
                        TENSOR_SCALE="*fp32", AMAX="*fp32")
        compiled = compile_for_sm90(
            quantized.quantized_forward_kernel, pointers,
            dict(flags, BLOCK_ROWS=args.block_rows or 16, BLOCK_N=args.block_n,
                 TAIL_N=args.tail_n, GROUPS_PER_TILE=1, QUANT_BLOCK=32 if mxfp8 else 128,
                 SCALE_KIND=args.scale_kind, SWIZZLED=False,
                 SCALE_WORDS=mxfp8 and args.block_n % 128 == 0, ROUND_Y=not args.fp32_y,
                 STORE_RSTD=args.store_rstd, AMAX_ONLY=False, STORES_BY_PTX=not args.no_ptx),
            args.warps or 4, args.maxnreg)
    else:
        pointers = {name: "*bf16" for name in ("X", "GATE", "W", "Y")}
        pointers.update(RSTD="*fp32")
        tile = dict(flags, BLOCK_ROWS=args.block_rows or 16, BLOCK_N=args.block_n,
                    TAIL_N=args.tail_n, STORE_RSTD=args.store_rstd)
        if args.row_loop:
            compiled = compile_for_sm90(forward.forward_row_loop_kernel, pointers,
                                        dict(tile, LOOP_STAGES=args.stages), args.warps or 4,
                                        args.maxnreg)
        else:
            compiled = compile_for_sm90(
                forward.forward_tile_kernel, pointers,
                dict(tile, RSTD_BY_PTX=not args.no_ptx, GATE_ROWS_AS_X=gate_as_x,
                     Y_ROWS_AS_X=as_x), args.warps or 4, args.maxnreg)
    lines, usage = disassemble(compiled)
    if args.loop_only:
        lines = main_loop(lines)
    counts = opcode_counts(lines)
    print(usage)
    print(f"instructions: {sum(counts.values())}" + (" (main loop body)" if args.loop_only else ""))
    print(", ".join(f"{op} {n}" for op, n in counts.most_common()))
    if not args.loop_only:
        early, total = loads_before_first_shuffle(lines)
        print(f"global loads issued before the first shuffle: {early} of {total}")
    if args.dump:
        with open(args.dump, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
