"""The course map's data: one line per lesson. Adding a lesson is adding its line here.

Each line: the lesson's number (its notebook is lessons/NN_*.ipynb), a short title, the
parallelism (or the idea about parallelism) it teaches, and the lessons it directly builds on.
tests/test_site.py checks that every notebook in lessons/ has its line and every line its notebook.
(Which package is which lesson's is tests/test_layout.py's LESSON map; the API pages read it there.)
"""
LESSONS = [
    # number, title, what it teaches (short: it is drawn in a box), builds on
    (1, "Split a matmul", "column and row shards", ()),
    (2, "Collectives", "all-reduce on send/recv", (1,)),
    (3, "Parallel MLP", "TP of the MLP: f and g", (2,)),
    (4, "Parallel attention", "TP over attention heads", (3,)),
    (5, "TP in autograd", "TP layers for torch", (4,)),
    (6, "Training a TP GPT", "TP training, torchrun", (5,)),
    (7, "Sequence parallel", "sequence parallelism", (6,)),
    (8, "Partial sync", "partially synced TP", (6,)),
    (9, "When TP pays", "compute vs communication", (6,)),
    (10, "Overlap", "hiding communication", (7,)),
    (11, "Parallelisms", "DP, ZeRO, pipelines + TP", (6,)),
    (12, "DeepSeek-V3", "experts: all-to-all, MLA", (5, 11)),
    (13, "TP numerics", "the same bits at every t", (10,)),
    (14, "TP inference", "decode, sampling, SPD", (6, 8, 9)),
]
