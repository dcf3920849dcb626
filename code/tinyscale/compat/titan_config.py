# --8<-- [start:assets]
"""torchtitan configs for this course: Python functions, as torchtitan 0.3.0 wants them.

    torchrun --nproc-per-node 2 code/scripts/torchtitan_train.py \\
        --module tinyscale.compat.titan_config --config tinyscale_debug

`--module` names a Python module and `--config` one of its functions; the function
returns a Trainer.Config, and flags such as `--training.steps 20` override its fields.
Ours starts from torchtitan's own llama3 debug model and changes only what a laptop
needs: our tokenizer and corpus (its wheel ships neither; nothing is downloaded), short
sequences, a few steps, no activation checkpointing, a fixed seed, and on a machine
without a GPU float32 compute instead of bf16.
"""

import json
import os
from pathlib import Path

from torchtitan.components.quantization.float8 import Float8LinearConverter
from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel
from torchtitan.models.llama3 import model_registry as llama3_registry
from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.tools.utils import has_cuda_capability
from torchtitan.trainer import Trainer

from tinyscale.compat.titan_compat import needs_patches
from tinyscale.core.data import EOT, load_corpus, train_tokenizer

ASSETS = Path("runs/torchtitan/assets")  # made by prepare_assets(), not committed
VOCAB_SIZE = 512  # our BPE tokenizer; the debug model's 2,048 embeddings cover it


def prepare_assets(out: Path = ASSETS) -> Path:
    """Write our tokenizer as Hugging Face files and our corpus as JSON lines, once.

    Every rank calls this at start, at the same time: each file is written under a name
    of its own process and renamed into place, so a reader never sees half a file.
    """
    tokenizer_dir, corpus_dir = out / "tokenizer", out / "corpus"
    if (corpus_dir / "train.jsonl").is_file():  # the last file written: all are there
        return out
    documents = load_corpus()  # the Python standard library's sources, shipped with Python
    special = {"eos_token": EOT, "bos_token": EOT, "add_bos_token": False, "add_eos_token": True}
    files = {
        tokenizer_dir / "tokenizer.json": train_tokenizer(documents, VOCAB_SIZE).to_str(),
        tokenizer_dir / "tokenizer_config.json": json.dumps(special),
        corpus_dir / "train.jsonl": "".join(json.dumps({"text": d}) + "\n" for d in documents),
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic: the old name, or the whole new file
    return out


# --8<-- [end:assets]


# --8<-- [start:config]
def tinyscale_debug() -> Trainer.Config:
    """llama3's debug model (6 layers, dim 256) on our data, sized for two CPU processes."""
    assets = prepare_assets()
    config = llama3_debugmodel()
    config.hf_assets_path = str(assets / "tokenizer")  # tokenizer.json + tokenizer_config.json
    config.dataloader.dataset_path = str(assets / "corpus")  # read by the "c4_test" loader
    config.training.seq_len = 128
    config.training.local_batch_size = 2
    config.training.steps = 6
    config.lr_scheduler.warmup_steps = 2
    config.parallelism.data_parallel_shard_degree = -1  # FSDP over every rank
    config.activation_checkpoint = None  # = activation-checkpoint:none on the command line
    if needs_patches():  # no GPU: compute in fp32, not torchtitan's default bf16
        config.training.mixed_precision_param = "float32"  # a CPU without bf16 units emulates it
    config.validator.enable = False
    config.checkpoint.enable = True
    config.checkpoint.interval = 3
    config.checkpoint.folder = "checkpoint"  # under --dump-folder
    config.dump_folder = "runs/torchtitan/out"
    config.metrics.disable_color_printing = True
    config.debug.seed = 0
    return config


# --8<-- [end:config]


# --8<-- [start:pp]
def tinyscale_pp() -> Trainer.Config:
    """tinyscale_debug cut into 2 pipeline stages (PP 2); FSDP shards over the ranks left over.

        torchrun --nproc-per-node 2 code/scripts/torchtitan_train.py \\
            --module tinyscale.compat.titan_config --config tinyscale_pp

    With 4 processes it is PP 2 x FSDP 2. The same 512 tokens per step as tinyscale_debug
    on 2 ranks: one pipeline of 4 sequences, in 4 micro-batches of 1.
    """
    config = tinyscale_debug()
    config.parallelism.pipeline_parallel_degree = 2
    config.parallelism.pipeline_parallel_schedule = "1F1B"  # or Interleaved1F1B, ZBVZeroBubble
    config.parallelism.pipeline_parallel_microbatch_size = 1  # local batch 4 -> 4 micro-batches
    config.training.local_batch_size = 4  # per pipeline (per data-parallel rank)
    config.training.disable_cuda_graphs = True  # CUDA graphs do not support PP yet
    config.checkpoint.enable = False
    config.dump_folder = "runs/torchtitan/pp"
    return config


# --8<-- [end:pp]


# --8<-- [start:moe]
def tinyscale_moe() -> Trainer.Config:
    """torchtitan's DeepSeek-V3 debug model on our data, with expert parallel 2 x FSDP 2.

        torchrun --nproc-per-node 4 code/scripts/torchtitan_train.py \\
            --module tinyscale.compat.titan_config --config tinyscale_moe

    The debug model's first 3 blocks (1 dense, 2 MoE of 8 experts, top 3, one shared
    expert), sized for four CPU processes. On 4 ranks the experts are split over EP 2 and
    each half sharded over the other 2 ranks (efsdp); every other weight over all 4.
    """
    laptop, config = tinyscale_debug(), deepseek_v3_debugmodel()
    for part in ("hf_assets_path", "dataloader", "training", "lr_scheduler", "metrics", "debug"):
        setattr(config, part, getattr(laptop, part))  # our tokenizer, corpus, sizes and seed
    config.model_spec.model.layers = config.model_spec.model.layers[:3]
    config.training.steps = 3
    config.parallelism.data_parallel_shard_degree = -1  # FSDP over every rank...
    config.parallelism.expert_parallel_degree = 2  # ...and the experts split in 2 first
    config.parallelism.spmd_backend = "partial_dtensor"  # its all-to-alls work on gloo
    config.training.disable_cuda_graphs = True  # the dispatcher reads the counts on the host
    config.activation_checkpoint = None
    config.validator.enable = False
    config.checkpoint.enable = False
    config.dump_folder = "runs/torchtitan/moe"
    return config


# --8<-- [end:moe]


# --8<-- [start:float8]
def tinyscale_float8() -> Trainer.Config:
    """tinyscale_debug with every linear layer in float8, emulated: FSDP 2 on a CPU.

        torchrun --nproc-per-node 2 code/scripts/torchtitan_train.py \\
            --module tinyscale.compat.titan_config --config tinyscale_float8

    torchtitan's Float8LinearConverter swaps Linear for torchao's Float8Linear before the
    model is built. Without an H100 (or MI300) it refuses unless `emulate` is set, and
    emulation replaces the recipe with torchao's default: tensorwise scales.
    """
    config = tinyscale_debug()
    fp8 = Float8LinearConverter.Config(
        emulate=not has_cuda_capability(8, 9), model_compile_enabled=False
    )
    config.model_spec = llama3_registry("debugmodel", converters=[fp8])
    config.checkpoint.enable = False
    config.dump_folder = "runs/torchtitan/float8"
    return config


# --8<-- [end:float8]


# --8<-- [start:tp]
def tinyscale_tp() -> Trainer.Config:
    """tinyscale_debug with every block split over 2 ranks: tensor parallel 2 (TP 2).

        torchrun --nproc-per-node 2 code/scripts/torchtitan_train.py \\
            --module tinyscale.compat.titan_config --config tinyscale_tp

    Both ranks read the same 2 sequences: a TP group is one data-parallel replica, so
    no rank is left over for FSDP. Sequence parallelism is torchtitan's default.
    """
    config = tinyscale_debug()
    config.parallelism.tensor_parallel_degree = 2
    config.parallelism.enable_sequence_parallel = True  # the default, said out loud
    config.training.steps = 3
    config.checkpoint.enable = False
    config.dump_folder = "runs/torchtitan/tp"
    return config


# --8<-- [end:tp]


# --8<-- [start:fsdp_tp]
def tinyscale_fsdp_tp() -> Trainer.Config:
    """2D: FSDP 2 x TP 2 on 4 processes. TP inside a pair of ranks, FSDP across pairs.

        torchrun --nproc-per-node 4 code/scripts/torchtitan_train.py \\
            --module tinyscale.compat.titan_config --config tinyscale_fsdp_tp

    data_parallel_shard_degree = -1 takes the ranks TP leaves: 4 / 2 = 2.
    """
    config = tinyscale_tp()
    config.parallelism.data_parallel_shard_degree = -1  # FSDP over the ranks left: 2
    config.dump_folder = "runs/torchtitan/fsdp_tp"
    return config


# --8<-- [end:fsdp_tp]
