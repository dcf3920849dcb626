# --8<-- [start:all]
"""torchtitan's trainer, with tinyscale's CPU patches applied first when there is no GPU.

Laptop:  torchrun --nproc-per-node 2 code/scripts/torchtitan_train.py \
             --module tinyscale.compat.titan_config --config tinyscale_debug
GPUs:    torchrun --nproc-per-node 8 code/scripts/torchtitan_train.py \
             --module llama3 --config llama3_debugmodel

Every argument goes to torchtitan: --module/--config pick a config function, and
<section>.<field> flags override it (see --help).
"""

from tinyscale.compat import titan_compat

if __name__ == "__main__":
    titan_compat.apply()  # no-op on a GPU machine
    from torchtitan.train import main  # imported after the patches: it binds device_type

    main()
# --8<-- [end:all]
