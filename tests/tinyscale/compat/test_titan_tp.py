"""torchtitan's tensor parallelism on CPU (tinyscale.compat.titan_config.tinyscale_tp, _fsdp_tp).

The runs are the page's code blocks: CI runs them (TP 2 on 2 gloo ranks, FSDP 2 x TP 2
on 4) and compares their output with the recorded text. These tests check that text
against the configs it came from (the mesh, the batch the ranks share, a loss that
falls), torchtitan's TP plan for llama3 against the page's table and against PyTorch's
own parallel styles, the rank layout of the 2D mesh, and the CPU fact the page warns
about: DTensor has no random-number tracker on a CPU mesh.
"""

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from helpers import ROOT, TIMEOUTS, prose, recorded_output, said

pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")

# torchtitan's modules are imported in the tests that use them: importing them costs
# seconds of CPU, and every pytest worker imports this file to collect it.
from tinyscale.comm.launch import run_on_ranks

PAGE = "week-4/tensor-parallel-torchtitan.md"
RUNS = {"tinyscale_tp": 2, "tinyscale_fsdp_tp": 4}  # config -> processes on the page


def recorded(name: str) -> list[str]:
    return recorded_output(PAGE, f"--config {name} 2>&1")


def losses(lines: list[str]) -> dict[int, float]:
    steps = [re.match(r"step: +(\d+) +loss: +([\d.]+)", x) for x in lines]
    return {int(m[1]): float(m[2]) for m in steps if m}


# --- the configs -------------------------------------------------------------------------


def test_configs_are_the_debug_run_with_tp_2_and_sequence_parallel_by_default() -> None:
    from torchtitan.config import ParallelismConfig

    from tinyscale.compat.titan_config import tinyscale_debug, tinyscale_fsdp_tp, tinyscale_tp

    base, tp, two_d = tinyscale_debug(), tinyscale_tp(), tinyscale_fsdp_tp()
    assert ParallelismConfig().enable_sequence_parallel is True  # torchtitan's default
    for config in (tp, two_d):
        p = config.parallelism
        assert (p.tensor_parallel_degree, p.data_parallel_shard_degree) == (2, -1)
        assert p.enable_sequence_parallel and p.spmd_backend == ParallelismConfig().spmd_backend
        assert config.training.steps == 3 and not config.checkpoint.enable
        assert config.hf_assets_path == base.hf_assets_path and config.debug.seed == 0
        assert config.dataloader.dataset_path == base.dataloader.dataset_path
        assert (config.training.seq_len, config.training.local_batch_size) == (128, 2)
    dumps = {tp.dump_folder, two_d.dump_folder, base.dump_folder}
    assert tp.dump_folder == "runs/torchtitan/tp" and len(dumps) == 3  # a folder each


def test_the_page_launches_each_config_on_its_number_of_processes() -> None:
    text = prose(PAGE)
    for name, world in RUNS.items():
        (nproc,) = said(text, rf"--nproc-per-node (\d+) [^|]*--config {name} 2>&1")
        assert int(nproc) == world
        assert recorded(name)  # compared by CI, not skipped


# --- the recorded runs ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(RUNS))
def test_recorded_mesh_and_batch_follow_the_config(name: str) -> None:
    from torchtitan.distributed import ParallelDims

    from tinyscale.compat import titan_config

    config = getattr(titan_config, name)()
    dims = ParallelDims.from_config(config.parallelism, RUNS[name])
    lines = recorded(name)
    assert lines[0] == (
        f"Building device mesh with parallelism: pp={dims.pp}, dp_replicate={dims.dp_replicate}, "
        f"dp_shard={dims.dp_shard}, cp={dims.cp}, tp={dims.tp}, ep={dims.ep}"
    )
    assert (dims.tp, dims.dp_shard) == ((2, 1) if name == "tinyscale_tp" else (2, 2))
    meshes = re.search(r"active dimensions: \[(.*)\]", lines[1])
    assert meshes, lines[1]
    active = set(meshes[1].replace("'", "").split(", "))
    assert active == ({"tp"} if dims.dp_shard == 1 else {"batch", "loss", "tp", "dp", "dp_shard"})
    # the two ranks of a TP group read the same sequences: only data parallelism adds any
    batch = re.search(r"local batch size (\d+), global batch size (\d+)", "\n".join(lines))
    assert batch, "the recorded run prints torchtitan's batch sizes"
    assert int(batch[1]) == config.training.local_batch_size
    assert int(batch[2]) == config.training.local_batch_size * dims.dp_shard * dims.dp_replicate


@pytest.mark.parametrize("name", sorted(RUNS))
def test_recorded_loss_falls_and_the_model_is_the_week_2_one(name: str) -> None:
    lines = recorded(name)
    found = losses(lines)
    assert sorted(found) == [1, 2, 3]
    assert found[3] < found[1] - 0.15
    assert lines[-1] == "Training completed"
    week2 = recorded_output("week-2/torchtitan.md", "--config tinyscale_debug 2>&1")
    count = [x for x in lines if x.startswith("Model llama3")]
    assert count == [x for x in week2 if x.startswith("Model llama3")] and count


def test_first_losses_the_page_compares_are_the_recorded_ones() -> None:
    """Same 4 sequences per step as Week 2's FSDP 2 run, other initial weights on a CPU."""
    two_d = losses(recorded("tinyscale_fsdp_tp"))
    fsdp = losses(recorded_output("week-2/torchtitan.md", "--config tinyscale_debug 2>&1"))
    ours, theirs = said(
        prose(PAGE), r"step 1 loss here is (\d+\.\d+), the Week 2 FSDP run's is (\d+\.\d+)"
    )
    assert (float(ours), float(theirs)) == (two_d[1], fsdp[1])
    assert two_d[1] != fsdp[1]


def test_the_pages_sizes_are_the_debug_models_split_in_2_and_8() -> None:
    from torchtitan.models.llama3 import model_registry

    from tinyscale.compat.titan_config import tinyscale_tp

    model = tinyscale_tp().model_spec.model
    attention, ffn = model.layers[0].attention, model.layers[0].feed_forward
    heads, hidden, vocab = attention.n_heads, ffn.w1.out_features, model.lm_head.out_features
    text = prose(PAGE)
    assert said(text, r"The debug model has (\d+) heads, a width of (\d+) and (\d+) hidden") == (
        str(heads),
        str(model.dim),
        str(hidden),
    )
    last0, first1, last1 = said(text, r"heads 0–(\d+) · rank 1: heads (\d+)–(\d+)")
    assert (int(last0), int(first1), int(last1)) == (heads // 2 - 1, heads // 2, heads - 1)
    assert said(text, r"(\d+) of the (\d+) hidden channels each") == (str(hidden // 2), str(hidden))
    per_gpu = said(text, r"(\d+) heads and (\d+) of the (\d+) hidden channels per GPU")
    assert per_gpu == (str(heads // 8), str(hidden // 8), str(hidden))
    assert said(text, r"split the ([\d,]+) vocabulary rows") == (f"{vocab:,}",)
    big = model_registry("8B").model.layers[0].attention
    assert said(text, r"llama3 8B has (\d+) heads in (\d+) groups") == (
        str(big.n_heads),
        str(big.n_kv_heads),
    )


# --- torchtitan's plan, the page's table, PyTorch's styles ---------------------------------


def sharding_configs(config: Any) -> Iterator[tuple[str, Any]]:
    """(path, sharding_config) of every module of one llama3 block and of the model's root,
    after torchtitan has filled them in (update_from_config, as its trainer does)."""
    import dataclasses

    from torchtitan.protocols.module import Module

    model = config.model_spec.model
    model.update_from_config(config=config)

    def walk(cfg: Any, path: str) -> Iterator[tuple[str, Any]]:
        if cfg.sharding_config is not None:
            yield path, cfg.sharding_config
        for field in dataclasses.fields(cfg):
            value = getattr(cfg, field.name)
            if field.name.startswith("_") or field.name == "layers":
                continue
            if isinstance(value, Module.Config):
                yield from walk(value, f"{path}.{field.name}".lstrip("."))

    yield from walk(model, "")
    yield from walk(model.layers[0], "")  # every block has the same plan


def tp_axis() -> Any:
    from torchtitan.distributed.parallel_dims import MeshAxisName

    return MeshAxisName.TP


def tp_placement(layout: Any) -> str:
    """A torchtitan SpmdLayout's placement on the TP mesh axis, in DTensor's words."""
    kind = repr(layout.per_axis_spmd_types()[tp_axis()])
    words = {"R": "Replicate", "I": "Replicate", "P": "Partial"}
    return words.get(kind) or re.sub(r"S\((-?\d)\)", r"Shard(\1)", kind)


def boundary(src: Any, dst: Any) -> str:
    """'src → dst' where a module redistributes, 'src' where it does not, '—' if undeclared."""
    if src is None and dst is None:
        return "—"
    first, last = (tp_placement(x) if x is not None else None for x in (src, dst))
    return first if last in (None, first) else f"{first} → {last}" if first else str(last)


def torchtitans_plan(config: Any) -> dict[str, tuple[str, str, str]]:
    """module -> (weight, input, output) on the TP axis, as torchtitan declares them."""
    plan = {}
    for path, s in sharding_configs(config):
        if "weight" not in s.state_shardings and not s.in_src_shardings:
            continue  # the RoPE cache: a buffer, replicated
        weight = s.state_shardings.get("weight")
        first = next(iter(s.in_src_shardings)) if s.in_src_shardings else None
        plan[path] = (
            tp_placement(weight) if weight is not None else "—",
            boundary(
                s.in_src_shardings[first] if first else None,
                s.in_dst_shardings[first] if s.in_dst_shardings else None,
            ),
            boundary(s.out_src_shardings, s.out_dst_shardings),
        )
    return plan


def page_table() -> dict[str, tuple[str, ...]]:
    """module -> (weight, input, output, PyTorch style), from the page's plan table."""
    text = (ROOT / "docs" / PAGE).read_text()
    rows = re.findall(r"^\| `([\w.]+)` \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", text, re.M)
    return {name: tuple(cell.strip().strip("`") for cell in cells) for name, *cells in rows}


def test_the_pages_table_is_torchtitans_plan_for_llama3() -> None:
    from tinyscale.compat.titan_config import tinyscale_tp

    theirs, ours = torchtitans_plan(tinyscale_tp()), page_table()
    assert {m: row[:3] for m, row in ours.items()} == theirs
    # what the page says in words, row by row
    assert theirs["attention.qkv_linear.wqkv"][0] == theirs["feed_forward.w1"][0] == "Shard(0)"
    assert (
        theirs["attention.wo"]
        == theirs["feed_forward.w2"]
        == ("Shard(1)", "—", "Partial → Shard(1)")
    )
    assert theirs["attention_norm"] == theirs["ffn_norm"] == ("Replicate", "Shard(1)", "Shard(1)")
    assert theirs["norm"][2] == "Shard(1) → Replicate" and theirs["lm_head"][2] == "Shard(-1)"


def test_without_sequence_parallel_the_outputs_are_all_reduced() -> None:
    from tinyscale.compat.titan_config import tinyscale_tp

    config = tinyscale_tp()
    config.parallelism.enable_sequence_parallel = False
    plan = torchtitans_plan(config)
    assert plan["attention.wo"][2] == plan["feed_forward.w2"][2] == "Partial → Replicate"
    assert plan["attention_norm"] == ("Replicate", "Replicate", "Replicate")
    (words,) = said(prose(PAGE), r"`wo` and `w2` end in `(Partial → Replicate)`")
    assert words == plan["attention.wo"][2]
    # in torchtitan's own letters, the two conversions are Megatron's f and g
    block = {path: s for path, s in sharding_configs(config)}
    tp = tp_axis()
    f_in = [
        block["attention"].in_src_shardings["x_BLD"],
        block["attention"].in_dst_shardings["x_BLD"],
    ]
    g_out = [block["attention.wo"].out_src_shardings, block["attention.wo"].out_dst_shardings]
    letters = [
        " → ".join(repr(x.per_axis_spmd_types()[tp]) for x in pair) for pair in (f_in, g_out)
    ]
    text = prose(PAGE)
    assert (
        said(text, r"convert their input `(\w → \w)`: identity forward")[0] == letters[0] == "I → R"
    )
    assert (
        said(text, r"convert their output `(\w → \w)`: all-reduce forward")[0]
        == letters[1]
        == "P → I"
    )


def in_words(placement: Any) -> str:
    """Shard(dim=1) -> Shard(1), Replicate() -> Replicate: the page's spelling."""
    return repr(placement).replace("dim=", "").replace("()", "")


@pytest.fixture
def fake_world() -> Iterator[Any]:
    """A process group of ``world`` ranks in this one process (PyTorch's fake backend):
    enough to build meshes and shard weights, nothing is sent."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def start(rank: int, world: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


def test_the_pages_pytorch_styles_split_the_weights_as_torchtitan_does(fake_world: Any) -> None:
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    names = {c.__name__: c for c in (ColwiseParallel, PrepareModuleInput, RowwiseParallel)}
    names |= {"SequenceParallel": SequenceParallel, "Shard": Shard, "Replicate": Replicate}
    fake_world(0, 2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    kinds = {"tok_embeddings": nn.Embedding(8, 4), "norm": nn.RMSNorm(4)}
    checked = set()
    for name, (weight, inputs, _, style) in page_table().items():
        if style == "—":
            assert weight == "—", f"{name}: a weight with no style"
            continue
        parallel = eval(style, {"__builtins__": {}}, names)  # the page's cell, as code
        if isinstance(parallel, PrepareModuleInput):  # a block's input: no weight of its own
            layouts = (parallel.input_layouts[0], parallel.desired_input_layouts[0])
            assert " → ".join(map(in_words, layouts)) == inputs, name
            checked.add(name)
            continue
        module = kinds.get(name) or (nn.RMSNorm(4) if "norm" in name else nn.Linear(4, 4))
        parallelize_module(module, mesh, parallel)
        (placement,) = module.weight.placements
        assert in_words(placement) == weight, name
        checked.add(name)
    assert {"attention.qkv_linear.wqkv", "attention.wo", "feed_forward.w2", "norm"} <= checked


@pytest.mark.parametrize(("world", "tp"), [(4, 2), (16, 8)])
def test_tp_groups_are_neighbouring_ranks_and_fsdp_goes_across(
    world: int, tp: int, fake_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's 2D picture: TP on ranks next to each other (one node), FSDP across."""
    import torchtitan.distributed.parallel_dims as parallel_dims

    from tinyscale.compat.titan_config import tinyscale_fsdp_tp

    monkeypatch.setattr(parallel_dims, "device_type", "cpu")  # this test's meshes only
    config = tinyscale_fsdp_tp()
    config.parallelism.tensor_parallel_degree = tp
    for rank in (0, world - 1):
        fake_world(rank, world)
        dims = parallel_dims.ParallelDims.from_config(config.parallelism, world)
        dims.build_mesh()
        first = rank // tp * tp
        assert dims.get_mesh("tp").mesh.tolist() == list(range(first, first + tp))
        assert dims.get_mesh("dp_shard").mesh.tolist() == list(range(rank % tp, world, tp))
        assert dims.get_mesh("batch").mesh.tolist() == dims.get_mesh("dp_shard").mesh.tolist()


# --- the CPU caveat and the GPU facts ------------------------------------------------------


def fill_a_sharded_weight() -> tuple[list[float], bool]:
    """On each rank: shard a 4 x 3 weight over a TP mesh of 2 and fill it as torchtitan's
    init does (torch.nn.init on the DTensor), from the same seed."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor._random import is_rng_supported_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    weight = distribute_tensor(torch.empty(4, 3), mesh, [Shard(0)])
    torch.nn.init.normal_(weight)
    return weight.to_local().flatten().tolist(), is_rng_supported_mesh(mesh)


def test_on_a_cpu_mesh_every_rank_draws_the_same_shard() -> None:
    (rank0, tracked0), (rank1, tracked1) = run_on_ranks(fill_a_sharded_weight, 2, **TIMEOUTS)
    assert not tracked0 and not tracked1  # no DTensor RNG tracker on a CPU mesh
    assert rank0 == rank1  # so the two halves of the weight start equal
    torch.manual_seed(0)
    one_process = torch.empty(4, 3).normal_().flatten().tolist()
    assert rank0 == one_process[:6] and rank0 != one_process[6:]


def test_fused_wqkv_is_initialised_whole_then_split() -> None:
    """The exception the page names: torchtitan draws wqkv replicated, then shards it."""
    from tinyscale.compat.titan_config import tinyscale_tp

    block = tinyscale_tp().model_spec.model.layers[0]
    fused = block.attention.qkv_linear.wqkv.param_init["weight"]
    plain = block.feed_forward.w1.param_init["weight"]
    assert "_fused_qkv_param_init" in fused.__qualname__
    assert getattr(plain, "func", None) is torch.nn.init.trunc_normal_


def test_float8_has_no_tp_switch_in_torchtitan_0_3() -> None:
    import dataclasses
    from pathlib import Path

    import torchtitan
    from torchtitan.components.quantization.float8 import Float8LinearConverter
    from torchtitan.config import ParallelismConfig

    fields = {f.name for f in dataclasses.fields(Float8LinearConverter.Config)}
    assert fields == {"recipe_name", "filter_fqns", "emulate", "model_compile_enabled"}
    assert not [f for f in dataclasses.fields(ParallelismConfig) if "float8" in f.name]
    source = Path(torchtitan.__path__[0])
    users = [p for p in source.rglob("*.py") if "Float8ColwiseParallel" in p.read_text()]
    assert users == []  # torchao's float8 TP styles are not used by 0.3.0
    text = prose(PAGE)
    for name in sorted(fields):
        assert f"`{name}`" in text, f"the page lists the converter's field {name}"


def test_the_tp_plan_applies_to_float8_layers_as_it_is() -> None:
    """The converter swaps Linear configs for Float8Linear ones; the plan is set after."""
    from tinyscale.compat.titan_config import tinyscale_float8, tinyscale_tp

    config = tinyscale_float8()
    config.parallelism.tensor_parallel_degree = 2
    block = config.model_spec.model.layers[0]
    assert type(block.attention.qkv_linear.wqkv).__qualname__ == "Float8Linear.Config"
    assert torchtitans_plan(config) == torchtitans_plan(tinyscale_tp())
