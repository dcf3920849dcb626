"""Numbers in the prose of docs/workshop/ that pass by rule, not by data.

Read by tools/prose_numbers.py; the format and the rules are in tests/docs/prose_rules/README.md.
"""

PROSE_RULES: dict[str, list[tuple[str, str]]] = {
    "workshop/lab-1.md": [
        ("a typo never leaves a half-made run directory behind", "not a number"),
        ("run the script twice with one seed and you get the same numbers twice", "not a number"),
    ],
    "workshop/lab-2.md": [
        ("Run 40 steps with two processes:", "definition"),
        ("Run the same 40 steps with 4 processes; the global batch stays 32", "definition"),
        ("Four processes *share* the two cores: each gets about half a core", "arithmetic"),
        ("four processes share them, each on half a core", "arithmetic"),
    ],
    "workshop/lab-3.md": [
        ("the Lab 2 script for 3 steps:", "definition"),
        ("The last check waits 3 s (`--rdzv-timeout`)", "definition"),
        ("After 3 steps the model is barely trained", "definition"),
        ("the four ranks computed together, each on a quarter of it", "arithmetic"),
        ("four share them, half a core each", "arithmetic"),
        (
            "25–400 Gb/s of Ethernet or InfiniBand (400 Gb/s is an NDR InfiniBand port, by its "
            "specification) versus 900 GB/s of NVLink inside an H100 node (NVIDIA's datasheet)",
            "source",
        ),
        ("8 ranks reach a barrier; 7 arrive at t = 0, one at t = 2 s", "example"),
        ("The 7 early ranks wait 2 s each — 14 rank-seconds", "arithmetic"),
        ("On 3 ranks, one 1 s late", "example"),
        ("A barrier took 4 s on rank 0 and 0.01 s on rank 3", "example"),
    ],
    "workshop/session-a.md": [
        ("with a checkpoint every 50 steps", "definition"),
        ("a reader sees the old checkpoint or the new one, never half of one", "not a number"),
    ],
    "workshop/session-b.md": [
        ("the all-reduce runs in two phases of N − 1 steps", "definition"),
        ("After N − 1 steps each rank owns one chunk", "definition"),
        ("splits the data in two halves and reduces each", "not a number"),
        ("~450 GB/s (NVIDIA's H100 datasheet: 900 GB/s both ways)", "source"),
        ("~64 GB/s (the PCIe 5 specification: 32 GT/s × 16 lanes)", "source"),
        (
            "one 400 Gb/s NIC per GPU | ~50 GB/s (the NDR specification: 400 Gb/s ÷ 8)",
            "source",
        ),
        ("The ninefold step (450 ÷ 50 GB/s) from NVLink to the network", "arithmetic"),
        ("on 8 GPUs, from 8 bytes to 1 GiB", "definition"),
    ],
    "workshop/session-c.md": [
        ("A job checkpoints every 500 steps at 1.2 s per step", "example"),
        ("up to 500 × 1.2 = 600 s of training", "arithmetic"),
    ],
    "workshop/deepspeed.md": [
        (
            "every parameter costs 16 bytes: 2 for the bf16 weight, 2 for its bf16 gradient, and 12 for the optimizer",
            "arithmetic",
        ),
        ("| 7.5B parameters on 64 GPUs |", "example"),
        ("each half moves about Ψ elements per rank", "not a number"),
        ("and reduce-scatters the gradients: 3Ψ, 1.5 times DDP", "arithmetic"),
        (
            "Two CPU processes train Lab 2's model with ZeRO-2 in bf16 (what `zero2.json` says) for 20 steps",
            "definition",
        ),
        (
            "12Ψ/2 = 994.5 KiB: half of the fp32 master weights and of Adam's two moments",
            "arithmetic",
        ),
        ("steps without overflow before the scale doubles", "definition"),
        ("overflows tolerated before the scale halves", "definition"),
        ("AdamW, lr 3e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1", "definition"),
        ("bigger is fewer, larger messages | 5e7", "definition"),
        ("the all-gather of updated weights (stages 1, 2) | 5e7", "definition"),
        ("elements of upcoming layers to gather ahead of time | 5e7", "definition"),
        ("1e5 (DeepSpeed's default) on a large model", "source"),
        ("at most this many gathered elements alive at once | 1e9", "definition"),
        (
            "keep a gathered weight if it is used again within this many elements | 1e9",
            "definition",
        ),
        ("4 + 8 bytes of optimizer state per parameter, not plain Adam's 8", "definition"),
        ("A 7.5B-parameter model trains with mixed-precision Adam on 64 GPUs", "example"),
        ("with Ψ = 7.5 × 10⁹ and N = 64", "example"),
        ("An 80 GB GPU fits the model from ZeRO-1 on (activations not counted)", "example"),
        ("The all-reduce is cut in its two halves", "not a number"),
    ],
    "workshop/checkpoints.md": [
        ("so a crash leaves the old checkpoint or the new one, never half of one", "not a number"),
    ],
    "workshop/kubernetes.md": [
        (
            "Containers get 64 MiB of shared memory, the container runtime's default (Docker's reference for `docker run --shm-size` documents it)",
            "source",
        ),
        ("Half a job can hold its GPUs while it waits for the other half", "not a number"),
        ("They meet again at the rendezvous and start a new group, at most 3 times", "definition"),
        (
            "The GPU limit alone leaves 4 processes on 8 GPUs: half the GPUs would sit idle",
            "arithmetic",
        ),
        (
            "Containers get 64 MiB of shared memory by default (the runtime's default, in Docker's reference for `docker run --shm-size`)",
            "source",
        ),
    ],
    "workshop/accelerate.md": [
        (
            "8 blocks per micro-batch × 1 × 2 processes = 16 blocks per step**: each process computes on half of Lab 1's batch",
            "arithmetic",
        ),
        ("every process draws the same masks for its half", "not a number"),
        ("each process's loss on its half, averaged over processes", "not a number"),
        (
            "which is why Session A counts 16 bytes per parameter for mixed precision too",
            "definition",
        ),
    ],
}
