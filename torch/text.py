"""A real text corpus that is on every machine (the Python standard library's source) and a
word-level LSTM language model whose embedding gradients are sparse by nature."""
import collections
import re
import sysconfig
from pathlib import Path

import torch
from torch import nn

_WORD = re.compile(r"[A-Za-z_]+|[0-9]+|[^\sA-Za-z_0-9]")


def stdlib_corpus(vocab_size=10_000, max_tokens=400_000, val_fraction=0.1):
    """(train ids, validation ids, vocabulary size) from the stdlib's .py files, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    tokens = []
    for path in sorted(root.glob("*.py")):
        tokens += _WORD.findall(path.read_text(errors="ignore"))
        if len(tokens) >= max_tokens:
            break
    tokens = tokens[:max_tokens]
    common = [w for w, _ in collections.Counter(tokens).most_common(vocab_size - 1)]
    ids = {w: i + 1 for i, w in enumerate(common)}  # 0 = out of vocabulary
    data = torch.tensor([ids.get(w, 0) for w in tokens], dtype=torch.long)
    split = int(len(data) * (1 - val_fraction))
    return data[:split], data[split:], vocab_size


def batches(data, batch, seq, generator):
    """Random (input, target) windows of seq tokens."""
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=generator)
    x = torch.stack([data[s:s + seq] for s in starts])
    y = torch.stack([data[s + 1:s + seq + 1] for s in starts])
    return x, y


class WordLSTM(nn.Module):
    """Embedding (large, sparse gradients) -> LSTM -> vocabulary logits."""

    def __init__(self, vocab, dim=256, hidden=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.out(self.lstm(self.embed(x))[0])
