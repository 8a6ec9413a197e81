"""The course map's data: one line per lesson. Adding a lesson is adding its line here.

Each line: the lesson's number (its notebook is lessons/NN_*.ipynb), a short title, the
parallelism (or the idea about parallelism) it teaches, the lessons it directly builds on,
and the packages of tp_from_scratch it writes (the site's API pages follow this order).
tests/test_site.py checks that every notebook in lessons/ has its line and every line its notebook.
"""
LESSONS = [
    # number, title, what it teaches, builds on, packages
    (1, "Split a matmul", "column and row shards", (), ("sharding", "matmul")),
    (2, "Collectives", "all-reduce from send/recv", (1,), ("comm", "collectives")),
    (3, "Parallel MLP", "tensor parallelism: f and g", (2,), ("layers",)),
    (4, "Parallel attention", "TP over attention heads", (3,), ()),
    (5, "TP in autograd", "TP layers for torch", (4,), ("nn",)),
    (6, "Training a TP GPT", "TP training, torch.distributed", (5,), ("gpt",)),
    (7, "Sequence parallelism", "sequence parallelism (SP)", (6,), ("sequence_parallel",)),
    (8, "Partial sync", "partially synced activations", (6,), ("partial_sync",)),
    (9, "When TP pays", "compute vs communication", (6,), ("planner",)),
    (10, "Overlap", "hiding communication", (7,), ("overlap",)),
    (11, "Parallelisms", "data, ZeRO, pipeline with TP", (6,), ("parallelisms",)),
]
