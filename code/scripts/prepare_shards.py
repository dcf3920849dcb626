# --8<-- [start:main]
"""Tokenize the corpus once into token shards on disk, for the labs' --corpus shards:DIR.

Launch:  python code/scripts/prepare_shards.py --out runs/shards --shard-tokens 65536
Faster:  torchrun --standalone --nproc-per-node 2 code/scripts/prepare_shards.py --out runs/shards

Under torchrun, rank r writes shards r, r + N, ... and rank 0 writes the index last.
Run it again after an interruption: the shards already written are checked and kept.
"""

import argparse
import os
import sys
from collections.abc import Sequence

from tinyscale.comm.dist import distributed
from tinyscale.core.cli import add_flags, from_args
from tinyscale.core.config import load_model_config
from tinyscale.core.errors import ArgumentParser, run_cli
from tinyscale.core.training import TrainConfig
from tinyscale.workflows.shards import ShardSpec, check_out, prepare, tokenize_once

DEFAULTS = TrainConfig()


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, DEFAULTS, ("config", "corpus", "progress", "timeout_s"),
              notes={"config": "its vocab_size sizes the tokenizer"})  # fmt: skip
    p.add_argument(
        "--out", default="runs/shards", help="the shard directory (default: %(default)s)"
    )
    p.add_argument("--shard-tokens", type=int, default=65536, help="tokens per shard file")
    args = p.parse_args(argv)
    cfg = from_args(DEFAULTS, args)  # every TrainConfig flag is checked here
    spec = ShardSpec(corpus=cfg.corpus, vocab_size=load_model_config(cfg.config).vocab_size,
                     shard_tokens=args.shard_tokens)  # fmt: skip
    check_out(args.out)  # every file it writes, before any rank writes one
    if "WORLD_SIZE" in os.environ:  # torchrun: the ranks share the work
        tokenize_once(spec)  # the corpus checked (and cached) before the ranks meet
        with distributed("cpu", timeout_s=cfg.timeout_s):
            done = prepare(spec, args.out, progress=args.progress)
    else:
        done = prepare(spec, args.out, progress=args.progress)
    if done["rank"] == 0:  # one report, whatever the number of ranks
        print(f"{args.out}: {done['shards']} shards by {done['world_size']} process(es): "
              f"{done['written']} written, {done['shards'] - done['written']} already complete; "
              "index.json written last")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
# --8<-- [end:main]
