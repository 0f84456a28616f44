"""`distil plan CONFIG [overrides]`: the argparse wiring of the planner."""

from __future__ import annotations

import json


def add_plan(sub, positive_int) -> None:
    p = sub.add_parser(
        "plan",
        help="memory and time of a run's step, per device and phase, before it runs",
        description="Plan a run without loading weights (models are built on the meta device "
        "from config.json): per device and per phase (generation, teacher scoring, student "
        "forward/backward + loss, optimizer step, eval) the peak memory and its terms, whether "
        "it fits, the overrides that would make it fit, and the FLOPs and time of a step at "
        "the device's peak. docs/memory.md explains how to read it.",
    )
    p.add_argument("config", help="YAML config (see configs/) or a run directory")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, as for distil train")
    p.add_argument("--device", default="h100", choices=["h100", "h200", "cpu"],
                   help="device preset (default h100; cpu measures this host briefly)")  # fmt: skip
    p.add_argument("--gpu-memory", default=None, metavar="SIZE",
                   help="memory of one device, e.g. 80GiB or 141GB (default: the preset's)")  # fmt: skip
    p.add_argument("--gpus", type=positive_int, default=1, help="devices (ranks) of the run")
    p.add_argument("--fsdp", action="store_true",
                   help="the student sharded over --gpus (an FSDP accelerate launch)")  # fmt: skip
    p.add_argument("--tflops", type=float, default=None, help="peak TFLOP/s to time with")
    p.add_argument("--bandwidth", type=float, default=None, help="memory bandwidth in bytes/s")
    p.add_argument("--context-tokens", type=int, default=None, metavar="N",
                   help="tokens teacher.context/system add to each teacher sequence (default: "
                   "measured on the first rows of data.train)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object (bytes)")
    p.set_defaults(func=run_plan)


def run_plan(args) -> int:
    from distil.plan import as_dict, plan, render

    planned = plan(
        args.config,
        args.overrides,
        device=args.device,
        gpus=args.gpus,
        fsdp=args.fsdp,
        gpu_memory=args.gpu_memory,
        tflops=args.tflops,
        bandwidth=args.bandwidth,
        context_tokens=args.context_tokens,
    )
    print(json.dumps(as_dict(planned), indent=1) if args.json else render(planned))
    return 0
