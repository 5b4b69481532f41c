"""Hypothesis strategies for Python modules with DataParallel sites in the code shapes real scripts have.

A module is a header of imports (every spelling the tool resolves) and a body of statements nested in
guards, loops, functions, classes, ``try``, ``with`` and ``match`` blocks, with comments in between and
on lines, an indentation of spaces or tabs, LF or CRLF line ends, form feeds, and sometimes no final
newline. Sites sit in assignments, attributes, comprehensions, lambdas, walrus expressions, f-strings,
default arguments, decorators, conditional expressions, and across line continuations.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

from hypothesis import strategies as st

IMPORTS = (
    "import torch",
    "import torch.nn as nn",
    "from torch.nn import DataParallel as DP",
    "from torch.nn import parallel",
    "import functools",
    "from torch.utils.data import DataLoader",
    "import torch.distributed as dist",
    "from tqdm import tqdm",
)

# Each spelling of a DataParallel call on ``model``; all resolve through the header above.
SITES = (
    "nn.DataParallel(model)",
    "torch.nn.DataParallel(model, device_ids=[0, 1])",
    "torch.nn.parallel.DataParallel(model, device_ids=list(range(2)), output_device=0)",
    "DP(model, [0, 1], 0)",
    "nn.DataParallel(model, dim=1)",
    "nn.DataParallel(module=model, dim=0)",
    "parallel.DataParallel(model).cuda()",
    "nn.DataParallel(model, **options)",
    "nn.parallel.data_parallel(model, inputs)",
    "torch.nn.parallel.data_parallel(model, inputs, device_ids=[0, 1], dim=0)",
    "nn.DataParallel(\n${inner}model,  # the network\n${inner}device_ids=[0, 1],\n${outer})",
    "nn.DataParallel(model,\n${inner}device_ids=[i for i in range(torch.cuda.device_count())])",
    "nn.DataParallel(torch.optim.SGD(model.parameters(), lr=0.1))",  # no model: left with MGP252
)

# Statements holding a site: ``$site`` is filled in; ``$outer``/``$inner`` are indentations.
SITE_STATEMENTS = (
    "model = $site",
    "self.model = $site",
    "model.features = $site",
    "models = [$site for model in models]",
    "wrap = lambda model: $site",
    "(wrapped := $site)",
    'print(f"wrapped: {$site!r}")',
    "model = \\\n${inner}${site}",
    "model = (\n${inner}${site}\n${outer})",
    "model = $site if torch.cuda.device_count() > 1 else model",
    "model = $site; step = 0",
    "nets = {'a': $site}",
)

PLAIN_STATEMENTS = (
    "step = 0",
    "pass",
    "# a comment about DataParallel",
    "label = 'nn.DataParallel(model) in a string'",
    "total = sum(x * 2 for x in range(3))",
    "items = {k: v for k, v in {}.items()}",
    "n_gpu = torch.cuda.device_count()",
    "model = model.module if hasattr(model, 'module') else model",
    "loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2)",
    "criterion = nn.CrossEntropyLoss(ignore_index=-100)",
    "outputs = model(inputs); loss = criterion(outputs, targets); loss.backward()",
    "loss = model(inputs, labels=labels)[0]",
    "loss = loss.mean()",
    "torch.save(model.module.state_dict(), 'checkpoint.pt')",
    "model.load_state_dict(torch.load('checkpoint.pt', map_location='cpu'))",
    "if isinstance(model, nn.DataParallel): model = model.module",
    "inputs, targets = inputs.cuda(non_blocking=True), targets.to(device)",
    "device = torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
    "norm = nn.BatchNorm2d(16)",
    "print(f'step {step}: loss {loss.item():.4f}')",
    "optimizer.zero_grad(); optimizer.step()",
)

# Block openers; a block follows, indented one level. Function bodies allow ``return``.
BLOCKS = (
    "if torch.cuda.device_count() > 1:",
    "if n_gpu > 1:  # several devices",
    "for step in range(2):",
    "while False:",
    "with torch.no_grad():",
    "def build(model, options=None):",
    "async def build_async(model):",
    "@functools.lru_cache(maxsize=None)\n${outer}def cached(model):",
    "def with_default(model, wrapped=$site):",
    "class Net(nn.Module):",
    "try:",
    "match config:\n${outer}${indent}case {'multi_gpu': True}:",
    "for inputs, targets in loader:",
    "for step, (inputs, targets) in enumerate(tqdm(loader)):",
    "for epoch in range(10):",
    "if __name__ == '__main__':",
    "def main():",
    "def forward(self, inputs, labels=None):",
)


@dataclass
class Module:
    source: str
    sites: int
    silenced: int


@st.composite
def _statements(draw, depth: int, level: int, indent: str, in_function: bool) -> tuple[list[str], int, int]:
    outer = indent * level
    lines: list[str] = []
    sites = silenced = 0
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(("site", "plain", "return", "block") if depth > 0 else ("site", "plain", "return")))
        if kind == "plain" or (kind == "return" and not in_function):
            lines.append(outer + draw(st.sampled_from(PLAIN_STATEMENTS)))
            continue
        if kind in ("site", "return"):
            site = draw(st.sampled_from(SITES))
            statement = "return $site" if kind == "return" else draw(st.sampled_from(SITE_STATEMENTS))
            text = Template(statement).safe_substitute(site=site)
            text = Template(text).substitute(outer=outer, inner=outer + indent)
            if "\n" not in text:
                suffix = draw(st.sampled_from(("", "", "  # wrap it", "  # noqa: MGP101", "  # noqa")))
                silenced += "noqa" in suffix
                text += suffix
            lines.append(outer + text)
            sites += 1
            continue
        opener = draw(st.sampled_from(BLOCKS))
        if "$site" in opener:
            sites += 1
        site = draw(st.sampled_from(SITES[:4]))
        lines.append(outer + Template(opener).substitute(site=site, outer=outer, indent=indent))
        body_level = level + 2 if opener.startswith("match") else level + 1
        function = in_function or " def " in f" {opener.split(chr(10))[-1].lstrip()}"
        if draw(st.booleans()):
            lines.append(indent * body_level + "# a comment inside the block")
        body, body_sites, body_silenced = draw(_statements(depth - 1, body_level, indent, function))
        if opener.startswith("class"):
            body = [indent * body_level + "def __init__(self, model):"] + [indent + line for line in body]
        lines += body
        sites, silenced = sites + body_sites, silenced + body_silenced
        if opener == "try:":
            lines += [outer + "except Exception:  # keep going", outer + indent + "pass"]
        elif opener.startswith("match"):
            lines += [outer + indent + "case _:", outer + indent * 2 + "pass"]
        elif opener.startswith("if n_gpu"):
            lines += [outer + "else:", outer + indent + "model = model.cuda()"]
    return lines, sites, silenced


@st.composite
def modules(draw) -> Module:
    """A module with DataParallel sites, as text, with how many sites it has and how many are under noqa."""
    indent = draw(st.sampled_from(("    ", "  ", "\t")))
    newline = draw(st.sampled_from(("\n", "\r\n")))
    header = draw(st.permutations(IMPORTS))
    body, sites, silenced = draw(_statements(depth=draw(st.integers(0, 3)), level=0, indent=indent, in_function=False))
    if draw(st.booleans()):
        body.insert(draw(st.integers(0, len(body))), "\f")
    if draw(st.booleans()):
        header.insert(0, '"""A training script."""')
    # Trailing lines LibCST cannot reproduce when whitespace-only lines are among them.
    footer = draw(st.sampled_from(([], [], ["# the end"], ["", "\t", "# the end"], ["  ", "\f", "# the end", "\t"])))
    source = newline.join([*header, "", *body, *footer])
    if draw(st.booleans()):
        source += newline
    return Module(source, sites, silenced)
