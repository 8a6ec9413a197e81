"""A config zoo for transformers' own TP: tiny random Llamas, one per shape a TP plan must handle.

    write(directory)   each config saved with save_pretrained in directory/NAME: [(NAME, path)]
    .venv/bin/python -m tp_from_scratch.verify.zoo      runs `verify model --zoo` (t = 2, 3, 4, both
                                                        dtypes) and prints the table of docs/verify.md

Every weight is drawn at random (a zero bias or a unit norm would hide a bias added t times or
a norm applied to a shard); 2 layers; nothing downloaded.
"""
import json
import os
import subprocess
import sys
import tempfile

BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1, pad_token_id=None)

# name -> (what it tries, the changes to BASE)
ZOO = {
    "even": ("every size divisible by t = 2, 4", {}),
    "gqa": ("grouped-query attention, 2 KV heads", dict(num_key_value_heads=2)),
    "kv1": ("one KV head: fewer KV heads than ranks at every t", dict(num_key_value_heads=1)),
    "heads3": ("3 heads of 16: heads not divisible by t = 2, 4", dict(hidden_size=48, num_attention_heads=3,
                                                                      num_key_value_heads=3)),
    "uneven": ("FFN 101 and vocabulary 131: uneven at every t", dict(hidden_size=48, num_attention_heads=12,
                                                                     num_key_value_heads=12, intermediate_size=101,
                                                                     vocab_size=131)),
    "tied": ("tied embeddings (GQA)", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "bias": ("attention and MLP biases (GQA)", dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True)),
    "padding": ("padding_idx 5 (pad_token_id)", dict(pad_token_id=5)),
}


def write(directory, seed=0, names=None):
    """Save the zoo configs (all, or ``names``) with random weights under ``directory``; [(name, path)]."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    from tp_from_scratch.verify.models import randomize
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    out = []
    for i, (name, (_, changes)) in enumerate(ZOO.items()):
        if names is not None and name not in names:
            continue
        path = os.path.join(directory, name)
        model = randomize(LlamaForCausalLM(LlamaConfig(**{**BASE, **changes})), seed + i)
        model.save_pretrained(path)
        out.append((name, path))
    return out


def markdown(document):
    """The docs' table from `verify model --zoo --json`'s document."""
    rows = document["configurations"]
    launches = list(dict.fromkeys(str(r["group"]) if r["group"] == r["world"] else f"{r['group']}of{r['world']}"
                                  for r in rows))
    lines = ["| config | what it tries | " + " | ".join(f"t = {t}" for t in launches) + " |",
             "|---|---|" + "---|" * len(launches)]
    for name, (what, _) in ZOO.items():
        cells = []
        for t in launches:
            mine = [r for r in rows if r["label"] == f"zoo:{name}" and
                    (str(r["group"]) if r["group"] == r["world"] else f"{r['group']}of{r['world']}") == t]
            cells.append("; ".join(f"{r['dtype'].replace('float', 'f')} {_cell(r)}" for r in mine) or "-")
        lines.append(f"| {name} | {what} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(r):
    if r["verdict"] == "equal":
        worst = max((c["error"] or 0.0 for c in r["checks"] if c["bound"]), default=0.0)
        return f"equal ({worst:.0e})" if worst else "equal (bitwise)"
    if r["verdict"] == "crashed":
        return f"**crashed** in {r['phase']}: `{r['message'].split(' (at ')[0][:70]}`"
    return f"**{r['verdict']}**"


def main(argv=None):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "zoo.json")
        cmd = [sys.executable, "-m", "tp_from_scratch.verify", "model", "--zoo", "--t", "2,3,4", "--json", out,
               *(argv if argv is not None else sys.argv[1:])]
        code = subprocess.call(cmd, stdout=sys.stderr)
        if not os.path.exists(out):
            return code or 2
        print(markdown(json.loads(open(out).read())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
