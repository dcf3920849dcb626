"""Run at the start of every Python process of the test run (`make test` puts this folder
on PYTHONPATH; the root conftest.py does it for a bare pytest).

Importing torch and torch._dynamo leaves about 320,000 objects that CPython's cyclic
garbage collector tracks. A full collection walks all of them, and by default one runs
each time the heap has grown by a quarter: during the import, many times over a growing
heap. Measured here: `import torch, torch._dynamo` and the course's training modules took
5.7 s of CPU with the default thresholds and 4.4 s with full collections made rarer.
The suite starts hundreds of such processes (every page command, every torchrun rank).

Only *when* cyclic garbage is collected changes: young objects are collected as often as
before, no result depends on it, and most processes of the test run live for seconds.
Readers' own runs keep Python's defaults.
"""

import gc

YOUNG, MIDDLE, FULL = gc.get_threshold()  # (700, 10, 10) by default
gc.set_threshold(YOUNG, MIDDLE, 100 * FULL)  # a full collection 100 times less often
