"""Checkpoints that follow the job, as pure values: each node's scan of `--checkpoint-dir`
read and checked (model.py), when an entry there is a complete checkpoint, judged over
successive scans on the head's clock (complete.py), which nodes must get a copy of each
node's part of it and which copies of deleted checkpoints go (placement.py), and what a
restart puts back in the checkpoint directory of the next attempt's nodes: the newest
checkpoint whose every part some surviving node holds, and where each missing file comes
from (staging.py). Nothing here reaches a node: the scans come in as values and the orders
go out as values.
"""
