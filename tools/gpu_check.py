"""The pages' GPU blocks: how many GPUs each needs, checked without a GPU, run with one.

Run:  python tools/gpu_check.py          (`make gpu-check`, on a machine with CUDA)
      python tools/gpu_check.py --list   (the plan: what this machine would run, and why not)
      python tools/gpu_check.py --cpu    (no GPU: tests/docs/test_gpu_blocks.py runs it)
      python tools/gpu_check.py --only workshop/lab-1.md   (some pages' blocks only)

A GPU block is a ```bash or ```python fence that pytest-codeblocks collects and the page
marks `<!--pytest.mark.skip(reason="needs GPUs")-->`, beside a CPU twin that CI runs.

- **How many GPUs**, read from its command: torchrun's --nnodes x --nproc-per-node,
  srun's and sbatch's flags (and the #SBATCH lines of the batch file), `deepspeed
  --num_gpus` (or its hostfile's slots), `accelerate launch --num_processes`, a
  PyTorchJob's pods x nvidia.com/gpu, nccl-tests' -g; a plain `python` is 1, and a
  Python block is 1, or the world size of its run_on_ranks(fn, N). Where the command does
  not say, a comment on the page right above the block does: `<!--gpus: 8-->`.
- **--cpu**: without a GPU, every script or module a block runs exists and accepts its
  flags (its own parser: the script's parse_args, or the parser its main builds;
  torchtitan's for torchtitan_train.py; torchrun's, deepspeed's and accelerate's for
  theirs), every file it names exists and parses (configs, hostfiles, batch files,
  DeepSpeed JSON, TOML, YAML), and a Python block's imports and calls match the code.
  Programs that are not the course's (nvidia-smi, kubectl, pip) are checked for the files
  they name only. A file the reader writes is named on the page: `<!--your-file: x.json-->`.
- **GPU mode** (default): the plan first, then each block whose GPUs fit this machine's
  (one node) and whose programs and variables it has, with a time limit, in page order
  until the budget (about 10 minutes) is spent, then the tests that need CUDA (their
  results go to the pages that name their files); one record per page in
  docs/generated/gpu/<part>__<page-stem>.json (machine, versions, date, and per block
  its command, exit code, output tail, wall time). tools/mkdocs_gpu_hook.py shows each
  block's record on its page, or "not yet run on a GPU".
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import datetime
import importlib
import importlib.util
import inspect
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pytest_codeblocks.main import extract_from_buffer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RECORDS = DOCS / "generated" / "gpu"
TESTS = ROOT / "tests"
REASON = 'reason="needs GPUs"'
RUN_SYNTAX = ("python", "sh", "bash")  # the blocks pytest-codeblocks runs (figures_testing.py)
GPUS_MARK = re.compile(r"<!--\s*gpus:\s*(\d+)\s*-->")
YOURS_MARK = re.compile(r"<!--\s*your-file:\s*(\S+?)\s*-->")
# Arguments that name a file of this repository: under one of its folders, or a config.
REPO_DIRS = ("code/", "docs/", "tools/", "tests/", "benchmarks/")
CONFIG_SUFFIXES = (".json", ".toml", ".yaml", ".yml", ".sbatch", ".def", ".cfg")
OUTPUT_DIRS = ("runs/", "logs/", "build/", "./build/")  # what a run writes, or the reader builds
SHELL_WORDS = {"export", "cd", "mkdir", "rm", "echo", "set", "source", "true", "sleep", "grep"}
PROGRAM_OPERATORS = {"|", "||", "&&", ";", "&", "(", ")"}
WRAPPER_MODULES = {"tinyscale.ops.multinode"}  # `python -m M SCRIPT ARGS` runs SCRIPT ARGS
TITAN_SCRIPT = "code/scripts/torchtitan_train.py"  # every argument goes to torchtitan
# GPU mode: the shell variables a block may use that this machine provides.
PROVIDED_VARS = ("SCRATCH", "SLURM_TMPDIR")
# --cpu: what a job's variables hold on a cluster, where a launcher parses them as numbers.
SAMPLE_VARS = {"NODE_RANK": "0", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
# torchtitan checks the GPU while it builds a config (float8 needs SM 8.9): --cpu answers
# as the GPU the block needs would (tests/tinyscale/compat/test_titan_compat.py does too).
TITAN_GPU_CHECKS = ("torchtitan.components.quantization.float8",)
BLOCK_TIMEOUT_S = 120
# Commands that watch until stopped (nvidia-smi's monitors): such a block gets this limit,
# and its record says it was stopped there, which is how a reader ends it too.
WATCHES = re.compile(r"nvidia-smi dmon|nvidia-smi .*(-l|--loop)[ =]\d|logs -f|^watch ", re.M)
WATCH_S = 20
TESTS_TIMEOUT_S = 240
BUDGET_S = 540  # a lent GPU machine gives about 10 minutes: the blocks and tests together
TAIL_LINES = 40
TAIL_CHARS = 4000


# --- the blocks --------------------------------------------------------------------------
@dataclasses.dataclass
class GpuBlock:
    page: str  # relative to docs/, e.g. "week-1/collectives.md"
    lineno: int  # the line of its opening fence, counted from 1
    syntax: str
    code: str
    marked: int | None = None  # <!--gpus: N--> above the block
    yours: tuple[str, ...] = ()  # <!--your-file: NAME--> above the block: the reader writes it

    @property
    def where(self) -> str:
        return f"{self.page}:{self.lineno}"


def is_gpu_block(syntax: str | None, marks: Sequence[str]) -> bool:
    return syntax in RUN_SYNTAX and any("skip" in m and REASON in m for m in marks)


def comments_above(lines: Sequence[str], lineno: int) -> list[str]:
    """The HTML comments (and blank lines) right above the fence on line ``lineno``."""
    found = []
    for line in reversed(lines[: lineno - 1]):
        text = line.strip()
        if text and not text.startswith("<!--"):
            break
        found.append(text)
    return found


def blocks_in_text(text: str, page: str) -> list[GpuBlock]:
    """The GPU blocks of a page's Markdown, as pytest-codeblocks reads it."""
    lines = text.splitlines()
    found = []
    for b in extract_from_buffer(io.StringIO(text)):
        if not is_gpu_block(b.syntax, b.marks):
            continue
        above = " ".join(comments_above(lines, b.lineno))
        marked = GPUS_MARK.search(above)
        found.append(
            GpuBlock(
                page=page,
                lineno=b.lineno,
                syntax=b.syntax,
                code=b.code,
                marked=int(marked[1]) if marked else None,
                yours=tuple(YOURS_MARK.findall(above)),
            )
        )
    return found


def page_blocks(path: Path, docs: Path = DOCS) -> list[GpuBlock]:
    return blocks_in_text(path.read_text("utf-8"), path.relative_to(docs).as_posix())


def all_blocks(docs: Path = DOCS) -> list[GpuBlock]:
    pages = sorted(p for p in docs.rglob("*.md") if "generated" not in p.relative_to(docs).parts)
    return [b for p in pages for b in page_blocks(p, docs)]


# --- commands ----------------------------------------------------------------------------
def strip_comment(line: str) -> str:
    """A shell line without its comment: a # that starts a word, outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def commands(code: str) -> list[list[str]]:
    """The simple commands of a bash block: each a list of words, without redirections."""
    joined = re.sub(r"\\\n", " ", code)
    found: list[list[str]] = []
    for line in joined.splitlines():
        lex = shlex.shlex(strip_comment(line), posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = ""
        words: list[str] = []
        tokens = list(lex)
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok in PROGRAM_OPERATORS:
                if words:
                    found.append(words)
                words = []
            elif tok in (">", ">>", "<", ">&", "&>", "2>"):
                if words and words[-1].isdigit():
                    words.pop()  # 2>&1: the digit belongs to the redirection
                i += 1  # the target
            else:
                words.append(tok)
            i += 1
        if words:
            found.append(words)
    return found


def without_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """NAME=value words before the program: the environment it gets, and the rest."""
    env = {}
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        name, value = words[0].split("=", 1)
        env[name] = value
        words = words[1:]
    return env, words


def flag_value(words: Sequence[str], *names: str) -> str | None:
    """The value of the last ``--name value`` or ``--name=value`` among the words."""
    value = None
    for i, w in enumerate(words):
        for name in names:
            if w == name and i + 1 < len(words):
                value = words[i + 1]
            elif w.startswith(name + "=") and name.startswith("--"):
                value = w.split("=", 1)[1]
            elif len(name) == 2 and w.startswith(name) and len(w) > 2 and w[2:].isdigit():
                value = w[2:]  # -N1
    return value


def as_int(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.split(":")[-1]  # torchrun --nnodes 1:4: the most it may use
    return int(value) if value.isdigit() else None


# --- how many GPUs -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Need:
    gpus: int
    nodes: int = 1

    def text(self) -> str:
        if self.gpus == 0:
            return "Needs no GPU itself: it runs on a GPU cluster's login node"
        if self.gpus == 1:
            return "Needs 1 GPU"
        if self.nodes > 1:
            return f"Needs {self.gpus} GPUs ({self.nodes} nodes × {self.gpus // self.nodes})"
        return f"Needs {self.gpus} GPUs (one node)"


def launcher_words(words: list[str], stop_after: Iterable[str] = ()) -> tuple[list[str], int]:
    """A launcher's own words (before its script), and where the script starts.

    The script is the first word that names a .py file, or the word after one of
    ``stop_after`` (torchrun's -m: the script is a module)."""
    stops = set(stop_after)
    for i, w in enumerate(words):
        if w.endswith(".py") and not w.startswith("-"):
            return words[:i], i
        if w in stops and i + 1 < len(words):
            return words[: i + 1], i + 1
    return words, len(words)


def hostfile_need(path: Path) -> Need | None:
    """A DeepSpeed hostfile: one "<host> slots=<GPUs>" line per node."""
    if not path.is_file():
        return None
    slots = [int(m[1]) for m in re.finditer(r"slots=(\d+)", path.read_text())]
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return Need(sum(slots), len(lines)) if slots else None


def slurm_need(flags: Sequence[str]) -> Need | None:
    """GPUs from srun/sbatch flags: --gres=gpu[:type]:N or --gpus-per-node per node, --gpus."""
    nodes = as_int(flag_value(flags, "--nodes", "-N")) or 1
    gres = flag_value(flags, "--gres")
    per_node = None
    if gres:
        m = re.search(r"gpu(?::[^:,]+)?:(\d+)", gres)
        per_node = int(m[1]) if m else None
    per_node = per_node or as_int(flag_value(flags, "--gpus-per-node"))
    if per_node:
        return Need(per_node * nodes, nodes)
    total = as_int(flag_value(flags, "--gpus", "-G"))
    if total:
        return Need(total, nodes)
    per_task = as_int(flag_value(flags, "--gpus-per-task"))
    tasks = as_int(flag_value(flags, "--ntasks", "-n"))
    if per_task and tasks:
        return Need(per_task * tasks, nodes)
    return None


def sbatch_lines(path: Path) -> list[str]:
    """The #SBATCH flags of a batch file (a ##SBATCH line is switched off)."""
    words = []
    for line in path.read_text().splitlines():
        if line.startswith("#SBATCH"):
            words += shlex.split(strip_comment(line[len("#SBATCH") :]))
    return words


def split_slurm(words: list[str]) -> tuple[list[str], list[str]]:
    """srun/sbatch words: its flags, then the command (or the batch file and its args)."""
    takes_value = {"-N", "-n", "-c", "-p", "-t", "-G", "-w", "-J", "-o", "-e", "-A"}
    i = 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in takes_value else 1
    return words[:i], words[i:]


def k8s_need(path: Path) -> Need | None:
    """A Kubeflow job: per replica spec, pods x the nvidia.com/gpu each container asks for."""
    if not path.is_file():
        return None
    import yaml

    gpus = pods = 0
    for doc in yaml.safe_load_all(path.read_text()):
        specs = next(
            (v for k, v in (doc.get("spec") or {}).items() if k.endswith("ReplicaSpecs")), {}
        )
        for spec in specs.values():
            replicas = int(spec.get("replicas", 1))
            containers = spec["template"]["spec"]["containers"]
            per_pod = sum(
                int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
                for c in containers
            )
            gpus, pods = gpus + replicas * per_pod, pods + replicas
    return Need(gpus, pods) if pods else None


def command_need(words: list[str]) -> Need | None:
    """How many GPUs one simple command starts, from its own flags; None: it does not say."""
    _, words = without_env(words)
    if not words:
        return None
    prog = Path(words[0]).name
    rest = words[1:]
    if prog in ("python", "python3"):
        return Need(1)
    if prog == "torchrun":
        own, _ = launcher_words(rest, stop_after=("-m", "--module"))
        nodes = as_int(flag_value(own, "--nnodes")) or 1
        nproc = as_int(flag_value(own, "--nproc-per-node", "--nproc_per_node")) or 1
        return Need(nodes * nproc, nodes)
    if prog == "deepspeed":
        own, _ = launcher_words(rest)
        per_node = as_int(flag_value(own, "--num_gpus", "--num-gpus"))
        nodes = as_int(flag_value(own, "--num_nodes", "--num-nodes"))
        hostfile = flag_value(own, "--hostfile", "-H")
        if per_node:
            return Need(per_node * (nodes or 1), nodes or 1)
        if hostfile:
            return hostfile_need(ROOT / hostfile)
        return None
    if prog == "accelerate" and rest[:1] == ["launch"]:
        own, _ = launcher_words(rest[1:])
        total = as_int(flag_value(own, "--num_processes", "--num-processes"))
        nodes = as_int(flag_value(own, "--num_machines", "--num-machines")) or 1
        return Need(total, nodes) if total else None
    if prog == "srun":
        flags, inner = split_slurm(rest)
        return slurm_need(flags) or command_need(inner)
    if prog == "sbatch":
        flags, inner = split_slurm(rest)
        batch = ROOT / inner[0] if inner else None
        file_flags = sbatch_lines(batch) if batch and batch.is_file() else []
        return slurm_need([*file_flags, *flags])
    if prog in ("apptainer", "singularity") and rest[:1] in (["exec"], ["run"]):
        return command_need(container_command(rest[1:]))
    if prog == "kubectl" and rest[:1] == ["apply"]:
        manifest = flag_value(rest, "-f", "--filename")
        return k8s_need(ROOT / manifest) if manifest else None
    if prog.endswith("_perf"):  # nccl-tests: -g GPUs per thread, -t threads
        gpus = as_int(flag_value(rest, "-g", "--ngpus")) or 1
        return Need(gpus * (as_int(flag_value(rest, "-t", "--nthreads")) or 1))
    if prog == "docker" and rest[:1] == ["run"]:
        return Need(n) if (n := as_int(flag_value(rest, "--gpus"))) else None
    return None


def container_command(words: list[str]) -> list[str]:
    """apptainer exec [flags] IMAGE COMMAND...: the command."""
    takes_value = {"--pwd", "-B", "--bind", "--env", "--home", "--overlay", "-W", "--workdir"}
    i = 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in takes_value else 1
    return words[i + 1 :]


def python_block_need(code: str) -> Need | None:
    """A Python block: the world size of its run_on_ranks(fn, N) or f(world_size=N), else
    1; None when it reads LOCAL_RANK itself (something else launched it)."""
    sizes = []
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", getattr(node.func, "attr", ""))
        size = node.args[1] if name == "run_on_ranks" and len(node.args) > 1 else None
        if isinstance(size, ast.Constant) and isinstance(size.value, int):
            sizes.append(size.value)
        for kw in node.keywords:
            if kw.arg == "world_size" and isinstance(kw.value, ast.Constant):
                sizes.append(int(kw.value.value))
    if sizes:
        return Need(max(sizes))
    return None if "LOCAL_RANK" in code else Need(1)


def derived_need(block: GpuBlock) -> Need | None:
    """What the block's own commands say, without the page's <!--gpus--> comment."""
    if block.syntax == "python":
        return python_block_need(block.code)
    needs = [n for words in commands(block.code) if (n := command_need(words))]
    return max(needs, key=lambda n: (n.gpus, n.nodes)) if needs else None


def need(block: GpuBlock) -> Need | None:
    if block.marked is not None:
        return Need(block.marked)
    return derived_need(block)


# --- CPU mode: the checks ----------------------------------------------------------------
class _Parsed(Exception):
    """Raised by the patched parse_args: the flags parsed, main stops there."""


@contextlib.contextmanager
def stop_after_parsing() -> Iterator[None]:
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        real(self, args, namespace)
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = real  # type: ignore[method-assign]


@contextlib.contextmanager
def quiet() -> Iterator[io.StringIO]:
    """stdout and stderr of a parser (argparse's usage lines) into one buffer."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        yield buf


@contextlib.contextmanager
def patch_attr(owner: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def with_samples(words: Sequence[str]) -> list[str]:
    """$NODE_RANK and the like replaced by a value a cluster would give (SAMPLE_VARS)."""
    pattern = re.compile(r"\$\{?(" + "|".join(SAMPLE_VARS) + r")\}?\b")
    return [pattern.sub(lambda m: SAMPLE_VARS[m[1]], w) for w in words]


_SCRIPTS: dict[Path, Any] = {}


def load_script(path: Path) -> Any:
    """Import a script (code/scripts is not a package) without running its __main__."""
    if path not in _SCRIPTS:
        spec = importlib.util.spec_from_file_location(f"gpu_check_{path.stem}", path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _SCRIPTS[path] = module
    return _SCRIPTS[path]


def parse_problem(fn: Any, argv: list[str], what: str) -> str | None:
    """Run a parser (a parse_args, or a main that builds one) on argv: None if it accepts."""
    from tinyscale.core.errors import UsageError

    try:
        with quiet() as out, stop_after_parsing():
            fn(argv)
    except _Parsed:
        return None
    except UsageError as err:
        return f"{what} refuses its flags: {err}"
    except SystemExit as err:
        if err.code in (0, None):
            return None
        lines = out.getvalue().strip().splitlines()
        return f"{what} refuses its flags: {lines[-1] if lines else err}"
    return None


def titan_problem(argv: list[str]) -> str | None:
    """torchtitan's own parser (its ConfigManager, tyro), as torchtitan_train.py calls it."""
    from torchtitan.config import ConfigManager

    checks = [importlib.import_module(m) for m in TITAN_GPU_CHECKS]
    try:
        with quiet() as out, contextlib.ExitStack() as stack:
            for module in checks:
                stack.enter_context(patch_attr(module, "has_cuda_capability", lambda *a: True))
            ConfigManager().parse_args(argv)
    except SystemExit:
        text = " ".join(re.sub(r"[│╭╮╰╯─]+|-{5,}", " ", out.getvalue()).split())
        m = re.search(
            r"(Error parsing .*?|Unrecognized options: .*?) ?(Available|For full|$)", text
        )
        return f"torchtitan refuses the flags: {m[1] if m else text[-300:]}"
    except (ValueError, TypeError, AttributeError, ImportError) as err:
        return f"torchtitan refuses the flags: {err}"
    return None


def script_problems(script: str, argv: list[str]) -> list[str]:
    path = ROOT / script
    if not path.is_file():
        return [f"runs {script}, which does not exist"]
    if script == TITAN_SCRIPT:
        found = titan_problem(argv)
        return [found] if found else []
    module = load_script(path)
    fn = getattr(module, "parse_args", None) or getattr(module, "main", None)
    if fn is None:
        return [f"{script}: no parse_args or main to check its flags with"]
    found = parse_problem(fn, argv, script)
    return [found] if found else []


def module_problems(name: str, argv: list[str]) -> list[str]:
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        return [f"runs module {name}, which does not exist"]
    if name in WRAPPER_MODULES:
        if not argv:
            return [f"{name} needs a script to run"]
        return target_problems(argv[0], argv[1:], module=False)
    if not name.startswith("tinyscale."):
        return []
    module = importlib.import_module(name)
    fn = getattr(module, "parse_args", None) or getattr(module, "main", None)
    if fn is None:
        return [f"module {name}: no main to check its flags with"]
    found = parse_problem(fn, argv, f"python -m {name}")
    return [found] if found else []


def target_problems(target: str, argv: list[str], *, module: bool) -> list[str]:
    return module_problems(target, argv) if module else script_problems(target, argv)


def python_problems(words: list[str]) -> list[str]:
    """python [-u] (SCRIPT | -m MODULE | -c CODE) ARGS."""
    i = 0
    while i < len(words) and words[i] in ("-u", "-O", "-B", "-E", "-s", "-I"):
        i += 1
    if i >= len(words):
        return []
    if words[i] == "-m":
        return module_problems(words[i + 1], words[i + 2 :])
    if words[i] == "-c":
        return code_problems(words[i + 1], "python -c")
    return script_problems(words[i], words[i + 1 :])


def launcher_problems(prog: str, words: list[str]) -> list[str]:
    """torchrun, deepspeed, accelerate launch: their own parser, then the script's."""
    found = []
    with quiet() as out:
        try:
            if prog == "torchrun":
                from torch.distributed.run import get_args_parser

                a = get_args_parser().parse_args(words)
                target, argv, module = a.training_script, a.training_script_args, a.module
                nodes = as_int(str(a.nnodes)) or 1
                real = Need(nodes * (as_int(str(a.nproc_per_node)) or 1), nodes)
            elif prog == "deepspeed":
                from deepspeed.launcher.runner import parse_args

                a = parse_args(words)
                target, argv, module = a.user_script, a.user_args, a.module
                nodes = max(a.num_nodes, 1)
                real = Need(a.num_gpus * nodes, nodes) if a.num_gpus > 0 else None
                if real is None and "--hostfile" in words:
                    real = hostfile_need(ROOT / a.hostfile)
            else:
                from accelerate.commands.launch import launch_command_parser

                a = launch_command_parser().parse_args(words)
                target, argv, module = a.training_script, a.training_script_args, a.module
                real = Need(a.num_processes, a.num_machines or 1) if a.num_processes else None
        except SystemExit:
            lines = out.getvalue().strip().splitlines()
            return [f"{prog} refuses its flags: {lines[-1] if lines else ''}"]
    light = command_need([prog, *(["launch"] if prog == "accelerate" else []), *words])
    if real is not None and light != real:
        found.append(f"{prog}: GPU count read as {light}, the launcher says {real}")
    return found + target_problems(target, list(argv), module=module)


def sbatch_problems(words: list[str]) -> list[str]:
    """sbatch FLAGS FILE ARGS: the file exists; ARGS reach the command that takes "$@"."""
    _, inner = split_slurm(words)
    if not inner:
        return ["sbatch without a batch file"]
    path = ROOT / inner[0]
    if not path.is_file():
        return []  # file_problems names it
    lines = re.sub(r"\\\n", " ", path.read_text()).splitlines()
    forwards = [ln for ln in lines if '"$@"' in ln and not ln.lstrip().startswith("#")]
    found = []
    for line in forwards[:1]:
        cmd = [w for w in shlex.split(strip_comment(line)) if w not in ("&", "$@")]
        found += [f"{inner[0]}: {p}" for p in command_problems([*cmd, *inner[1:]])]
    return found


def command_problems(words: list[str]) -> list[str]:
    """One simple command: what it runs exists and accepts its flags."""
    _, words = without_env(words)
    if not words:
        return []
    prog, rest = Path(words[0]).name, words[1:]
    if prog in ("python", "python3"):
        return python_problems(rest)
    if prog in ("torchrun", "deepspeed"):
        return launcher_problems(prog, rest)
    if prog == "accelerate" and rest[:1] == ["launch"]:
        return launcher_problems(prog, rest[1:])
    if prog == "srun":
        return command_problems(split_slurm(rest)[1])
    if prog == "sbatch":
        return sbatch_problems(rest)
    if prog in ("apptainer", "singularity") and rest[:1] in (["exec"], ["run"]):
        return command_problems(container_command(rest[1:]))
    return []  # not the course's program: only the files it names


def named_files(words: Sequence[str]) -> list[str]:
    """The words that name a file of this repository (a value after = counts too)."""
    found = []
    for w in words:
        value = w.split("=", 1)[1] if w.startswith("-") and "=" in w else w
        if "$" in value or value.startswith(("/", "-", *OUTPUT_DIRS)) or "://" in value:
            continue
        if value.startswith(REPO_DIRS) or value.endswith(CONFIG_SUFFIXES):
            found.append(value)
    return found


def file_problems(name: str) -> list[str]:
    path = ROOT / name
    if not path.is_file():
        return [f"names {name}, which does not exist"]
    try:
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".toml":
            tomllib.loads(path.read_text())
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            list(yaml.safe_load_all(path.read_text()))
    except Exception as err:  # json's, tomllib's and yaml's errors
        return [f"{name} does not parse: {str(err).splitlines()[0]}"]
    return []


def code_problems(code: str, what: str) -> list[str]:
    """Python code: it compiles, its imports exist, and its calls of the course's functions
    match their signatures."""
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        return [f"{what} does not compile: {err}"]
    found, names = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if importlib.util.find_spec(alias.name.split(".")[0]) is None:
                    found.append(f"{what} imports {alias.name}, which does not exist")
        elif isinstance(node, ast.ImportFrom) and node.module:
            try:
                module = importlib.import_module(node.module)
            except ImportError:
                found.append(f"{what} imports from {node.module}, which does not exist")
                continue
            for alias in node.names:
                if not hasattr(module, alias.name):
                    found.append(f"{what}: {node.module} has no {alias.name}")
                elif node.module.startswith("tinyscale"):
                    names[alias.asname or alias.name] = getattr(module, alias.name)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        fn = names.get(node.func.id)
        starred = any(isinstance(a, ast.Starred) for a in node.args)
        if fn is None or starred or any(kw.arg is None for kw in node.keywords):
            continue
        try:
            inspect.signature(fn).bind(*node.args, **{kw.arg: kw for kw in node.keywords})
        except TypeError as err:
            found.append(f"{what}: {node.func.id}(...) does not match its signature: {err}")
        except ValueError:
            pass  # no signature to read
    return found


def block_problems(block: GpuBlock) -> list[str]:
    """Everything --cpu checks in one block, as lines "page:line: problem"."""
    found = []
    derived = derived_need(block)
    if block.marked is not None and derived is not None and derived.gpus != block.marked:
        found.append(f"<!--gpus: {block.marked}--> but the command says {derived.gpus}")
    if need(block) is None:
        found.append("no GPU count: the command does not say; add <!--gpus: N--> above it")
    if block.syntax == "python":
        found += code_problems(block.code, "the block")
    else:
        used = set()
        for words in commands(block.code):
            found += command_problems(with_samples(words))
            for name in named_files(without_env(words)[1][1:]):
                used.add(name)
                said = any(f"runs {name}," in p for p in found)  # a missing script, once
                if name not in block.yours and not said:
                    found += file_problems(name)
        found += [
            f"<!--your-file: {n}--> but the block names no such file"
            for n in block.yours
            if n not in used
        ]
    return [f"{block.where}: {p}" for p in found]


def cpu_check(blocks: Sequence[GpuBlock]) -> list[str]:
    found = []
    for block in blocks:
        found += block_problems(block)
    return found


# --- GPU mode ----------------------------------------------------------------------------
def record_path(page: str, records: Path = RECORDS) -> Path:
    """docs/generated/gpu/<part>__<page-stem>.json: week-1/collectives.md -> week-1__collectives.json."""
    return records / (page.removesuffix(".md").replace("/", "__") + ".json")


def read_record(path: Path) -> dict[str, Any]:
    record = json.loads(path.read_text())
    assert set(record) == {"page", "blocks", "tests"}, f"{path}: keys {sorted(record)}"
    for entry in record["blocks"]:
        missing = {"command", "gpus", "machine", "date", "exit_code", "wall_s", "output_tail"}
        assert missing <= set(entry), f"{path}: a block lacks {sorted(missing - set(entry))}"
    for entry in record["tests"]:
        assert {"test", "outcome", "machine", "date"} <= set(entry), f"{path}: {entry}"
    return record


def write_record(
    page: str,
    blocks: Sequence[dict[str, Any]],
    tests: Sequence[dict[str, Any]] = (),
    records: Path = RECORDS,
    docs: Path = DOCS,
) -> Path:
    """Merge this run into the page's record: a block's or test's new result replaces its
    old one; results of blocks no longer on the page are dropped."""
    path = record_path(page, records)
    old = read_record(path) if path.is_file() else {"page": page, "blocks": [], "tests": []}
    on_page = {b.code for b in page_blocks(docs / page, docs)} if (docs / page).is_file() else None
    by_command = {e["command"]: e for e in old["blocks"]} | {e["command"]: e for e in blocks}
    by_test = {e["test"]: e for e in old["tests"]} | {e["test"]: e for e in tests}
    kept = [e for c, e in by_command.items() if on_page is None or c in on_page]
    record = {
        "page": page,
        "blocks": kept,
        "tests": sorted(by_test.values(), key=lambda e: e["test"]),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


def machine() -> dict[str, Any]:
    """This machine's GPU and versions, read in a child process (the parent stays off CUDA)."""
    probe = (
        "import json, torch; c = torch.cuda.is_available(); print(json.dumps({"
        "'gpus': torch.cuda.device_count() if c else 0,"
        "'gpu': torch.cuda.get_device_name(0) if c else None,"
        "'torch': torch.__version__, 'cuda': torch.version.cuda,"
        "'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if c else None}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    info = json.loads(out.stdout.strip().splitlines()[-1])
    driver = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        driver = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 and smi.stdout else None
    return {**info, "driver": driver}


def variables(code: str) -> set[str]:
    """The shell variables a block reads, less those it sets itself."""
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", code))
    return used - set(re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)=", code))


def programs(block: GpuBlock) -> list[str]:
    """The programs a bash block starts (through srun and containers too)."""
    found = []
    for words in commands(block.code):
        _, words = without_env(words)
        if words and words[0] not in SHELL_WORDS:
            found.append(words[0])
    return found


def why_not(block: GpuBlock, gpus: int, env: dict[str, str]) -> str | None:
    """Why this machine cannot run the block; None if it can."""
    n = need(block)
    if n is None:
        return "no GPU count"
    if n.gpus == 0:
        return "uses no GPU: it needs a GPU cluster's login node"
    if n.nodes > 1:
        return f"needs {n.nodes} nodes"
    if n.gpus > gpus:
        return f"needs {n.gpus} GPU{'s' if n.gpus > 1 else ''}, {gpus} here"
    if block.syntax != "python":
        missing = [
            p
            for p in programs(block)
            if not (shutil.which(p, path=env["PATH"]) or ("/" in p and (ROOT / p).exists()))
        ]
        if missing:
            return f"needs {', '.join(sorted(set(missing)))}"
        unset = sorted(v for v in variables(block.code) if v not in env)
        if unset:
            return f"needs ${', $'.join(unset)}"
    return None


def run_env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for name in PROVIDED_VARS:
        env.setdefault(name, str(scratch / name.lower()))
    return env


def tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-TAIL_LINES:])[-TAIL_CHARS:]


def run_block(block: GpuBlock, env: dict[str, str], timeout_s: float, scratch: Path) -> dict:
    """Run one block as a reader would paste it: bash stops at the first failing line."""
    if block.syntax == "python":
        script = scratch / f"block_{block.page.replace('/', '_')}_{block.lineno}.py"
        script.write_text(block.code)
        n = need(block) or Need(1)
        argv = [sys.executable, str(script)]
        if "LOCAL_RANK" in block.code:  # launched by torchrun, one process per GPU
            argv = ["torchrun", "--standalone", f"--nproc-per-node={n.gpus}", str(script)]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    code, timed_out, wall = run_limited(argv, env, timeout_s, scratch / "block.log")
    return {
        "line": block.lineno,
        "command": block.code,
        "gpus": (need(block) or Need(0)).gpus,
        "exit_code": code,
        "timed_out": timed_out,
        "wall_s": wall,
        "output_tail": tail((scratch / "block.log").read_text(errors="replace")),
    }


def run_limited(
    argv: Sequence[str], env: dict[str, str], timeout_s: float, log: Path
) -> tuple[int | None, bool, float]:
    """Run argv, its output (stdout and stderr, interleaved) into ``log``; at the time
    limit, end it and every process it started (torchrun's workers too)."""
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code, timed_out = proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code, timed_out = None, True
    return code, timed_out, round(time.monotonic() - start, 1)


def cuda_tests(tests: Path = TESTS) -> list[str]:
    """Test ids that run only where CUDA is: skipped without it, or a branch under
    `if torch.cuda.is_available():`."""
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        source = path.read_text("utf-8")
        if "cuda.is_available" not in source:
            continue
        for node in ast.parse(source).body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            decorators = [ast.unparse(d) for d in node.decorator_list]
            skipped = any("skipif(not torch.cuda.is_available()" in d for d in decorators)
            branch = any(
                isinstance(n, ast.If)
                and ast.unparse(n.test).endswith("cuda.is_available()")
                and not ast.unparse(n.test).startswith("not ")
                and not all("skip" in ast.unparse(s) for s in n.body)
                for n in ast.walk(node)
            )
            if skipped or branch:
                found.append(f"{path.relative_to(ROOT).as_posix()}::{node.name}")
    return found


def run_tests(
    ids: Sequence[str], env: dict[str, str], timeout_s: float, scratch: Path
) -> list[dict]:
    """pytest on the CUDA tests; one result per test (junit XML)."""
    import xml.etree.ElementTree as ET

    if not ids:
        return []
    report = scratch / "cuda_tests.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
    code, timed_out, wall = run_limited([*argv, *ids], env, timeout_s, scratch / "tests.log")
    print(tail((scratch / "tests.log").read_text(errors="replace")))
    if timed_out or not report.is_file():
        outcome = "timed out" if timed_out else f"not run (pytest exit {code})"
        return [{"test": t, "outcome": outcome, "message": "", "wall_s": wall} for t in ids]
    results = []
    for case in ET.parse(report).iter("testcase"):
        file = case.get("classname", "").replace(".", "/") + ".py"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = ((child.get("message") or "").splitlines() or [""])[0][:300]
        results.append(
            {"test": f"{file}::{case.get('name')}", "outcome": outcome, "message": message,
             "wall_s": round(float(case.get("time", 0)), 1)}
        )  # fmt: skip
    return results


def pages_naming(test_file: str, docs: Path = DOCS) -> list[str]:
    """The pages that name a test file (its results are shown there)."""
    return sorted(
        p.relative_to(docs).as_posix()
        for p in docs.rglob("*.md")
        if "generated" not in p.relative_to(docs).parts and test_file in p.read_text("utf-8")
    )


def plan(
    blocks: Sequence[GpuBlock], gpus: int, env: dict[str, str]
) -> list[tuple[GpuBlock, str | None]]:
    return [(b, why_not(b, gpus, env)) for b in blocks]


def print_plan(rows: Sequence[tuple[GpuBlock, str | None]], gpus: int) -> None:
    runs = [b for b, why in rows if why is None]
    print(f"{len(rows)} GPU blocks; this machine has {gpus} GPU(s): {len(runs)} would run")
    for block, why in rows:
        n = need(block)
        count = (
            "?"
            if n is None
            else f"{n.gpus} GPU(s)" + (f" on {n.nodes} nodes" if n.nodes > 1 else "")
        )
        print(f"  {'run ' if why is None else 'skip'} {block.where:<45} {count:<18} {why or ''}")


def gpu_mode(args: argparse.Namespace) -> int:
    info = machine()
    gpus = info["gpus"]
    scratch = Path(
        tempfile.mkdtemp(
            prefix="gpu-check-", dir=ROOT / "build" if (ROOT / "build").is_dir() else None
        )
    )
    env = run_env(scratch)
    blocks = [
        b for b in all_blocks(args.docs) if not args.only or any(o in b.where for o in args.only)
    ]
    rows = plan(blocks, gpus, env)
    print_plan(rows, gpus)
    tests = cuda_tests()
    print(f"{len(tests)} tests that need CUDA")
    if args.list:
        return 0
    if not gpus:
        print(
            "no CUDA GPU on this machine: nothing to run (python tools/gpu_check.py --cpu checks the blocks without one)"
        )
        return 1
    date = datetime.date.today().isoformat()
    deadline = time.monotonic() + args.budget
    results: dict[str, list[dict]] = {}
    for block, why in rows:
        left = deadline - time.monotonic() - TESTS_TIMEOUT_S
        if why is not None:
            continue
        if left < 10:
            print(f"  not run (time budget spent): {block.where}")
            continue
        limit = min(args.timeout, left, WATCH_S if WATCHES.search(block.code) else args.timeout)
        print(f"  running {block.where} (at most {limit:.0f} s) ...", flush=True)
        result = run_block(block, env, limit, scratch)
        result |= {"machine": info, "date": date}
        print(f"    exit {result['exit_code']} in {result['wall_s']} s")
        results.setdefault(block.page, []).append(result)
    test_results: dict[str, list[dict]] = {}
    left = max(30.0, deadline - time.monotonic())
    for result in run_tests(tests, env, min(TESTS_TIMEOUT_S, left), scratch):
        result |= {"machine": info, "date": date}
        for page in pages_naming(result["test"].split("::")[0], args.docs):
            test_results.setdefault(page, []).append(result)
    for page in sorted(set(results) | set(test_results)):
        path = write_record(
            page, results.get(page, []), test_results.get(page, []), args.records, args.docs
        )
        print(f"wrote {path}")
    failed = [r for rs in results.values() for r in rs if r["exit_code"] != 0]
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cpu", action="store_true", help="check every GPU block without a GPU")
    p.add_argument("--list", action="store_true", help="print the plan: what would run here")
    p.add_argument("--docs", type=Path, default=DOCS, help="the pages' folder")
    p.add_argument("--records", type=Path, default=RECORDS, help="where the records go")
    p.add_argument(
        "--only", nargs="+", metavar="PAGE", help="only these blocks, e.g. workshop/lab-1.md"
    )
    p.add_argument("--timeout", type=float, default=BLOCK_TIMEOUT_S, help="s per block")
    p.add_argument("--budget", type=float, default=BUDGET_S, help="s for the whole GPU run")
    args = p.parse_args(argv)
    if args.cpu:
        blocks = all_blocks(args.docs)
        found = cpu_check(blocks)
        for block in blocks:
            n = need(block)
            print(f"{block.where}: {n.text() if n else 'no GPU count'}")
        print("\n".join(found) if found else f"{len(blocks)} GPU blocks: every check passed")
        return 1 if found else 0
    return gpu_mode(args)


if __name__ == "__main__":
    sys.exit(main())
