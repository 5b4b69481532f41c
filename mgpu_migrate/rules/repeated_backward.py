"""MGP108, MGP370: two backward passes over one forward of a wrapped model, which torch's DDP reducer cannot follow."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Optional

import libcst as cst

from mgpu_migrate.analysis.models import TENSOR_DESCRIPTION, Sites
from mgpu_migrate.analysis.scopes import FlowIndex, Place, Scope
from mgpu_migrate.analysis.tree import Tree, contains
from mgpu_migrate.analysis.values import Values
from mgpu_migrate.analysis.walk import DEFINITIONS, children
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import BALANCED, DDP, PROGRAM, TORCH_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import keyword, with_keyword
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

REPEATED_BACKWARD = Review(
    "MGP370",
    name="backward-twice-per-forward",
    summary="two backward passes over one forward of the wrapped model: DDP reduces the gradients once per forward",
    why=(
        "The loop calls `backward()` more than once on values computed by one call of the wrapped model, with no "
        "new call of it in between (a trainer module whose forward returns the discriminator's and the "
        "generator's losses, then `d_loss.backward()` ... `g_loss.backward()`; or a `backward(retain_graph=True)` "
        "in a loop over the outputs of one forward). DataParallel keeps nothing between its forward and the "
        "backward passes, so each pass adds its gradients. torch's DistributedDataParallel prepares one gradient "
        "reduction per forward and expects each parameter's gradient once: a second pass that reaches a parameter "
        "the first reached fails (\"Expected to mark a variable ready only once\"); when the first pass reached "
        "every parameter, the second pass's gradients are never reduced, and the processes' weights drift apart "
        "without an error; a step that runs only one of the passes leaves the reduction unfinished (\"Expected to "
        "have finished reduction in the prior iteration\"). So does a backward pass that reaches the model only "
        "through `torch.autograd.grad(..., create_graph=True)` of its output (a WGAN-GP gradient penalty stepped on "
        "its own): it reaches only the parameters that gradient depends on, never the last layer's bias, and the "
        "reduction waits for the others. `--to ddp --style torch`, which has no runtime to sum the "
        "gradients otherwise, leaves the file as it is; the default style passes `reduce_each_backward=True` to the "
        "runtime's wrapper (MGP108)."
    ),
    todo=(
        "Give each backward pass a forward of its own: call the wrapped model once per loss "
        "(`losses = model(x, part='d')` ... `losses = model(x, part='g')`), or wrap the generator and the "
        "discriminator each on its own, as GAN scripts do; or add up losses that train the same parameters and "
        "call `backward()` once. Then migrate. Or migrate with the default style (the runtime sums the gradients "
        "after each pass), or `--to balanced`: one process, whose backward passes add their gradients as "
        "DataParallel's did. Passes over parameters that share nothing, both run at every step, do train under "
        "DDP: the file cannot show that, so say it with `# noqa: MGP370` at the second pass."
    ),
    veto=True,
)
AUTOGRAD_GRAD = "torch.autograd.grad"
# Methods and attributes whose result carries no autograd graph: a backward pass does not reach the forward through them.
_DETACHING = frozenset({"detach", "detach_", "item", "tolist", "numpy"})
_NO_GRAPH = TENSOR_DESCRIPTION | {"data", "grad"}
# How many assignments back a value is followed.
_DEPTH = 8
_LOOPS = (cst.For, cst.While)
_BRANCHES = (cst.If, cst.Try, cst.TryStar, cst.For, cst.While, cst.Match)


class RepeatedBackward(Rule):
    """
    ## What it does
    Under ``--to ddp``, reports a second backward pass over the graph of one forward of a wrapped model: two
    ``.backward()`` (or ``torch.autograd.backward``) calls in one loop body (or one function) whose losses
    both come from the same call of the wrapped model, with no new call of that model between them, or a
    ``.backward()`` in a loop that runs over the outputs of one forward made before it. The values are
    followed back through the assignments that reach each backward pass; ``.detach()``, ``.item()`` and
    ``.data`` end the graph. So is a backward pass whose loss reaches a wrapped model only through
    ``torch.autograd.grad(...)`` of its output (a WGAN-GP gradient penalty, ``create_graph=True``, stepped on its
    own): it reaches only the parameters that gradient depends on. The wrap that forward runs is then given ``reduce_each_backward=True``: the
    runtime leaves torch's reducer out of its forwards and sums the model's gradients over the processes at
    the end of each backward pass. Under ``--style torch``, which has no runtime, the file is left as it is
    (MGP370).

    Not reported: a GAN loop over two wraps (the discriminator's loss on ``fake.detach()``), a new forward
    before each backward pass, gradient accumulation (a forward each micro-step), a single
    ``backward(retain_graph=True)``, losses added up and passed to one ``backward()``, and backward passes in
    the two branches of an ``if``.

    ## Why is this bad?
    DataParallel runs a forward and lets autograd add up whatever backward passes follow. torch's DDP
    prepares one gradient reduction per forward: a second backward pass that reaches a parameter the first
    reached fails with "Expected to mark a variable ready only once", and when the first reached every
    parameter, the second's gradients are never reduced: each process keeps its own, and the copies of the
    model drift apart with no error. A step that runs only the first pass (the generator trained every
    n-th step) leaves the reduction unfinished, and the next forward fails. Summed at the end of each pass,
    each parameter's ``.grad`` is whole after each, as DataParallel's was, whatever the loop does between the
    passes (an optimizer's step, clipping). Under ``--style torch`` only passes over disjoint parameters, both
    run at every step, train; the file does not show which parameters a pass reaches, so
    ``# noqa: MGP370`` at the second pass migrates such a file.

    ## Example
    ```python
    model = nn.DataParallel(Trainer(config))
    for x in loader:
        losses = model(x)                 # one forward: the D and G losses
        losses["d"].backward()
        optimizer_d.step()
        losses["g"].backward()            # a second backward pass over it
        optimizer_g.step()
    ```

    ## Use instead
    ```python
    model = mgpu_runtime.DistributedDataParallel(Trainer(config), reduce_each_backward=True)
    ```
    Under ``--style torch``, give each backward pass a forward of its own (``model(x, part="d")["d"].backward()``
    ... ``model(x, part="g")["g"].backward()``), or migrate with ``--to balanced``, which runs the file as it is.

    ## Fix safety
    Exact: each pass's gradients are summed over the processes before anything reads them, as the one process
    of DataParallel held them. What it costs: the reduction no longer overlaps the backward pass, and a
    parameter that no pass reaches is still sent (as zeros). Under ``--style torch`` nothing is rewritten, in
    the whole file, and how to split the forward is the author's to decide.
    """

    CODE = Rewrite("MGP108")
    PHASE = PROGRAM
    USES = ("flow", "models", "values")
    REVIEW_CODES = (REPEATED_BACKWARD,)
    DESCRIPTION = "several backward passes over one forward: gradients summed after each (reduce_each_backward=True)"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(Trainer())
            for x in loader:
                losses = model(x)
                losses["d"].backward()
                optimizer_d.step()
                losses["g"].backward()
                optimizer_g.step()
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(Trainer(), reduce_each_backward=True)
            for x in loader:
                losses = model(x)
                losses["d"].backward()
                optimizer_d.step()
                losses["g"].backward()
                optimizer_g.step()
            """,
            DDP,
            ("MGP101", "MGP108"),
            message='line 8\'s `losses["g"].backward()` is a second backward pass over one forward, `model(x)` (line 5)',
            line=3,
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(Trainer())
            for x in loader:
                losses = model(x)
                losses["d"].backward()
                optimizer_d.step()
                losses["g"].backward()
                optimizer_g.step()
            """,
            None,
            DDP,
            (REPEATED_BACKWARD,),
            TORCH_OPTIONS,
            message='`losses["g"].backward()`: a second backward pass over one forward, `model(x)` (line 5), after line 6\'s',
            line=8,
            name="style-torch-leaves-the-file",
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            critic = nn.DataParallel(Critic())
            for points in loader:
                points.requires_grad_(True)
                scores = critic(points)
                grad = torch.autograd.grad(scores.sum(), points, create_graph=True)[0]
                penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
                penalty.backward()
                optimizer.step()
            """,
            """
            import torch
            import mgpu_runtime

            critic = mgpu_runtime.DistributedDataParallel(Critic(), reduce_each_backward=True)
            for points in loader:
                points.requires_grad_(True)
                scores = critic(points)
                grad = torch.autograd.grad(scores.sum(), points, create_graph=True)[0]
                penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
                penalty.backward()
                optimizer.step()
            """,
            DDP,
            ("MGP101", "MGP108"),
            message="line 10's `penalty.backward()` reaches `critic(points)` (line 7) only through the gradient of its output",
            line=4,
            name="gradient-penalty-stepped-on-its-own",
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(Net())
            for x, y in loader:
                outputs = model(x)
                for output, target in zip(outputs, y):
                    criterion(output, target).backward(retain_graph=True)
                optimizer.step()
            """,
            None,
            DDP,
            (REPEATED_BACKWARD,),
            TORCH_OPTIONS,
            message="runs at each pass of the loop at line 6 over one forward, `model(x)` (line 5)",
            line=7,
            name="backward-in-a-loop-over-one-forward",
        ),
        Example(
            """
            import torch.nn as nn

            netG = nn.DataParallel(Generator())
            netD = nn.DataParallel(Discriminator())
            for real in loader:
                fake = netG(noise)
                loss_d = criterion(netD(real), ones) + criterion(netD(fake.detach()), zeros)
                loss_d.backward()
                optimizer_d.step()
                loss_g = criterion(netD(fake), ones)
                loss_g.backward()
                optimizer_g.step()
            """,
            """
            import mgpu_runtime

            netG = mgpu_runtime.DistributedDataParallel(Generator())
            netD = mgpu_runtime.DistributedDataParallel(Discriminator())
            for real in loader:
                fake = netG(noise)
                loss_d = criterion(netD(real), ones) + criterion(netD(fake.detach()), zeros)
                loss_d.backward()
                optimizer_d.step()
                loss_g = criterion(netD(fake), ones)
                loss_g.backward()
                optimizer_g.step()
            """,
            DDP,
            ("MGP101",),
            name="gan-a-forward-before-each-backward",
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(Net())
            for x, y in loader:
                for chunk, target in zip(x.chunk(4), y.chunk(4)):
                    loss = criterion(model(chunk), target) / 4
                    loss.backward()
                main, aux = model(x)
                (criterion(main, y) + 0.4 * criterion(aux, y)).backward()
                optimizer.step()
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(Net())
            for x, y in loader:
                for chunk, target in zip(x.chunk(4), y.chunk(4)):
                    loss = criterion(model(chunk), target) / 4
                    loss.backward()
                main, aux = model(x)
                (criterion(main, y) + 0.4 * criterion(aux, y)).backward()
                optimizer.step()
            """,
            DDP,
            ("MGP101",),
            name="accumulation-and-summed-losses",
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(Net())
            for step, (x, y) in enumerate(loader):
                out = model(x)
                if step % 2:
                    criterion(out, y).backward()
                else:
                    other(out, y).backward()
                loss = criterion(model(x), y)
                loss.backward(retain_graph=True)
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(Net())
            for step, (x, y) in enumerate(loader):
                out = model(x)
                if step % 2:
                    criterion(out, y).backward()
                else:
                    other(out, y).backward()
                loss = criterion(model(x), y)
                loss.backward(retain_graph=True)
            """,
            DDP,
            ("MGP101",),
            name="one-backward-per-forward-in-each-branch",
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(Trainer())
            for x in loader:
                losses = model(x)
                losses["d"].backward()
                losses["g"].backward()
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DataParallelModel(Trainer())
            for x in loader:
                losses = model(x)
                losses["d"].backward()
                losses["g"].backward()
            """,
            BALANCED,
            ("MGP101",),
            name="balanced-runs-two-backward-passes",
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        forwards = self._forwards()
        if not forwards:
            return
        by_function: dict[Optional[cst.FunctionDef], list[cst.Call]] = defaultdict(list)
        for call in self.analysis.calls:
            if _loss_of(self.analysis, call) is not None:
                by_function[self.analysis.tree.function(call)].append(call)
        self._passes: dict[Any, str] = {}
        """The wrap sites whose forward feeds several backward passes, each with what says so (the first found)."""
        for function, backwards in by_function.items():
            self._check(function, backwards, forwards)
        models = self.analysis.models
        for wrap in self.program.wraps:
            why = self._passes.get(models.site_of(wrap))
            if why is None or keyword(wrap, "reduce_each_backward") is not None or not self.rewrite_allowed(wrap):
                continue
            self.edits.replace(wrap, _reduced_each_backward)
            self.rewrote(wrap, f"reduce_each_backward=True: {why}")

    def _several_passes(self, backward: cst.Call, forward: cst.Call, sites: Sites, left: str, rewritten: str) -> None:
        """A backward pass that is not the first over ``forward``'s graph: under ``--style torch`` the file is left
        (``left`` says why); otherwise the wraps that forward runs sum their gradients after each pass."""
        if self.options.style == TORCH_STYLE:
            self.left(backward, REPEATED_BACKWARD, left)
            return
        for site in sites:
            self._passes.setdefault(site, rewritten)

    # -- the forwards ------------------------------------------------------------------------------
    def _forwards(self) -> dict[cst.Call, Sites]:
        """The calls that run a forward of a wrapped model, with the wrap sites they run: the model's own calls,
        and the calls of this file's functions that make one (followed four calls deep)."""
        analysis = self.analysis
        found: dict[cst.Call, Sites] = {call: sites for call, _, sites in analysis.models.model_calls()}
        if not found:
            return found
        index = analysis.flow
        runs: dict[cst.FunctionDef, Sites] = defaultdict(frozenset)
        for call, sites in found.items():
            function = analysis.tree.function(call)
            if function is not None:
                runs[function] |= sites
        calls: list[tuple[cst.Call, cst.FunctionDef]] = []
        for call, scope in index.calls:
            made = index.callee(call, scope)
            if made is not None:
                calls.append((call, made[0]))
        for _ in range(4):
            grown = False
            for call, callee in calls:
                reached = runs.get(callee, frozenset())
                function = analysis.tree.function(call)
                if reached and function is not None and not reached <= runs[function]:
                    runs[function] |= reached
                    grown = True
            if not grown:
                break
        for call, callee in calls:
            if runs.get(callee):
                found[call] = found.get(call, frozenset()) | runs[callee]
        return found

    # -- one function's backward passes -------------------------------------------------------------
    def _check(self, function: Optional[cst.FunctionDef], backwards: list[cst.Call], forwards: dict[cst.Call, Sites]) -> None:
        analysis = self.analysis
        root = function if function is not None else analysis.module
        local = [call for call in forwards if analysis.tree.function(call) is function]
        if not local:
            return
        order = {id(node): number for number, node in enumerate(contains(root, lambda node: True))}
        backwards = sorted((call for call in backwards if id(call) in order), key=lambda call: order[id(call)])
        reader = _Reader(analysis.tree, analysis.flow, analysis.values, function, order, forwards, analysis.resolve)
        sources = {call: reader.sources(_loss_of(analysis, call), call) for call in backwards}
        for call in backwards:
            self._through_a_gradient(call, reader, sources[call], forwards)
        regions = {call: self._region(call, root) for call in backwards}
        reported: set[cst.Call] = set()
        for later_index, later in enumerate(backwards):
            for earlier in backwards[:later_index]:
                if regions[earlier] is not regions[later] or not self._together(earlier, later, regions[later]):
                    continue
                forward = next(
                    (
                        call
                        for call in sorted(sources[earlier] & sources[later], key=lambda call: order[id(call)])
                        if order[id(call)] < order[id(earlier)]
                        and not any(
                            other is not call and forwards[other] & forwards[call] and order[id(earlier)] < order[id(other)] < order[id(later)]
                            for other in local
                        )
                    ),
                    None,
                )
                if forward is not None:
                    reported.add(later)
                    code, line = shorten(analysis.code_of(later), 32), analysis.position(later)[0]
                    made = f"`{shorten(analysis.code_of(forward), 24)}` (line {analysis.position(forward)[0]})"
                    self._several_passes(
                        later,
                        forward,
                        forwards[forward],
                        f"`{code}`: a second backward pass over one forward, {made}, after line "
                        f"{analysis.position(earlier)[0]}'s: file left as it is",
                        f"line {line}'s `{code}` is a second backward pass over one forward, {made}",
                    )
                    break
        for call in backwards:
            region = regions[call]
            if call in reported or type(region) not in _LOOPS:
                continue
            forward = next(
                (
                    source
                    for source in sorted(sources[call], key=lambda source: order[id(source)])
                    if order[id(source)] < order[id(region)]
                    and not any(forwards[other] & forwards[source] and _inside(analysis, other, region) for other in local)
                ),
                None,
            )
            if forward is not None:
                code, loop = shorten(analysis.code_of(call), 32), analysis.position(region)[0]
                made = f"`{shorten(analysis.code_of(forward), 24)}` (line {analysis.position(forward)[0]})"
                self._several_passes(
                    call,
                    forward,
                    forwards[forward],
                    f"`{code}` runs at each pass of the loop at line {loop} over one forward, {made}: file left as it is",
                    f"`{code}` runs at each pass of the loop at line {loop} over one forward, {made}",
                )

    def _through_a_gradient(self, backward: cst.Call, reader: _Reader, sources: frozenset[cst.Call], forwards: dict[cst.Call, Sites]) -> None:
        """A backward pass that reaches a wrapped model only through ``torch.autograd.grad(..., create_graph=True)``
        of its output (a WGAN-GP gradient penalty stepped on its own): it reaches only the parameters that gradient
        depends on, never the last layer's bias, while DDP's reducer waits for every parameter of the forward."""
        if not sources:
            return
        direct = reader.sources(_loss_of(self.analysis, backward), backward, gradients=False)
        reached = frozenset().union(*(forwards[call] for call in direct))
        analysis = self.analysis
        for forward in sorted(sources - direct, key=lambda call: analysis.position(call)):
            sites = forwards[forward] - reached
            if not sites:
                continue
            code, line = shorten(analysis.code_of(backward), 32), analysis.position(backward)[0]
            made = f"`{shorten(analysis.code_of(forward), 24)}` (line {analysis.position(forward)[0]})"
            self._several_passes(
                backward,
                forward,
                sites,
                f"`{code}` reaches {made} only through the gradient of its output: file left as it is",
                f"line {line}'s `{code}` reaches {made} only through the gradient of its output",
            )
            return

    def _region(self, call: cst.Call, root: cst.CSTNode) -> cst.CSTNode:
        """The innermost loop whose body runs ``call`` (its function, or the module, when none does)."""
        child: cst.CSTNode = call
        for ancestor in self.analysis.tree.ancestors(call):
            if ancestor is root:
                break
            if type(ancestor) in _LOOPS and child is getattr(ancestor, "body", None):
                return ancestor
            child = ancestor
        return root

    def _together(self, earlier: cst.Call, later: cst.Call, region: cst.CSTNode) -> bool:
        """Whether one of the two backward passes runs whenever the other does: the branches around one are
        among those around the other (not the two parts of one ``if``, nor two ``if``s of their own)."""
        tree = self.analysis.tree
        first, second = _parts(tree, earlier, region), _parts(tree, later, region)
        return first <= second or second <= first


def _reduced_each_backward(call: cst.CSTNode) -> cst.CSTNode:
    assert type(call) is cst.Call
    return with_keyword(call, "reduce_each_backward", cst.Name("True"))


def _parts(tree: Tree, node: cst.CSTNode, stop: Optional[cst.CSTNode]) -> frozenset[tuple[int, int]]:
    """The parts of the branching statements and loops between ``node`` and ``stop`` (its function, its loop)
    that hold it: each as the statement and the part (``if``'s body or ``else``, a loop's body, a handler)."""
    found = set()
    child = node
    for ancestor in tree.ancestors(node):
        if ancestor is stop or type(ancestor) in DEFINITIONS:
            break
        if type(ancestor) in _BRANCHES:
            found.add((id(ancestor), id(child)))
        child = ancestor
    return frozenset(found)


def _inside(analysis, node: cst.CSTNode, region: cst.CSTNode) -> bool:
    return any(ancestor is region for ancestor in analysis.tree.ancestors(node))


def _loss_of(analysis, call: cst.Call) -> Optional[cst.BaseExpression]:
    """What a backward pass starts from: ``loss`` in ``loss.backward()``, the first argument of
    ``torch.autograd.backward``; None for any other call."""
    func = call.func
    if type(func) is cst.Attribute and func.attr.value == "backward":
        if analysis.resolve(func) != "torch.autograd.backward":
            return func.value
    elif type(func) is not cst.Name or func.value != "backward" or analysis.resolve(func) != "torch.autograd.backward":
        return None
    return call.args[0].value if call.args else None


class _Reader:
    """The forwards a value of one function comes from, through the assignments that reach where it is read."""

    def __init__(
        self,
        tree: Tree,
        index: FlowIndex,
        values: Values,
        function: Optional[cst.FunctionDef],
        order: dict[int, int],
        forwards: dict[cst.Call, Sites],
        resolve: Any,
    ) -> None:
        self.resolve = resolve
        self.tree = tree
        self.index = index
        self.values = values
        self.function = function
        self.order = order
        self.forwards = forwards
        self.scope: Scope = self.index.scopes.get(function, self.index.module_scope) if function is not None else self.index.module_scope
        self._loops: Optional[dict[Place, list[cst.BaseExpression]]] = None

    def sources(self, expr: Optional[cst.BaseExpression], use: cst.CSTNode, gradients: bool = True) -> frozenset[cst.Call]:
        """The forwards ``expr`` comes from; with ``gradients=False``, not counting those it reaches only through
        the gradient ``torch.autograd.grad`` takes of them."""
        found: set[cst.Call] = set()
        if expr is not None:
            self._read(expr, use, _DEPTH, found, set(), gradients)
        return frozenset(found)

    def _read(
        self, expr: cst.CSTNode, use: cst.CSTNode, depth: int, found: set[cst.Call], seen: set[int], gradients: bool
    ) -> None:
        stack: list[Any] = [expr]  # (each node is told apart by its type before its fields are read)
        while stack:
            node = stack.pop()
            kind = type(node)
            if kind in DEFINITIONS:
                continue
            if kind is cst.Call:
                func = node.func
                if type(func) is cst.Attribute and func.attr.value in _DETACHING:
                    continue
                if not gradients and self.resolve(func) == AUTOGRAD_GRAD:
                    continue
                if node in self.forwards:
                    found.add(node)
                    stack += [arg.value for arg in node.args]
                    continue
            elif kind is cst.Attribute and node.attr.value in _NO_GRAPH:
                continue
            if kind in (cst.Name, cst.Attribute, cst.Subscript) and depth > 0:
                place = self.index.place_of(node, self.scope)
                if place is not None:
                    for value in self._reaching(place, use):
                        if id(value) not in seen:
                            seen.add(id(value))
                            self._read(value, value, depth - 1, found, seen, gradients)
            if kind is cst.Attribute or kind is cst.Subscript:
                stack.append(node.value)
            elif kind is not cst.Name:
                stack += children(node)

    def _reaching(self, place: Place, use: cst.CSTNode) -> list[cst.BaseExpression]:
        """The values stored in ``place`` that may be what it holds where ``use`` reads it: the last assignment of
        this function before the read, and those before it that the last may not have replaced (one under a branch
        or loop that the read is not under); every one of them when none comes before (a value from an earlier
        pass of a loop), and the assignments of other scopes when this function makes none."""
        order, tree = self.order, self.tree
        stored = []
        for value, scope, position in self.values.stored.get(place, ()):
            if position is not None and type(value) in (cst.Tuple, cst.List):
                stored += [part for part, _ in self.values.element(value, scope, position)]
            else:
                stored.append(value)
        stored += self._iterated(place)
        local = [value for value in stored if id(value) in order]
        if not local:
            return stored
        at = order.get(id(use), -1)
        before = sorted(
            (value for value in local if order[id(value)] < at and not any(a is value for a in tree.ancestors(use))),
            key=lambda value: order[id(value)],
            reverse=True,
        )
        if not before:
            return local
        reaching = []
        around_use = _parts(tree, use, self.function)
        for value in before:
            reaching.append(value)
            if _parts(tree, value, self.function) <= around_use:
                break  # it runs whenever the read does: what it stores replaced what came before
        return reaching

    def _iterated(self, place: Place) -> list[cst.BaseExpression]:
        """What the loops of this file iterate to bind ``place`` (``loss`` in ``for loss in losses``)."""
        if self._loops is None:
            self._loops = defaultdict(list)
            for loop in self.index.loops:
                for bound in self.index.assigned_places(loop.target, loop.scope):
                    self._loops[bound].append(loop.iterable)
        return self._loops.get(place, [])
