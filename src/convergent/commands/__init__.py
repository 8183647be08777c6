"""The commands above the library: ``train``, ``diagnose`` and ``prune``.

Together with `convergent.studies` this is the only configuration-aware code: a command takes
a config (or flags), builds data, model and optimizer through the library's plain-argument
functions, and writes a run or report folder. `runs` finds and rebuilds the run folders that
``train`` writes. Library packages never import from here.
"""

from .config import TrainConfig, build_model
from .diagnose import diagnose
from .prune import format_prune_summary, prune_run
from .runs import LoadedRun, find_run_folder, load_run, read_run_config
from .train import run_training

__all__ = [
    "LoadedRun",
    "TrainConfig",
    "build_model",
    "diagnose",
    "find_run_folder",
    "format_prune_summary",
    "load_run",
    "prune_run",
    "read_run_config",
    "run_training",
]
