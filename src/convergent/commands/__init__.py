"""The commands above the library and the studies: ``train``, ``data``, ``prune``, ``bench``,
``diagnose``, ``reproduce`` and ``report``.

Together with `convergent.studies` this is the only configuration-aware code: a command takes
a config (or flags), builds data, model and optimizer through the library's plain-argument
functions, and writes a run or report folder. Each command's command line is one module here
(``train_command``, ``data_command``, ``prune_command``, ``bench_command``,
``diagnose_command``, ``reproduce``, ``report``): ``add_parser(commands)`` adds its flags and
its handler turns them into plain-argument calls; `flags` holds what they share. `runs` finds
and rebuilds the run folders that ``train`` writes; `hf_reading` loads Hugging Face
``save_pretrained`` folders for ``prune`` and ``diagnose``, `hf_folders` the data they are
measured on; `compressed` writes and reads
compressed model folders (``save_sparse``, ``load_sparse``). Library packages never import
from here.
"""

from convergent.commands.benchmark import bench, format_bench
from convergent.commands.compressed import load_sparse, save_sparse
from convergent.commands.config import TrainConfig, build_model
from convergent.commands.diagnose import diagnose
from convergent.commands.hf_reading import (
    HFFolderError,
    HFModel,
    is_hf_model_folder,
    load_hf_folder,
)
from convergent.commands.prune import prune_hf_folder, prune_run
from convergent.commands.pruned_folder import SaveOptions
from convergent.commands.pruning_report import format_prune_summary
from convergent.commands.runs import LoadedRun, find_run_folder, load_run, read_run_config
from convergent.commands.train import run_training

__all__ = [
    "HFFolderError",
    "HFModel",
    "LoadedRun",
    "SaveOptions",
    "TrainConfig",
    "bench",
    "build_model",
    "diagnose",
    "find_run_folder",
    "format_bench",
    "format_prune_summary",
    "is_hf_model_folder",
    "load_hf_folder",
    "load_run",
    "load_sparse",
    "prune_hf_folder",
    "prune_run",
    "read_run_config",
    "run_training",
    "save_sparse",
]
