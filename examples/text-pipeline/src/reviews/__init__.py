"""A small text classifier, written as an ordinary PyTorch project: jsonl shards, a pure-Python
tokenizer, a padding collate, an embedding model. feedbench measures it as it is
(../../config.yaml); nothing here imports feedbench."""
