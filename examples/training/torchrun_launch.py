"""torchrun, made quick to restart and to stop: `python torchrun_launch.py ARGS` takes
torchrun's own arguments (torch.distributed.run's parser and launch configuration) and runs
the same elastic agent and rendezvous, with two differences that matter to a requeued job.

- **The ranks are forked from the agent, with the training script already loaded.** Plain
  torchrun starts each rank as a new interpreter that imports torch (and the script's
  imports) again after the rendezvous: 2-3 s of CPU per rank on a 2-core node, paid on
  every restart. Here the agent loads the script (and torch._dynamo, which the first
  optimizer step would import) once, before the rendezvous, and the ranks are forked from
  it (torch elastic's function entrypoint with start method "fork"): they start at once.
  The agent computes nothing before it forks (no thread pools), which keeps fork safe.
- **Every process exits as soon as its work is done.** When Slurm requeues the job it
  signals every process of the step, and requeues only once all of them are gone (or
  KillWait has passed and it has SIGKILLed them). An interpreter holding torch takes
  seconds to tear itself down (2-4 s per process measured on a loaded 2-core node); the
  forked ranks end through multiprocessing's os._exit, and the agent exits the same way.

A rank's exit status is the script's `main(argv)` return value, as when it runs alone. The
options that need a new interpreter per rank (--no-python, --module, --no-use-env) run
plain torchrun.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
import uuid
import warnings
from types import ModuleType
from typing import Any

# The CPU wheel warns on import when numpy is absent (train.py says the same).
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from torch.distributed.elastic.multiprocessing.api import SignalException  # noqa: E402
from torch.distributed.launcher.api import elastic_launch  # noqa: E402
from torch.distributed.run import (  # noqa: E402
    config_from_args,
    get_use_env,
    parse_args,
    parse_min_max_nnodes,
)
from torch.distributed.run import run as torchrun  # noqa: E402

_script: ModuleType | None = None


def load_script(path: str) -> ModuleType:
    """Import the training script as a module (its `if __name__ == "__main__"` not run)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location("training_script", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"torchrun_launch: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def rank(*argv: str) -> int:
    """One rank, in the process forked for it: the script's main; a non-zero return is the
    process's exit status (what torch elastic reads as this rank's failure)."""
    assert _script is not None
    rc = int(_script.main(list(argv)) or 0)
    if rc:
        sys.exit(rc)
    return 0


def run(argv: list[str]) -> int:
    global _script
    args: Any = parse_args(argv)
    if args.no_python or args.module or args.run_path or not get_use_env(args):
        torchrun(args)
        return 0
    one_node_static = (
        args.rdzv_backend == "static"
        and not args.rdzv_endpoint
        and args.master_port is None
        and parse_min_max_nnodes(args.nnodes)[1] == 1
    )
    if args.standalone or one_node_static:
        # As torch.distributed.run.run: a rendezvous of its own on a free port, not the
        # static one on 29500 (two standalone jobs on a host would both take that port).
        args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500  # as torch.distributed.run.run sets it
    config, _, _ = config_from_args(args)
    config.start_method = "fork"
    _script = load_script(args.training_script)
    import torch._dynamo  # noqa: F401  # what a first optimizer step imports, 0.5-1 s

    elastic_launch(config=config, entrypoint=rank)(*args.training_script_args)
    return 0


def main() -> int:
    try:
        return run(sys.argv[1:])
    except SignalException as e:  # the agent stopped its workers on this signal
        print(f"torchrun: stopped on signal {e.sigval}", file=sys.stderr)
        return 128 + int(e.sigval)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001  # torchrun's own errors (a failed rank): say them
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
