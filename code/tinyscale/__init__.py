# --8<-- [start:package]
"""tinyscale: the code of the course, one concept per module.

config (the model's shape), model (TinyTransformer), data (corpus, tokenizer, blocks),
training (the loop), checkpoint (atomic save, safe load), metrics (logs and curves),
memory (estimates and measurements), errors (one-line errors, exit code 2).
"""
# --8<-- [end:package]
