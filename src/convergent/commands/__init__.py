"""The commands above the library: ``train``, ``diagnose`` and ``prune``.

Together with `convergent.studies` this is the only configuration-aware code: a command takes
a config (or flags), builds data, model and optimizer through the library's plain-argument
functions, and writes a run or report folder. `runs` finds and rebuilds the run folders that
``train`` writes; `hf_folders` loads Hugging Face ``save_pretrained`` folders for ``prune`` and
``diagnose``. Library packages never import from here.
"""

from convergent.commands.config import TrainConfig, build_model
from convergent.commands.diagnose import diagnose
from convergent.commands.hf_folders import (
    HFFolderError,
    HFModel,
    is_hf_model_folder,
    load_hf_folder,
)
from convergent.commands.prune import prune_hf_folder, prune_run
from convergent.commands.pruning_report import format_prune_summary
from convergent.commands.runs import LoadedRun, find_run_folder, load_run, read_run_config
from convergent.commands.train import run_training

__all__ = [
    "HFFolderError",
    "HFModel",
    "LoadedRun",
    "TrainConfig",
    "build_model",
    "diagnose",
    "find_run_folder",
    "format_prune_summary",
    "is_hf_model_folder",
    "load_hf_folder",
    "load_run",
    "prune_hf_folder",
    "prune_run",
    "read_run_config",
    "run_training",
]
